package node

import (
	"context"
	"sync/atomic"
	"time"
)

// LeaseHandle is a concurrency lease this member holds for a client, as
// returned by Acquire. Renew it before it expires or lose it; Release it
// when done. Its methods are safe for concurrent use.
type LeaseHandle struct {
	// ID names the lease across the mesh; it starts with the owner's peer
	// ID, so another member can tell who owns it.
	ID        string
	Rule, Key string

	n       *Node
	expires atomic.Int64 // Unix nanoseconds
}

// Expires returns when the lease ends unless renewed.
func (l *LeaseHandle) Expires() time.Time { return time.Unix(0, l.expires.Load()) }

// Renew extends the lease by the rule's lease_ttl from now and returns the
// TTL; see Node.Renew.
func (l *LeaseHandle) Renew(ctx context.Context) (time.Duration, error) {
	ttl, expires, err := l.n.renew(ctx, l.ID)
	if err == nil {
		l.expires.Store(expires.UnixNano())
	}
	return ttl, err
}

// Release ends the lease; see Node.Release.
func (l *LeaseHandle) Release(ctx context.Context) error { return l.n.Release(ctx, l.ID) }

// Acquire admits one more concurrent lease of a concurrency rule's key iff
// the mesh's live leases plus the projection stay within the limit, and
// returns the lease, expiring after the rule's lease_ttl unless renewed.
// opts may set Class. A denial is a nil lease and a Decision with Allowed
// false, not an error. A share denial is held like Allow's; when this
// member's share is a fraction of a lease and its lottery draw refuses it,
// the lease may be granted by a member whose draw admits it (over a
// Transport that implements Forwarder): its ID then names that member as
// the owner, and Renew and Release at any member reach it.
func (n *Node) Acquire(ctx context.Context, rule, key string, opts ...Option) (*LeaseHandle, Decision, error) {
	if err := ctx.Err(); err != nil {
		return nil, Decision{}, err
	}
	req, _, err := request(opts, acceptLease)
	if err != nil {
		return nil, Decision{}, err
	}
	return n.acquireHeld(ctx, rule, key, req.Class, -1, true)
}

// Renew extends the lease id by its rule's lease_ttl from now and returns
// the TTL. A lease another member owns is renewed at its owner when the
// Transport implements Forwarder (ErrOwnerUnreachable when the owner is
// live but does not answer), and gives a *NotOwnerError naming the owner
// otherwise. An unknown or expired lease, or one whose owner is no live
// member, gives ErrUnknownLease; a malformed ID ErrBadLease.
func (n *Node) Renew(ctx context.Context, id string) (time.Duration, error) {
	ttl, _, err := n.renew(ctx, id)
	return ttl, err
}

func (n *Node) renew(ctx context.Context, id string) (time.Duration, time.Time, error) {
	if err := ctx.Err(); err != nil {
		return 0, time.Time{}, err
	}
	owner, local, err := n.leaseOwner(id)
	if err != nil {
		return 0, time.Time{}, err
	}
	if local {
		return n.renewLocal(ctx, id)
	}
	resp, err := n.forwardLease(ctx, owner, &ForwardRequest{Op: ForwardRenew, LeaseID: id})
	if err != nil {
		return 0, time.Time{}, err
	}
	return resp.TTL, time.Now().Add(resp.TTL), nil
}

// renewLocal renews a lease at this member, which must own it.
func (n *Node) renewLocal(ctx context.Context, id string) (time.Duration, time.Time, error) {
	if err := ctx.Err(); err != nil {
		return 0, time.Time{}, err
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return 0, time.Time{}, ErrClosed
	}
	now := n.decisionTime()
	ttl, err := n.core.Renew(now, id)
	return ttl, now.Add(ttl), err
}

// Release ends the lease id; another member's lease is released at its
// owner, with Renew's errors.
func (n *Node) Release(ctx context.Context, id string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	owner, local, err := n.leaseOwner(id)
	if err != nil {
		return err
	}
	if local {
		return n.releaseLocal(ctx, id)
	}
	_, err = n.forwardLease(ctx, owner, &ForwardRequest{Op: ForwardRelease, LeaseID: id})
	return err
}

// releaseLocal releases a lease at this member, which must own it.
func (n *Node) releaseLocal(ctx context.Context, id string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return ErrClosed
	}
	return n.core.Release(n.decisionTime(), id)
}
