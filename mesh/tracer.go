package mesh

import (
	"strings"
	"sync"
	"sync/atomic"
	"time"

	pubsub "github.com/libp2p/go-libp2p-pubsub"
	"github.com/libp2p/go-libp2p/core/metrics"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
)

// tracer follows gossipsub's topic mesh and counts the silent drops the
// notes warn about (full queues, a slow subscriber) and signature
// failures. Pubsub calls it synchronously from its loop: every method is
// short and never blocks.
type tracer struct {
	topic string

	mu   sync.Mutex
	mesh map[peer.ID]struct{}

	droppedRPC, undeliverable, validationDropped, badSignature atomic.Uint64
	// selfOrigin counts messages claiming this member as author that
	// another peer sent (forged_author).
	selfOrigin atomic.Uint64

	// onRefuse, when set, is told of the refusals counted here (the Mesh
	// logs them, rate-limited). It must not block.
	onRefuse func(r Reason, from peer.ID, why string)
}

var _ pubsub.RawTracer = (*tracer)(nil)

func newTracer(topic string) *tracer {
	return &tracer{topic: topic, mesh: make(map[peer.ID]struct{})}
}

func (t *tracer) inMesh(p peer.ID) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	_, ok := t.mesh[p]
	return ok
}

// removePeer forgets a disconnected peer (gossipsub drops it from the mesh
// without a Prune event).
func (t *tracer) removePeer(p peer.ID) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.mesh, p)
}

func (t *tracer) Graft(p peer.ID, topic string) {
	if topic != t.topic {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.mesh[p] = struct{}{}
}

func (t *tracer) Prune(p peer.ID, topic string) {
	if topic == t.topic {
		t.removePeer(p)
	}
}

// RejectMessage counts gossipsub's own refusals of messages on our topic
// (a rejection by our validator, "validation failed", is counted by the
// validator itself).
func (t *tracer) RejectMessage(msg *pubsub.Message, reason string) {
	if msg.GetTopic() != t.topic {
		return
	}
	r := ReasonBadSignature
	switch reason {
	case pubsub.RejectValidationQueueFull, pubsub.RejectValidationThrottled:
		t.validationDropped.Add(1)
		return
	case pubsub.RejectMissingSignature, pubsub.RejectInvalidSignature, pubsub.RejectUnexpectedSignature, pubsub.RejectUnexpectedAuthInfo:
		t.badSignature.Add(1)
	case pubsub.RejectSelfOrigin:
		t.selfOrigin.Add(1)
		r = ReasonAuthor
	default:
		return
	}
	if t.onRefuse != nil {
		t.onRefuse(r, msg.ReceivedFrom, reason)
	}
}

func (t *tracer) DropRPC(*pubsub.RPC, peer.ID)             { t.droppedRPC.Add(1) }
func (t *tracer) UndeliverableMessage(*pubsub.Message)     { t.undeliverable.Add(1) }
func (t *tracer) OnNewOutboundStream(peer.ID, protocol.ID) {}
func (t *tracer) OnClosedOutboundStream(peer.ID)           {}
func (t *tracer) Join(string)                              {}
func (t *tracer) Leave(string)                             {}
func (t *tracer) ValidateMessage(*pubsub.Message)          {}
func (t *tracer) DeliverMessage(*pubsub.Message)           {}
func (t *tracer) DuplicateMessage(*pubsub.Message)         {}
func (t *tracer) ThrottlePeer(peer.ID)                     {}
func (t *tracer) RecvRPC(*pubsub.RPC)                      {}
func (t *tracer) SendRPC(*pubsub.RPC, peer.ID)             {}

// wire counts the bytes libp2p's streams carry, exactly and at once
// (libp2p's own BandwidthCounter updates its totals once a second): in
// total and for gossipsub and the sync protocol.
type wire struct {
	sync                protocol.ID
	in, out             atomic.Int64
	gossipIn, gossipOut atomic.Int64
	syncIn, syncOut     atomic.Int64
}

func isGossip(p protocol.ID) bool {
	return strings.HasPrefix(string(p), "/meshsub/") || strings.HasPrefix(string(p), "/floodsub/")
}

var _ metrics.Reporter = (*wire)(nil)

func (w *wire) LogSentMessage(n int64) { w.out.Add(n) }
func (w *wire) LogRecvMessage(n int64) { w.in.Add(n) }
func (w *wire) LogSentMessageStream(n int64, p protocol.ID, _ peer.ID) {
	switch {
	case p == w.sync:
		w.syncOut.Add(n)
	case isGossip(p):
		w.gossipOut.Add(n)
	}
}

func (w *wire) LogRecvMessageStream(n int64, p protocol.ID, _ peer.ID) {
	switch {
	case p == w.sync:
		w.syncIn.Add(n)
	case isGossip(p):
		w.gossipIn.Add(n)
	}
}

func (w *wire) GetBandwidthForPeer(peer.ID) metrics.Stats             { return metrics.Stats{} }
func (w *wire) GetBandwidthForProtocol(protocol.ID) metrics.Stats     { return metrics.Stats{} }
func (w *wire) GetBandwidthByPeer() map[peer.ID]metrics.Stats         { return nil }
func (w *wire) GetBandwidthByProtocol() map[protocol.ID]metrics.Stats { return nil }
func (w *wire) Reset()                                                { w.in.Store(0); w.out.Store(0) }
func (w *wire) TrimIdle(time.Time)                                    {}
func (w *wire) GetBandwidthTotals() metrics.Stats {
	return metrics.Stats{TotalIn: w.in.Load(), TotalOut: w.out.Load()}
}
