package limiter

import (
	"fmt"
	"time"

	"github.com/ratemesh/ratemesh/crdt"
)

// Limiter decides one rule's requests for one member, over the member's
// replicated counters: it reads the merged usage of a key from a
// crdt.RuleSet, applies Decide, and records the result in the member's own
// slot (admitted and attempted credits), marking it dirty for the next
// delta. It performs no I/O and reads no clock.
//
// A Limiter is not safe for concurrent use; its owner serialises calls
// together with the merges into the same container.
type Limiter struct {
	rule     Rule
	set      *crdt.RuleSet
	c        *crdt.Container
	self     crdt.SlotID
	windowMs int64
	seed     uint64
	hasExtra bool // overrides or classes: LimitFor needs lookups
}

// New returns a limiter for rule over container c, writing as slot self.
// seed (drawn from the member's seeded rand) makes the per-key lottery
// draws for fractional shares differ between members. The rule is
// normalised and validated; the error names the rule and field.
func New(rule Rule, c *crdt.Container, self crdt.SlotID, seed uint64) (*Limiter, error) {
	if err := rule.Normalize(); err != nil {
		return nil, err
	}
	return &Limiter{
		rule:     rule,
		set:      c.Rule(rule.Name),
		c:        c,
		self:     self,
		windowMs: rule.WindowMs(),
		seed:     seed,
		hasExtra: len(rule.Overrides) > 0 || len(rule.Classes) > 0,
	}, nil
}

// Rule returns the limiter's (normalised) rule.
func (l *Limiter) Rule() *Rule { return &l.rule }

// Set returns the counters the limiter reads and writes.
func (l *Limiter) Set() *crdt.RuleSet { return l.set }

// SetSelf changes the slot the limiter writes as (after a new incarnation).
func (l *Limiter) SetSelf(self crdt.SlotID) { l.self = self }

// Check is one resolved request: a key, its cost in credits, and its
// effective limit.
type Check struct {
	Key       string
	Cost      uint64
	Limit     uint64
	Unlimited bool
}

// Resolve validates key and req and returns the check to decide.
func (l *Limiter) Resolve(key string, req Request) (Check, error) {
	if key == "" || len(key) > crdt.MaxKeyLen {
		return Check{}, fmt.Errorf("%w: key must be 1 to %d bytes, got %d", ErrBadKey, crdt.MaxKeyLen, len(key))
	}
	if l.rule.Algorithm == Concurrency {
		return Check{}, fmt.Errorf("%w: rule %q is a concurrency rule; acquire a lease", ErrWrongAlgorithm, l.rule.Name)
	}
	var cost uint64 = 1
	if req.HasCost && req.Type == "" && req.Cost <= MaxCost {
		cost = req.Cost
	} else if req.HasCost || req.Type != "" {
		var err error
		if cost, err = l.rule.CostOf(req); err != nil {
			return Check{}, err
		}
	}
	limit := l.rule.Limit
	unlimited := false
	if l.hasExtra || req.Class != "" {
		var err error
		if limit, unlimited, err = l.rule.LimitFor(key, req.Class); err != nil {
			return Check{}, err
		}
	}
	return Check{Key: key, Cost: cost, Limit: limit, Unlimited: unlimited}, nil
}

// Decide decides ch at env without recording anything.
func (l *Limiter) Decide(ch Check, env Env) Decision {
	s := l.set.Series(ch.Key)
	if s == nil && ch.Cost > 0 && l.set.Len() >= l.rule.MaxKeys {
		d := l.rule.Decide(ch.Limit, ch.Cost, Usage{}, env, 0)
		d.Allowed, d.Shadow, d.Reason = false, false, ReasonKeyCap
		d.RetryAfter = d.ResetAfter
		return d
	}
	u := l.usage(s, env.NowMs)
	if ch.Unlimited {
		d := l.rule.Decide(ch.Limit, 0, u, env, 0)
		d.Allowed, d.Shadow, d.RetryAfter, d.Reason = true, false, 0, ReasonUnlimited
		return d
	}
	return l.rule.Decide(ch.Limit, ch.Cost, u, env, l.draw(ch.Key, env.NowMs))
}

// Record counts ch in the member's own slot: cost credits attempted, and
// admitted too when admitted is true. A cost of 0 records nothing.
func (l *Limiter) Record(ch Check, admitted bool, nowMs int64) {
	if ch.Cost == 0 {
		return
	}
	w := l.set.Ensure(ch.Key).EnsureWindow(l.windowMs, floorDiv(nowMs, l.windowMs))
	w.Attempted.Add(l.self, ch.Cost)
	if admitted {
		w.Admitted.Add(l.self, ch.Cost)
	}
	l.c.MarkDirty(w)
}

// Allow resolves, decides and records one request. A denial is a Decision
// with Allowed false, not an error; errors are for bad requests.
func (l *Limiter) Allow(key string, req Request, env Env) (Decision, error) {
	ch, err := l.Resolve(key, req)
	if err != nil {
		return Decision{}, err
	}
	d := l.Decide(ch, env)
	if d.Reason != ReasonKeyCap {
		l.Record(ch, d.Allowed, env.NowMs)
	}
	return d, nil
}

