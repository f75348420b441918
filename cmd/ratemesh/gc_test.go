package main

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"testing"
	"time"

	"github.com/ratemesh/ratemesh/internal/testutil"
)

func TestGCPercent(t *testing.T) {
	for _, c := range []struct {
		headroom, live uint64
		want           int
	}{
		{64 << 20, 0, 1600},       // before the first collection: a goal of 64 MiB
		{64 << 20, 1 << 10, 1600}, // the runtime's least goal, 4 MiB × 16, is the headroom
		{64 << 20, 4 << 20, 1600},
		{64 << 20, 3 << 20, 1600},
		{64 << 20, 6 << 20, 1100}, // 1067 rounded up: at least the headroom
		{64 << 20, 32 << 20, 200}, // 64 MiB more
		{64 << 20, 64 << 20, 100}, // Go's default
		{64 << 20, 96 << 20, 70},  // 66.7 rounded up to a multiple of 5: still 64 MiB more
		{64 << 20, 128 << 20, 50},
		{64 << 20, 200 << 20, 35}, // 32 rounded up
		{64 << 20, 256 << 20, 25}, // a quarter of the live heap from here on
		{64 << 20, 1 << 30, 25},
		{64 << 20, 10 << 30, 25},
	} {
		if got := gcPercent(c.headroom, c.live); got != c.want {
			t.Errorf("gcPercent(%d, %d) = %d, want %d", c.headroom, c.live, got, c.want)
		}
	}
}

// TestGCTuner: the tuner raises GOGC after a collection so that this
// test process's small heap may grow by the headroom, and stays off when
// the environment sets GOGC or GOMEMLIMIT.
func TestGCTuner(t *testing.T) {
	for _, env := range []map[string]string{{"GOGC": "200"}, {"GOMEMLIMIT": "1GiB"}} {
		if _, ok := startGCTuner(64<<20, func(k string) string { return env[k] }); ok {
			t.Errorf("started with %v in the environment", env)
		}
	}
	prev := debug.SetGCPercent(100)
	t.Cleanup(func() { debug.SetGCPercent(prev) })
	stop, ok := startGCTuner(64<<20, func(string) string { return "" })
	if !ok {
		t.Fatal("not started")
	}
	t.Cleanup(stop)
	current := func() int {
		p := debug.SetGCPercent(-1)
		debug.SetGCPercent(p)
		return p
	}
	testutil.Eventually(t, 10*time.Second, func() (bool, string) {
		runtime.GC()
		p := current()
		return p >= 800, fmt.Sprintf("GOGC %d after a collection, want ≥ 800 for a heap of a few MB and 64 MiB of headroom", p)
	})
}
