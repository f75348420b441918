package limiter

// Suppression (mode: suppress) is Ably's answer to a flood. Hard limiting
// of a key offered far more than its limit oscillates: everything passes
// until the merged count catches up, then everything fails until the
// window turns. Suppression instead admits the fraction L/D of the key's
// requests, where D is the key's merged attempted rate (admitted and
// rejected credits, replicated like the admitted ones), so the admitted
// rate holds steady at the limit.
//
// The rate estimate follows Ably's rule of smoothing over completed
// sub-intervals and looking at the one in progress only when it is above
// them: D = max(A_prev, A_cur / max(e, minElapsed)), where A_prev is the
// previous window's merged attempts (complete, fully replicated), A_cur the
// current window's so far and e the elapsed fraction of the window. The
// current window, partly replicated and noisy early on, can only raise the
// estimate: a spike reacts at once, a lull or the replication lag of the
// last few milliseconds never lets a flood through.
//
// Suppression engages only when the key's demand is over its limit: in the
// previous window (A_prev > L) or in this one (A_cur + c > L). A key whose
// demand stays within its limit is never suppressed. While engaged, each
// member realises the fraction with an error accumulator per key (see
// thinning), not coin flips, and the limit still caps: a request is admitted
// only if it also fits under L as the member sees the merged usage.

// minElapsed is the smallest elapsed fraction the in-progress window's
// attempts are extrapolated over: a quarter of a window, Ably's
// sub-interval (4 sub-intervals of 6 s), so a handful of early requests
// cannot pass for a flood.
const minElapsed = 0.25

// suppression returns the fraction of requests of cost c to admit for a key
// whose limit (after partition scaling) is L, given its usage u at elapsed
// fraction e of the window: 1 when the key's demand is within its limit,
// L/D otherwise (see above).
func suppression(L, c float64, u *Usage, e float64) float64 {
	prev, cur := float64(u.PrevAttempted), float64(u.CurAttempted)
	if prev <= L && cur+c <= L {
		return 1
	}
	D := max(prev, (cur+c)/max(e, minElapsed))
	if D <= L {
		return 1
	}
	return L / D
}

// thinning realises an admission fraction p deterministically: every
// request adds p to the accumulator, and a request that brings it to 1 or
// more is admitted and takes 1 off. Over any run of n requests it admits
// ⌊n·p + acc₀⌋ of them, within one of n·p, where independent coin flips
// would stray by √(n·p·(1−p)). The zero value starts empty.
type thinning struct {
	acc float64
	win int64 // the last window it was used in, for pruning
}

// take adds one request at fraction p and reports whether it is admitted.
func (t *thinning) take(p float64) bool {
	t.acc += p
	if t.acc >= 1 {
		t.acc--
		return true
	}
	return false
}

// thin reports whether a suppressed request at fraction p is admitted: for
// a Limiter, through its per-key accumulator; for the pure Rule.Decide,
// iff draw < p.
func (t *lottery) thin(env *Env, p float64) bool {
	if t.l == nil {
		return t.draw < p
	}
	return t.l.thin(t.key, env, p)
}

// thin is the member's per-key thinning of a suppressed key. A new
// accumulator starts at the member's lottery draw for the key and window;
// the draws are stratified over the members, so members that see a flood
// at the same moment admit evenly staggered, never in step.
// Accumulators unused for two windows are dropped as the windows turn.
func (l *Limiter) thin(key string, env *Env, p float64) bool {
	idx := floorDiv(env.NowMs, l.windowMs)
	if idx != l.thinWin {
		for k, t := range l.thins {
			if t.win < idx-1 {
				delete(l.thins, k)
			}
		}
		l.thinWin = idx
	}
	t, ok := l.thins[key]
	if !ok {
		if l.thins == nil {
			l.thins = make(map[string]*thinning)
		}
		t = &thinning{acc: l.draw(key, env)}
		l.thins[key] = t
	}
	t.win = idx
	return t.take(p)
}
