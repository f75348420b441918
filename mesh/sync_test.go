package mesh

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ratemesh/ratemesh/crdt"
	"github.com/ratemesh/ratemesh/internal/testutil"
	"github.com/ratemesh/ratemesh/node"
)

// slowHandler is a member whose node merges each anti-entropy batch
// slowly, as on a starved host: HandleBatch of a direct batch returns
// after delay, or, with gate set, not before the gate closes.
type slowHandler struct {
	recorder
	delay time.Duration
	gate  chan struct{}
}

func (h *slowHandler) HandleBatch(in node.Inbound) {
	if in.Direct {
		if h.gate != nil {
			<-h.gate
		}
		time.Sleep(h.delay) // the merge's cost, not a wait for a condition
	}
	h.recorder.HandleBatch(in)
}

// startWith starts a mesh for cfg delivering to h.
func startWith(t *testing.T, cfg Config, h node.Handler) *Mesh {
	t.Helper()
	m := newMesh(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := m.Start(ctx, h); err != nil {
		t.Fatal(err)
	}
	return m
}

// bigBatches returns n full-state batches of from, each carrying keys
// entries (about 60 bytes each).
func bigBatches(from string, n, keys int) []*crdt.Batch {
	out := make([]*crdt.Batch, n)
	for i := range out {
		b := batch(from, 0, "", 1)
		b.Flags = crdt.FlagFull
		b.Windows = b.Windows[:0]
		for k := range keys {
			b.Windows = append(b.Windows, crdt.WindowEntry{Rule: "api", Key: fmt.Sprintf("batch-%03d-key-%06d", i, k),
				WindowMs: 1000, Window: 1_700_000_000, Admitted: 1, Attempted: 1})
		}
		out[i] = b
	}
	out[n-1].Flags |= crdt.FlagLast
	return out
}

// TestSendDirectOutlastsSyncTimeoutWhileProgressing: a full state whose
// transfer takes three times SyncTimeout, because the receiver merges
// each batch slowly, still arrives whole and in order: SyncTimeout bounds
// each step without progress, not the exchange. (When it bounded the
// whole exchange, a member of a mesh on a starved host never finished a
// rejoin transfer of half a million keys: each attempt was reset at 30 s
// and began again.)
func TestSendDirectOutlastsSyncTimeoutWhileProgressing(t *testing.T) {
	t.Parallel()
	const timeout = 600 * time.Millisecond
	const frames, keys = 24, 600
	cfgA := testConfig(t)
	cfgA.SyncTimeout = timeout
	h := &slowHandler{delay: timeout / 8}
	a := startWith(t, cfgA, h)
	cfgB := testConfig(t)
	cfgB.SyncTimeout = timeout
	cfgB.Bootstrap = []string{tcpAddr(t, a)}
	b, _ := startMesh(t, cfgB)

	bs := bigBatches(b.PeerID(), frames, keys)
	if data, _ := bs[0].Encode(); frames*len(data) < 512<<10 {
		t.Fatalf("the batches encode to %d bytes: too few to fill the stream's window (256 KiB) twice", frames*len(data))
	}
	start := time.Now()
	if err := b.SendDirect(context.Background(), a.PeerID(), bs); err != nil {
		t.Fatalf("SendDirect after %v: %v", time.Since(start), err)
	}
	took := time.Since(start)
	if took < 2*timeout {
		t.Fatalf("the transfer took %v, under twice the sync timeout %v: it does not test a long transfer", took, timeout)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.batches) != frames {
		t.Fatalf("received %d batches, want %d", len(h.batches), frames)
	}
	for i, in := range h.batches {
		if want := fmt.Sprintf("batch-%03d-key-%06d", i, 0); !in.Direct || in.Batch.Windows[0].Key != want || len(in.Batch.Windows) != keys {
			t.Errorf("batch %d: direct %v, first key %s of %d, want %s of %d", i, in.Direct, in.Batch.Windows[0].Key, len(in.Batch.Windows), want, keys)
		}
	}
}

// TestSendDirectGivesUpOnAStalledReceiver: a receiver that stops taking
// batches (its merge never returns) makes SendDirect fail about
// SyncTimeout after the last progress, not hang; the batches taken before
// the stall were delivered.
func TestSendDirectGivesUpOnAStalledReceiver(t *testing.T) {
	t.Parallel()
	const timeout = 300 * time.Millisecond
	cfgA := testConfig(t)
	cfgA.SyncTimeout = 10 * time.Second // the receiver is not the one to give up here
	h := &slowHandler{gate: make(chan struct{})}
	a := startWith(t, cfgA, h)
	var once sync.Once
	release := func() { once.Do(func() { close(h.gate) }) }
	t.Cleanup(release)
	cfgB := testConfig(t)
	cfgB.SyncTimeout = timeout
	cfgB.Bootstrap = []string{tcpAddr(t, a)}
	b, _ := startMesh(t, cfgB)

	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- b.SendDirect(context.Background(), a.PeerID(), bigBatches(b.PeerID(), 24, 2000)) }()
	select {
	case err := <-done:
		took := time.Since(start)
		if err == nil {
			t.Fatal("SendDirect to a stalled receiver succeeded")
		}
		if took < timeout {
			t.Errorf("SendDirect gave up after %v, before the sync timeout %v", took, timeout)
		}
		if !isTimeout(err) {
			t.Errorf("error %v does not say the peer timed out", err)
		}
	case <-time.After(20 * timeout):
		t.Fatalf("SendDirect to a stalled receiver still waiting after %v", 20*timeout)
	}
	release()
	testutil.Eventually(t, 5*time.Second, func() (bool, string) {
		h.mu.Lock()
		defer h.mu.Unlock()
		return len(h.batches) >= 1, "the batch read before the stall delivered"
	})
}

// TestSyncStreamIdleReset: a peer that opens the anti-entropy stream,
// sends one batch and then nothing more without closing is cut off about
// SyncTimeout after that batch; the batch it sent is delivered.
func TestSyncStreamIdleReset(t *testing.T) {
	t.Parallel()
	const timeout = 300 * time.Millisecond
	cfgA := testConfig(t)
	cfgA.SyncTimeout = timeout
	a, ra := startMesh(t, cfgA)
	c, _ := startMesh(t, testConfig(t))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Host().Connect(ctx, a.Host().Peerstore().PeerInfo(a.Host().ID())); err != nil {
		t.Fatal(err)
	}
	s, err := c.Host().NewStream(ctx, a.Host().ID(), a.SyncProtocol())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Reset()
	if err := writeFrames(s, [][]byte{encode(t, batch(c.PeerID(), 0, "before-the-stall", 1))}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_ = s.SetReadDeadline(time.Now().Add(20 * timeout))
	var one [1]byte
	_, err = s.Read(one[:])
	took := time.Since(start)
	if err == nil || isTimeout(err) {
		t.Fatalf("the receiver did not cut the stalled stream off within %v: %v", took, err)
	}
	if took < timeout/2 {
		t.Errorf("the stream was cut off after %v, well before the sync timeout %v", took, timeout)
	}
	if !ra.has(c.PeerID(), "before-the-stall") {
		t.Error("the batch sent before the stall was not delivered")
	}
}
