package mesh

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ratemesh/ratemesh/crdt"
	"github.com/ratemesh/ratemesh/internal/testutil"
	"github.com/ratemesh/ratemesh/node"
)

// TestFiveMeshesExchange bootstraps five meshes in a chain (each dials the
// previous one) and checks that PeerConnected fires for every neighbour
// and that one batch published by each member reaches all the others.
func TestFiveMeshesExchange(t *testing.T) {
	t.Parallel()
	const n = 5
	ms := make([]*Mesh, n)
	rs := make([]*recorder, n)
	for i := range n {
		cfg := testConfig(t)
		if i > 0 {
			cfg.Bootstrap = []string{tcpAddr(t, ms[i-1])}
		}
		ms[i], rs[i] = startMesh(t, cfg)
		if i > 0 && !connected(ms[i], ms[i-1]) {
			t.Fatalf("Start returned before mesh %d reached its bootstrap peer", i)
		}
	}
	for i := 1; i < n; i++ {
		a, b := i-1, i
		testutil.Eventually(t, 5*time.Second, func() (bool, string) {
			return rs[a].connectedCount(ms[b].PeerID()) == 1 && rs[b].connectedCount(ms[a].PeerID()) == 1, fmt.Sprintf("PeerConnected between %d and %d", a, b)
		})
	}
	ctx := context.Background()

	// Warm-up: the chain forwards only once each topic mesh has formed
	// (a heartbeat after connecting); until then anti-entropy covers.
	seq := uint64(0)
	testutil.Eventually(t, 10*time.Second, func() (bool, string) {
		seq++
		for i, m := range ms {
			if err := m.Publish(ctx, batch(m.PeerID(), seq, fmt.Sprintf("probe-%d", i), 1)); err != nil {
				t.Fatal(err)
			}
		}
		for i := range ms {
			for j := range ms {
				if i != j && !rs[i].has(ms[j].PeerID(), fmt.Sprintf("probe-%d", j)) {
					return false, "every member hears a probe from every other"
				}
			}
		}
		return true, "every member hears a probe from every other"
	})

	// Once the mesh is formed, a single publish from each reaches all.
	for i, m := range ms {
		if err := m.Publish(ctx, batch(m.PeerID(), 1000, fmt.Sprintf("real-%d", i), 7)); err != nil {
			t.Fatal(err)
		}
	}
	for i := range ms {
		for j := range ms {
			if i == j {
				continue
			}
			key := fmt.Sprintf("real-%d", j)
			testutil.Eventually(t, 3*time.Second, func() (bool, string) {
				return rs[i].has(ms[j].PeerID(), key), fmt.Sprintf("member %d receives %s", i, key)
			})
			in, _ := rs[i].find(key)
			if in.Direct {
				t.Errorf("gossip batch delivered as Direct")
			}
			if got := in.Batch.Windows[0].Admitted; got != 7 {
				t.Errorf("member %d: %s admitted %d, want 7", i, key, got)
			}
		}
		if _, own := rs[i].find(fmt.Sprintf("real-%d", i)); own {
			t.Errorf("member %d was handed its own batch", i)
		}
	}
	for i, m := range ms {
		st := m.Stats()
		if st.Received == 0 || st.Published == 0 || st.WireOut == 0 || st.GossipWireOut == 0 {
			t.Errorf("member %d stats not counting: %+v", i, st)
		}
		for r := range NumReasons {
			if st.RejectedGossip[r] != 0 {
				t.Errorf("member %d rejected %d honest batches (%v)", i, st.RejectedGossip[r], r)
			}
		}
	}
}

