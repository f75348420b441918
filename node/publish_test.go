package node_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ratemesh/ratemesh/crdt"
	"github.com/ratemesh/ratemesh/internal/testutil"
	"github.com/ratemesh/ratemesh/limiter"
	"github.com/ratemesh/ratemesh/node"
)

func TestCoreFlushPublishesPendingChangesEarly(t *testing.T) {
	start := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	rules := []limiter.Rule{fixedRule("api", 100, time.Hour)}
	c := newCore(t, "a", start, rules, nil)
	sync := node.DefaultCoreConfig().SyncInterval

	first := tick(c, start) // the first sync is due at once
	if len(first.Messages) != 1 || !first.NextTick.Equal(start.Add(sync)) {
		t.Fatalf("first Tick: %d messages, next tick %v; want 1 and %v", len(first.Messages), first.NextTick, start.Add(sync))
	}
	if !c.LastPublished().Equal(start) {
		t.Fatalf("LastPublished() = %v, want %v", c.LastPublished(), start)
	}
	at := start.Add(3 * time.Millisecond)
	if node.Pending(c) {
		t.Fatal("Pending() = true before any change")
	}
	if rd := flush(c, at); len(rd.Messages) != 0 {
		t.Fatalf("Flush without a change published %d batches", len(rd.Messages))
	}
	if _, err := c.Allow(at, "api", "k", limiter.Request{}); err != nil {
		t.Fatal(err)
	}
	if !node.Pending(c) {
		t.Fatal("Pending() = false after a decision")
	}
	rd := flush(c, at)
	if len(rd.Messages) != 1 {
		t.Fatalf("Flush published %d batches, want 1", len(rd.Messages))
	}
	b := rd.Messages[0]
	if b.Seq != first.Messages[0].Seq+1 || len(b.Windows) != 1 || b.Windows[0].Key != "k" || b.Windows[0].Admitted != 1 {
		t.Fatalf("Flush's batch: seq %d, windows %+v; want seq %d and k admitted 1", b.Seq, b.Windows, first.Messages[0].Seq+1)
	}
	if node.Pending(c) || !c.LastPublished().Equal(at) {
		t.Fatalf("after Flush: Pending() = %v, LastPublished() = %v; want false, %v", node.Pending(c), c.LastPublished(), at)
	}
	// The sync came early: the next one is due a whole interval later,
	// and the tick that was due before publishes nothing.
	if rd := tick(c, start.Add(sync)); len(rd.Messages) != 0 || !rd.NextTick.Equal(at.Add(sync)) {
		t.Fatalf("Tick at the old sync time: %d messages, next tick %v; want 0 and %v", len(rd.Messages), rd.NextTick, at.Add(sync))
	}
	if _, err := c.Allow(at.Add(time.Millisecond), "api", "k", limiter.Request{}); err != nil {
		t.Fatal(err)
	}
	if rd := tick(c, at.Add(sync)); len(rd.Messages) != 1 || rd.Messages[0].Windows[0].Admitted != 2 {
		t.Fatalf("Tick at the new sync time: %+v, want one batch with k admitted 2", rd.Messages)
	}
	if _, err := c.Allow(at.Add(sync), "api", "k", limiter.Request{}); err != nil {
		t.Fatal(err)
	}
	if rd := leave(c, at.Add(sync)); len(rd.Messages) != 1 || rd.Messages[0].Windows[0].Admitted != 3 {
		t.Fatalf("Leave: %+v, want one batch with k admitted 3", rd.Messages)
	}
	if rd := flush(c, at.Add(sync)); node.Pending(c) || len(rd.Messages) != 0 {
		t.Fatalf("after Leave: Pending() = %v, Flush published %d batches; want false, 0", node.Pending(c), len(rd.Messages))
	}
}

// published is one batch a recordingTransport saw.
type published struct {
	clock time.Time // the batch's Clock: when the core built it
	keys  []string
}

// recordingTransport records what the runtime publishes; it has no peers.
type recordingTransport struct {
	mu  sync.Mutex
	got []published
}

func (r *recordingTransport) Start(context.Context, node.Handler) error { return nil }
func (r *recordingTransport) SendDirect(context.Context, string, []*crdt.Batch) error {
	return nil
}
func (r *recordingTransport) Close() error { return nil }
func (r *recordingTransport) Publish(_ context.Context, b *crdt.Batch) error {
	p := published{clock: time.UnixMilli(b.Clock)}
	for _, e := range b.Windows {
		p.keys = append(p.keys, e.Key)
	}
	r.mu.Lock()
	r.got = append(r.got, p)
	r.mu.Unlock()
	return nil
}

