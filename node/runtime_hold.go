package node

import (
	"context"
	"time"

	"github.com/ratemesh/ratemesh/limiter"
)

// Holding a share denial (limiter.Rule.ShareWait).
//
// A request the limit has room for but this member's share does not
// (limiter.ReasonShare) is not refused at once: the share grows back as
// the member's own recent admissions are acknowledged, within an
// acknowledgement delay or two. The runtime holds such a request — Allow,
// AllowAll, Acquire and the HTTP API and middleware over them — for at
// most the rule's share_wait (and never past the caller's context),
// deciding it again under the mutex each time the run loop has ticked the
// core (which applies acknowledgements, expires leases and turns windows),
// in the order the requests arrived. It answers as soon as a decision
// admits it or denies it for another reason (the limit is reached: no
// holding when the global room is gone), and with the last denial when
// share_wait runs out. A held request counts as one attempt per window,
// however often it is decided again (Limiter.RecordRetry).
//
// When the share is a fraction of the request (a limit below N), this
// member's lottery draw may refuse the request although the limit has
// room for it; holding cannot help while the draw stands (a window, or a
// lease epoch), so the request goes to a member whose draw admits it
// instead (runtime_forward.go), which decides and holds it there.
//
// The hot path pays one comparison: only a denial with ReasonShare leaves
// it, for the functions below.

// waiter is one held request. retry, called under Node.mu, decides it
// again and reports whether it is settled.
type waiter struct {
	retry    func(now time.Time) bool
	done     chan struct{} // closed once settled by the run loop
	resolved bool          // guarded by Node.mu
}

// HoldStats counts what holding and forwarding did; every field only
// grows.
type HoldStats struct {
	// Held counts requests held for their share; HeldAdmitted and
	// HeldDenied those of them admitted in the end (here or where they
	// were forwarded) and denied (the rest are still held).
	Held, HeldAdmitted, HeldDenied uint64
	// Forwards counts requests sent to other members: leases renewed or
	// released at their owner, and lottery losers' requests.
	Forwards uint64
	// ForwardsAbandoned counts forwarded requests that got no answer (a
	// stream error, or none before the hold's deadline). The member asked
	// may have admitted the request, counting it against the limit while
	// this member answers from its own hold: each can leave one request's
	// credits of the limit unused (never more admitted than the limit).
	ForwardsAbandoned uint64
}

// HoldStats returns a snapshot of the hold and forward counters.
func (n *Node) HoldStats() HoldStats {
	return HoldStats{Held: n.held.Load(), HeldAdmitted: n.heldAdmitted.Load(), HeldDenied: n.heldDenied.Load(),
		Forwards: n.forwards.Load(), ForwardsAbandoned: n.fwdAbandoned.Load()}
}

// minHoldMargin is the least time a hold leaves before its caller's
// deadline for the answer to be decided, encoded and sent.
const minHoldMargin = 5 * time.Millisecond

// boundWait caps a hold by ctx's deadline: it leaves half the time left,
// and at least minHoldMargin, for the answer. On a starved host a timer
// fires late and the lock is contended, so a hold that kept a tenth of
// Envoy's 20 ms (2 ms) answered after the caller had given up; half of it
// leaves 10 ms. With minHoldMargin or less left it does not hold at all.
func boundWait(ctx context.Context, wait time.Duration) time.Duration {
	if dl, ok := ctx.Deadline(); ok {
		left := time.Until(dl)
		wait = min(wait, left-max(left/2, minHoldMargin))
	}
	return wait
}

