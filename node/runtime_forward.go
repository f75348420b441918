package node

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ratemesh/ratemesh/limiter"
)

// forwardMargin is how much of a held request's remaining time the
// receiver of a forwarded one leaves for the way back.
const forwardMargin = 20 * time.Millisecond

// forwardTo sends req to peer through the transport's Forwarder.
func (n *Node) forwardTo(ctx context.Context, peer string, req *ForwardRequest) (*ForwardResponse, error) {
	n.forwards.Add(1)
	resp, err := n.fwd.Forward(ctx, peer, req)
	if err != nil {
		return nil, err
	}
	return resp, nil
}

// forwardDecision hands a lottery loser's request (ForwardAllow or
// ForwardAcquire) to the first of peers that answers, leaving it until
// deadline (less the way back) to hold it. At most one such request per
// rule and key is under way from this member at a time: the others are
// held here. It reports false when no peer answered.
func (n *Node) forwardDecision(ctx context.Context, deadline time.Time, peers []string, req *ForwardRequest) (*ForwardResponse, bool) {
	fk := req.Rule + "\x00" + req.Key
	n.mu.Lock()
	if _, busy := n.fwdBusy[fk]; busy || n.closed {
		n.mu.Unlock()
		return nil, false
	}
	n.fwdBusy[fk] = struct{}{}
	n.mu.Unlock()
	defer func() {
		n.mu.Lock()
		delete(n.fwdBusy, fk)
		n.mu.Unlock()
	}()
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	for _, p := range peers {
		req.Hold = max(time.Until(deadline)-forwardMargin, 0)
		resp, err := n.forwardTo(ctx, p, req)
		if err != nil {
			n.fwdAbandoned.Add(1) // p may have admitted it: see HoldStats
			if ctx.Err() != nil {
				return nil, false
			}
			n.log.Debug("forward", "to", p, "op", req.Op, "err", err)
			continue
		}
		if resp.Status == ForwardOK {
			return resp, true
		}
		n.log.Debug("forward refused", "to", p, "op", req.Op, "status", resp.Status, "msg", resp.Msg)
	}
	return nil, false
}

// HandleForward implements ForwardHandler: it runs a request another
// member forwarded, if that member is live in this member's view.
func (h handler) HandleForward(ctx context.Context, from string, req *ForwardRequest) *ForwardResponse {
	n := h.n
	n.mu.Lock()
	closed, member := n.closed, n.core.IsLive(from) && from != n.cfg.Peer
	n.mu.Unlock()
	switch {
	case closed:
		return &ForwardResponse{Status: ForwardClosed, Msg: ErrClosed.Error()}
	case !member:
		return &ForwardResponse{Status: ForwardNotMember, Msg: fmt.Sprintf("node: %s is not a live member here", from)}
	}
	hold := min(max(req.Hold, 0), limiter.MaxShareWait)
	var resp ForwardResponse
	var err error
	switch req.Op {
	case ForwardAllow:
		resp.Decision, err = n.decideHeld(ctx, req.Rule, req.Key, req.Request, hold)
	case ForwardAcquire:
		var ls *LeaseHandle
		ls, resp.Decision, err = n.acquireHeld(ctx, req.Rule, req.Key, req.Request.Class, hold, false)
		if ls != nil {
			resp.LeaseID, resp.TTL = ls.ID, max(time.Until(ls.Expires()), 0)
		}
	case ForwardRenew:
		resp.TTL, _, err = n.renewLocal(ctx, req.LeaseID)
	case ForwardRelease:
		err = n.releaseLocal(ctx, req.LeaseID)
	default:
		return &ForwardResponse{Status: ForwardBadRequest, Msg: fmt.Sprintf("node: unknown forwarded operation %d", req.Op)}
	}
	if err != nil {
		resp = ForwardResponse{Status: forwardStatus(err), Msg: err.Error()}
	}
	return &resp
}

func forwardStatus(err error) ForwardStatus {
	var owner *NotOwnerError
	switch {
	case errors.Is(err, ErrUnknownLease), errors.As(err, &owner), errors.Is(err, ErrBadLease):
		return ForwardUnknownLease
	case errors.Is(err, ErrUnknownRule):
		return ForwardUnknownRule
	case errors.Is(err, ErrClosed):
		return ForwardClosed
	}
	return ForwardBadRequest
}

// leaseOwner routes a Renew or Release of id: local reports that this
// member owns it (or cannot forward); otherwise owner is the member to
// forward to. err wraps ErrBadLease for a malformed ID, and
// ErrUnknownLease for an owner that is no live member.
func (n *Node) leaseOwner(id string) (owner string, local bool, err error) {
	owner, _, _, err = ParseLeaseID(id)
	if err != nil {
		return "", false, err
	}
	if owner == n.cfg.Peer || n.fwd == nil {
		return owner, true, nil
	}
	if err := n.fwd.CheckPeer(owner); err != nil {
		return "", false, badLease(id, err, "owner: %v", err)
	}
	n.mu.Lock()
	live := n.core.IsLive(owner)
	n.mu.Unlock()
	if !live {
		return owner, false, &OwnerError{Owner: owner, Err: leaseErr(ErrUnknownLease, nil, "unknown or expired lease: its owner is not a live member")}
	}
	return owner, false, nil
}

// forwardLease renews or releases a lease at its owner, answering as the
// owner does.
func (n *Node) forwardLease(ctx context.Context, owner string, req *ForwardRequest) (*ForwardResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, leaseForwardTimeout)
	defer cancel()
	resp, err := n.forwardTo(ctx, owner, req)
	if err != nil {
		return nil, &OwnerError{Owner: owner, Err: leaseErr(ErrOwnerUnreachable, err, "lease owner unreachable: %v", err)}
	}
	switch resp.Status {
	case ForwardOK:
		return resp, nil
	case ForwardUnknownLease, ForwardClosed:
		return nil, &OwnerError{Owner: owner, Err: ErrUnknownLease}
	case ForwardNotMember:
		return nil, &OwnerError{Owner: owner, Err: leaseErr(ErrOwnerUnreachable, nil, "lease owner unreachable: %s", resp.Msg)}
	}
	return nil, fmt.Errorf("node: lease owner %s: %s", owner, resp.Msg)
}

// leaseForwardTimeout bounds a forwarded Renew or Release.
const leaseForwardTimeout = 3 * time.Second