// batches returns what was published so far.
func (r *recordingTransport) batches() []published {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.got)
}

// carrying returns the index of the first batch carrying key, or -1.
func carrying(ps []published, key string) int {
	return slices.IndexFunc(ps, func(p published) bool { return slices.Contains(p.keys, key) })
}

// slowSync returns a runtime config whose sync tick is 5 s away, so that
// any batch within seconds of a change comes from the leading edge.
func slowSync(tr node.Transport, gap time.Duration) node.Config {
	cfg := node.DefaultConfig()
	cfg.Peer, cfg.Rules, cfg.Transport = "a", []limiter.Rule{fixedRule("api", 1000, time.Hour)}, tr
	cfg.SyncInterval, cfg.Heartbeat = 5*time.Second, 5*time.Second
	cfg.SuspectAfter, cfg.DeadAfter = 6*time.Second, 6*time.Second
	cfg.PublishGap = gap
	return cfg
}

func TestRuntimePublishesOnTheLeadingEdge(t *testing.T) {
	const gap = 100 * time.Millisecond
	tr := &recordingTransport{}
	n := rtStart(t, slowSync(tr, gap))
	ctx := context.Background()
	wait := func(key string) (published, published) {
		t.Helper()
		var ps []published
		testutil.Eventually(t, 3*time.Second, func() (bool, string) {
			ps = tr.batches()
			return carrying(ps, key) >= 0, "a batch carrying " + key
		})
		i := carrying(ps, key)
		if i == 0 {
			t.Fatalf("the first batch carries %s", key)
		}
		return ps[i-1], ps[i]
	}
	testutil.Eventually(t, 3*time.Second, func() (bool, string) { return len(tr.batches()) > 0, "the first sync" })

	// Right after a batch: the change waits for the gap, not the tick.
	if _, err := n.Allow(ctx, "api", "k1"); err != nil {
		t.Fatal(err)
	}
	prev, b1 := wait("k1")
	if d := b1.clock.Sub(prev.clock); d < gap-time.Millisecond || d >= 5*time.Second {
		t.Errorf("k1 went out %v after the batch before it, want at least the gap %v and before the tick", d, gap)
	}
	// Changes made within the gap go out together, a gap later (unless
	// the machine stalls between them for longer than the gap).
	for _, k := range []string{"k2", "k3"} {
		if _, err := n.Allow(ctx, "api", k); err != nil {
			t.Fatal(err)
		}
	}
	for _, k := range []string{"k2", "k3"} {
		prev, b := wait(k)
		if d := b.clock.Sub(prev.clock); d < gap-time.Millisecond || d >= 5*time.Second {
			t.Errorf("%s went out %v after the batch before it, want at least the gap %v and before the tick", k, d, gap)
		}
	}
	// A change long after the last batch goes out at once.
	testutil.Eventually(t, 3*time.Second, func() (bool, string) {
		return time.Since(tr.batches()[len(tr.batches())-1].clock) > 3*gap, "the gap passed"
	})
	at := time.Now()
	if _, err := n.Allow(ctx, "api", "k4"); err != nil {
		t.Fatal(err)
	}
	_, b4 := wait("k4")
	if d := b4.clock.Sub(at); d >= 5*time.Second {
		t.Errorf("k4 went out %v after the change, want before the tick", d)
	}
	t.Logf("a sparse change went out %v after Allow (clock resolution 1 ms)", b4.clock.Sub(at).Round(time.Millisecond))
}

func TestRuntimeWithoutLeadingEdgePublishesOnTheTick(t *testing.T) {
	tr := &recordingTransport{}
	cfg := slowSync(tr, -1)
	cfg.SyncInterval = 300 * time.Millisecond
	n := rtStart(t, cfg)
	testutil.Eventually(t, 3*time.Second, func() (bool, string) { return len(tr.batches()) > 0, "the first sync" })
	if _, err := n.Allow(context.Background(), "api", "k1"); err != nil {
		t.Fatal(err)
	}
	var ps []published
	testutil.Eventually(t, 5*time.Second, func() (bool, string) {
		ps = tr.batches()
		return carrying(ps, "k1") > 0, "a batch carrying k1"
	})
	i := carrying(ps, "k1")
	if d := ps[i].clock.Sub(ps[i-1].clock); d < cfg.SyncInterval-time.Millisecond {
		t.Errorf("k1 went out %v after the batch before it, want a whole sync interval %v", d, cfg.SyncInterval)
	}
}
