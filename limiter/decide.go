package limiter

import (
	"math"
	"time"
)

// Never is the RetryAfter of a request that can never be admitted: its cost
// exceeds the key's limit.
const Never time.Duration = -1

// Reason says why a decision came out as it did. Its String is the
// lower-case name the HTTP API answers as "reason" and metrics count by.
type Reason uint8

// The reasons.
const (
	ReasonAdmitted   Reason = iota // within the share
	ReasonLimit                    // the global limit is reached
	ReasonShare                    // global room exists, but not within this member's share yet
	ReasonCost                     // the cost exceeds the limit: never admissible
	ReasonKeyCap                   // a new key at the rule's max_keys, or the node's (crdt.Container.SetMaxKeys)
	ReasonJoining                  // the member has not joined the mesh yet
	ReasonUnlimited                // an unlimited class: admitted, counted
	ReasonSuppressed               // mode suppress: the key's demand is over its limit and this request fell outside the admitted fraction
	ReasonFenced                   // strict policy: this member's side of a partition holds no majority
	ReasonStale                    // this member's view is stale: a majority has not acknowledged its batches lately
)

// NumReasons is the number of reasons: every Reason is below it.
const NumReasons = int(ReasonStale) + 1

var reasonNames = [NumReasons]string{"admitted", "limit", "share", "cost", "key_cap", "joining", "unlimited", "suppressed", "fenced", "stale"}

func (r Reason) String() string {
	if int(r) < len(reasonNames) {
		return reasonNames[r]
	}
	return "unknown"
}

// Decision is the answer to one check.
type Decision struct {
	Allowed bool
	// Limit is the key's limit after override and class multiplier,
	// before any partition scaling.
	Limit uint64
	// Remaining is what a retry can expect: when allowed, the global
	// remaining as this member sees it, max(0, limit − merged usage),
	// after this request; when denied, 0 (the member cannot admit the
	// request now), except for ReasonCost, where it stays the global
	// remaining (smaller requests may pass; this one never will).
	Remaining uint64
	// ResetAfter is the time until the current window ends (0 for
	// concurrency).
	ResetAfter time.Duration
	// RetryAfter is 0 when allowed; otherwise the earliest moment a retry
	// could succeed as this member estimates it (rounded up to a
	// millisecond), or Never.
	RetryAfter time.Duration
	// Shadow reports a request that was admitted only because the rule is
	// in shadow mode.
	Shadow bool
	Reason Reason
}

// Env is what a decision needs to know about the mesh at this moment.
type Env struct {
	// NowMs is mesh time in Unix milliseconds.
	NowMs int64
	// Members is N, the live members (alive and suspect), at least 1.
	Members int
	// Rank is this member's place, from 0, among the Members sorted by
	// peer ID. Members that agree on the membership hold distinct ranks,
	// which stratify their lottery draws (see Limiter.draw).
	Rank int
	// Scale multiplies the limit: alive/(alive+suspect) under the strict
	// partition policy, 1 otherwise (0 means 1).
	Scale float64
	// AckDelay is how long this member expects acknowledgements to take
	// to return: the retry hint when the only obstacle is its share.
	AckDelay time.Duration
}

// Usage is one key's usage around now, as this member knows it: merged
// values over every slot, and the part of this member's own usage that not
// every live member has acknowledged yet (u).
type Usage struct {
	Cur, Prev               uint64 // merged admitted credits: current and previous window (or live leases in Cur)
	CurUnacked, PrevUnacked uint64 // this member's unacknowledged part of them

	// The demand signal, read only by mode suppress and share demand
	// (a Limiter leaves it zero for other rules): attempted credits
	// (admitted and rejected), merged over every slot and this member's
	// own, in the current and previous window.
	CurAttempted, PrevAttempted       uint64
	OwnCurAttempted, OwnPrevAttempted uint64

	// Tokens is a token bucket's credits now, merged (see
	// docs/token-bucket.md); Cur and Prev are then the consumption of the
	// current and previous epoch.
	Tokens float64
}

// weighted returns the usage and its unacknowledged part at elapsed
// fraction e: the sliding window weighs the previous window by 1−e.
func (u *Usage) weighted(alg Algorithm, e float64) (used, unacked float64) {
	used, unacked = float64(u.Cur), float64(u.CurUnacked)
	if alg == SlidingWindow {
		w := 1 - e
		used += float64(u.Prev) * w
		unacked += float64(u.PrevUnacked) * w
	}
	return used, unacked
}

