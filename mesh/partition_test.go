package mesh

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/ratemesh/ratemesh/crdt"
	"github.com/ratemesh/ratemesh/internal/testutil"
)

// TestBlockUnblock cuts two members apart with Block and heals them with
// Unblock: while blocked they are disconnected, the redial loop keeps
// failing against the gater, and what is published does not arrive; after
// Unblock the bootstrap redial reconnects, PeerConnected fires again on
// both sides (so the runtime runs anti-entropy on heal) and gossip flows.
func TestBlockUnblock(t *testing.T) {
	t.Parallel()
	a, ra := startMesh(t, testConfig(t))
	cfg := testConfig(t)
	cfg.Bootstrap = []string{tcpAddr(t, a)}
	b, rb := startMesh(t, cfg)
	ctx := context.Background()
	seq := uint64(0)
	exchange := func(tag string) {
		t.Helper()
		testutil.Eventually(t, 5*time.Second, func() (bool, string) {
			seq++
			if err := a.Publish(ctx, batch(a.PeerID(), seq, tag+"-a", 1)); err != nil {
				t.Fatal(err)
			}
			if err := b.Publish(ctx, batch(b.PeerID(), seq, tag+"-b", 1)); err != nil {
				t.Fatal(err)
			}
			return rb.has(a.PeerID(), tag+"-a") && ra.has(b.PeerID(), tag+"-b"), "A and B exchange " + tag
		})
	}
	exchange("before")
	testutil.Eventually(t, 2*time.Second, func() (bool, string) {
		return ra.connectedCount(b.PeerID()) == 1 && rb.connectedCount(a.PeerID()) == 1, "PeerConnected on both sides"
	})

	if got := a.Peers(); len(got) != 1 || got[0] != b.PeerID() {
		t.Errorf("A's Peers() = %v, want [B]", got)
	}
	if addrs := a.PeerAddrs(b.PeerID()); len(addrs) == 0 || !strings.HasSuffix(addrs[0], "/p2p/"+b.PeerID()) {
		t.Errorf("A's PeerAddrs(B) = %v", addrs)
	}
	if err := a.Block(b.PeerID()); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 2*time.Second, func() (bool, string) { return !connected(a, b) && !connected(b, a), "B disconnected" })
	testutil.Eventually(t, 2*time.Second, func() (bool, string) { return len(a.Peers()) == 0, "B gone from Peers()" })
	refused := a.Stats().Refused
	// B redials its bootstrap peer A with backoff; A's gater refuses.
	testutil.Eventually(t, 5*time.Second, func() (bool, string) { return a.Stats().Refused >= refused+3, "B's redials refused" })
	if connected(a, b) {
		t.Fatal("blocked peer reconnected")
	}
	if err := a.Publish(ctx, batch(a.PeerID(), 10_000, "during", 1)); err != nil {
		t.Fatal(err)
	}
	if got := len(a.topic.ListPeers()); got != 0 {
		t.Errorf("A still has %d topic peers while blocked", got)
	}
	if rb.has(a.PeerID(), "during") {
		t.Error("a batch crossed the block")
	}
	if ra.connectedCount(b.PeerID()) != 1 || rb.connectedCount(a.PeerID()) != 1 {
		t.Error("PeerConnected fired while blocked")
	}

	if err := a.Unblock(b.PeerID()); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 5*time.Second, func() (bool, string) {
		return ra.connectedCount(b.PeerID()) == 2 && rb.connectedCount(a.PeerID()) == 2, "reconnected after Unblock, PeerConnected again on both sides"
	})
	exchange("after")

	if err := a.Block("not-a-peer"); err == nil {
		t.Error("Block accepted a bad peer ID")
	}
}

