package node_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/ratemesh/ratemesh/limiter"
	"github.com/ratemesh/ratemesh/node"
)

// BenchmarkTickHoldingKeys measures what housekeeping costs a member
// holding many keys and serving nothing (issue 28): the time each Tick
// takes, which the runtime spends holding the lock every decision takes,
// so a decision that arrives during a Tick waits for it.
//
//   - expire: every key decided once in the same 1 s window, then 6 s of
//     Ticks every SyncInterval, across the instant the keys all expire
//     (2 s after they were made) and until they are all collected.
//   - idle: every key decided once in a 60 s window, then 10 s of Ticks
//     while they are all held.
//   - repair: as idle, for 11 s, across the repair that publishes every
//     window published since the last one again (RepairInterval, 5 s):
//     a burst of new keys is repaired over the syncs of a repair interval,
//     not in one Tick (outbox.startRepair).
//
// It reports the 99th percentile and the longest Tick (ms) and the share
// of one core spent in Ticks per second of virtual time (busy-%, the idle
// member's CPU). The keys are decided, and the Ticks that publish them
// run, with the timer stopped; but for the repair case, the repair that
// would publish them all again is put off past the span. Run it once per
// count, the setup is long; to compare commits, build the test binary at
// each and run them in turn (docs/performance.md):
//
//	go test -run='^$' -bench=TickHoldingKeys -benchtime=1x -count=3 -benchmem ./node/
func BenchmarkTickHoldingKeys(b *testing.B) {
	for _, keys := range []int{100_000, 1_000_000} {
		for _, sc := range []struct {
			name   string
			window time.Duration
			span   time.Duration
			held   int  // keys held at the end
			repair bool // the repair falls in the span
		}{
			{"expire", time.Second, 6 * time.Second, 0, false},
			{"idle", time.Minute, 10 * time.Second, keys, false},
			{"repair", time.Minute, 11 * time.Second, keys, true},
		} {
			b.Run(fmt.Sprintf("%s/keys=%d", sc.name, keys), func(b *testing.B) {
				var ticks []time.Duration
				var busy, virtual time.Duration
				for range b.N {
					b.StopTimer()
					c, now := coreHolding(b, keys, sc.window, sc.repair)
					sent := c.Stats().EntriesSent
					b.StartTimer()
					step := node.DefaultCoreConfig().SyncInterval
					for end := now.Add(sc.span); now.Before(end); {
						now = now.Add(step)
						start := time.Now()
						tick(c, now)
						d := time.Since(start)
						ticks = append(ticks, d)
						busy += d
					}
					virtual += sc.span
					b.StopTimer()
					held := 0
					for _, r := range c.Keys() {
						held += r.Keys
					}
					if held != sc.held {
						b.Fatalf("%d keys held after %v, want %d", held, sc.span, sc.held)
					}
					if sent = c.Stats().EntriesSent - sent; sc.repair && sent < uint64(keys) {
						b.Fatalf("the repair sent %d entries within %v, want all %d keys'", sent, sc.span, keys)
					}
				}
				slices.Sort(ticks)
				b.ReportMetric(float64(ticks[len(ticks)*99/100])/1e6, "p99-tick-ms")
				b.ReportMetric(float64(ticks[len(ticks)-1])/1e6, "max-tick-ms")
				b.ReportMetric(100*float64(busy)/float64(virtual), "busy-%")
			})
		}
	}
}

// coreHolding returns a lone member that has decided keys keys once each
// in one window of a sliding-window rule of the given window, and
// published them, and the instant it is at. Unless repair, its repairs
// are put off for an hour.
func coreHolding(b *testing.B, keys int, window time.Duration, repair bool) (*node.Core, time.Time) {
	b.Helper()
	cfg := node.DefaultCoreConfig()
	cfg.Peer, cfg.Incarnation = "bench", 1
	cfg.Rules = []limiter.Rule{{Name: "api", Algorithm: limiter.SlidingWindow, Limit: 10, Window: window, MaxKeys: keys}}
	// The repair that re-announces the windows just published is a cost
	// of the burst that made the keys, not of holding them: measured on
	// its own.
	if !repair {
		cfg.RepairInterval = time.Hour
	}
	now := time.UnixMilli(1_700_000_040_000) // the start of a 1 s and of a 60 s window
	c, err := node.NewCore(cfg, now)
	if err != nil {
		b.Fatal(err)
	}
	tick(c, now)
	for i := range keys {
		if d, err := c.Allow(now, "api", fmt.Sprintf("acct:%d", i), limiter.Request{}); err != nil || !d.Allowed {
			b.Fatalf("Allow = %+v, %v", d, err)
		}
	}
	// The first Tick publishes the keys, the next one settles the
	// publication (tens of ms for a million): costs of the burst that made
	// the keys, not of holding them.
	for range 2 {
		now = now.Add(cfg.SyncInterval)
		tick(c, now)
	}
	return c, now
}