// Usage returns what the member knows of key at nowMs.
func (l *Limiter) Usage(key string, nowMs int64) Usage {
	return l.usage(l.set.Series(key), nowMs)
}

// Earliest returns how long until ch could first fit (see Rule.Earliest).
func (l *Limiter) Earliest(ch Check, env Env) time.Duration {
	if ch.Unlimited || ch.Cost == 0 {
		return 0
	}
	return l.rule.Earliest(ch.Limit, ch.Cost, l.usage(l.set.Series(ch.Key), env.NowMs), env)
}

// ResolveLease validates key and class for a concurrency rule.
func (l *Limiter) ResolveLease(key, class string) (Check, error) {
	if key == "" || len(key) > crdt.MaxKeyLen {
		return Check{}, fmt.Errorf("%w: key must be 1 to %d bytes, got %d", ErrBadKey, crdt.MaxKeyLen, len(key))
	}
	if l.rule.Algorithm != Concurrency {
		return Check{}, fmt.Errorf("%w: rule %q is a %s rule; use allow", ErrWrongAlgorithm, l.rule.Name, l.rule.Algorithm)
	}
	limit, unlimited, err := l.rule.LimitFor(key, class)
	if err != nil {
		return Check{}, err
	}
	return Check{Key: key, Cost: 1, Limit: limit, Unlimited: unlimited}, nil
}

// LeaseUsage returns the live leases of key: Cur is the merged count over
// the slots live reports true for, CurUnacked this member's acquisitions
// not yet acknowledged by every live member.
func (l *Limiter) LeaseUsage(key string, live func(crdt.SlotID) bool) Usage {
	s := l.set.Series(key)
	if s == nil {
		return Usage{}
	}
	u := Usage{Cur: uint64(s.Leases.ValueWhere(live))}
	if own := s.Leases.SlotValue(l.self); own > s.LeasesAcked {
		u.CurUnacked = uint64(own - s.LeasesAcked)
	}
	return u
}

// DecideLease decides whether one more lease of ch.Key fits, like Decide
// does for credits, without recording it.
func (l *Limiter) DecideLease(ch Check, env Env, live func(crdt.SlotID) bool) Decision {
	if l.set.Series(ch.Key) == nil && l.set.Len() >= l.rule.MaxKeys {
		return Decision{Limit: ch.Limit, Reason: ReasonKeyCap, RetryAfter: l.rule.LeaseTTL}
	}
	u := l.LeaseUsage(ch.Key, live)
	if ch.Unlimited {
		d := l.rule.Decide(ch.Limit, 0, u, env, 0)
		d.Allowed, d.RetryAfter, d.Reason = true, 0, ReasonUnlimited
		return d
	}
	return l.rule.Decide(ch.Limit, 1, u, env, l.draw(ch.Key, env.NowMs))
}

// RecordLease counts one acquisition (delta +1) or release (delta −1) of
// key in the member's own slot.
func (l *Limiter) RecordLease(key string, delta int) {
	s := l.set.Ensure(key)
	if delta > 0 {
		s.Leases.P.Add(l.self, uint64(delta))
	} else if delta < 0 {
		s.Leases.N.Add(l.self, uint64(-delta))
	}
	l.c.MarkLeasesDirty(s)
}

func (l *Limiter) usage(s *crdt.Series, nowMs int64) Usage {
	var u Usage
	if s == nil {
		return u
	}
	idx := floorDiv(nowMs, l.windowMs)
	for _, w := range s.Windows {
		if w.WindowMs != l.windowMs {
			continue
		}
		switch w.Index {
		case idx:
			u.Cur, u.CurUnacked = w.Admitted.Value(), unacked(w, l.self)
		case idx - 1:
			u.Prev, u.PrevUnacked = w.Admitted.Value(), unacked(w, l.self)
		}
	}
	return u
}

func unacked(w *crdt.Window, self crdt.SlotID) uint64 {
	if own := w.Admitted.Get(self); own > w.Acked {
		return own - w.Acked
	}
	return 0
}

// draw returns this member's lottery draw in [0, 1) for key in the window
// containing nowMs: fixed for the window, different across members and keys.
func (l *Limiter) draw(key string, nowMs int64) float64 {
	h := l.seed ^ uint64(floorDiv(nowMs, max(l.windowMs, 1)))*0x9e3779b97f4a7c15
	for i := 0; i < len(key); i++ {
		h ^= uint64(key[i])
		h *= 1099511628211
	}
	// splitmix64 finaliser
	h ^= h >> 30
	h *= 0xbf58476d1ce4e5b9
	h ^= h >> 27
	h *= 0x94d049bb133111eb
	h ^= h >> 31
	return float64(h>>11) / (1 << 53)
}

func floorDiv(a, b int64) int64 {
	if b <= 0 {
		return 0
	}
	q := a / b
	if a%b < 0 {
		q--
	}
	return q
}
