package limiter

import "github.com/ratemesh/ratemesh/crdt"

// Demand shares (share: demand) are the Allegro Hermes idea without its
// coordinator. Equal shares (each member may take 1/N of the remaining
// headroom before its usage is acknowledged) strand capacity when load is
// uneven: a member that receives all of a key's traffic creeps towards the
// limit by 1/N of what is left per acknowledgement round, while the others'
// shares go unused. Every member already holds every slot's attempted
// credits, replicated like the admitted ones, so each can compute the same
// demand-weighted shares locally:
//
//	f = floor/N + (1 − floor) · own/all
//
// where own and all are this member's and everyone's attempted credits over
// the last window length (the previous window weighted by the part of it
// still inside, as a sliding window weighs usage), each counting the
// request being decided. The request is admitted iff
//
//	P + (u + c)/f ≤ L
//
// (share f·(L − P) − u ≥ c, and the lottery of equal share below one
// request). The floor (demand_floor) keeps an idle member's share positive,
// floor/N, so it can wake up; floor = 1 is equal share. Since the own/all
// fractions of all members sum to one, so do their shares: demand moves
// headroom to busy members without handing out more than there is (up to
// what replication has not shown yet). A member's own attempts count at
// once, so a member that starts receiving traffic raises its share with
// its first requests; a request is never refused for a share of zero.

// demandShare returns this member's share f of the remaining headroom for a
// request of cost credits, at elapsed fraction e of the window, given the
// demand signal in u (see above). It is in (0, 1].
func (r *Rule) demandShare(u *Usage, env *Env, e float64, cost uint64) float64 {
	w := 1 - e
	c := float64(cost)
	own := float64(u.OwnPrevAttempted)*w + float64(u.OwnCurAttempted) + c
	all := float64(u.PrevAttempted)*w + float64(u.CurAttempted) + c
	if all <= 0 {
		// Nothing attempted anywhere (a peek on a fresh key): equal share.
		return 1 / env.members()
	}
	frac := min(max(own, 0)/all, 1)
	floor := r.DemandFloor
	if !(floor > 0 && floor <= 1) {
		floor = DefaultDemandFloor
	}
	return floor/env.members() + (1-floor)*frac
}

// attemptedAt fills u's demand signal from series s (nil for none) in
// window idx. Only rules that read it pay for it.
func (l *Limiter) attemptedAt(u *Usage, s *crdt.Series, idx int64) {
	if s == nil {
		return
	}
	for _, w := range s.Windows() {
		if w.WindowMs != l.windowMs {
			continue
		}
		switch w.Index {
		case idx:
			u.CurAttempted, u.OwnCurAttempted = w.Attempted.Value(), w.Attempted.Get(l.self)
		case idx - 1:
			u.PrevAttempted, u.OwnPrevAttempted = w.Attempted.Value(), w.Attempted.Get(l.self)
		}
	}
}
