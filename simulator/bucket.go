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
// or 0). A key starts, like a rule's bucket, with initial credits at the
// start of the epoch of its first request (g ms long).
func (rb *refBucket) take(nowMs, g int64, cost uint64) uint64 {
	if rb.b == 0 {
		return 0
	}
	if !rb.started {
		rb.started, rb.lastMs, rb.tokens = true, nowMs/g*g, rb.init
	}
	rb.tokens = math.Min(rb.b, rb.tokens+rb.rate*float64(nowMs-rb.lastMs))
	rb.lastMs = nowMs
	if c := float64(cost); c <= rb.tokens {
		rb.tokens -= c
		return cost
	}
	return 0
}

// bucket reads a token_bucket rule's keys into r (max into Limit), and
// refuses limit on a bucket and max elsewhere; the limiter validates the
// rest by field.
func (rr *rawRule) bucket(field string, r *limiter.Rule) error {
	if r.Algorithm != limiter.TokenBucket {
		if rr.Max != nil {
			return errf(field+".max", "applies to token_bucket rules only; use limit")
		}
		r.Refill = uint64(max(rr.Refill, 0))
		if rr.Refill < 0 {
			return errf(field+".refill", "%d must not be negative", rr.Refill)
		}
		var err error
		r.Interval, err = parseDur(field+".interval", rr.Interval, 0, false)
		r.HasInitial = rr.Initial != nil
		return err
	}
	switch {
	case rr.Limit != 0:
		return errf(field+".limit", "a token_bucket rule has max, refill and interval instead")
	case rr.Max == nil:
		return errf(field+".max", "must be set: the credits the bucket holds at most")
	case *rr.Max < 1:
		return errf(field+".max", "%d must be at least 1", *rr.Max)
	case rr.Refill < 1:
		return errf(field+".refill", "%d must be at least 1", rr.Refill)
	case rr.Initial != nil && *rr.Initial < 0:
		return errf(field+".initial", "%d must not be negative", *rr.Initial)
	}
	r.Limit, r.Refill = uint64(*rr.Max), uint64(rr.Refill)
	if rr.Initial != nil {
		r.Initial, r.HasInitial = uint64(*rr.Initial), true
	}
	var err error
	if r.Interval, err = parseDur(field+".interval", rr.Interval, 0, false); err != nil {
		return err
	}
	if r.Interval <= 0 {
		return errf(field+".interval", "must be set, for example 1s")
	}
	return nil
}
