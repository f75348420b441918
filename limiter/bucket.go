package limiter

import (
	"math"
	"time"

	"github.com/ratemesh/ratemesh/crdt"
)

// A token bucket's counters live in windows of its epoch G (BucketEpochMs):
// per slot, Admitted holds the credits the slot consumed in the epoch and
// Attempted the credits it drained, in units of 1/BurnUnit: consumed
// credits plus burned ones. A burn is refill a full bucket could not hold,
// or, at the start of an epoch, the credits the bucket lacked then. With
// B_k the bucket at the start s_k of epoch k, A_k the merged consumption and
// W_k the merged burns of epoch k, the bucket at t in epoch k is
//
//	T(t) = min(b, b + r·(t − s_k) − A_k − max(W_k, b − B_k))
//	B_k  = min(b, b + r·G − A_{k−1} − W_{k−1})   (initial if epoch k−1 holds nothing)
//
// A key whose epochs k−1 and k hold nothing yet starts at its first use t₀
// with initial credits: the consumption at t₀ raises W_k to b − initial +
// r·(t₀ − s_k), the refill of the epoch before t₀, so T(t) = min(b,
// initial + r·(t − t₀) − A_k) from then on.
//
// and a member consuming at t first raises W_k (in its own slot) to
// max(W_k, b − B_k) + max(0, T_raw(t) − b), T_raw being T before the cap.
// docs/token-bucket.md shows that this is the single bucket, exactly, on a
// member that knows every slot's counters, and never more than it when some
// are missing.

// bucketState is a key's bucket at an instant as a member sees it.
type bucketState struct {
	tokens float64 // T(t), at most b: the credits in the bucket
	burnTo uint64  // the burn units epoch k must hold for a consumption at t
}

// bucketParams returns the bucket of a key whose effective limit (max after
// override and class) is limit: its max b, its refill rate in credits per
// millisecond and its initial credits, all scaled by limit/Limit.
func (r *Rule) bucketParams(limit uint64) (b, rate, initial float64) {
	f := float64(limit) / float64(r.Limit)
	b = float64(limit)
	rate = float64(r.Refill) * f / float64(r.Interval.Milliseconds())
	initial = b
	if r.HasInitial {
		initial = math.Min(b, float64(r.Initial)*f)
	}
	return b, rate, initial
}

// epochSums are one epoch window's merged counters.
type epochSums struct {
	ok       bool    // the window exists
	consumed float64 // A: admitted credits
	burned   float64 // W: burned credits
}

func sumsOf(w *crdt.Window) epochSums {
	var burn uint64
	w.Attempted.Each(func(id crdt.SlotID, d uint64) {
		burn = max(burn, slotBurn(w, id, d))
	})
	return epochSums{ok: true, consumed: float64(w.Admitted.Value()), burned: float64(burn) / BurnUnit}
}

// slotBurn returns the burn units slot id's drained value d holds beyond
// its consumption.
func slotBurn(w *crdt.Window, id crdt.SlotID, d uint64) uint64 {
	a := w.Admitted.Get(id)
	if au := a * BurnUnit; a <= math.MaxUint64/BurnUnit && d > au {
		return d - au
	}
	return 0
}

// bucketAt computes the bucket at nowMs from the merged counters of the
// epoch containing it (cur) and the one before (prev), for a key whose
// effective limit is limit; g is r.BucketEpochMs(). It is pure.
func (r *Rule) bucketAt(limit uint64, nowMs, g int64, prev, cur epochSums) bucketState {
	b, rate, initial := r.bucketParams(limit)
	start := floorDiv(nowMs, g) * g
	begin := initial // an epoch after an idle one starts with initial credits
	if prev.ok {
		begin = math.Min(b, b+rate*float64(g)-prev.consumed-prev.burned)
	}
	base := math.Max(cur.burned, b-begin)
	if !prev.ok && cur.consumed == 0 && cur.burned == 0 {
		// A key nobody has used in this epoch or the last (new, or idle
		// long enough to be collected) starts now with initial credits,
		// not with initial plus what refilled since the epoch began: its
		// first consumption burns that refill (the burn it records is
		// the epoch offset it started at), so every member reads the
		// bucket as begun at that moment.
		base += rate * float64(nowMs-start)
	}
	raw := b + rate*float64(nowMs-start) - cur.consumed - base
	st := bucketState{tokens: math.Min(b, raw)}
	if need := base + math.Max(0, raw-b); need > 0 {
		// Rounded up, but not for float noise on a whole unit.
		st.burnTo = uint64(math.Ceil(need*BurnUnit - 1e-3))
	}
	return st
}

