package simulator

import (
	"math"

	"github.com/ratemesh/ratemesh/limiter"
)

// refBucket is one key's single token bucket, fed every offered request
// in true virtual time: what one bucket, with no mesh, would admit. A
// token_bucket rule's key-windows are measured against it (their limit is
// the credits it admitted in the window), so the overshoot and utilisation
// columns compare the mesh with one bucket.
type refBucket struct {
	started       bool
	lastMs        int64
	tokens        float64
	b, rate, init float64
}

// newRefBuckets returns the reference buckets of a token_bucket rule's keys
// with their effective limits (0: unlimited, no reference needed).
func newRefBucket(r *limiter.Rule, limit uint64) refBucket {
	if limit == 0 {
		return refBucket{}
	}
	f := float64(limit) / float64(r.Limit)
	rb := refBucket{b: float64(limit), rate: float64(r.Refill) * f / float64(r.Interval.Milliseconds())}
	rb.init = rb.b
	if r.HasInitial {
		rb.init = math.Min(rb.b, float64(r.Initial)*f)
	}
	return rb
}

// take offers cost credits at nowMs and returns the credits admitted (cost
// or 0). A key starts, like a rule's bucket, with initial credits at its
// first request.
func (rb *refBucket) take(nowMs int64, cost uint64) uint64 {
	if rb.b == 0 {
		return 0
	}
	if !rb.started {
		rb.started, rb.lastMs, rb.tokens = true, nowMs, rb.init
	}
	rb.tokens = math.Min(rb.b, rb.tokens+rb.rate*float64(nowMs-rb.lastMs))
	rb.lastMs = nowMs
	if c := float64(cost); c <= rb.tokens {
		rb.tokens -= c
		return cost
	}
	return 0
}
