package limiter

import (
	"math"
	"time"
)

// The questions the rest of ratemesh asks of a rule's algorithm. Package
// node, the mesh and the simulator ask these instead of switching on
// Rule.Algorithm, so that an algorithm lives in this package alone
// (CONTRIBUTING.md, "Add an algorithm"); each of them expects a
// normalised rule.

// Leased reports whether the rule counts leases held at once (Acquire,
// Renew, Release) rather than credits in windows.
func (r *Rule) Leased() bool { return r.Algorithm == Concurrency }

// OldestWindowStart returns the start, in mesh milliseconds, of the oldest
// window whose admissions a decision at nowMs counts against the key's
// limit: the current window (a token bucket's epoch), and for a sliding
// window the one before it. A token bucket's previous epoch only sets the
// level its current one began at, and is not included. ok is false for a
// leased rule, which has no windows.
func (r *Rule) OldestWindowStart(nowMs int64) (startMs int64, ok bool) {
	wms := r.WindowMs()
	if wms <= 0 {
		return 0, false
	}
	startMs = floorDiv(nowMs, wms) * wms
	if r.Algorithm == SlidingWindow {
		startMs -= wms
	}
	return startMs, true
}

// MostAdmissible returns the most credits (leases, for a leased rule) the
// rule can admit for one key in one window (a token bucket's epoch, see
// BucketEpochMs), overrides and classes included: its limit, or its
// largest override if higher, times its largest class multiplier (at
// least 1), rounded up; a token bucket admits its max plus what it
// refills over an epoch, scaled alike. ok is false when nothing bounds
// it: a rule with an unlimited class, or in shadow mode (which counts
// without ever denying), or a bound beyond any 64-bit counter.
func (r *Rule) MostAdmissible() (most uint64, ok bool) {
	if r.Shadow {
		return 0, false
	}
	limit := r.Limit
	for _, o := range r.Overrides {
		limit = max(limit, o)
	}
	mult := 1.0
	for _, c := range r.Classes {
		if c.Unlimited {
			return 0, false
		}
		mult = max(mult, c.Multiplier)
	}
	m := float64(limit)
	if r.Algorithm == TokenBucket && r.Limit > 0 && r.Interval > 0 {
		// Refill scales with an override as max does (limit/r.Limit).
		epochs := float64(r.BucketEpochMs()) * float64(time.Millisecond) / float64(r.Interval)
		m += float64(r.Refill) * float64(limit) / float64(r.Limit) * epochs
	}
	m = math.Ceil(m * mult)
	if m >= 1<<64 {
		return 0, false
	}
	return uint64(m), true
}

// RatePerMs returns the credits per millisecond a key whose effective
// limit is limit is admitted at most over time: the limit spread evenly
// over the window, or a token bucket's refill, scaled as limit scales its
// max. It is 0 for a leased rule, whose leases are held, not spent.
func (r *Rule) RatePerMs(limit uint64) float64 {
	if r.Algorithm == TokenBucket {
		_, rate, _ := r.bucketParams(limit)
		return rate
	}
	wms := r.WindowMs()
	if wms <= 0 {
		return 0
	}
	return float64(limit) / float64(wms)
}