func (e *Env) scale() float64 {
	if e.Scale <= 0 || e.Scale > 1 {
		return 1
	}
	return e.Scale
}

func (e *Env) members() float64 {
	if e.Members < 1 {
		return 1
	}
	return float64(e.Members)
}

// position returns the elapsed fraction of the current window and the time
// until it ends.
func position(windowMs, nowMs int64) (elapsed float64, reset time.Duration) {
	if windowMs <= 0 {
		return 0, 0
	}
	into := nowMs % windowMs
	if into < 0 {
		into += windowMs
	}
	return float64(into) / float64(windowMs), time.Duration(windowMs-into) * time.Millisecond
}

// Decide applies the equal-share rule to one request of cost credits
// against a key whose effective limit is limit:
//
//	admit iff P + N·(u + c) ≤ L
//
// where u is this member's unacknowledged usage, P the merged usage minus u,
// N the live members and L the limit times the partition scale. When the
// member's share (L − P)/N − u is positive but smaller than c, and the
// request fits under L (merged usage + c ≤ L), the request is admitted iff
// draw < share/c: draw is fixed per key and window, so that across N
// members about L/c requests pass even when L < N·c (a limit of 10 per
// second over 96 members still admits about 10 per second, and never
// none); with N = 1 it is an exact limiter. A cost of 0 is a peek: allowed
// iff the share is not exhausted (share > 0).
//
// Under share demand the share is f·(L − P) − u, f this member's part of
// the recent attempted credits in u (see Rule.demandShare). Under mode
// suppress, a key whose demand is over its limit admits the fraction L/D
// (see suppression): here iff draw < L/D; a Limiter uses a per-key error
// accumulator instead.
//
// A paced rule (Pace) also bounds the current window's usage by PaceCap,
// in the projection as L is. Decide is pure: it records nothing. The rule
// must be valid.
func (r *Rule) Decide(limit, cost uint64, u Usage, env Env, draw float64) Decision {
	var d Decision
	elapsed, reset := position(r.WindowMs(), env.NowMs)
	r.decide(&d, limit, cost, &u, &env, &lottery{draw: draw}, winPos{elapsed, reset})
	return d
}

// winPos is where an instant falls in its window, as position computes it.
type winPos struct {
	elapsed float64       // the elapsed fraction of the window
	reset   time.Duration // the time until the window ends
}

// lottery is where a decision's draw comes from: draw as given, or, when l
// is set, l's draw for key, computed only when the decision needs it (the
// hot path of Limiter.Allow seldom does).
type lottery struct {
	l    *Limiter
	key  string
	draw float64
}

func (t *lottery) value(env *Env) float64 {
	if t.l != nil {
		return t.l.draw(t.key, env)
	}
	return t.draw
}

// decide is Decide writing into *d, which it overwrites entirely, with
// env.NowMs's position in its window given.
func (r *Rule) decide(d *Decision, limit, cost uint64, u *Usage, env *Env, lot *lottery, pos winPos) {
	if r.Algorithm == TokenBucket {
		r.decideBucket(d, limit, cost, u, env, lot)
		return
	}
	used, unacked := u.weighted(r.Algorithm, pos.elapsed)
	*d = Decision{Limit: limit, ResetAfter: pos.reset}
	if cost > limit {
		d.Reason = ReasonCost
		d.RetryAfter = Never
	} else {
		L := float64(limit) * env.scale()
		P := used - unacked
		share := equalShare(L, P, unacked, env)
		if r.Share == Demand {
			share = (L-P)*r.demandShare(u, env, pos.elapsed, cost) - unacked
		}
		c := float64(cost)
		// room: the request fits under the global limit as this member
		// sees it (for a peek: the limit is not reached). The lottery
		// divides room that exists; it never admits beyond L.
		room := used+c <= L
		if cost == 0 {
			room = used < L
		}
		if r.Pace {
			n := env.members() // this member takes 1/n of the paced headroom
			if r.Share == Demand {
				n = 1 / r.demandShare(u, env, pos.elapsed, cost)
			}
			share, room = paced(share, room, L, c, cost == 0, u, n, pos.elapsed)
		}
		thin := 1.0 // the fraction mode suppress admits; 1: not suppressing
		if r.Mode == Suppress {
			thin = suppression(L, c, u, pos.elapsed)
		}
		suppressed := false
		switch {
		case cost == 0:
			d.Allowed = share > 0
		case thin < 1:
			// Suppressing. Once a whole window of demand is known, the
			// thinning divides the limit by demand, so the share is not
			// consulted; in a flood's first window the share still
			// applies, as in mode reject. The limit always caps.
			if room && (float64(u.PrevAttempted) > L || share >= c) {
				d.Allowed = lot.thin(env, thin)
				suppressed = !d.Allowed
			}
		case share >= c:
			d.Allowed = true
		case share > 0 && room:
			// The lottery for a fractional share (closed for leases
			// while a new epoch's draws wait for the last epoch's
			// winners to be merged everywhere).
			d.Allowed = !(r.Algorithm == Concurrency && leaseGuard(env)) && lot.value(env) < share/c
		}
		if d.Allowed {
			d.Reason = ReasonAdmitted
		} else if suppressed {
			d.Reason = ReasonSuppressed
		} else if room {
			d.Reason = ReasonShare
		} else {
			d.Reason = ReasonLimit
		}
	}
	if !d.Allowed {
		d.RetryAfter = r.retryAfter(limit, cost, *u, *env, d.Reason)
		if r.Shadow {
			d.Allowed, d.Shadow = true, true
		}
	}
	if !d.Allowed && d.Reason != ReasonCost {
		return // Remaining 0: a retry now would be denied too
	}
	after := used
	if d.Allowed {
		after += float64(cost)
	}
	d.Remaining = remaining(limit, after)
}

