package mesh_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ratemesh/ratemesh/internal/testutil"
	"github.com/ratemesh/ratemesh/limiter"
	"github.com/ratemesh/ratemesh/mesh"
)

// TestNodeJoinsMidWindow: four members spend 90% of a 20 s window's limit;
// a fifth, started mid-window with the four as its bootstrap peers, is hit
// as hard as it will take the moment Start returns. It admits no more than
// the remaining 10% (plus 2% of the limit) in that window, and the mesh as
// a whole no more than 1.02 × the limit. The numbers fit: the
// clock is aligned so the test runs in the window's first seconds.
func TestNodeJoinsMidWindow(t *testing.T) {
	const (
		limit = 1000
		spent = limit * 9 / 10
		n     = 4
	)
	win := 20 * time.Second
	clock := testutil.AlignedClock(win, time.Second)
	rules := []limiter.Rule{fixedRule("api", limit, win)}
	ms := startMembers(t, n, spec{rules: rules, clock: clock})
	ctx := context.Background()
	window := clock().UnixMilli() / win.Milliseconds()

	// Each of the four spends its quarter of 90%, retrying denials as
	// acknowledgements free its share.
	var wg sync.WaitGroup
	for _, x := range ms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tick := time.NewTicker(time.Millisecond)
			defer tick.Stop()
			for got := 0; got < spent/n; {
				d, err := x.n.Allow(ctx, "api", "k")
				if err != nil {
					t.Error(err)
					return
				}
				if d.Allowed {
					got++
				} else {
					<-tick.C
				}
			}
		}()
	}
	wg.Wait()
	testutil.Eventually(t, 5*time.Second, func() (bool, string) {
		if d := usageDiff(ms, "api", "k"); d != "" {
			return false, d
		}
		// A forwarded request whose answer came back after the hold's
		// deadline may have been admitted where it was forwarded, unseen
		// by the caller: each such counts one more than the callers saw.
		var abandoned uint64
		for _, x := range ms {
			abandoned += x.n.HoldStats().ForwardsAbandoned
		}
		rep, _ := ms[0].n.Usage("api", "k")
		return rep.Total >= spent && rep.Total <= spent+abandoned,
			fmt.Sprintf("members hold %d, want %d (+ up to %d forwards abandoned)", rep.Total, spent, abandoned)
	})

	var boot []*mesh.Mesh
	for _, x := range ms {
		boot = append(boot, x.m)
	}
	start := time.Now()
	late := startMember(t, spec{rules: rules, clock: clock, bootstrap: boot})
	joined := time.Since(start)
	// 20 requests a millisecond for 2 s, the first burst at once.
	var admitted uint64
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); <-tick.C {
		for range 20 {
			d, err := late.n.Allow(ctx, "api", "k")
			if err != nil {
				t.Fatal(err)
			}
			if d.Allowed {
				admitted++
			}
		}
	}
	if w := clock().UnixMilli() / win.Milliseconds(); w != window {
		t.Fatalf("the window changed during the test (%d → %d)", window, w)
	}
	all := append(ms, late)
	testutil.Eventually(t, 5*time.Second, func() (bool, string) {
		d := usageDiff(all, "api", "k")
		return d == "", d
	})
	rep, _ := late.n.Usage("api", "k")
	t.Logf("joined in %v; the late member admitted %d (remaining was %d, bound %d); the mesh holds %d of %d",
		joined.Round(time.Millisecond), admitted, limit-spent, limit-spent+limit/50, rep.Total, limit)
	if admitted > limit-spent+limit/50 {
		t.Errorf("the late member admitted %d, over the remaining %d + 2%% of the limit", admitted, limit-spent)
	}
	if float64(rep.Total) > 1.02*limit {
		t.Errorf("the mesh admitted %d in the window, over 1.02 × %d", rep.Total, limit)
	}
	if admitted == 0 {
		t.Error("the late member admitted nothing of the remaining 10%")
	}
}

// TestNodesAccuracy: five members, one key, a limit of 1000 per 1 s
// window, 10× the limit offered for 5 s spread uniformly over the
// members and over time. Every whole window, counted from the test's own
// record of decisions, admits at least 0.95 × and at most 1.02 × the
// limit. The figures are logged:
//
//	go test -run TestNodesAccuracy -v ./mesh/
func TestNodesAccuracy(t *testing.T) {
	if testing.Short() {
		t.Skip("runs for seconds")
	}
	const (
		n     = 5
		limit = 1000
	)
	win := time.Second
	rules := []limiter.Rule{fixedRule("api", limit, win)}
	clock := time.Now
	ms := startMembers(t, n, spec{rules: rules})
	tl := newTally(win)
	stop := make(chan struct{})
	errs := make(chan error, n)
	var wg sync.WaitGroup
	from := clock()
	for _, x := range ms {
		wg.Add(1)
		go func() { defer wg.Done(); offer(x.n, clock, "api", "hot", 10*limit/n, tl, stop, errs) }()
	}
	select {
	case err := <-errs:
		t.Fatal(err)
	case <-time.After(5 * time.Second):
	}
	close(stop)
	wg.Wait()
	to := clock()
	for i, x := range ms {
		t.Logf("member %d: mesh clock offset %v", i, x.n.Offset())
	}
	idx, adm := tl.windows(from, to)
	if len(idx) < 4 {
		t.Fatalf("only %d whole windows", len(idx))
	}
	tl.mu.Lock()
	offered := make([]uint64, len(idx))
	for i, w := range idx {
		offered[i] = tl.offered[w]
	}
	tl.mu.Unlock()
	flooded := 0
	for i, w := range idx {
		ratio := float64(adm[i]) / limit
		t.Logf("window %d: offered %d, admitted %d of %d (%.3f×)", w, offered[i], adm[i], limit, ratio)
		if ratio > 1.02 {
			t.Errorf("window %d: admitted %d, over 1.02 × %d", w, adm[i], limit)
		}
		if float64(offered[i]) < 8*limit {
			// The machine, not the limiter: a window offered under 8×
			// the limit tests no utilisation. The upper bound holds
			// whatever was offered.
			t.Logf("window %d: only %d offered, the load generator fell behind; its utilisation is not checked", w, offered[i])
			continue
		}
		flooded++
		if ratio < 0.95 && !raceEnabled {
			// Under the race detector on a loaded machine deliveries take
			// 100–300 ms, acknowledgements return late and a member's
			// share stays small for longer: utilisation is the issue's
			// only without -race. The upper bound holds either way.
			t.Errorf("window %d: admitted %d, under 0.95 × %d", w, adm[i], limit)
		}
	}
	if flooded == 0 {
		t.Skipf("the load generator offered under 8 × the limit in every window (this machine is too busy to flood it); the upper bound held")
	}
}