// hold decides a held request again at once and then after every tick
// of the run loop until retry reports it settled, deadline passes, ctx
// ends (its error is returned) or the node closes.
func (n *Node) hold(ctx context.Context, deadline time.Time, retry func(time.Time) bool) error {
	w := &waiter{retry: retry, done: make(chan struct{})}
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return nil
	}
	settled := retry(n.readClock())
	n.armIfPending() // the retry may have admitted, or counted an attempt
	if settled {
		n.mu.Unlock()
		return nil
	}
	n.waiters = append(n.waiters, w)
	n.mu.Unlock()
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	var err error
	select {
	case <-w.done:
		return nil
	case <-timer.C:
	case <-ctx.Done():
		err = ctx.Err()
	case <-n.quit:
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if w.resolved {
		return nil // settled meanwhile: its admission counted, so answer it
	}
	for i, x := range n.waiters {
		if x == w {
			n.waiters = append(n.waiters[:i], n.waiters[i+1:]...)
			break
		}
	}
	return err
}

// wake decides every held request again at now, oldest first, and
// releases the settled ones. mu must be held.
func (n *Node) wake(now time.Time) {
	kept := n.waiters[:0]
	for _, w := range n.waiters {
		if w.retry(now) {
			w.resolved = true
			close(w.done)
		} else {
			kept = append(kept, w)
		}
	}
	clear(n.waiters[len(kept):])
	n.waiters = kept
}

// holdAllow holds d, Allow's share denial of a request decided at the
// local time at, for at most the rule's share_wait (and maxHold when not
// negative), first handing it to a member whose lottery draw admits it
// when forward is set. Kept out of line so that Allow stays small.
//
//go:noinline
func (n *Node) holdAllow(ctx context.Context, d Decision, at time.Time, rule, key string, req limiter.Request, maxHold time.Duration, forward bool) (Decision, error) {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return d, nil
	}
	wait := n.core.ShareWait(rule)
	if maxHold >= 0 {
		wait = min(wait, maxHold)
	}
	counted := n.core.WindowIndex(rule, at)
	var peers []string
	if forward && n.fwd != nil && wait > 0 {
		peers = n.core.lotteryPeers(at, rule, key, &req, false)
	}
	n.mu.Unlock()
	if wait = boundWait(ctx, wait); wait <= 0 {
		return d, nil
	}
	n.held.Add(1)
	deadline := time.Now().Add(wait)
	if len(peers) > 0 {
		fr := &ForwardRequest{Op: ForwardAllow, Rule: rule, Key: key, Request: req}
		if resp, ok := n.forwardDecision(ctx, deadline, peers, fr); ok && resp.Decision.Allowed {
			n.heldAdmitted.Add(1)
			return resp.Decision, nil
		}
	}
	err := n.hold(ctx, deadline, func(now time.Time) bool {
		var nd Decision
		if err := n.core.retryAllow(&nd, now, rule, key, &req, &counted); err != nil {
			return true // a reload removed or changed the rule: answer the denial
		}
		d = nd
		return d.Allowed || d.Reason != limiter.ReasonShare
	})
	if d.Allowed {
		n.heldAdmitted.Add(1)
		return d, nil
	}
	n.heldDenied.Add(1)
	return d, err
}

// decideHeld is Allow for a forwarded request: decided here, held at most
// maxHold, never forwarded again.
func (n *Node) decideHeld(ctx context.Context, rule, key string, req limiter.Request, maxHold time.Duration) (Decision, error) {
	if err := ctx.Err(); err != nil {
		return Decision{}, err
	}
	d, now, err := n.decide(rule, key, &req)
	if err == nil && !d.Allowed && d.Reason == limiter.ReasonShare {
		d, err = n.holdAllow(ctx, d, now, rule, key, req, maxHold, false)
		if d.Allowed {
			n.publishIfOver()
		}
	}
	return d, err
}

// shareOnly reports whether the denial of an AllowAll is its share's
// alone: some check is refused by its share and none for another reason.
func shareOnly(ds []Decision) bool {
	share := false
	for i := range ds {
		switch d := &ds[i]; {
		case d.Shadow, d.Reason == limiter.ReasonAdmitted, d.Reason == limiter.ReasonUnlimited:
		case d.Reason == limiter.ReasonShare:
			share = true
		default:
			return false
		}
	}
	return share
}

