package node

import (
	"fmt"
	"testing"
	"time"

	"github.com/ratemesh/ratemesh/limiter"
)

// TestTickCollectsInSlices checks that a Tick collects at most
// collectBudget keys plus those made since the last Tick, and that
// the Ticks after it, every SyncInterval, collect the rest: 2.5 budgets'
// worth of keys expiring at once go in three Ticks, all counted.
func TestTickCollectsInSlices(t *testing.T) {
	const keys = collectBudget*5/2 + 1
	cfg := DefaultCoreConfig()
	cfg.Peer, cfg.Incarnation = "p", 1
	cfg.Rules = []limiter.Rule{{Name: "api", Algorithm: limiter.FixedWindow, Limit: 10, Window: time.Second, MaxKeys: keys}}
	now := time.UnixMilli(1_700_000_040_000) // a window starts
	c, err := NewCore(cfg, now)
	if err != nil {
		t.Fatal(err)
	}
	tick(c, now)
	for i := range keys {
		if d, err := c.Allow(now, "api", fmt.Sprintf("k%d", i), limiter.Request{}); err != nil || !d.Allowed {
			t.Fatalf("Allow = %+v, %v", d, err)
		}
	}
	// Tick every SyncInterval to the instant the keys expire (the end of
	// the next window), 2 s on: the collection 500 ms in saw the keys
	// made and nothing due.
	step := cfg.SyncInterval
	for end := now.Add(2 * time.Second); now.Before(end.Add(-step)); {
		now = now.Add(step)
		tick(c, now)
	}
	if got := c.keyCount(); got != keys {
		t.Fatalf("%d keys held before they expire, want %d", got, keys)
	}
	var held []int
	for range 4 {
		now = now.Add(step)
		tick(c, now)
		held = append(held, c.keyCount())
	}
	want := []int{keys - collectBudget, keys - 2*collectBudget, 0, 0}
	if fmt.Sprint(held) != fmt.Sprint(want) {
		t.Errorf("keys held after each Tick from the expiry on = %v, want %v", held, want)
	}
	if st := c.Stats(); st.KeysCollected != keys || st.WindowsCollected != keys {
		t.Errorf("collected %d keys and %d windows, want %d each", st.KeysCollected, st.WindowsCollected, keys)
	}
	if c.collectBehind {
		t.Errorf("collectBehind after the backlog is gone")
	}
}
