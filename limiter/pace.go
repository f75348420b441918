package limiter

import (
	"math"
	"time"
)

// Pacing (LINE): a window's quota is released over the window instead of
// all at its start. At elapsed fraction e of a window, a paced rule's
// current window may hold at most
//
//	cap(e) = min(L, L·e + B)
//
// admitted credits, where L is the effective limit (override × class
// multiplier × partition scale) and B the burst allowance,
// PaceBurst·L but at least one credit, so that a limit below 1/PaceBurst
// still admits one request at a window's start. A window offered more than
// its quota at once thus admits B at its start and then L per window
// length, evenly, until L.
//
// Pacing composes with the rest of the decision as one more condition:
//
//   - Equal share: cap(e) takes L's place in the projection over the
//     current window's merged usage, P + N·(u + c) ≤ cap(e). The merged
//     view P is the mesh's usage, so it is the mesh that follows the pace,
//     and each member takes 1/N of the paced headroom: each member paces
//     its share. With N = 1 it is an exact paced limiter. Under share
//     demand a member takes its demand share f of the paced headroom
//     instead of 1/N: P + (u + c)/f ≤ cap(e).
//   - Sliding window: the paced condition bounds the current window's
//     usage only, in addition to the sliding condition over the weighted
//     usage. After a full previous window the sliding condition already
//     paces (prev·(1 − e) + cur ≤ L means cur ≤ L·e); after a quiet one
//     the pace keeps the new window from being spent at once.
//
// A request denied only by the pace has the reason ReasonLimit (the paced
// limit is reached) and a RetryAfter of the paced time at which it would
// fit; denied by its share of the paced headroom, ReasonShare.
// Concurrency rules cannot be paced: they have no window.

// PaceBurst is the burst allowance of a paced rule as a fraction of the
// effective limit (at least one credit): 10 %, so that a paced window
// admits a tenth of its quota at once and the rest at the pace.
const PaceBurst = 0.1

// paceEps absorbs float rounding in L·e: usage and costs are whole
// credits, so a cap a hair below a whole number is meant to be that number.
const paceEps = 1e-9

// paceBurst returns the burst allowance for effective limit L.
func paceBurst(L float64) float64 {
	return max(L*PaceBurst, 1)
}

// PaceCap returns how many credits a paced window with effective limit L
// may have admitted at elapsed fraction e ∈ [0, 1) of the window:
// min(L, floor(L·e + B)), B = max(PaceBurst·L, 1).
func PaceCap(L, e float64) float64 {
	return min(L, math.Floor(L*e+paceBurst(L)+paceEps))
}

// paced applies the pace to a decision's share and room (see decide): it
// returns the smaller of share and this member's share of the paced
// headroom, and room only if the request also fits under the paced cap. L
// is the effective limit, c the cost, and the member takes 1/n of the
// headroom (n = N, or 1/f for its demand share f); a peek (cost 0) needs
// the cap not to be reached.
func paced(share float64, room bool, L, c float64, peek bool, u *Usage, n, elapsed float64) (float64, bool) {
	capL := PaceCap(L, elapsed)
	cur, unacked := float64(u.Cur), float64(u.CurUnacked)
	ps := (capL-(cur-unacked))/n - unacked
	proom := cur+c <= capL
	if peek {
		proom = cur < capL
	}
	return min(share, ps), room && proom
}

// earliestPaced is Earliest for a paced windowed rule: the first
// millisecond at which a request of c credits fits both the algorithm's
// condition and the paced cap, with L the effective limit and every usage
// acknowledged.
func (r *Rule) earliestPaced(L, c float64, u Usage, nowMs int64) time.Duration {
	wms := r.WindowMs()
	_, reset := position(wms, nowMs)
	into := wms - reset.Milliseconds()
	cur, prev := float64(u.Cur), float64(u.Prev)
	if r.Algorithm != SlidingWindow {
		prev = 0 // a fixed window forgets the previous one
	}
	if t, ok := pacedFit(L, c, cur, prev, into, wms); ok {
		return time.Duration(t-into) * time.Millisecond
	}
	if L < c {
		// Even an empty window is too small at this scale (a partition
		// shrank L); the window's end is the best estimate.
		return reset
	}
	// The next window: this one's usage becomes the previous one.
	next := cur
	if r.Algorithm != SlidingWindow {
		next = 0
	}
	if t, ok := pacedFit(L, c, 0, next, 0, wms); ok {
		return reset + time.Duration(t)*time.Millisecond
	}
	// The one after: nothing carries over any more, and c ≤ L fits by
	// the window's end.
	t, _ := pacedFit(L, c, 0, 0, 0, wms)
	return reset + time.Duration(wms+t)*time.Millisecond
}

// pacedFit returns the first millisecond t ≥ from into a window of w ms at
// which a request of c credits fits a paced window holding cur credits
// after a previous window of prev credits: both prev·(1 − t/w) + cur + c ≤
// L and cur + c ≤ PaceCap(L, t/w), computed as the decision computes them.
// ok is false when no t < w fits.
func pacedFit(L, c, cur, prev float64, from, w int64) (t int64, ok bool) {
	need := cur + c
	if need > L {
		return 0, false
	}
	wf := float64(w)
	x := float64(from)
	if prev > 0 && prev > L-need {
		x = max(x, wf*(prev-(L-need))/prev)
	}
	if b := paceBurst(L); need > b {
		x = max(x, (need-b)*wf/L)
	}
	if x >= wf {
		return 0, false
	}
	// The closed forms are exact up to float rounding; step to the first
	// millisecond the decision's own arithmetic admits, a few at most.
	first := int64(math.Ceil(x))
	for t = first; t < w && t < first+4; t++ {
		e := float64(t) / wf
		if cur+prev*(1-e)+c <= L && need <= PaceCap(L, e) {
			return t, true
		}
	}
	return first, first < w
}
