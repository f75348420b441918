package limiter

import "math"

// Reference is what one key would be admitted under a rule by a single
// exact limiter with no mesh, offered every request in true time: what
// the simulator measures a mesh's admissions in a window against when
// the limit alone does not say what a window may hold (a token bucket's
// epoch holds its max plus what it refilled, as the requests' timing
// allowed). A Reference is not safe for concurrent use.
type Reference interface {
	// Take offers cost credits at nowMs, never before the instant of
	// the Take before, and returns the credits admitted: cost or 0.
	Take(nowMs int64, cost uint64) uint64
}

// Reference returns a Reference for a key whose effective limit is limit
// (0, for an unlimited class, gives one that admits nothing: such a key
// has no limit to measure). ok is false for a rule whose limit is what
// each window may hold, a fixed or sliding window, and for a leased rule.
func (r *Rule) Reference(limit uint64) (ref Reference, ok bool) {
	if r.Algorithm != TokenBucket {
		return nil, false
	}
	if limit == 0 {
		return &refBucket{}, true
	}
	rb := &refBucket{}
	rb.b, rb.rate, rb.init = r.bucketParams(limit)
	return rb, true
}

// refBucket is a token bucket's Reference: the single bucket, refilled
// continuously. A key starts, like a rule's bucket, with its initial
// credits at its first request. The zero value admits nothing.
type refBucket struct {
	started       bool
	lastMs        int64
	tokens        float64
	b, rate, init float64
}

func (rb *refBucket) Take(nowMs int64, cost uint64) uint64 {
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