// bucketUsage writes the usage of series s (nil for none) at nowMs for a
// bucket rule into *u (expected zero): consumption and its unacknowledged
// part in the current and previous epoch, and Tokens. It returns the
// current epoch's window (if it exists) with the burn a consumption at
// nowMs must add.
func (l *Limiter) bucketUsage(u *Usage, s *crdt.Series, nowMs int64, limit uint64) ownWindow {
	idx := floorDiv(nowMs, l.windowMs)
	var prev, cur epochSums
	var own ownWindow
	if s != nil {
		for _, w := range s.Windows() {
			if w.WindowMs != l.windowMs {
				continue
			}
			switch w.Index {
			case idx:
				a := w.Admitted.Get(l.self)
				u.Cur, u.CurUnacked = w.Admitted.Value(), unacked(a, w.Acked)
				cur, own = sumsOf(w), ownWindow{w: w, admitted: a}
			case idx - 1:
				u.Prev, u.PrevUnacked = w.Admitted.Value(), unacked(w.Admitted.Get(l.self), w.Acked)
				prev = sumsOf(w)
			}
		}
	}
	st := l.rule.bucketAt(limit, nowMs, l.windowMs, prev, cur)
	u.Tokens = st.tokens
	own.burnTo, own.bucket = st.burnTo, true
	return own
}

// recordBucket counts an admitted consumption of ch.Cost credits at nowMs in
// the member's own slot of the current epoch, raising its burn to
// own.burnTo (computed now unless own.bucket). A bucket counts no denied
// attempts.
func (l *Limiter) recordBucket(ch *Check, own ownWindow, admitted bool, nowMs int64) {
	if !admitted || ch.Cost == 0 {
		return
	}
	if !own.bucket {
		var u Usage
		own = l.bucketUsage(&u, l.set.Series(ch.Key), nowMs, ch.Limit)
	}
	w := own.w
	if w == nil {
		w = l.set.Ensure(ch.Key).EnsureWindow(l.windowMs, floorDiv(nowMs, l.windowMs))
	}
	burn := max(own.burnTo, slotBurn(w, l.self, w.Attempted.Get(l.self)))
	a := w.Admitted.Get(l.self) + ch.Cost
	w.Admitted.Raise(l.self, a)
	w.Attempted.Raise(l.self, a*BurnUnit+burn)
	l.c.MarkDirty(w)
}

// decideBucket is decide for a token bucket: the equal-share rule over the
// bucket's credits T (u.Tokens) instead of a window's headroom,
//
//	admit iff N·(u + c) ≤ T + u
//
// with u this member's unacknowledged consumption (both epochs), which is
// P + N·(u + c) ≤ L with L − P = T + u; the lottery divides a fractional
// share as for windows. Under a partition scale s the bucket holds back
// (1 − s)·max.
func (r *Rule) decideBucket(d *Decision, limit, cost uint64, u *Usage, env *Env, lot *lottery) {
	b, rate, _ := r.bucketParams(limit)
	T := u.Tokens - (1-env.scale())*b + bucketTolerance
	own := float64(u.CurUnacked + u.PrevUnacked)
	*d = Decision{Limit: limit}
	c := float64(cost)
	if cost > limit {
		d.Reason, d.RetryAfter = ReasonCost, Never
	} else {
		share := (T+own)/env.members() - own
		room := c <= T
		if cost == 0 {
			room = T > 0
		}
		switch {
		case cost == 0:
			d.Allowed = share > 0
		case share >= c:
			d.Allowed = true
		case share > 0 && room:
			d.Allowed = lot.value(env) < share/c
		}
		switch {
		case d.Allowed:
			d.Reason = ReasonAdmitted
		case room:
			d.Reason = ReasonShare
		default:
			d.Reason = ReasonLimit
		}
	}
	if !d.Allowed {
		d.RetryAfter = r.retryAfter(limit, cost, *u, *env, d.Reason)
		if r.Shadow {
			d.Allowed, d.Shadow = true, true
		}
	}
	after := u.Tokens + bucketTolerance
	if d.Allowed {
		after -= c
	}
	if after > 0 {
		d.Remaining = uint64(math.Floor(after))
	}
	d.ResetAfter = msDuration((b - after) / rate)
}

// earliestBucket is Earliest for a token bucket: the time until the
// bucket, refilling with nothing consumed, holds c credits.
func (r *Rule) earliestBucket(limit uint64, c float64, u Usage, env Env) time.Duration {
	b, rate, _ := r.bucketParams(limit)
	held := (1 - env.scale()) * b
	T := u.Tokens - held + bucketTolerance
	switch {
	case T >= c:
		return 0
	case c > b-held:
		// Never enough at this scale: the time until the bucket is full
		// is the best estimate.
		return msDuration((b - u.Tokens) / rate)
	}
	return msDuration((c - T) / rate)
}

// bucketTolerance is the rounding a bucket forgives: one burn unit (about
// a millionth of a credit), so that float noise and burns rounded up to a
// unit never deny a request, nor lower Remaining, where the exact
// arithmetic would not.
const bucketTolerance = 1.0 / BurnUnit

// msDuration converts milliseconds to a duration rounded up to a whole
// millisecond (0 for none).
func msDuration(ms float64) time.Duration {
	if ms = ms - 1e-6; !(ms > 0) { // float noise on a whole millisecond
		return 0
	}
	if ms > float64(MaxWindow.Milliseconds()) {
		return MaxWindow
	}
	return time.Duration(math.Ceil(ms)) * time.Millisecond
}
