package node

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/ratemesh/ratemesh/crdt"
	"github.com/ratemesh/ratemesh/limiter"
)

// Forwarding: a member hands a request to one other member and answers as
// that member does. It serves two purposes:
//
//   - Leases at any member. A lease belongs to the member that granted it
//     (its ID starts with that member's peer ID); Renew and Release at
//     another member go to the owner.
//   - A lottery loser's request. When this member's share of a request is
//     a fraction of its cost (a limit below N), its lottery draw may
//     refuse a request the limit has room for — an idle key's first
//     request, say. It hands the request to a member whose draw admits it
//     (limiter.Limiter.LotteryWinners); that member decides it under its
//     own share, so forwarding never admits more than deciding there
//     would.
//
// A Node forwards only when its Transport implements Forwarder (package
// mesh does, over a libp2p stream); on other transports Renew and Release
// of another member's lease answer *NotOwnerError, and lottery losers are
// only held (see hold.go).

// Forwarder is implemented by a Transport that can carry a request to one
// member and bring its answer back. Its methods are called concurrently
// from request goroutines.
type Forwarder interface {
	// CheckPeer returns an error wrapping ErrBadPeer when id is not a
	// well-formed peer ID of this transport.
	CheckPeer(id string) error
	// Forward sends req to peer and returns its answer: the peer's
	// ForwardHandler ran it. It fails when the peer cannot be reached,
	// does not answer within ctx, or answers something malformed. It must
	// not retain req.
	Forward(ctx context.Context, peer string, req *ForwardRequest) (*ForwardResponse, error)
}

// ForwardHandler is implemented by the Handler a Node passes to
// Transport.Start: a Forwarder's receiving side calls it with the request
// and the authenticated peer that sent it. Calls may be concurrent and may
// block up to req.Hold (a held decision) or until ctx ends.
type ForwardHandler interface {
	HandleForward(ctx context.Context, from string, req *ForwardRequest) *ForwardResponse
}

// ForwardOp names what a ForwardRequest asks.
type ForwardOp uint8

// The operations.
const (
	// ForwardAllow decides Rule, Key and Request at the receiver, as its
	// Allow would, without forwarding again.
	ForwardAllow ForwardOp = iota + 1
	// ForwardAcquire acquires a lease of Rule and Key (Request.Class) at
	// the receiver, which owns it.
	ForwardAcquire
	// ForwardRenew renews LeaseID, which the receiver owns.
	ForwardRenew
	// ForwardRelease releases LeaseID, which the receiver owns.
	ForwardRelease
)

// ForwardRequest is one forwarded request.
type ForwardRequest struct {
	Op        ForwardOp
	Rule, Key string
	Request   limiter.Request // ForwardAllow: cost, type, units, class; ForwardAcquire: class
	LeaseID   string          // ForwardRenew, ForwardRelease
	// Hold bounds how long the receiver may hold a decision its share
	// refuses (ForwardAllow, ForwardAcquire), capped by the rule's own
	// share_wait there; 0 answers at once.
	Hold time.Duration
}

// ForwardStatus is the outcome class of a forwarded request.
type ForwardStatus uint8

// The statuses.
const (
	ForwardOK           ForwardStatus = iota // done: Decision (and lease), or the renewal or release
	ForwardUnknownLease                      // the lease is unknown or expired at the receiver
	ForwardUnknownRule                       // the receiver has no such rule
	ForwardBadRequest                        // the receiver refused the request's content
	ForwardClosed                            // the receiver is shutting down
	ForwardNotMember                         // the receiver does not hold the sender as a live member
)

// ForwardResponse is the receiver's answer.
type ForwardResponse struct {
	Status ForwardStatus
	Msg    string // the error's text when Status is not ForwardOK
	// Decision answers ForwardAllow and ForwardAcquire.
	Decision Decision
	// LeaseID names the lease ForwardAcquire granted (owned by the
	// receiver); TTL is its time to live, or a renewed lease's.
	LeaseID string
	TTL     time.Duration
}

// Errors of forwarding.
var (
	// ErrBadPeer is wrapped by Forwarder.CheckPeer for a malformed peer
	// ID.
	ErrBadPeer = errors.New("node: malformed peer ID")
	// ErrBadLease is returned by Renew and Release for a lease ID that
	// no member could have granted: not <peer>~<incarnation>~<sequence>,
	// or (with a Forwarder) a malformed owner peer ID.
	ErrBadLease = errors.New("node: malformed lease ID")
	// ErrOwnerUnreachable is returned by Renew and Release when the
	// lease's owner is a live member that did not answer: the lease may
	// well be alive, so retry.
	ErrOwnerUnreachable = errors.New("node: lease owner unreachable")
)

// OwnerError is a Renew or Release of a lease that another member owns,
// failed at or on the way to the owner. It wraps ErrUnknownLease (the
// owner does not know the lease, or is no live member) or
// ErrOwnerUnreachable.
type OwnerError struct {
	Owner string // the owner's peer ID
	Err   error  // ErrUnknownLease or ErrOwnerUnreachable, maybe wrapped
}

func (e *OwnerError) Error() string { return fmt.Sprintf("%v (owner %s)", e.Err, e.Owner) }

// Unwrap returns the cause.
func (e *OwnerError) Unwrap() error { return e.Err }

// ParseLeaseID splits a lease ID into its owner's peer ID and the owner's
// incarnation and sequence number, or returns an error wrapping
// ErrBadLease.
func ParseLeaseID(id string) (owner string, incarnation, seq uint64, err error) {
	parts := strings.Split(id, "~")
	if len(parts) != 3 || parts[0] == "" || len(parts[0]) > crdt.MaxPeerLen {
		return "", 0, 0, badLease(id, nil, "want <peer>~<incarnation>~<sequence>")
	}
	inc, err1 := strconv.ParseUint(parts[1], 36, 64)
	seq, err2 := strconv.ParseUint(parts[2], 36, 64)
	if err1 != nil || err2 != nil || inc == 0 || seq == 0 {
		return "", 0, 0, badLease(id, nil, "incarnation and sequence must be positive base-36 numbers")
	}
	return parts[0], inc, seq, nil
}

// forwardMargin is how much of a held request's remaining time the
// receiver of a forwarded one leaves for the way back.
const forwardMargin = 20 * time.Millisecond

// lotteryPeers returns the alive members, nearest rank first, whose
// lottery draws admit the request as this member sees its key (see
// limiter.Limiter.LotteryWinners) under the env its own decision takes
// (setUp: a reclaim's scale included), or nil.
func (c *Core) lotteryPeers(now time.Time, rule, key string, req *limiter.Request, lease bool) []string {
	if !c.join.joined || c.members.n < 2 {
		return nil
	}
	var s setup
	if err := c.setUp(&s, now, rule, key, req, lease); err != nil {
		return nil
	}
	ranks := s.l.LotteryWinners(s.ch, s.env, c.liveSlot)
	if len(ranks) == 0 {
		return nil
	}
	byRank := c.members.liveByRank(c.self.Peer)
	var out []string
	for _, r := range ranks {
		if r < len(byRank) && byRank[r] != nil && byRank[r].state == Alive {
			out = append(out, byRank[r].peer)
		}
	}
	return out
}

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
