package node_test

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/ratemesh/ratemesh/crdt"
	"github.com/ratemesh/ratemesh/limiter"
	"github.com/ratemesh/ratemesh/node"
	"github.com/ratemesh/ratemesh/node/memnet"
)

// benchLimit is far above what a benchmark can spend in a window, so every
// decision runs in full and admits.
const (
	benchLimit = limiter.MaxLimit
	benchKey   = "acct:1234567"
)

// BenchmarkNodeAllow measures the embedding API's hot path: a started
// single node deciding one hot key. Compare it with BenchmarkLimiterAllow
// in the same run:
//
//	go test -run='^$' -bench='NodeAllow|LimiterAllow' -benchmem -count=5 ./node/
//
// startBenchNode starts a lone node with rule on memnet, closed when the
// benchmark ends.
func startBenchNode(b *testing.B, rule limiter.Rule) *node.Node {
	b.Helper()
	cfg := node.DefaultConfig()
	cfg.Peer, cfg.Seed = "bench", 1
	cfg.Rules = []limiter.Rule{rule}
	cfg.Transport = memnet.NewHub().Transport("bench")
	n, err := node.Start(context.Background(), cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = n.Close() })
	return n
}

func BenchmarkNodeAllow(b *testing.B) {
	n := startBenchNode(b, limiter.Rule{Name: "api", Algorithm: limiter.SlidingWindow, Limit: benchLimit, Window: time.Second})
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		d, err := n.Allow(ctx, "api", benchKey)
		if err != nil || !d.Allowed {
			b.Fatalf("Allow = %+v, %v", d, err)
		}
	}
}

// BenchmarkNodeAllowOptions is BenchmarkNodeAllow with a cost and a class.
func BenchmarkNodeAllowOptions(b *testing.B) {
	n := startBenchNode(b, limiter.Rule{Name: "api", Algorithm: limiter.SlidingWindow, Limit: benchLimit / 8, Window: time.Second,
		Classes: map[string]limiter.Class{"payer": {Multiplier: 5}}})
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		d, err := n.Allow(ctx, "api", benchKey, node.Cost(2), node.Class("payer"))
		if err != nil || !d.Allowed {
			b.Fatalf("Allow = %+v, %v", d, err)
		}
	}
}

// BenchmarkNodeAllowParallel is BenchmarkNodeAllow from GOMAXPROCS
// goroutines at once: the cost of the shared mutex under contention.
func BenchmarkNodeAllowParallel(b *testing.B) {
	n := startBenchNode(b, limiter.Rule{Name: "api", Algorithm: limiter.SlidingWindow, Limit: benchLimit, Window: time.Second})
	ctx := context.Background()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := n.Allow(ctx, "api", benchKey); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkCoreAllow is the core's Allow alone, at a fixed instant and
// without the runtime's mutex and clock: with BenchmarkNodeAllow and
// BenchmarkLimiterAllow it splits the node's overhead between the runtime
// and the core.
func BenchmarkCoreAllow(b *testing.B) {
	cfg := node.DefaultCoreConfig()
	cfg.Peer, cfg.Incarnation, cfg.Rand = "bench", 1, rand.New(rand.NewPCG(1, 1))
	cfg.Rules = []limiter.Rule{{Name: "api", Algorithm: limiter.SlidingWindow, Limit: benchLimit, Window: time.Second}}
	now := time.UnixMilli(1_700_000_000_123)
	c, err := node.NewCore(cfg, now)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		d, err := c.Allow(now, "api", benchKey, limiter.Request{})
		if err != nil || !d.Allowed {
			b.Fatalf("Allow = %+v, %v", d, err)
		}
	}
}

// BenchmarkLimiterAllow is the limiter's own hot path with the setup of
// the limiter package's BenchmarkAllow — a Limiter over a crdt.Container,
// sliding window, one hot key that has a previous window and another
// member's slot, a fixed env with N = 5 — so that one run gives the node's
// overhead over the bare decision.
func BenchmarkLimiterAllow(b *testing.B) {
	c := crdt.NewContainer()
	slots := crdt.NewSlotTable()
	self := slots.Intern(crdt.Slot{Peer: "self", Incarnation: 1})
	other := slots.Intern(crdt.Slot{Peer: "other", Incarnation: 1})
	l, err := limiter.New(limiter.Rule{Name: "api", Algorithm: limiter.SlidingWindow, Limit: benchLimit, Window: time.Second}, c, self)
	if err != nil {
		b.Fatal(err)
	}
	const nowMs = 1_700_000_000_123
	env := limiter.Env{NowMs: nowMs, Members: 5, AckDelay: 40 * time.Millisecond}
	if _, err := l.Allow(benchKey, limiter.Request{}, limiter.Env{NowMs: nowMs - 1000, Members: 5}); err != nil {
		b.Fatal(err)
	}
	l.Set().Series(benchKey).EnsureWindow(1000, nowMs/1000).Admitted.Raise(other, 100)
	b.ReportAllocs()
	for b.Loop() {
		d, err := l.Allow(benchKey, limiter.Request{}, env)
		if err != nil || !d.Allowed {
			b.Fatalf("Allow = %+v, %v", d, err)
		}
	}
}