// holdAll holds AllowAll's denial ds of checks decided at the local time
// at, for at most the least share_wait of the checks its shares refused.
// Kept out of line so that AllowAll stays small.
//
//go:noinline
func (n *Node) holdAll(ctx context.Context, at time.Time, checks []Check, ds []Decision) (bool, []Decision, error) {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return false, ds, nil
	}
	wait := limiter.MaxShareWait
	counted := make([]int64, len(checks))
	for i := range checks {
		counted[i] = n.core.WindowIndex(checks[i].Rule, at)
		if ds[i].Reason == limiter.ReasonShare && !ds[i].Shadow {
			wait = min(wait, n.core.ShareWait(checks[i].Rule))
		}
	}
	n.mu.Unlock()
	if wait = boundWait(ctx, wait); wait <= 0 {
		return false, ds, nil
	}
	n.held.Add(1)
	allowed := false
	err := n.hold(ctx, time.Now().Add(wait), func(now time.Time) bool {
		ok, nds, err := n.core.allowAll(now, checks, counted)
		if err != nil {
			return true
		}
		allowed, ds = ok, nds
		return ok || !shareOnly(nds)
	})
	if allowed {
		n.heldAdmitted.Add(1)
		return true, ds, nil
	}
	n.heldDenied.Add(1)
	return false, ds, err
}

// acquireHeld is Acquire with its share denial held for at most the
// rule's share_wait (and maxHold when not negative), first handed to a
// member whose lottery draw admits it when forward is set: the lease is
// then that member's.
func (n *Node) acquireHeld(ctx context.Context, rule, key, class string, maxHold time.Duration, forward bool) (*LeaseHandle, Decision, error) {
	if err := ctx.Err(); err != nil {
		return nil, Decision{}, err
	}
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return nil, Decision{}, ErrClosed
	}
	now := n.decisionTime()
	ls, d, err := n.core.Acquire(now, rule, key, class)
	if err != nil || d.Allowed || d.Reason != limiter.ReasonShare {
		n.mu.Unlock()
		return n.leaseHandle(ls, d), d, err
	}
	wait := n.core.ShareWait(rule)
	if maxHold >= 0 {
		wait = min(wait, maxHold)
	}
	var peers []string
	if forward && n.fwd != nil && wait > 0 {
		peers = n.core.lotteryPeers(now, rule, key, &limiter.Request{Class: class}, true)
	}
	n.mu.Unlock()
	if wait = boundWait(ctx, wait); wait <= 0 {
		return nil, d, nil
	}
	n.held.Add(1)
	deadline := time.Now().Add(wait)
	if len(peers) > 0 {
		fr := &ForwardRequest{Op: ForwardAcquire, Rule: rule, Key: key, Request: limiter.Request{Class: class}}
		if resp, ok := n.forwardDecision(ctx, deadline, peers, fr); ok && resp.Decision.Allowed && resp.LeaseID != "" {
			n.heldAdmitted.Add(1)
			h := &LeaseHandle{ID: resp.LeaseID, Rule: rule, Key: key, n: n}
			h.expires.Store(time.Now().Add(resp.TTL).UnixNano())
			return h, resp.Decision, nil
		}
	}
	err = n.hold(ctx, deadline, func(now time.Time) bool {
		l, nd, err := n.core.Acquire(now, rule, key, class)
		if err != nil {
			return true
		}
		ls, d = l, nd
		return d.Allowed || d.Reason != limiter.ReasonShare
	})
	if d.Allowed {
		n.heldAdmitted.Add(1)
		return n.leaseHandle(ls, d), d, nil
	}
	n.heldDenied.Add(1)
	return nil, d, err
}

// leaseHandle returns the handle of a lease Acquire granted, or nil for
// a denial.
func (n *Node) leaseHandle(ls Lease, d Decision) *LeaseHandle {
	if !d.Allowed {
		return nil
	}
	h := &LeaseHandle{ID: ls.ID, Rule: ls.Rule, Key: ls.Key, n: n}
	h.expires.Store(ls.Expires.UnixNano())
	return h
}
