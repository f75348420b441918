package node

import (
	"context"
	"time"

	"github.com/ratemesh/ratemesh/limiter"
)

// Allow decides one request of rule for key now and, unless it is a peek,
// counts it. opts may set Cost, Type and Class. A denial is a Decision
// with Allowed false, not an error; errors are for bad requests and wrap
// ErrUnknownRule, limiter.ErrBadKey, limiter.ErrUnknownClass and the like,
// or ErrClosed. Allow takes the node's mutex and decides in the caller's
// goroutine. A request the limit has room for but this member's share
// does not (limiter.ReasonShare) is held for at most the rule's
// share_wait, and never past ctx, while acknowledgements return, and
// decided again (see limiter.Rule.ShareWait); when the share is a fraction
// of the request, it may be decided by a member whose lottery draw admits
// it instead (over a Transport that implements Forwarder). If ctx ends
// while the request is held, Allow returns the denial and ctx's error.
func (n *Node) Allow(ctx context.Context, rule, key string, opts ...Option) (Decision, error) {
	if err := ctx.Err(); err != nil {
		return Decision{}, err
	}
	var req limiter.Request
	if len(opts) > 0 {
		var err error
		if req, _, err = request(opts, acceptRequest); err != nil {
			return Decision{}, err
		}
	}
	d, now, err := n.decide(rule, key, &req)
	if d.Reason == limiter.ReasonShare && !d.Allowed {
		d, err = n.holdAllow(ctx, d, now, rule, key, req, -1, true)
		if d.Allowed {
			n.publishIfOver()
		}
	}
	return d, err
}

// decide decides one request under the node's mutex at the decision time,
// which it returns for a hold, and publishes first when the decision took
// a rule's unpublished credits to the publish budget (Allow, decideHeld).
func (n *Node) decide(rule, key string, req *limiter.Request) (Decision, time.Time, error) {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return Decision{}, time.Time{}, ErrClosed
	}
	var d Decision
	now := n.decisionTime()
	err := n.core.allowInto(&d, now, rule, key, req)
	over := n.core.overBudget
	n.mu.Unlock()
	if over {
		n.publishOver()
	}
	return d, now, err
}

// AllowAll decides several checks as one — per second and per hour, say:
// it admits only if every check passes and consumes nothing when any
// fails. Build checks with NewCheck. The decisions come back in the order
// of the checks. A denial that only shares cause (no check refused by its
// limit, cost or key cap) is held like Allow's, for at most the least
// share_wait of those checks' rules, and decided again as a whole.
func (n *Node) AllowAll(ctx context.Context, checks ...Check) (allowed bool, ds []Decision, err error) {
	if err := ctx.Err(); err != nil {
		return false, nil, err
	}
	for i := range checks {
		if err := checks[i].err; err != nil {
			return false, nil, &CheckError{Index: i, Err: err}
		}
	}
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return false, nil, ErrClosed
	}
	now := n.decisionTime()
	allowed, ds, err = n.core.AllowAll(now, checks)
	over := n.core.overBudget
	n.mu.Unlock()
	if over {
		n.publishOver()
	}
	if err == nil && !allowed && shareOnly(ds) {
		allowed, ds, err = n.holdAll(ctx, now, checks, ds)
		if allowed {
			n.publishIfOver()
		}
	}
	return allowed, ds, err
}

// Wait decides like Allow, and while denied sleeps until the earliest
// moment a retry could succeed and tries again. It returns the denial at
// once, without sleeping, when that moment is past ctx's deadline or past
// MaxWait from the call, or never comes (RetryAfter Never). If ctx ends
// while it sleeps it returns the last denial and ctx's error. Every
// attempt counts as demand, like a client's retry would.
func (n *Node) Wait(ctx context.Context, rule, key string, opts ...Option) (Decision, error) {
	req, maxWait, err := request(opts, acceptWait)
	if err != nil {
		return Decision{}, err
	}
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	var until time.Time
	for first := true; ; first = false {
		if err := ctx.Err(); err != nil {
			return Decision{}, err
		}
		n.mu.Lock()
		if n.closed {
			n.mu.Unlock()
			return Decision{}, ErrClosed
		}
		now := n.readClock()
		if !n.pubArmed {
			n.armPublish()
		}
		if first && maxWait >= 0 {
			until = now.Add(maxWait)
		}
		d, err := n.core.Allow(now, rule, key, req)
		if err != nil || d.Allowed || d.RetryAfter == Never {
			over := n.core.overBudget
			n.mu.Unlock()
			if over {
				n.publishOver()
			}
			return d, err
		}
		early, err := n.core.Earliest(now, rule, key, req)
		n.mu.Unlock()
		if err != nil || early == Never {
			return d, err
		}
		wait := max(d.RetryAfter, early, time.Millisecond)
		at := now.Add(wait)
		if maxWait >= 0 && at.After(until) {
			return d, nil
		}
		if dl, ok := ctx.Deadline(); ok && at.After(dl) {
			return d, nil
		}
		if timer == nil {
			timer = time.NewTimer(wait)
		} else {
			timer.Reset(wait)
		}
		select {
		case <-timer.C:
		case <-ctx.Done():
			return d, ctx.Err()
		}
	}
}
