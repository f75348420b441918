package persistence_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ratemesh/ratemesh/crdt"
	"github.com/ratemesh/ratemesh/limiter"
	"github.com/ratemesh/ratemesh/node"
	"github.com/ratemesh/ratemesh/node/memnet"
	"github.com/ratemesh/ratemesh/persistence"
)

// BenchmarkNodeAllow is node's BenchmarkNodeAllow on a persisted rule (a
// 1-hour window), with the store on pebble and on go-datastore's map:
// persistence must not sit on Allow's path. It runs at the default
// flush_interval (1s) and, as a stress case, flushing every 10 ms so that
// flushes run throughout (on two cores their sync then competes with the
// benchmark for CPU, not for the node's lock). Compare the pairs in one run:
//
//	go test -run='^$' -bench='NodeAllow' -benchmem -count=5 ./persistence/
func BenchmarkNodeAllow(b *testing.B) {
	for _, bc := range []struct {
		kind  string
		flush time.Duration
	}{{"memory", time.Second}, {"pebble", time.Second}, {"memory", 10 * time.Millisecond}, {"pebble", 10 * time.Millisecond}} {
		kind := bc.kind
		b.Run(fmt.Sprintf("%s/flush=%v", kind, bc.flush), func(b *testing.B) {
			st := persistence.NewMemory()
			if kind == "pebble" {
				var err error
				if st, err = persistence.Open(b.TempDir()); err != nil {
					b.Fatal(err)
				}
			}
			cfg := node.DefaultConfig()
			cfg.Peer, cfg.Store = "bench", st
			cfg.Rules = []limiter.Rule{{Name: "api", Algorithm: limiter.SlidingWindow, Limit: limiter.MaxLimit, Window: time.Hour}}
			cfg.Transport = memnet.NewHub().Transport("bench")
			cfg.FlushInterval = bc.flush
			ctx := context.Background()
			n, err := node.Start(ctx, cfg)
			if err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				d, err := n.Allow(ctx, "api", "acct:1234567")
				if err != nil || !d.Allowed {
					b.Fatalf("Allow = %+v, %v", d, err)
				}
			}
			b.StopTimer()
			if err := n.Close(); err != nil {
				b.Fatal(err)
			}
			if bc.flush < time.Second && n.Stats().PersistFlushes == 0 && b.N > 1000 {
				b.Errorf("no flush ran during the benchmark")
			}
		})
	}
}

// BenchmarkFlush measures one flush of changed window records on pebble
// (read for the per-field max, one batch, one sync), reported per entry:
//
//	go test -run='^$' -bench='Flush' -benchmem -count=5 ./persistence/
func BenchmarkFlush(b *testing.B) {
	for _, size := range []int{100, 2000} {
		b.Run(fmt.Sprint(size), func(b *testing.B) {
			st, err := persistence.Open(b.TempDir())
			if err != nil {
				b.Fatal(err)
			}
			defer st.Close()
			ctx := context.Background()
			recs := make([]node.WindowRecord, size)
			for i := range recs {
				recs[i] = node.WindowRecord{Rule: "hour", Key: fmt.Sprintf("acct:%07d", i), WindowMs: 3_600_000, Window: 480_000,
					Slot: crdt.Slot{Peer: "12D3KooWGzBbE1kZb3hNqYk3PvpbBQK2G8Yy7hnzqbk4wD3SNdEw", Incarnation: 1_700_000_000_000}}
			}
			v := uint64(0)
			for b.Loop() {
				v++
				for i := range recs {
					recs[i].Admitted, recs[i].Attempted = v, v
				}
				if err := st.Flush(ctx, node.Flush{Windows: recs, CollectBeforeMs: 1}); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*size), "ns/entry")
		})
	}
}

// BenchmarkExport measures the part of a flush that holds the node's
// mutex: Core.Persist (the Persister's export) with keys persisted keys (1-hour windows) of
// which 100 changed since the last export, by the member's own
// admissions. The admissions themselves are outside the timing. It
// reports the time per changed key (what the export should cost) and per
// persisted key (what a walk over every window would cost).
//
//	go test -run='^$' -bench='Export' -benchmem -count=5 ./persistence/
func BenchmarkExport(b *testing.B) {
	for _, keys := range []int{10_000, 100_000} {
		b.Run(fmt.Sprintf("keys=%d/changed=100", keys), func(b *testing.B) {
			cfg := node.DefaultCoreConfig()
			now := time.UnixMilli(472_223 * 3_600_000) // an hour's start: the window lasts the run
			cfg.Peer, cfg.Incarnation = "bench", 1
			cfg.Rules = []limiter.Rule{{Name: "api", Algorithm: limiter.FixedWindow, Limit: limiter.MaxLimit, Window: time.Hour}}
			cfg.SyncInterval = time.Millisecond
			c, err := node.NewCore(cfg, now)
			if err != nil {
				b.Fatal(err)
			}
			const changed = 100
			names := make([]string, keys)
			for i := range names {
				names[i] = fmt.Sprintf("k%d", i)
				if _, err := c.Allow(now, "api", names[i], limiter.Request{}); err != nil {
					b.Fatal(err)
				}
			}
			node.NewPersister(c, time.Minute)
			if f := export(c, now); len(f.Windows) != keys {
				b.Fatalf("first export: %d records, want %d", len(f.Windows), keys)
			}
			c.Tick(now) // gossip takes the admissions, as the runtime's run loop does
			c.Ready()   // and hands them over
			next := 0
			allow := func(n int) {
				for range n {
					if _, err := c.Allow(now, "api", names[next], limiter.Request{}); err != nil {
						b.Fatal(err)
					}
					next = (next + 1) % keys
				}
			}
			for b.Loop() {
				// Between two flushes the run loop publishes most changes
				// (Tick takes them from the container's dirty set); the
				// latest are still there when the flush comes.
				b.StopTimer()
				allow(changed / 2)
				now = now.Add(cfg.SyncInterval)
				c.Tick(now)
				c.Ready()
				allow(changed - changed/2)
				b.StartTimer()
				if f := export(c, now); len(f.Windows) != changed {
					b.Fatalf("exported %d, want %d", len(f.Windows), changed)
				}
			}
			ns := float64(b.Elapsed().Nanoseconds()) / float64(b.N)
			b.ReportMetric(ns/changed, "ns/changed")
			b.ReportMetric(ns/float64(keys), "ns/key")
		})
	}
}

// export has c's Persister export at now (Core.Persist) and returns the
// Flush its Ready hands over.
func export(c *node.Core, now time.Time) node.Flush {
	c.Persist(now)
	return *c.Ready().Persist
}
