package memnet_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ratemesh/ratemesh/crdt"
	"github.com/ratemesh/ratemesh/internal/testutil"
	"github.com/ratemesh/ratemesh/node"
	"github.com/ratemesh/ratemesh/node/memnet"
)

// recorder is a Handler that records what it hears.
type recorder struct {
	mu       sync.Mutex
	batches  []node.Inbound
	connects []string
}

func (r *recorder) HandleBatch(in node.Inbound) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.batches = append(r.batches, in)
}

func (r *recorder) PeerConnected(peer string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.connects = append(r.connects, peer)
}

func (r *recorder) seqs() []uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []uint64
	for _, in := range r.batches {
		out = append(out, in.Batch.Seq)
	}
	return out
}

func (r *recorder) connected() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.connects)
}

func batch(peer string, seq uint64) *crdt.Batch {
	return &crdt.Batch{Version: crdt.Version, From: crdt.Slot{Peer: peer, Incarnation: 1}, Seq: seq}
}

// attach starts transports for peers on hub with recorders.
func attach(t *testing.T, hub *memnet.Hub, peers ...string) (map[string]*memnet.Transport, map[string]*recorder) {
	t.Helper()
	ts, rs := map[string]*memnet.Transport{}, map[string]*recorder{}
	for _, p := range peers {
		ts[p], rs[p] = hub.Transport(p), &recorder{}
		if err := ts[p].Start(context.Background(), rs[p]); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ts[p].Close() })
	}
	return ts, rs
}

func TestPublishReachesEveryOtherMemberInOrder(t *testing.T) {
	hub := memnet.NewHub()
	hub.SetDelay(time.Millisecond)
	ts, rs := attach(t, hub, "a", "b", "c")
	ctx := context.Background()
	for seq := uint64(1); seq <= 20; seq++ {
		if err := ts["a"].Publish(ctx, batch("a", seq)); err != nil {
			t.Fatal(err)
		}
	}
	want := make([]uint64, 20)
	for i := range want {
		want[i] = uint64(i + 1)
	}
	testutil.Eventually(t, 5*time.Second, func() (bool, string) {
		b, c := rs["b"].seqs(), rs["c"].seqs()
		return slices.Equal(b, want) && slices.Equal(c, want), fmt.Sprintf("b got %v, c got %v", b, c)
	})
	if got := rs["a"].seqs(); len(got) != 0 {
		t.Errorf("the publisher heard its own batches %v", got)
	}
	// Each receiver owns its own copy.
	rs["b"].mu.Lock()
	rs["c"].mu.Lock()
	if rs["b"].batches[0].Batch == rs["c"].batches[0].Batch {
		t.Error("two receivers share one *Batch")
	}
	rs["c"].mu.Unlock()
	rs["b"].mu.Unlock()
}

func TestAttachReportsPeersBothWays(t *testing.T) {
	hub := memnet.NewHub()
	_, rs := attach(t, hub, "a", "b", "c")
	testutil.Eventually(t, 5*time.Second, func() (bool, string) {
		a, b, c := rs["a"].connected(), rs["b"].connected(), rs["c"].connected()
		slices.Sort(a)
		slices.Sort(b)
		slices.Sort(c)
		ok := slices.Equal(a, []string{"b", "c"}) && slices.Equal(b, []string{"a", "c"}) && slices.Equal(c, []string{"a", "b"})
		return ok, fmt.Sprintf("a %v, b %v, c %v", a, b, c)
	})
	if got := hub.Peers(); !slices.Equal(got, []string{"a", "b", "c"}) {
		t.Errorf("Peers() = %v", got)
	}
}

func TestCutAndHeal(t *testing.T) {
	hub := memnet.NewHub()
	ts, rs := attach(t, hub, "a", "b", "c")
	ctx := context.Background()
	testutil.Eventually(t, 5*time.Second, func() (bool, string) {
		return len(rs["a"].connected()) == 2, "a not connected to both"
	})
	hub.Cut("a", "b")
	if err := ts["a"].Publish(ctx, batch("a", 1)); err != nil {
		t.Fatal(err)
	}
	if err := ts["a"].SendDirect(ctx, "b", []*crdt.Batch{batch("a", 1)}); !errors.Is(err, memnet.ErrUnreachable) {
		t.Errorf("SendDirect across a cut: err = %v, want ErrUnreachable", err)
	}
	// c hears the batch; b, cut off, never does. A marker sent to b by c
	// after it shows that b's queue has moved past it.
	testutil.Eventually(t, 5*time.Second, func() (bool, string) {
		return slices.Equal(rs["c"].seqs(), []uint64{1}), fmt.Sprintf("c got %v", rs["c"].seqs())
	})
	if err := ts["c"].SendDirect(ctx, "b", []*crdt.Batch{batch("c", 99)}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 5*time.Second, func() (bool, string) {
		return slices.Contains(rs["b"].seqs(), 99), "b did not get c's marker"
	})
	if got := rs["b"].seqs(); !slices.Equal(got, []uint64{99}) {
		t.Errorf("b, cut from a, got %v; want only c's marker", got)
	}

	before := len(rs["b"].connected())
	hub.Heal("a", "b")
	testutil.Eventually(t, 5*time.Second, func() (bool, string) {
		a, b := rs["a"].connected(), rs["b"].connected()
		return len(b) == before+1 && b[len(b)-1] == "a" && a[len(a)-1] == "b", fmt.Sprintf("after heal: a %v, b %v", a, b)
	})
	if err := ts["a"].SendDirect(ctx, "b", []*crdt.Batch{batch("a", 2)}); err != nil {
		t.Fatalf("SendDirect after the heal: %v", err)
	}
	testutil.Eventually(t, 5*time.Second, func() (bool, string) {
		return slices.Contains(rs["b"].seqs(), 2), "b did not get a's batch after the heal"
	})
	rs["b"].mu.Lock()
	last := rs["b"].batches[len(rs["b"].batches)-1]
	rs["b"].mu.Unlock()
	if !last.Direct {
		t.Error("a SendDirect batch arrived with Direct false")
	}
}

func TestTransportRefusals(t *testing.T) {
	hub := memnet.NewHub()
	ts, _ := attach(t, hub, "a")
	ctx := context.Background()
	if err := ts["a"].Publish(ctx, batch("mallory", 1)); !errors.Is(err, memnet.ErrForged) {
		t.Errorf("Publish of another peer's batch: err = %v, want ErrForged", err)
	}
	if err := hub.Transport("a").Start(ctx, &recorder{}); !errors.Is(err, memnet.ErrDuplicate) {
		t.Errorf("a second transport for a: err = %v, want ErrDuplicate", err)
	}
	if err := hub.Transport("b").Publish(ctx, batch("b", 1)); !errors.Is(err, memnet.ErrNotStarted) {
		t.Errorf("Publish before Start: err = %v, want ErrNotStarted", err)
	}
	if err := ts["a"].Close(); err != nil {
		t.Fatal(err)
	}
	if err := ts["a"].Close(); err != nil {
		t.Errorf("second Close = %v", err)
	}
	if err := ts["a"].Publish(ctx, batch("a", 1)); !errors.Is(err, memnet.ErrClosed) {
		t.Errorf("Publish after Close: err = %v, want ErrClosed", err)
	}
	if got := hub.Peers(); len(got) != 0 {
		t.Errorf("Peers() after Close = %v, want none", got)
	}
}
