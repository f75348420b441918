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
// only held (see runtime_hold.go).

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
