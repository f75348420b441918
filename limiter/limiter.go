package limiter

import (
	"math"
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
	hasExtra bool // overrides or classes: LimitFor needs lookups
	demand   bool // mode suppress or share demand: decisions read attempted credits
	// plain: a fixed or sliding window in mode reject with equal
	// shares, not paced, where a request within the member's share is
	// admitted with nothing else to consult (AllowInto's fast path).
	plain bool

	// thins holds the per-key thinning of suppressed keys (mode
	// suppress), pruned as windows turn past thinWin.
	thins   map[string]*thinning
	thinWin int64

	// The window that held the last instant Decide or Allow saw, as
	// [winStart, winEnd) with index winIdx: spares the hot path its
	// divisions while time stays within one window. Empty at first.
	winStart, winEnd, winIdx int64
}

// New returns a limiter for rule over container c, writing as slot self.
// The rule is normalised and validated; the error names the rule and
// field.
func New(rule Rule, c *crdt.Container, self crdt.SlotID) (*Limiter, error) {
	if err := rule.Normalize(); err != nil {
		return nil, err
	}
	return &Limiter{
		rule:     rule,
		set:      c.Rule(rule.Name),
		c:        c,
		self:     self,
		windowMs: rule.WindowMs(),
		hasExtra: len(rule.Overrides) > 0 || len(rule.Classes) > 0,
		demand:   rule.Mode == Suppress || rule.Share == Demand,
		plain: (rule.Algorithm == FixedWindow || rule.Algorithm == SlidingWindow) &&
			rule.Mode == Reject && rule.Share == Equal && !rule.Pace,
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
	var ch Check
	err := l.resolve(&ch, key, &req)
	return ch, err
}

// resolve is Resolve writing into *ch. It takes pointers so that Allow
// passes no large struct by value (copying one through the stack costs more
// than the rest of the resolution).
func (l *Limiter) resolve(ch *Check, key string, req *Request) error {
	if key == "" || len(key) > crdt.MaxKeyLen {
		return requestErr("key", ErrBadKey, "bad key: key must be 1 to %d bytes, got %d", crdt.MaxKeyLen, len(key))
	}
	if l.rule.Algorithm == Concurrency {
		return requestErr("rule", ErrWrongAlgorithm, "wrong algorithm for this call: rule %q is a concurrency rule; acquire a lease", l.rule.Name)
	}
	var cost uint64 = 1
	if req.HasCost && req.Type == "" && req.Cost <= MaxCost {
		cost = req.Cost
	} else if req.HasCost || req.Type != "" {
		var err error
		if cost, err = l.rule.CostOf(*req); err != nil {
			return err
		}
	}
	limit := l.rule.Limit
	unlimited := false
	if l.hasExtra || req.Class != "" {
		var err error
		if limit, unlimited, err = l.rule.LimitFor(key, req.Class); err != nil {
			return err
		}
	}
	ch.Key, ch.Cost, ch.Limit, ch.Unlimited = key, cost, limit, unlimited
	return nil
}

// Decide decides ch at env without recording anything.
func (l *Limiter) Decide(ch Check, env Env) Decision {
	var d Decision
	l.decide(&d, &ch, l.set.Series(ch.Key), &env)
	return d
}

// ownWindow is the key's window containing the decision's instant, if it
// exists, and this member's admitted credits in it: what Allow needs to
// record without looking the key, the window and the slot up again.
type ownWindow struct {
	w        *crdt.Window
	admitted uint64 // w.Admitted.Get(l.self)
	// Token bucket: the burn units a consumption now must raise the
	// member's slot to, valid when bucket is set.
	burnTo uint64
	bucket bool
}

// decide is Decide writing into *d, given the key's series s (nil if it has
// none).
func (l *Limiter) decide(d *Decision, ch *Check, s *crdt.Series, env *Env) ownWindow {
	idx, pos := l.window(env.NowMs)
	if s == nil && ch.Cost > 0 && l.set.Full(l.rule.MaxKeys) {
		// Decided as a peek for the window's position; denied, so a
		// retry can expect nothing before the window ends.
		l.rule.decide(d, ch.Limit, 0, &Usage{}, env, &lottery{}, pos)
		d.Allowed, d.Shadow, d.Reason, d.Remaining = false, false, ReasonKeyCap, 0
		d.RetryAfter = d.ResetAfter
		return ownWindow{}
	}
	var u Usage
	var cur ownWindow
	if l.rule.Algorithm == TokenBucket {
		cur = l.bucketUsage(&u, s, env.NowMs, ch.Limit)
	} else {
		cur = l.usageAt(&u, s, idx)
	}
	if ch.Unlimited {
		l.rule.decide(d, ch.Limit, 0, &u, env, &lottery{}, pos)
		d.Allowed, d.Shadow, d.RetryAfter, d.Reason = true, false, 0, ReasonUnlimited
		d.Remaining -= min(d.Remaining, ch.Cost) // admitted and counted: Remaining is after it
		return cur
	}
	l.rule.decide(d, ch.Limit, ch.Cost, &u, env, &lottery{l: l, key: ch.Key}, pos)
	return cur
}

// window returns the index of the window containing nowMs and nowMs's
// position in it, exactly as floorDiv and position compute them, without
// dividing while nowMs stays in the window of the previous call.
func (l *Limiter) window(nowMs int64) (idx int64, pos winPos) {
	if nowMs < l.winStart || nowMs >= l.winEnd {
		idx = floorDiv(nowMs, l.windowMs)
		pos.elapsed, pos.reset = position(l.windowMs, nowMs)
		if w := l.windowMs; w > 0 {
			into := nowMs % w
			if into < 0 {
				into += w
			}
			// Cache the window unless its bounds overflow (within a
			// window of the ends of time, every call divides).
			if start := nowMs - into; start <= nowMs && start <= math.MaxInt64-w {
				l.winStart, l.winEnd, l.winIdx = start, start+w, idx
			}
		}
		return idx, pos
	}
	into := nowMs - l.winStart
	return l.winIdx, winPos{float64(into) / float64(l.windowMs), time.Duration(l.windowMs-into) * time.Millisecond}
}

// Record counts ch in the member's own slot: cost credits attempted, and
// admitted too when admitted is true. A cost of 0 records nothing.
func (l *Limiter) Record(ch Check, admitted bool, nowMs int64) {
	l.record(&ch, ownWindow{}, admitted, nowMs)
}

// record is Record into own.w, the key's window containing nowMs, or,
// when it is nil, into that window created as needed.
func (l *Limiter) record(ch *Check, own ownWindow, admitted bool, nowMs int64) {
	if ch.Cost == 0 {
		return
	}
	if l.rule.Algorithm == TokenBucket {
		l.recordBucket(ch, own, admitted, nowMs)
		return
	}
	w := own.w
	if w == nil {
		w = l.set.Ensure(ch.Key).EnsureWindow(l.windowMs, floorDiv(nowMs, l.windowMs))
		own.admitted = w.Admitted.Get(l.self)
	}
	w.Attempted.Add(l.self, ch.Cost)
	if admitted {
		// w.Admitted.Add(l.self, ch.Cost), sparing its lookup of the
		// slot's value, which own holds.
		v := own.admitted + ch.Cost
		if v < own.admitted {
			v = math.MaxUint64 // saturate, as Add does
		}
		w.Admitted.Raise(l.self, v)
	}
	l.c.MarkDirty(w)
}

// RecordRetry counts ch decided again at nowMs after an earlier decision
// of it, denied and recorded in the window with index counted, was held
// (package node's share_wait): within that window its attempt is already
// counted, so only an admission adds (admitted credits, and attempted ones
// raised to match should they lag); in a later window it counts as a new
// attempt there, like Record. It returns the index of the window the
// request's attempt now counts in.
func (l *Limiter) RecordRetry(ch Check, admitted bool, nowMs, counted int64) int64 {
	idx := floorDiv(nowMs, l.windowMs)
	if idx != counted {
		l.record(&ch, ownWindow{}, admitted, nowMs)
		return idx
	}
	if !admitted || ch.Cost == 0 {
		return idx
	}
	w := l.set.Ensure(ch.Key).EnsureWindow(l.windowMs, idx)
	w.Admitted.Add(l.self, ch.Cost)
	if adm := w.Admitted.Get(l.self); w.Attempted.Get(l.self) < adm {
		w.Attempted.Raise(l.self, adm)
	}
	l.c.MarkDirty(w)
	return idx
}

// WindowIndex returns the index of the window containing mesh time nowMs
// (0 for a concurrency rule).
func (l *Limiter) WindowIndex(nowMs int64) int64 { return floorDiv(nowMs, l.windowMs) }

// Allow resolves, decides and records one request. A denial is a Decision
// with Allowed false, not an error; errors are for bad requests.
func (l *Limiter) Allow(key string, req Request, env Env) (d Decision, err error) {
	err = l.AllowInto(&d, key, &req, &env)
	return d, err
}

// AllowInto is Allow writing the decision into *d (overwritten entirely;
// the zero Decision on an error) and reading req and env through pointers:
// a caller on the hot path spares the copies of three structs, which cost
// as much as the rest of a decision. It does not retain req or env.
func (l *Limiter) AllowInto(d *Decision, key string, req *Request, env *Env) error {
	var ch Check
	if err := l.resolve(&ch, key, req); err != nil {
		*d = Decision{}
		return err
	}
	s := l.set.Series(key)
	if !l.plain || s == nil || ch.Unlimited {
		own := l.decide(d, &ch, s, env)
		if d.Reason != ReasonKeyCap {
			l.record(&ch, own, d.Allowed, env.NowMs)
		}
		return nil
	}
	// The hot path: an existing key of a plain rule, where decide would
	// pass no key cap, no bucket and no unlimited class. It reads the
	// usage as decide does, and the commonest decision, a request within
	// this member's equal share, it takes and records in this frame:
	// for a plain rule that is all Rule.decide would consult (its
	// "share >= c" case, from the same arithmetic), and what record
	// would count. Anything else goes to Rule.decide with the usage
	// already read. TestAllowFastPathMatchesGeneral holds the two paths
	// equal.
	idx, pos := l.window(env.NowMs)
	var u Usage
	own := l.usageAt(&u, s, idx)
	if c := float64(ch.Cost); own.w != nil && ch.Cost > 0 && ch.Cost <= ch.Limit {
		used, unacked := u.weighted(l.rule.Algorithm, pos.elapsed)
		L := float64(ch.Limit) * env.scale()
		if equalShare(L, used-unacked, unacked, env) >= c {
			*d = Decision{Allowed: true, Limit: ch.Limit, ResetAfter: pos.reset, Reason: ReasonAdmitted}
			d.Remaining = remaining(ch.Limit, used+c)
			own.w.Attempted.Add(l.self, ch.Cost)
			own.w.Admitted.Add(l.self, ch.Cost)
			l.c.MarkDirty(own.w)
			return nil
		}
	}
	l.rule.decide(d, ch.Limit, ch.Cost, &u, env, &lottery{l: l, key: ch.Key}, pos)
	l.record(&ch, own, d.Allowed, env.NowMs)
	return nil
}

// Usage returns what the member knows of key at nowMs (of a token bucket:
// at the rule's max, without override or class).
func (l *Limiter) Usage(key string, nowMs int64) Usage {
	if l.rule.Algorithm == TokenBucket {
		limit, _, _ := l.rule.LimitFor(key, "")
		var u Usage
		l.bucketUsage(&u, l.set.Series(key), nowMs, limit)
		return u
	}
	return l.usage(l.set.Series(key), nowMs)
}

// Earliest returns how long until ch could first fit (see Rule.Earliest).
func (l *Limiter) Earliest(ch Check, env Env) time.Duration {
	if ch.Unlimited || ch.Cost == 0 {
		return 0
	}
	if l.rule.Algorithm == TokenBucket {
		var u Usage
		l.bucketUsage(&u, l.set.Series(ch.Key), env.NowMs, ch.Limit)
		return l.rule.Earliest(ch.Limit, ch.Cost, u, env)
	}
	return l.rule.Earliest(ch.Limit, ch.Cost, l.usage(l.set.Series(ch.Key), env.NowMs), env)
}

// ResolveLease validates key and class for a concurrency rule.
func (l *Limiter) ResolveLease(key, class string) (Check, error) {
	if key == "" || len(key) > crdt.MaxKeyLen {
		return Check{}, requestErr("key", ErrBadKey, "bad key: key must be 1 to %d bytes, got %d", crdt.MaxKeyLen, len(key))
	}
	if l.rule.Algorithm != Concurrency {
		return Check{}, requestErr("rule", ErrWrongAlgorithm, "wrong algorithm for this call: rule %q is a %s rule; use allow", l.rule.Name, l.rule.Algorithm)
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
	lc := s.Leases()
	u := Usage{Cur: uint64(lc.ValueWhere(live))}
	if own := lc.SlotValue(l.self); own > lc.Acked {
		u.CurUnacked = uint64(own - lc.Acked)
	}
	return u
}

// DecideLease decides whether one more lease of ch.Key fits, like Decide
// does for credits, without recording it.
func (l *Limiter) DecideLease(ch Check, env Env, live func(crdt.SlotID) bool) Decision {
	if l.set.Series(ch.Key) == nil && l.set.Full(l.rule.MaxKeys) {
		return Decision{Limit: ch.Limit, Reason: ReasonKeyCap, RetryAfter: l.rule.LeaseTTL}
	}
	u := l.LeaseUsage(ch.Key, live)
	var d Decision
	var pos winPos // a concurrency rule has no window
	if ch.Unlimited {
		l.rule.decide(&d, ch.Limit, 0, &u, &env, &lottery{}, pos)
		d.Allowed, d.Shadow, d.RetryAfter, d.Reason = true, false, 0, ReasonUnlimited
		d.Remaining -= min(d.Remaining, 1) // admitted and counted: Remaining is after it
		return d
	}
	l.rule.decide(&d, ch.Limit, 1, &u, &env, &lottery{l: l, key: ch.Key}, pos)
	return d
}

// RecordLease counts one acquisition (delta +1) or release (delta −1) of
// key in the member's own slot.
func (l *Limiter) RecordLease(key string, delta int) {
	s := l.set.Ensure(key)
	if delta > 0 {
		s.EnsureLeases().P.Add(l.self, uint64(delta))
	} else if delta < 0 {
		s.EnsureLeases().N.Add(l.self, uint64(-delta))
	}
	l.c.MarkLeasesDirty(s)
}

// usage returns the usage of series s (nil for none) at nowMs.
func (l *Limiter) usage(s *crdt.Series, nowMs int64) Usage {
	var u Usage
	l.usageAt(&u, s, floorDiv(nowMs, l.windowMs))
	return u
}

// usageAt writes the usage of series s (nil for none) in window idx into
// *u, which it expects zero, and returns that window with this member's
// admitted credits in it, if it exists. (Writing through a pointer keeps
// the large Usage out of the return registers' spill on the hot path.)
func (l *Limiter) usageAt(u *Usage, s *crdt.Series, idx int64) (cur ownWindow) {
	if s == nil {
		return cur
	}
	for _, w := range s.Windows() {
		if w.WindowMs != l.windowMs {
			continue
		}
		switch w.Index {
		case idx:
			own := w.Admitted.Get(l.self)
			u.Cur, u.CurUnacked = w.Admitted.Value(), unacked(own, w.Acked)
			cur = ownWindow{w: w, admitted: own}
		case idx - 1:
			u.Prev, u.PrevUnacked = w.Admitted.Value(), unacked(w.Admitted.Get(l.self), w.Acked)
		}
	}
	if l.demand {
		l.attemptedAt(u, s, idx)
	}
	return cur
}

// unacked returns the part of own admitted credits not yet acknowledged.
func unacked(own, acked uint64) uint64 {
	if own > acked {
		return own - acked
	}
	return 0
}

// draw returns this member's lottery draw in [0, 1) for key in the window
// containing env.NowMs (for a concurrency rule, which has no window: in
// the lease epoch, see leaseEpochMs). The draws of one key and window are
// one stratified sample over the members: a start U, hashed from the
// key and the window alike at every member, plus the member's
// Rank/Members, modulo 1. So the N members' draws are spaced exactly 1/N
// apart, and when all of them hold the same fractional share f of a
// request (the same view of the merged usage), the lottery admits ⌊N·f⌋
// or ⌈N·f⌉ of them: exactly the room when N·f is whole, as it is for a
// limit with unit costs. A member that has not yet merged another's
// admission sees more room, but the winners of a larger room include the
// winners of the smaller one, so that adds no winner beyond the room the
// first admission was taken from. Draws drawn independently per member
// overshot a small limit whenever two members won the same last unit.
func (l *Limiter) draw(key string, env *Env) float64 {
	u := l.drawStart(key, env)
	n := env.members()
	rank := min(max(env.Rank, 0), int(n)-1)
	v := u + float64(rank)/n
	if v >= 1 {
		v--
	}
	return v
}

// drawStart returns U, the start of the stratified sample of draws for key
// at env.NowMs: every member computes the same.
func (l *Limiter) drawStart(key string, env *Env) float64 {
	per := l.windowMs
	if per <= 0 {
		per = leaseEpochMs(env)
	}
	h := uint64(floorDiv(env.NowMs, per)) * 0x9e3779b97f4a7c15
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

// LotteryWinners returns the ranks of the other members whose lottery
// draws admit ch as this member sees the key's usage, nearest after
// env.Rank first, when this member's own share of ch is fractional
// (positive, below the cost) and its own draw refuses it: a request this
// member's draw refuses
// although the limit has room for it, such as an idle key's first request
// under a limit below N. It returns nil when the lottery does not decide ch
// here: no room, a whole or empty share, an unlimited class or a peek, and
// for rules whose shares the equal lottery alone does not set (mode
// suppress, share demand, pace). live reports which lease slots count
// (concurrency rules; nil for windowed ones).
//
// Each other member's share is estimated as (L − M)/N, M the merged usage
// this member sees, its own unacknowledged usage assumed acknowledged:
// only a guess at who would admit. Package node hands such a request to
// one of them, whose own decision is what counts, so the guess never
// admits anything beyond that member's share.
func (l *Limiter) LotteryWinners(ch Check, env Env, live func(crdt.SlotID) bool) []int {
	r := &l.rule
	if ch.Unlimited || ch.Cost == 0 || ch.Cost > ch.Limit || r.Mode != Reject || r.Share != Equal || r.Pace {
		return nil
	}
	var u Usage
	var used, unacked float64
	if r.Algorithm == Concurrency {
		u = l.LeaseUsage(ch.Key, live)
		used, unacked = float64(u.Cur), float64(u.CurUnacked)
	} else {
		idx, pos := l.window(env.NowMs)
		l.usageAt(&u, l.set.Series(ch.Key), idx)
		used, unacked = u.weighted(r.Algorithm, pos.elapsed)
	}
	L, c, n := float64(ch.Limit)*env.scale(), float64(ch.Cost), env.members()
	own := (L-(used-unacked))/n - unacked
	if used+c > L || own <= 0 || own >= c || n < 2 {
		return nil
	}
	other := (L - used) / n
	start := l.drawStart(ch.Key, &env)
	rank := min(max(env.Rank, 0), int(n)-1)
	if v := start + float64(rank)/n; v < own/c || v-1 >= 0 && v-1 < own/c {
		return nil // this member's own draw admits (once a lease epoch's guard opens)
	}
	var out []int
	for k := 1; k < int(n); k++ {
		j := (rank + k) % int(n)
		v := start + float64(j)/n
		if v >= 1 {
			v--
		}
		if other >= c || v < other/c {
			out = append(out, j)
		}
	}
	return out
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

// leaseEpochMs is how long a concurrency rule's lottery draws hold: ten
// acknowledgement delays (400 ms at the default 20 ms sync interval). A
// windowed rule's draws hold for its window, whose usage starts afresh; a
// lease outlives any epoch, so the draws must move (or a member whose
// clients never ask would keep the freed capacity forever), and a lease
// won under one epoch's draws must reach every member before the next
// epoch's draws can pick another winner for the same unit: see leaseGuard.
func leaseEpochMs(env *Env) int64 { return max(10*env.AckDelay.Milliseconds(), 1) }

// leaseGuard reports whether env.NowMs falls in the first acknowledgement
// delay of a lease epoch, when the lottery is closed: an Acquire within
// the member's whole share still passes, one that needs a draw is denied
// with the share as its reason. By the time the lottery opens, every lease
// won in the epoch before has been merged by every member that delivers
// within the acknowledgement delay, so the new epoch's draws divide only
// room that is really free. Without the guard, leases won by different
// epochs' draws a few milliseconds apart overshot the limit by a lease or
// two (connections: 101–102 of 100).
func leaseGuard(env *Env) bool {
	e := leaseEpochMs(env)
	return env.NowMs-floorDiv(env.NowMs, e)*e < env.AckDelay.Milliseconds()
}