// equalShare returns this member's equal share of the room under the
// scaled limit L, given the merged usage P and its own unacknowledged
// usage u: (L − P)/N − u. Rule.decide and Limiter.AllowInto's fast path
// both take it from here.
func equalShare(L, P, unacked float64, env *Env) float64 {
	return (L-P)/env.members() - unacked
}

// remaining returns max(0, ⌊limit − after⌋), what a decision's Remaining
// reports after usage after.
func remaining(limit uint64, after float64) uint64 {
	if rem := float64(limit) - after; rem > 0 {
		return uint64(math.Floor(rem))
	}
	return 0
}

func (r *Rule) retryAfter(limit, cost uint64, u Usage, env Env, reason Reason) time.Duration {
	switch reason {
	case ReasonCost:
		return Never
	case ReasonShare, ReasonSuppressed:
		return ceilMs(env.AckDelay)
	}
	// A denied peek waits, like a request of one credit, for room.
	return r.Earliest(limit, max(cost, 1), u, env)
}

// Earliest returns how long from now until a request of cost credits could
// first fit under the key's limit (for a token bucket: until the bucket,
// u.Tokens now, holds cost credits), assuming no further usage arrives and
// every unacknowledged usage is acknowledged by then: 0 if it fits now,
// Never if it never can. It is the math behind Wait and RetryAfter; for a
// concurrency rule, where room appears only when a lease ends, it returns
// the rule's lease TTL as the bound.
func (r *Rule) Earliest(limit, cost uint64, u Usage, env Env) time.Duration {
	if cost > limit {
		return Never
	}
	L := float64(limit) * env.scale()
	c := float64(cost)
	if r.Algorithm == Concurrency {
		if float64(u.Cur)+c <= L {
			return 0
		}
		return r.LeaseTTL
	}
	if r.Algorithm == TokenBucket {
		return r.earliestBucket(limit, c, u, env)
	}
	if r.Pace {
		return r.earliestPaced(L, c, u, env.NowMs)
	}
	w := float64(r.WindowMs())
	elapsed, reset := position(r.WindowMs(), env.NowMs)
	cur, prev := float64(u.Cur), float64(u.Prev)
	if r.Algorithm == FixedWindow {
		if cur+c <= L {
			return 0
		}
		return reset
	}
	// Sliding: within this window, U(t) = prev·(1 − e − t/w) + cur.
	if x := L - cur - c; x >= 0 {
		if prev == 0 || prev*(1-elapsed) <= x {
			return 0
		}
		t := w*(1-elapsed) - w*x/prev
		return ceilMs(time.Duration(t * float64(time.Millisecond)))
	}
	// Next window: U(s) = cur·(1 − s/w) after it starts.
	x := L - c
	if x < 0 {
		// Even an empty window is too small at this scale (a partition
		// shrank L); the window's end is the best estimate.
		return reset
	}
	s := w * (1 - x/cur)
	if s < 0 {
		s = 0
	}
	return ceilMs(reset + time.Duration(s*float64(time.Millisecond)))
}

func ceilMs(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	return (d + time.Millisecond - 1) / time.Millisecond * time.Millisecond
}
