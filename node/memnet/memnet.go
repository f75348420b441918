// Package memnet is an in-memory node.Transport on real time, for tests,
// examples and single-process demos: many node runtimes attach to one Hub,
// and every batch one publishes reaches every other attached member
// asynchronously, after the hub's delay, unless the link between the two
// is cut.
//
// A test wires it like this:
//
//	hub := memnet.NewHub()
//	hub.SetDelay(2 * time.Millisecond)
//	cfgA := node.DefaultConfig()
//	cfgA.Peer, cfgA.Rules, cfgA.Transport = "a", rules, hub.Transport("a")
//	a, err := node.Start(ctx, cfgA)
//	… the same for "b" …
//	hub.Cut("a", "b")  // a partition: nothing flows between a and b
//	hub.Heal("a", "b") // both sides get PeerConnected and exchange state
//
// Batches travel as their CBOR encoding and are decoded once per receiver,
// so each handler owns a fresh batch and the wire format is exercised. A
// transport authenticates its own member: it refuses to publish a batch
// whose From names another peer.
//
// Unlike node/nodetest, which drives pure cores on virtual time, memnet
// runs on the wall clock with one delivery goroutine per member, so it is
// not deterministic; use it for the runtime, nodetest for the core.
package memnet

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/ratemesh/ratemesh/crdt"
	"github.com/ratemesh/ratemesh/node"
)

// Errors of the transport.
var (
	ErrClosed      = errors.New("memnet: transport closed")
	ErrNotStarted  = errors.New("memnet: transport not started")
	ErrUnreachable = errors.New("memnet: peer unreachable")
	ErrDuplicate   = errors.New("memnet: peer already attached")
	ErrForged      = errors.New("memnet: batch names another peer as its author")
)

// Hub is the in-memory network that Transports attach to. Its zero value
// is not usable; call NewHub. A Hub is safe for concurrent use.
type Hub struct {
	mu      sync.Mutex
	delay   time.Duration
	members map[string]*Transport
	cut     map[[2]string]bool
	oneWay  map[[2]string]bool // (from, to) cut in that direction only
}

// NewHub returns an empty hub with no delay and no cut links.
func NewHub() *Hub {
	return &Hub{members: make(map[string]*Transport), cut: make(map[[2]string]bool), oneWay: make(map[[2]string]bool)}
}

// SetDelay sets the latency of every delivery sent from now on (0, the
// default, delivers as soon as the receiver's goroutine runs). Each
// member's deliveries stay in the order they were sent.
func (h *Hub) SetDelay(d time.Duration) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.delay = max(d, 0)
}

// Transport returns a transport for member peer. It attaches to the hub
// when the runtime starts it; peer must be the peer ID the runtime is
// configured with.
func (h *Hub) Transport(peer string) *Transport {
	return &Transport{hub: h, peer: peer, wake: make(chan struct{}, 1), done: make(chan struct{}), exited: make(chan struct{})}
}

// Peers returns the peer IDs attached now, sorted.
func (h *Hub) Peers() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]string, 0, len(h.members))
	for p := range h.members {
		out = append(out, p)
	}
	slices.Sort(out)
	return out
}

func pair(a, b string) [2]string {
	if a > b {
		a, b = b, a
	}
	return [2]string{a, b}
}

// Cut breaks the link between a and b in both directions: nothing sent
// between them is delivered, including batches already in flight.
func (h *Hub) Cut(a, b string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.cut[pair(a, b)] = true
}

// Heal restores the link between a and b. When both are attached, each
// side's handler gets PeerConnected for the other, as after a reconnect,
// so their runtimes exchange full state.
func (h *Hub) Heal(a, b string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.cut[pair(a, b)] {
		return
	}
	delete(h.cut, pair(a, b))
	ta, tb := h.members[a], h.members[b]
	if ta != nil && tb != nil {
		ta.push(item{connect: b, at: time.Now()})
		tb.push(item{connect: a, at: time.Now()})
	}
}

// Resume restores the link between a and b as a connection that stayed up
// through the partition does: batches flow again, but neither handler gets
// PeerConnected, so no full state is exchanged by itself.
func (h *Hub) Resume(a, b string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.cut, pair(a, b))
}

// CutOneWay breaks the link from a to b only: b hears nothing from a,
// including batches already in flight, while a still hears b (an output
// queue that stalled, a one-way slow link). ResumeOneWay restores it.
func (h *Hub) CutOneWay(from, to string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.oneWay[[2]string{from, to}] = true
}

// ResumeOneWay restores the link from a to b that CutOneWay broke, as a
// connection that stayed up (see Resume).
func (h *Hub) ResumeOneWay(from, to string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.oneWay, [2]string{from, to})
}

// reachable reports whether a batch from a may reach b.
func (h *Hub) reachable(a, b string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return !h.cut[pair(a, b)] && !h.oneWay[[2]string{a, b}]
}

func (h *Hub) attach(t *Transport) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.members[t.peer]; ok {
		return fmt.Errorf("%w: %q", ErrDuplicate, t.peer)
	}
	now := time.Now()
	for _, p := range sortedPeers(h.members) {
		if h.cut[pair(p, t.peer)] {
			continue
		}
		h.members[p].push(item{connect: t.peer, at: now})
		t.push(item{connect: p, at: now})
	}
	h.members[t.peer] = t
	return nil
}

func (h *Hub) detach(t *Transport) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.members[t.peer] == t {
		delete(h.members, t.peer)
	}
}

