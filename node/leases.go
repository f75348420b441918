package node

import (
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/ratemesh/ratemesh/crdt"
	"github.com/ratemesh/ratemesh/limiter"
)

// Leases (concurrency rules). A lease belongs to the member that granted
// it: the member counts it in its own slot of the key's lease counter (a
// PN-counter: acquired and released), and only it can renew or release
// it. Its ID, <peer>~<incarnation>~<sequence>, names the owner, so another
// member can tell whom to ask (forward.go). A lease that is not renewed
// expires after the rule's lease_ttl; leases of a slot that is no longer
// live (a member evicted, or replaced by a new incarnation) stop counting
// at once (Core.liveSlot).

// Lease is a concurrency slot held by this member for a client.
type Lease struct {
	ID      string
	Rule    string
	Key     string
	Expires time.Time
}

type lease struct {
	id      string
	rule    string
	key     string
	expires time.Time
}

// leaseTable holds the leases this member owns. Its invariant: every lease
// in it was counted once in its rule's lease counter (Limiter.RecordLease)
// and is released from it exactly once, when it leaves the table. The zero
// value is not usable: see newLeaseTable.
type leaseTable struct {
	byID map[string]*lease
	seq  uint64 // the sequence number of the latest lease granted
}

func newLeaseTable() leaseTable { return leaseTable{byID: make(map[string]*lease)} }

// grant adds a lease of (rule, key) owned by self, expiring at expires,
// under the next sequence number.
func (t *leaseTable) grant(self crdt.Slot, rule, key string, expires time.Time) *lease {
	t.seq++
	ls := &lease{
		id:      self.Peer + "~" + strconv.FormatUint(self.Incarnation, 36) + "~" + strconv.FormatUint(t.seq, 36),
		rule:    rule,
		key:     key,
		expires: expires,
	}
	t.byID[ls.id] = ls
	return ls
}

// lookup returns the lease id at now. A lease held but expired comes back
// with expired set (the caller releases it); a lease not held comes back
// nil, with a *NotOwnerError when its ID names another owner than
// selfPeer, or ErrUnknownLease.
func (t *leaseTable) lookup(now time.Time, id, selfPeer string) (ls *lease, expired bool, err error) {
	if ls, ok := t.byID[id]; ok {
		return ls, !now.Before(ls.expires), nil
	}
	if owner, _, ok := strings.Cut(id, "~"); ok && owner != selfPeer && owner != "" {
		return nil, false, &NotOwnerError{Owner: owner}
	}
	return nil, false, ErrUnknownLease
}

// expired returns the leases expired at now, sorted by ID.
func (t *leaseTable) expired(now time.Time) []*lease {
	var out []*lease
	for _, ls := range t.byID {
		if !now.Before(ls.expires) {
			out = append(out, ls)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].id < out[j].id })
	return out
}

// list returns the leases, sorted by ID.
func (t *leaseTable) list() []Lease {
	out := make([]Lease, 0, len(t.byID))
	for _, ls := range t.byID {
		out = append(out, Lease{ID: ls.id, Rule: ls.rule, Key: ls.key, Expires: ls.expires})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// Acquire admits one more concurrent lease of (rule, key) iff the merged
// live leases plus the projection stay within the limit, and returns the
// lease, owned by this member, expiring after the rule's lease_ttl unless
// renewed.
func (c *Core) Acquire(now time.Time, rule, key, class string) (Lease, limiter.Decision, error) {
	var s setup
	if err := c.setUp(&s, now, rule, key, &limiter.Request{Class: class}, true); err != nil {
		return Lease{}, limiter.Decision{}, err
	}
	if c.gated {
		return Lease{}, c.gate(&s, now), nil
	}
	d := s.l.DecideLease(s.ch, s.env, c.liveSlot)
	c.staleReason(&d)
	c.count(&d)
	if !d.Allowed {
		return Lease{}, d, nil
	}
	s.l.RecordLease(key, 1)
	ls := c.leases.grant(c.self, rule, key, now.Add(s.l.Rule().LeaseTTL))
	return Lease{ID: ls.id, Rule: rule, Key: key, Expires: ls.expires}, d, nil
}

// ownLease returns the live lease id, releasing it if it has expired.
func (c *Core) ownLease(now time.Time, id string) (*lease, error) {
	ls, expired, err := c.leases.lookup(now, id, c.self.Peer)
	if err != nil {
		return nil, err
	}
	if expired {
		c.release(ls)
		return nil, ErrUnknownLease
	}
	return ls, nil
}

// Renew extends a lease this member owns by the rule's lease_ttl from now
// and returns the TTL.
func (c *Core) Renew(now time.Time, id string) (time.Duration, error) {
	ls, err := c.ownLease(now, id)
	if err != nil {
		return 0, err
	}
	ttl := c.limiters[ls.rule].Rule().LeaseTTL
	ls.expires = now.Add(ttl)
	return ttl, nil
}

// Release ends a lease this member owns.
func (c *Core) Release(now time.Time, id string) error {
	ls, err := c.ownLease(now, id)
	if err != nil {
		return err
	}
	c.release(ls)
	return nil
}

// release removes ls from the table and from its rule's lease counter.
func (c *Core) release(ls *lease) {
	delete(c.leases.byID, ls.id)
	if l := c.limiters[ls.rule]; l != nil {
		l.RecordLease(ls.key, -1)
	}
}

// Leases returns the leases this member owns, sorted by ID.
func (c *Core) Leases() []Lease { return c.leases.list() }

func (c *Core) expireLeases(now time.Time) {
	for _, ls := range c.leases.expired(now) {
		c.release(ls)
	}
}

// liveSlot reports whether a slot's lease counts still count: our current
// incarnation, or a live member's current incarnation.
func (c *Core) liveSlot(id crdt.SlotID) bool {
	m := c.meta[id]
	if m.m == nil {
		return m.inc == c.self.Incarnation
	}
	return m.m.inc == m.inc && m.m.live()
}
