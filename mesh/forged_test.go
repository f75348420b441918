package mesh

import (
	"context"
	"encoding/binary"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p"
	pubsub "github.com/libp2p/go-libp2p-pubsub"
	pb "github.com/libp2p/go-libp2p-pubsub/pb"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"
	"google.golang.org/protobuf/proto"

	"github.com/ratemesh/ratemesh/crdt"
	"github.com/ratemesh/ratemesh/internal/testutil"
)

// rawPeer is a plain libp2p host with a gossipsub that has no validator:
// it publishes whatever bytes a test gives it, signed by its own key.
type rawPeer struct {
	h     host.Host
	ps    *pubsub.PubSub
	topic *pubsub.Topic
	stop  context.CancelFunc // ends ps (quiet)
}

// quiet stops the raw peer's own gossipsub router, once connect has seen
// the mesh subscribed, so that only the RPCs sendRPC writes by hand reach
// the mesh. Gossipsub keeps one inbound stream per peer and resets the
// previous one when another opens: the router's own writer, respawned
// after the mesh reset its stream, would otherwise reset a hand-written
// stream before the mesh read it (TestRefusalsCounted failed so under two
// busy loops, its 40 messages never read).
func (r *rawPeer) quiet() { r.stop() }

func newRawPeer(t *testing.T, topic string) *rawPeer {
	t.Helper()
	h, err := libp2p.New(libp2p.ListenAddrStrings("/ip4/127.0.0.1/tcp/0"), libp2p.DisableRelay(), libp2p.DisableMetrics())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() { cancel(); h.Close() })
	params := pubsub.DefaultGossipSubParams()
	params.HeartbeatInterval = 100 * time.Millisecond
	ps, err := pubsub.NewGossipSub(ctx, h, pubsub.WithGossipSubParams(params), pubsub.WithFloodPublish(true))
	if err != nil {
		t.Fatal(err)
	}
	tp, err := ps.Join(topic)
	if err != nil {
		t.Fatal(err)
	}
	return &rawPeer{h: h, ps: ps, topic: tp, stop: cancel}
}

func (r *rawPeer) connect(t *testing.T, m *Mesh) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := r.h.Connect(ctx, peer.AddrInfo{ID: m.Host().ID(), Addrs: m.Host().Addrs()}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 5*time.Second, func() (bool, string) {
		for _, p := range r.topic.ListPeers() {
			if p == m.Host().ID() {
				return true, "raw peer sees the mesh subscribed"
			}
		}
		return false, "raw peer sees the mesh subscribed"
	})
}

// rawMsg is a gossipsub message as an adversary writes it by hand: topic,
// data and seqno; from and signature are whatever the test sets.
func rawMsg(topic string, seq uint64, from peer.ID, data []byte) *pb.Message {
	var sq [8]byte
	binary.BigEndian.PutUint64(sq[:], seq)
	return &pb.Message{From: []byte(from), Data: data, Seqno: sq[:], Topic: &topic}
}

// sign signs msg as r's host, as gossipsub's StrictSign does (sign.go):
// the marshalled message without signature and key, prefixed.
func (r *rawPeer) sign(t *testing.T, msg *pb.Message) *pb.Message {
	t.Helper()
	msg.Signature, msg.Key = nil, nil
	data, err := proto.Marshal(msg)
	if err != nil {
		t.Fatal(err)
	}
	sig, err := r.h.Peerstore().PrivKey(r.h.ID()).Sign(append([]byte(pubsub.SignPrefix), data...))
	if err != nil {
		t.Fatal(err)
	}
	msg.Signature = sig
	return msg
}

// sendRPC opens a gossipsub stream of its own to m's host, bypassing the
// raw peer's router, and writes each frame length-prefixed as gossipsub
// does (a uvarint and the bytes). The stream replaces any inbound
// gossipsub stream m had from this peer. Write errors are returned, not
// fatal: m resets a stream it refuses.
func (r *rawPeer) sendRPC(t *testing.T, m *Mesh, frames ...[]byte) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := r.h.NewStream(ctx, m.Host().ID(), pubsub.GossipSubID_v11)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	_ = s.SetDeadline(time.Now().Add(5 * time.Second))
	return writeFrames(s, frames)
}

