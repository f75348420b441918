package node

import (
	"sort"
	"time"

	"github.com/ratemesh/ratemesh/crdt"
	"github.com/ratemesh/ratemesh/limiter"
)

// Persister decides what of a Core survives a restart: it restores the
// saved state into a fresh core at start, and on every flush exports what
// changed since the last one as a Flush for a Store. Like the core it is
// pure: it reads no clock and performs no I/O; the caller passes the time
// and writes the Flush.
//
// What it persists: the merged state (every slot's admitted and attempted
// credits) of the windows of rules whose window is at least MinWindow, and
// the leases the member owns with their expiry. Shorter windows end before
// a restart could matter; other members' leases are theirs to keep.
//
// A Persister is not safe for concurrent use: serialise its calls with the
// core's (the runtime holds the node's mutex).
type Persister struct {
	c           *Core
	minWindowMs int64
	seen        map[*crdt.Window]winMark
	gen         uint32
	leases      map[string]time.Time // what the store holds: ID → expiry
	released    []string             // releases a failed flush did not write
	full        bool                 // export everything next time
}

type winMark struct {
	admitted, attempted uint64
	gen                 uint32
}

// NewPersister returns a Persister over c that persists windows of at least
// minWindow. A minWindow ≤ 0 persists every window.
func NewPersister(c *Core, minWindow time.Duration) *Persister {
	return &Persister{
		c:           c,
		minWindowMs: max(minWindow.Milliseconds(), 1),
		seen:        make(map[*crdt.Window]winMark),
		leases:      make(map[string]time.Time),
	}
}

// RestoreStats counts what Restore did with the saved state.
type RestoreStats struct {
	// Windows and Leases were restored.
	Windows, Leases int
	// Skipped records: of a rule that no longer exists or whose window
	// changed, already collected, or of this member's current slot.
	SkippedWindows int
	// Skipped leases: expired, or of a rule that no longer exists or is
	// no longer a concurrency rule.
	SkippedLeases int
}

// Restore loads saved state into the core at now, before it serves. Window
// records merge into their slots by max: the member's own earlier
// incarnations keep counting until their windows end, and other members'
// slots are known before they are heard again. Leases still live at now
// are owned again under the current incarnation, with their IDs and
// expiry, so their clients can renew and release them; the others are
// released from the store at the next flush.
func (p *Persister) Restore(now time.Time, recs []WindowRecord, leases []Lease) RestoreStats {
	c := p.c
	var st RestoreStats
	nowMs := c.MeshMs(now)
	for _, r := range recs {
		l := c.limiters[r.Rule]
		if l == nil || l.Rule().Algorithm == limiter.Concurrency || l.Rule().WindowMs() != r.WindowMs ||
			r.WindowMs <= 0 || r.CollectAt() <= nowMs || r.Slot == c.self || r.Slot.Peer == "" || r.Slot.Incarnation == 0 {
			st.SkippedWindows++
			continue
		}
		id, ok := c.slots.Lookup(r.Slot)
		if !ok {
			id = c.intern(r.Slot, c.members[r.Slot.Peer])
		}
		w := l.Set().Ensure(r.Key).EnsureWindow(r.WindowMs, r.Window)
		w.Admitted.Raise(id, r.Admitted)
		w.Attempted.Raise(id, r.Attempted)
		st.Windows++
	}
	// What was restored is on disk already: mark it exported.
	p.gen++
	p.eachWindow(nowMs, func(w *crdt.Window) {
		p.seen[w] = winMark{w.Admitted.Value(), w.Attempted.Value(), p.gen}
	})
	for _, ls := range leases {
		p.leases[ls.ID] = ls.Expires // on disk: released below unless restored
		l := c.limiters[ls.Rule]
		if l == nil || l.Rule().Algorithm != limiter.Concurrency || !now.Before(ls.Expires) || c.leases[ls.ID] != nil {
			st.SkippedLeases++
			continue
		}
		l.RecordLease(ls.Key, 1)
		c.leases[ls.ID] = &lease{id: ls.ID, rule: ls.Rule, key: ls.Key, expires: ls.Expires}
		st.Leases++
	}
	return st
}

// eachWindow calls f for every window persisted and not yet collected at
// nowMs.
func (p *Persister) eachWindow(nowMs int64, f func(w *crdt.Window)) {
	for _, name := range p.c.RuleNames() {
		l := p.c.limiters[name]
		r := l.Rule()
		if r.Algorithm == limiter.Concurrency || r.WindowMs() < p.minWindowMs {
			continue
		}
		l.Set().Each(func(s *crdt.Series) {
			for _, w := range s.Windows {
				if w.WindowMs >= p.minWindowMs && !w.Expired(nowMs) {
					f(w)
				}
			}
		})
	}
}

// Export returns what changed since the last export at now: the records of
// every persisted window whose merged values grew (all its slots), the
// leases acquired or renewed, the leases released or expired, and the mesh
// time before which the store may collect. It costs a walk over the
// persisted windows, and a record per slot of each changed window.
func (p *Persister) Export(now time.Time) Flush {
	c := p.c
	nowMs := c.MeshMs(now)
	f := Flush{CollectBeforeMs: nowMs}
	p.gen++
	full := p.full
	p.full = false
	p.eachWindow(nowMs, func(w *crdt.Window) {
		m := winMark{w.Admitted.Value(), w.Attempted.Value(), p.gen}
		old, ok := p.seen[w]
		p.seen[w] = m
		if ok && !full && old.admitted == m.admitted && old.attempted == m.attempted {
			return
		}
		s := w.Series()
		rec := WindowRecord{Rule: s.Rule().Name, Key: s.Key, WindowMs: w.WindowMs, Window: w.Index}
		w.Attempted.Each(func(id crdt.SlotID, att uint64) {
			rec.Slot, rec.Admitted, rec.Attempted = c.slots.Slot(id), w.Admitted.Get(id), att
			f.Windows = append(f.Windows, rec)
		})
		w.Admitted.Each(func(id crdt.SlotID, adm uint64) {
			if w.Attempted.Get(id) == 0 {
				rec.Slot, rec.Admitted, rec.Attempted = c.slots.Slot(id), adm, 0
				f.Windows = append(f.Windows, rec)
			}
		})
	})
	for w, m := range p.seen {
		if m.gen != p.gen {
			delete(p.seen, w) // collected
		}
	}
	f.Released, p.released = p.released, nil
	for id := range p.leases {
		if c.leases[id] == nil {
			f.Released = append(f.Released, id)
			delete(p.leases, id)
		}
	}
	sort.Strings(f.Released)
	for id, ls := range c.leases {
		if exp, ok := p.leases[id]; ok && !full && exp.Equal(ls.expires) {
			continue
		}
		p.leases[id] = ls.expires
		f.Leases = append(f.Leases, Lease{ID: id, Rule: ls.rule, Key: ls.key, Expires: ls.expires})
	}
	sort.Slice(f.Leases, func(i, j int) bool { return f.Leases[i].ID < f.Leases[j].ID })
	return f
}

// Done records the outcome of writing f, the last Export. After a failure
// the next Export carries everything again (a store merges by max, so
// writing a value twice is harmless), and the releases f did not write.
func (p *Persister) Done(f *Flush, err error) {
	if err != nil {
		p.c.stats.PersistErrors++
		p.full = true
		p.released = append(p.released, f.Released...)
		return
	}
	p.c.stats.PersistFlushes++
	p.c.stats.PersistEntries += uint64(len(f.Windows) + len(f.Leases) + len(f.Released))
}