// TestRedialAfterDrop: when the connection to a bootstrap peer drops
// (the peer closes it), the member redials by itself.
func TestRedialAfterDrop(t *testing.T) {
	t.Parallel()
	a, ra := startMesh(t, testConfig(t))
	cfg := testConfig(t)
	cfg.Bootstrap = []string{tcpAddr(t, a)}
	b, _ := startMesh(t, cfg)
	testutil.Eventually(t, 2*time.Second, func() (bool, string) { return ra.connectedCount(b.PeerID()) == 1, "first PeerConnected" })
	if err := a.Host().Network().ClosePeer(b.Host().ID()); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 5*time.Second, func() (bool, string) { return ra.connectedCount(b.PeerID()) == 2 && connected(a, b), "B redials A" })
}

// TestPeerConnectedBeforeStart: a peer that connects while this member is
// built but not started is reported once Start runs, and the peer hears
// of this member once it announces the sync protocol — PeerConnected only
// ever names peers that can take an anti-entropy answer.
func TestPeerConnectedBeforeStart(t *testing.T) {
	t.Parallel()
	a := newMesh(t, testConfig(t)) // built, listening, not started
	cfg := testConfig(t)
	cfg.Bootstrap = []string{tcpAddr(t, a)}
	b, rb := startMesh(t, cfg)
	if !connected(b, a) {
		t.Fatal("B did not reach A")
	}
	ra := &recorder{}
	if got := rb.connectedCount(a.PeerID()); got != 0 {
		t.Fatalf("B reported A (not yet a member) %d times", got)
	}
	if err := a.Start(context.Background(), ra); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 5*time.Second, func() (bool, string) {
		return ra.connectedCount(b.PeerID()) == 1 && rb.connectedCount(a.PeerID()) == 1, "both sides report the other once A starts"
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := b.SendDirect(ctx, a.PeerID(), []*crdt.Batch{batch(b.PeerID(), 0, "hello", 1)}); err != nil {
		t.Fatal(err)
	}
	if !ra.has(b.PeerID(), "hello") {
		t.Error("anti-entropy answer lost")
	}
}

// TestRedialLostMember: when the connection between two members drops and
// neither is the other's bootstrap peer, they redial each other. Before,
// only bootstrap peers were redialled, and two members a partition had
// parted stayed apart after it healed (TestServePartitionHeal).
func TestRedialLostMember(t *testing.T) {
	t.Parallel()
	a, ra := startMesh(t, testConfig(t))
	b, rb := startMesh(t, testConfig(t))
	if err := b.Connect(context.Background(), tcpAddr(t, a)); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 5*time.Second, func() (bool, string) {
		return ra.connectedCount(b.PeerID()) == 1 && rb.connectedCount(a.PeerID()) == 1, "first PeerConnected on both sides"
	})
	if err := a.Host().Network().ClosePeer(b.Host().ID()); err != nil {
		t.Fatal(err)
	}
	// Both redial, and at least one side announces the other again (a
	// side whose new connection opened before it handled the old one's
	// end sees no gap, and announces nothing new).
	testutil.Eventually(t, 5*time.Second, func() (bool, string) {
		again := ra.connectedCount(b.PeerID()) == 2 || rb.connectedCount(a.PeerID()) == 2
		return again && connected(a, b) && connected(b, a),
			fmt.Sprintf("A and B redial each other (PeerConnected %d and %d times)", ra.connectedCount(b.PeerID()), rb.connectedCount(a.PeerID()))
	})
}