// rpcOf marshals an RPC publishing msgs.
func rpcOf(t *testing.T, msgs ...*pb.Message) []byte {
	t.Helper()
	data, err := proto.Marshal(&pb.RPC{Publish: msgs})
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func encode(t *testing.T, b *crdt.Batch) []byte {
	t.Helper()
	data, err := b.Encode()
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// TestForgedGossipRejected publishes, from a raw gossipsub peer, batches
// that a correct member never sends: one claiming another member's slot,
// one carrying an entry of a foreign slot, one with an impossible value,
// one that does not decode and one over the size cap. The receiving
// members' validators reject every one (so nobody forwards them), the
// handler never sees them, and the counters say why. An honest batch from
// the same raw peer, published last, arrives: the rejections are not an
// accident of connectivity.
func TestForgedGossipRejected(t *testing.T) {
	t.Parallel()
	plausible := func(rule string) (uint64, bool) {
		if rule == "api" {
			return 100, true
		}
		return 0, false
	}
	cfgA := testConfig(t)
	cfgA.Plausible = plausible
	cfgA.MaxMessageBytes = 4096
	a, ra := startMesh(t, cfgA)
	cfgB := testConfig(t)
	cfgB.Plausible = plausible
	cfgB.Bootstrap = []string{tcpAddr(t, a)}
	b, rb := startMesh(t, cfgB)

	raw := newRawPeer(t, a.Topic())
	raw.connect(t, a)
	// A forwards only to its topic mesh, which takes B in at a heartbeat.
	testutil.Eventually(t, 5*time.Second, func() (bool, string) { return a.trace.inMesh(b.Host().ID()), "B in A's topic mesh" })
	rawID := raw.h.ID().String()

	foreign := batch(rawID, 2, "forged-foreign", 1)
	foreign.Slots = []crdt.Slot{{Peer: b.PeerID(), Incarnation: 1}}
	foreign.Windows[0].Slot = 1
	big := batch(rawID, 5, "forged-big", 1)
	big.Windows[0].Key = strings.Repeat("x", crdt.MaxKeyLen)
	for i := 0; i < 20; i++ {
		e := big.Windows[0]
		e.Window += int64(i + 1)
		big.Windows = append(big.Windows, e)
	}
	cases := []struct {
		name   string
		data   []byte
		reason Reason
	}{
		{"claims another member's slot", encode(t, batch(b.PeerID(), 1, "forged-author", 1)), ReasonAuthor},
		{"entry of a foreign slot", encode(t, foreign), ReasonForeignSlot},
		{"value beyond any admission", encode(t, batch(rawID, 3, "forged-value", 101)), ReasonImplausible},
		{"not CBOR", []byte("\xff\x00garbage"), ReasonMalformed},
		{"over the size cap", encode(t, big), ReasonOversize},
	}
	ctx := context.Background()
	for _, c := range cases {
		if err := raw.topic.Publish(ctx, c.data); err != nil {
			t.Fatalf("%s: raw publish: %v", c.name, err)
		}
	}
	// A value at the bound, and a rule the member does not know (checked
	// by the core, not here), are accepted.
	if err := raw.topic.Publish(ctx, encode(t, batch(rawID, 6, "honest-at-bound", 100))); err != nil {
		t.Fatal(err)
	}
	unknown := batch(rawID, 7, "honest-unknown-rule", 1_000_000)
	unknown.Windows[0].Rule = "other"
	if err := raw.topic.Publish(ctx, encode(t, unknown)); err != nil {
		t.Fatal(err)
	}

	testutil.Eventually(t, 5*time.Second, func() (bool, string) {
		st := a.Stats()
		for _, c := range cases {
			if st.RejectedGossip[c.reason] == 0 {
				return false, "every forged batch rejected and the honest ones delivered"
			}
		}
		return ra.has(rawID, "honest-at-bound") && ra.has(rawID, "honest-unknown-rule"), "every forged batch rejected and the honest ones delivered"
	})
	st := a.Stats()
	for _, c := range cases {
		if st.RejectedGossip[c.reason] != 1 {
			t.Errorf("%s: %d rejections for %v, want 1", c.name, st.RejectedGossip[c.reason], c.reason)
		}
	}
	// B hears the honest batches through A; the forged ones never.
	testutil.Eventually(t, 5*time.Second, func() (bool, string) {
		return rb.has(rawID, "honest-at-bound"), "B hears the honest batch forwarded by A"
	})
	for _, key := range []string{"forged-author", "forged-foreign", "forged-value", "forged-big"} {
		if in, ok := ra.find(key); ok {
			t.Errorf("A's handler was given %s from %s", key, in.Batch.From.Peer)
		}
		if in, ok := rb.find(key); ok {
			t.Errorf("B's handler was given %s from %s", key, in.Batch.From.Peer)
		}
	}
	if got := b.Stats().RejectedGossip; got != [NumReasons]uint64{} {
		t.Errorf("B rejected %v: A forwarded forged batches", got)
	}
}

// TestForgedDirectRejected sends, over the anti-entropy stream, a batch
// that claims another member's slot and one that carries a foreign slot's
// entry. The receiver resets the stream (SendDirect fails), counts the
// rejection and never hands the batch over; an honest batch still goes
// through afterwards.
func TestForgedDirectRejected(t *testing.T) {
	t.Parallel()
	cfgA := testConfig(t)
	cfgA.Plausible = func(string) (uint64, bool) { return 100, true }
	a, ra := startMesh(t, cfgA)
	victim, _ := startMesh(t, testConfig(t))
	cfgC := testConfig(t)
	cfgC.Bootstrap = []string{tcpAddr(t, a)}
	c, _ := startMesh(t, cfgC)

	foreign := batch(c.PeerID(), 0, "forged-foreign", 1)
	foreign.Slots = []crdt.Slot{{Peer: victim.PeerID(), Incarnation: 1}}
	foreign.Windows[0].Slot = 1
	cases := []struct {
		name   string
		b      *crdt.Batch
		reason Reason
	}{
		{"claims another member's slot", batch(victim.PeerID(), 0, "forged-author", 1), ReasonAuthor},
		{"entry of a foreign slot", foreign, ReasonForeignSlot},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, tc := range cases {
		honestFirst := batch(c.PeerID(), 0, "before-"+tc.name, 1)
		err := c.SendDirect(ctx, a.PeerID(), []*crdt.Batch{honestFirst, tc.b, batch(c.PeerID(), 0, "after-"+tc.name, 1)})
		if err == nil {
			t.Errorf("%s: SendDirect succeeded", tc.name)
		}
		if st := a.Stats(); st.RejectedDirect[tc.reason] != 1 {
			t.Errorf("%s: RejectedDirect[%v] = %d, want 1", tc.name, tc.reason, st.RejectedDirect[tc.reason])
		}
		if !ra.has(c.PeerID(), "before-"+tc.name) {
			t.Errorf("%s: the honest batch before the forged one was lost", tc.name)
		}
		if ra.has(c.PeerID(), "after-"+tc.name) {
			t.Errorf("%s: the receiver kept reading after a forged batch", tc.name)
		}
	}
	for _, key := range []string{"forged-author", "forged-foreign"} {
		if _, ok := ra.find(key); ok {
			t.Errorf("handler was given %s", key)
		}
	}
	// An implausible value is dropped, not fatal: the rest still arrives.
	err := c.SendDirect(ctx, a.PeerID(), []*crdt.Batch{batch(c.PeerID(), 0, "too-much", 101), batch(c.PeerID(), 0, "fine", 3)})
	if err != nil {
		t.Fatalf("SendDirect with an implausible batch: %v", err)
	}
	if ra.has(c.PeerID(), "too-much") || !ra.has(c.PeerID(), "fine") {
		t.Error("implausible batch delivered or the honest one after it lost")
	}
	if got := a.Stats().RejectedDirect[ReasonImplausible]; got != 1 {
		t.Errorf("RejectedDirect[implausible] = %d, want 1", got)
	}
	// A malformed frame from a raw stream: reset, counted.
	s, err := c.Host().NewStream(ctx, a.Host().ID(), a.SyncProtocol())
	if err != nil {
		t.Fatal(err)
	}
	if err := writeFrames(s, [][]byte{[]byte("\xa0junk")}); err != nil {
		t.Fatal(err)
	}
	s.CloseWrite()
	var one [1]byte
	if _, err := s.Read(one[:]); err == nil || errors.Is(err, context.Canceled) {
		t.Errorf("malformed frame: stream not reset (%v)", err)
	}
	testutil.Eventually(t, 2*time.Second, func() (bool, string) {
		return a.Stats().RejectedDirect[ReasonMalformed] == 1, "malformed direct batch counted"
	})
}

// TestGossipClaimingTheReceiverRejected: our validator accepts our own
// messages unread, so a raw gossipsub peer tries to pass for us — a batch
// naming the receiver as its author, signed by itself. It is refused as a
// forged author like any other (the accept goes by the peer that handed
// the message over, which a remote peer cannot be), and an honest batch
// from the same peer, published after it, arrives.
func TestGossipClaimingTheReceiverRejected(t *testing.T) {
	t.Parallel()
	a, ra := startMesh(t, testConfig(t))
	raw := newRawPeer(t, a.Topic())
	raw.connect(t, a)
	rawID := raw.h.ID().String()
	ctx := context.Background()
	if err := raw.topic.Publish(ctx, encode(t, batch(a.PeerID(), 1, "as-the-receiver", 1))); err != nil {
		t.Fatal(err)
	}
	if err := raw.topic.Publish(ctx, encode(t, batch(rawID, 1, "honest", 1))); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 5*time.Second, func() (bool, string) {
		return ra.has(rawID, "honest"), "the honest batch delivered"
	})
	if got := a.Stats().RejectedGossip[ReasonAuthor]; got != 1 {
		t.Errorf("RejectedGossip[author] = %d, want 1", got)
	}
	if _, ok := ra.find("as-the-receiver"); ok {
		t.Error("the handler was given a batch claiming the receiver's own identity")
	}
}