// send queues data from peer from to every attached member in to (all
// others when to is empty).
func (h *Hub) send(from, to string, data []byte, direct bool) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	at := time.Now().Add(h.delay)
	if to != "" {
		t := h.members[to]
		if t == nil || h.cut[pair(from, to)] {
			return fmt.Errorf("%w: %q", ErrUnreachable, to)
		}
		t.push(item{from: from, data: data, direct: direct, at: at})
		return nil
	}
	for _, p := range sortedPeers(h.members) {
		if p != from && !h.cut[pair(from, p)] {
			h.members[p].push(item{from: from, data: data, at: at})
		}
	}
	return nil
}

func sortedPeers(m map[string]*Transport) []string {
	out := make([]string, 0, len(m))
	for p := range m {
		out = append(out, p)
	}
	slices.Sort(out)
	return out
}

// item is one queued delivery: a batch's encoding, or a connect event.
type item struct {
	at      time.Time
	from    string
	data    []byte
	direct  bool
	connect string // a PeerConnected for this peer, when set
}

// Transport is one member's attachment to a Hub; it implements
// node.Transport. Its zero value is not usable; get one from
// Hub.Transport. It is safe for concurrent use; the handler is called from
// the transport's one delivery goroutine, so calls never overlap.
type Transport struct {
	hub  *Hub
	peer string

	mu      sync.Mutex
	queue   []item
	h       node.Handler
	started bool
	closed  bool

	wake   chan struct{}
	done   chan struct{}
	exited chan struct{}
}

var _ node.Transport = (*Transport)(nil)

// Peer returns the member's peer ID.
func (t *Transport) Peer() string { return t.peer }

func (t *Transport) push(it item) {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return
	}
	t.queue = append(t.queue, it)
	t.mu.Unlock()
	select {
	case t.wake <- struct{}{}:
	default:
	}
}

// Start implements node.Transport: it attaches to the hub, reports every
// reachable member already attached through PeerConnected (and this one to
// them), and starts delivering to h. ctx is not retained.
func (t *Transport) Start(_ context.Context, h node.Handler) error {
	t.mu.Lock()
	switch {
	case t.closed:
		t.mu.Unlock()
		return ErrClosed
	case t.started:
		t.mu.Unlock()
		return fmt.Errorf("memnet: transport %q started twice", t.peer)
	}
	t.h, t.started = h, true
	t.mu.Unlock()
	if err := t.hub.attach(t); err != nil {
		t.mu.Lock()
		t.started = false
		t.mu.Unlock()
		return err
	}
	go t.deliver()
	return nil
}

func (t *Transport) ready() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	switch {
	case t.closed:
		return ErrClosed
	case !t.started:
		return ErrNotStarted
	}
	return nil
}

func (t *Transport) encode(b *crdt.Batch) ([]byte, error) {
	if b.From.Peer != t.peer {
		return nil, fmt.Errorf("%w: from %q, sent by %q", ErrForged, b.From.Peer, t.peer)
	}
	return b.Encode()
}

// Publish implements node.Transport: it encodes b and queues it for every
// other reachable member. It never blocks on a receiver.
func (t *Transport) Publish(ctx context.Context, b *crdt.Batch) error {
	if err := t.ready(); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	data, err := t.encode(b)
	if err != nil {
		return err
	}
	return t.hub.send(t.peer, "", data, false)
}

// SendDirect implements node.Transport: it queues bs, in order, for peer
// alone, or fails with ErrUnreachable when peer is not attached or the
// link is cut.
func (t *Transport) SendDirect(ctx context.Context, peer string, bs []*crdt.Batch) error {
	if err := t.ready(); err != nil {
		return err
	}
	for _, b := range bs {
		if err := ctx.Err(); err != nil {
			return err
		}
		data, err := t.encode(b)
		if err != nil {
			return err
		}
		if err := t.hub.send(t.peer, peer, data, true); err != nil {
			return err
		}
	}
	return nil
}

// Close implements node.Transport: it detaches from the hub, drops what is
// still queued for this member and returns once the handler will not be
// called again. Batches this member published before are still delivered
// to the others. It must not be called from within the handler.
func (t *Transport) Close() error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil
	}
	t.closed = true
	started := t.started
	t.queue = nil
	t.mu.Unlock()
	t.hub.detach(t)
	close(t.done)
	if started {
		<-t.exited
	}
	return nil
}

// deliver is the member's delivery goroutine: it hands each queued item
// to the handler in order, once it is due.
func (t *Transport) deliver() {
	defer close(t.exited)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for {
		t.mu.Lock()
		if t.closed {
			t.mu.Unlock()
			return
		}
		if len(t.queue) == 0 {
			t.mu.Unlock()
			select {
			case <-t.wake:
			case <-t.done:
				return
			}
			continue
		}
		it := t.queue[0]
		if wait := time.Until(it.at); wait > 0 {
			t.mu.Unlock()
			timer.Reset(wait)
			select {
			case <-timer.C:
			case <-t.done:
				timer.Stop()
				return
			}
			continue
		}
		t.queue[0] = item{}
		t.queue = t.queue[1:]
		h := t.h
		t.mu.Unlock()
		t.handle(h, it)
	}
}

func (t *Transport) handle(h node.Handler, it item) {
	if it.connect != "" {
		if t.hub.reachable(t.peer, it.connect) {
			h.PeerConnected(it.connect)
		}
		return
	}
	if !t.hub.reachable(it.from, t.peer) {
		return
	}
	b, err := crdt.DecodeBatch(it.data)
	if err != nil {
		return // cannot happen: the sender encoded it, which validates
	}
	h.HandleBatch(node.Inbound{Batch: b, Direct: it.direct})
}