// TestNoRedialAfterLeave: a member that announced it leaves is not
// redialled once its connection closes; one that went silent without a
// word is, and a blocked one is not.
func TestNoRedialAfterLeave(t *testing.T) {
	t.Parallel()
	a, ra := startMesh(t, testConfig(t))
	join := func() *Mesh {
		m, _ := startMesh(t, testConfig(t))
		if err := m.Connect(context.Background(), tcpAddr(t, a)); err != nil {
			t.Fatal(err)
		}
		testutil.Eventually(t, 5*time.Second, func() (bool, string) { return ra.connectedCount(m.PeerID()) == 1, "PeerConnected" })
		return m
	}
	leaver, crasher, blocked := join(), join(), join()

	lb := batch(leaver.PeerID(), 1, "bye", 1)
	lb.Flags |= crdt.FlagLeaving
	if err := leaver.Publish(context.Background(), lb); err != nil {
		t.Fatal(err)
	}
	if !ra.has(leaver.PeerID(), "bye") {
		t.Fatal("the leave announcement did not reach A before Publish returned")
	}
	for _, m := range []*Mesh{leaver, crasher} {
		if err := m.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.Block(blocked.PeerID()); err != nil {
		t.Fatal(err)
	}
	redialled := func(m *Mesh) bool {
		a.mu.Lock()
		defer a.mu.Unlock()
		return a.redials[pid(t, m)] != nil
	}
	gone := func(m *Mesh) bool { // A's event loop handled the loss
		a.peersMu.Lock()
		defer a.peersMu.Unlock()
		return a.peers[pid(t, m)] == nil
	}
	testutil.Eventually(t, 5*time.Second, func() (bool, string) {
		return gone(leaver) && gone(crasher) && gone(blocked), "A lost all three"
	})
	if !redialled(crasher) {
		t.Errorf("A does not redial a member that went silent (its addresses: %v)", a.Host().Peerstore().Addrs(pid(t, crasher)))
	}
	if redialled(leaver) {
		t.Error("A redials a member that announced it leaves")
	}
	if redialled(blocked) {
		t.Error("A redials a member it blocked")
	}
}

// TestResetUnsubscribedMember: a connected member that gossipsub does not
// count among the topic's subscribers past the grace — here a real host
// that speaks our sync protocol and never joins the topic; in production
// one whose subscription gossipsub forgot when a duplicate connection
// closed — has its connections reset, so both sides start afresh.
func TestResetUnsubscribedMember(t *testing.T) {
	t.Parallel()
	a := newMesh(t, testConfig(t))
	a.subscribeGrace = 300 * time.Millisecond
	ra := &recorder{}
	if err := a.Start(context.Background(), ra); err != nil {
		t.Fatal(err)
	}
	h, err := libp2p.New(libp2p.ListenAddrStrings("/ip4/127.0.0.1/tcp/0"), libp2p.DisableRelay(), libp2p.DisableMetrics())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	h.SetStreamHandler(a.syncProto, func(s network.Stream) { s.Reset() })
	pi, err := peer.AddrInfoFromString(tcpAddr(t, a))
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Connect(context.Background(), *pi); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 5*time.Second, func() (bool, string) {
		return ra.connectedCount(h.ID().String()) == 1, "A announces the host"
	})
	testutil.Eventually(t, 5*time.Second, func() (bool, string) {
		return a.Stats().Resets >= 1, "A resets the connection"
	})
}

// TestLostRedialsBounded: at the bound on lost members redialled, the
// member lost longest ago is forgotten for the one lost last.
func TestLostRedialsBounded(t *testing.T) {
	t.Parallel()
	a := newMesh(t, testConfig(t))
	a.maxLost = 1
	ra := &recorder{}
	if err := a.Start(context.Background(), ra); err != nil {
		t.Fatal(err)
	}
	redialled := func(m *Mesh) bool {
		a.mu.Lock()
		defer a.mu.Unlock()
		return a.redials[pid(t, m)] != nil
	}
	var lost []*Mesh
	for range 2 {
		m, _ := startMesh(t, testConfig(t))
		if err := m.Connect(context.Background(), tcpAddr(t, a)); err != nil {
			t.Fatal(err)
		}
		testutil.Eventually(t, 5*time.Second, func() (bool, string) { return ra.connectedCount(m.PeerID()) == 1, "PeerConnected" })
		if err := m.Close(); err != nil {
			t.Fatal(err)
		}
		testutil.Eventually(t, 5*time.Second, func() (bool, string) { return redialled(m), "A redials the member it lost" })
		lost = append(lost, m)
	}
	if redialled(lost[0]) {
		t.Error("A still redials the member lost first, over the bound of 1")
	}
	a.mu.Lock()
	n := a.lostLoops
	a.mu.Unlock()
	if n != 1 {
		t.Errorf("%d lost members' loops, want 1", n)
	}
}
