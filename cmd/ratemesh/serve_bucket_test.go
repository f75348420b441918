package main

import (
	"fmt"
	"github.com/ratemesh/ratemesh/internal/testutil"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// e2eBucketConfig is one token bucket named e2e (so drive can flood it):
// max 100 credits, 10 every 100 ms, share holds off (share_wait: 0). With
// holds a denied request waits for the refill and is then admitted, so
// each client issues no faster than the bucket admits and the flood never
// happens: about 730 offered of 730 admitted.
const e2eBucketConfig = `
mesh:
  suspect_after: 1s
  dead_after: 2s
  evict_after: 3s
rules:
  - {name: e2e, algorithm: token_bucket, max: 100, refill: 10, interval: 100ms, share_wait: 0}
`

// TestServeFiveProcessesBucket: five real `ratemesh serve` processes on
// loopback share one token bucket, flooded over HTTP at all five for 6 s.
// One bucket flooded from full admits max + rate × the run; the five
// admit within 2% of it.
func TestServeFiveProcessesBucket(t *testing.T) {
	if testing.Short() {
		t.Skip("starts five processes")
	}
	bin := buildBinary(t)
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "ratemesh.yaml")
	if err := os.WriteFile(cfgPath, []byte(e2eBucketConfig), 0o644); err != nil {
		t.Fatal(err)
	}
	serveArgs := func(i int, extra ...string) []string {
		return append([]string{"--config", cfgPath, "--api", "127.0.0.1:0", "--listen", "/ip4/127.0.0.1/tcp/0",
			"--data-dir", filepath.Join(dir, fmt.Sprintf("n%d", i))}, extra...)
	}
	const n = 5
	procs := []*proc{startServe(t, bin, serveArgs(0)...)}
	boot := procs[0].ready.Addrs[0]
	for i := 1; i < n; i++ {
		procs = append(procs, startServe(t, bin, serveArgs(i, "--bootstrap", boot)...))
	}
	for i, p := range procs {
		testutil.Eventually(t, 30*time.Second, func() (bool, string) {
			st := p.states(t)
			alive := 0
			for _, s := range st {
				if s == "alive" {
					alive++
				}
			}
			return alive == n, fmt.Sprintf("node %d sees %d alive members: %v", i, n, st)
		})
	}
	var mu sync.Mutex
	admitted, offered := 0, 0
	perNode := map[int]int{}
	record := func(o outcome) {
		mu.Lock()
		defer mu.Unlock()
		offered++
		if o.allowed {
			admitted++
			perNode[o.node]++
		}
	}
	stop := make(chan struct{})
	start := time.Now()
	wg := drive(t, procs, []int{0, 1, 2, 3, 4}, 2, "kb", stop, record)
	time.Sleep(6 * time.Second) // the traffic phase itself, not a wait for a condition
	close(stop)
	wg.Wait()
	span := time.Since(start)
	one := 100 + 100*span.Seconds()
	mu.Lock()
	defer mu.Unlock()
	t.Logf("offered %d in %v, admitted %d (per node %v); one bucket admits %.0f (%.4f×)",
		offered, span.Round(time.Millisecond), admitted, perNode, one, float64(admitted)/one)
	if float64(offered) < 3*one {
		if raceEnabled {
			t.Skipf("only %d offered under the race detector: not a flood; the bound is checked without it", offered)
		}
		t.Fatalf("only %d offered: not a flood", offered)
	}
	if r := float64(admitted) / one; r > 1.02 || r < 0.98 {
		t.Errorf("admitted %d, one bucket %.0f: %.4f×, outside 2%%", admitted, one, r)
	}
}