// TestSendDirect checks the anti-entropy stream: batches arrive in order,
// flagged Direct, and the stream's remote peer is the author.
func TestSendDirect(t *testing.T) {
	t.Parallel()
	a, ra := startMesh(t, testConfig(t))
	cfg := testConfig(t)
	cfg.Bootstrap = []string{tcpAddr(t, a)}
	b, _ := startMesh(t, cfg)

	var bs []*crdt.Batch
	for i := range 3 {
		x := batch(b.PeerID(), 0, fmt.Sprintf("full-%d", i), uint64(i+1))
		x.Flags = crdt.FlagFull
		bs = append(bs, x)
	}
	bs[2].Flags |= crdt.FlagLast
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := b.SendDirect(ctx, a.PeerID(), bs); err != nil {
		t.Fatal(err)
	}
	// SendDirect returns after the receiver has read everything, so the
	// batches are already handed over.
	ra.mu.Lock()
	var got []node.Inbound
	for _, in := range ra.batches {
		if in.Direct {
			got = append(got, in)
		}
	}
	ra.mu.Unlock()
	if len(got) != 3 {
		t.Fatalf("received %d direct batches, want 3", len(got))
	}
	for i, in := range got {
		if in.Batch.From.Peer != b.PeerID() || in.Batch.Windows[0].Key != fmt.Sprintf("full-%d", i) {
			t.Errorf("batch %d: from %s key %s", i, in.Batch.From.Peer, in.Batch.Windows[0].Key)
		}
	}
	if !got[2].Batch.Has(crdt.FlagLast) {
		t.Error("FlagLast lost")
	}
	if st := a.Stats(); st.DirectReceived != 3 {
		t.Errorf("DirectReceived = %d, want 3", st.DirectReceived)
	}
	if st := b.Stats(); st.DirectSent != 3 || st.DirectSentBytes == 0 {
		t.Errorf("DirectSent = %d (%d bytes), want 3", st.DirectSent, st.DirectSentBytes)
	}
	// An empty send is a valid (if pointless) exchange.
	if err := b.SendDirect(ctx, a.PeerID(), nil); err != nil {
		t.Errorf("empty SendDirect: %v", err)
	}
	if err := b.SendDirect(ctx, "not-a-peer", bs); err == nil || !strings.Contains(err.Error(), "bad peer ID") {
		t.Errorf("SendDirect to a bad ID: %v", err)
	}
}

// TestLifecycle covers Start/Publish/Close ordering errors and idempotent
// Close.
func TestLifecycle(t *testing.T) {
	t.Parallel()
	m := newMesh(t, testConfig(t))
	ctx := context.Background()
	if err := m.Publish(ctx, batch(m.PeerID(), 1, "k", 1)); err != ErrNotStarted {
		t.Errorf("Publish before Start: %v, want ErrNotStarted", err)
	}
	if !strings.HasPrefix(m.PeerID(), "12D3KooW") {
		t.Errorf("PeerID %q is not an Ed25519 peer ID in text form", m.PeerID())
	}
	for _, a := range m.Addrs() {
		if !strings.HasSuffix(a, "/p2p/"+m.PeerID()) {
			t.Errorf("address %s does not end in /p2p/<id>", a)
		}
	}
	if err := m.Start(ctx, &recorder{}); err != nil {
		t.Fatal(err)
	}
	if err := m.Start(ctx, &recorder{}); err == nil {
		t.Error("second Start succeeded")
	}
	// Publishing with nobody listening is not an error, and goes no
	// further than the encoding.
	if err := m.Publish(ctx, batch(m.PeerID(), 1, "k", 1)); err != nil {
		t.Errorf("Publish alone: %v", err)
	}
	if st := m.Stats(); st.PublishedAlone != 1 || st.Published != 0 {
		t.Errorf("after publishing alone: PublishedAlone %d, Published %d; want 1, 0", st.PublishedAlone, st.Published)
	}
	// Publish refuses a batch claiming another author.
	if err := m.Publish(ctx, batch("12D3KooWSomebodyElse", 2, "k", 1)); err == nil {
		t.Error("published a batch claiming another author")
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if err := m.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if err := m.Publish(ctx, batch(m.PeerID(), 3, "k", 1)); err != ErrClosed {
		t.Errorf("Publish after Close: %v, want ErrClosed", err)
	}
	if err := m.Start(ctx, &recorder{}); err != ErrClosed {
		t.Errorf("Start after Close: %v, want ErrClosed", err)
	}
}
