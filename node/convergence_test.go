package node_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/ratemesh/ratemesh/limiter"
	"github.com/ratemesh/ratemesh/node"
	"github.com/ratemesh/ratemesh/node/nodetest"
)

// tMid is half an hour into an hour, so hour-long windows hold every count
// of a test that starts here, whatever the members' clock offsets.
var tMid = t0.Add(30 * time.Minute)

// mixedRules are a rule of every algorithm, with windows long enough for
// every count of a test to land in one window.
func mixedRules() []limiter.Rule {
	return []limiter.Rule{
		{Name: "fw", Algorithm: limiter.FixedWindow, Limit: 300, Window: time.Hour},
		{Name: "sw", Algorithm: limiter.SlidingWindow, Limit: 60, Window: time.Hour},
		{Name: "cc", Algorithm: limiter.Concurrency, Limit: 25, LeaseTTL: 10 * time.Minute},
	}
}

var mixedKeys = []string{"k0", "k1", "k2", "k3", "k4"}

// traffic returns a workload that issues ops random requests per round on
// random running members, rules and keys: allows of random cost, lease
// acquisitions and releases.
func traffic(t testing.TB, net *nodetest.Network, ops int) func(time.Time) {
	return func(time.Time) {
		rng := net.Rand()
		for range ops {
			i := rng.IntN(net.Len())
			if net.Down(i) {
				continue
			}
			c, now := net.Core(i), net.Local(i)
			key := mixedKeys[rng.IntN(len(mixedKeys))]
			switch rng.IntN(4) {
			case 0:
				if _, err := c.Allow(now, "fw", key, limiter.Request{Cost: 1 + rng.Uint64N(3), HasCost: true}); err != nil {
					t.Fatal(err)
				}
			case 1:
				if _, err := c.Allow(now, "sw", key, limiter.Request{}); err != nil {
					t.Fatal(err)
				}
			case 2:
				if _, _, err := c.Acquire(now, "cc", key, ""); err != nil {
					t.Fatal(err)
				}
			case 3:
				if ls := c.Leases(); len(ls) > 0 {
					if err := c.Release(now, ls[rng.IntN(len(ls))].ID); err != nil {
						t.Fatal(err)
					}
				}
			}
		}
	}
}

// TestCoreConvergenceAnyOrder delivers every batch in shuffled order, a third
// of them twice, and checks that all members end with identical merged
// state: the same Total and the same value in every slot of every
// (rule, key).
func TestCoreConvergenceAnyOrder(t *testing.T) {
	for _, n := range []int{3, 10} {
		for seed := uint64(1); seed <= 3; seed++ {
			t.Run(fmt.Sprintf("%d_cores/seed_%d", n, seed), func(t *testing.T) {
				reportSeed(t, seed)
				net := clusterAt(t, n, seed, tMid, mixedRules(), nil)
				net.Duplicate = 0.3
				work := traffic(t, net, 2)
				for range 30 {
					net.Hold()
					run(t, net, time.Duration(10+net.Rand().IntN(60))*time.Millisecond, work)
					if err := net.Release(); err != nil {
						t.Fatal(err)
					}
				}
				// Let the last changes be published, still held and shuffled.
				net.Hold()
				run(t, net, 50*time.Millisecond, nil)
				if err := net.Release(); err != nil {
					t.Fatal(err)
				}
				if err := net.Drain(); err != nil {
					t.Fatal(err)
				}
				if d := converged(t, net, mixedKeys); d != "" {
					t.Fatalf("not converged:\n%s", d)
				}
				assertBusy(t, net)
			})
		}
	}
}

// assertBusy guards against a vacuous pass: the workload must have left
// counts in every rule on member 0.
func assertBusy(t *testing.T, net *nodetest.Network) {
	t.Helper()
	v := viewOf(t, net.Core(0), net.Local(0), mixedKeys)
	sums := map[string]uint64{}
	slots := map[string]int{}
	for rk, rep := range v {
		for _, s := range rep.Slots {
			sums[rk.rule] += s.Attempted
		}
		slots[rk.rule] = max(slots[rk.rule], len(rep.Slots))
	}
	for _, r := range []string{"fw", "sw", "cc"} {
		if sums[r] == 0 || slots[r] < 2 {
			t.Errorf("rule %s: attempted %d over at most %d slots; the workload is too thin to test convergence", r, sums[r], slots[r])
		}
	}
}

// TestCoreConvergenceUnderLoss loses 5% of the copies, duplicates 5% and
// reorders many, and still converges, through nacks and repairs, within a
// few repair intervals after the traffic stops.
func TestCoreConvergenceUnderLoss(t *testing.T) {
	const repair = time.Second
	for _, n := range []int{3, 10} {
		for seed := uint64(1); seed <= 3; seed++ {
			t.Run(fmt.Sprintf("%d_cores/seed_%d", n, seed), func(t *testing.T) {
				reportSeed(t, seed)
				net := clusterAt(t, n, seed, tMid, mixedRules(), func(c *node.CoreConfig) { c.RepairInterval = repair })
				// Jitter beyond the sync interval reorders batches too.
				net.Delay, net.Jitter = 5*time.Millisecond, 50*time.Millisecond
				net.Loss, net.Duplicate = 0.05, 0.05
				net.ShareDecoded = n > 3 // one decoding per batch: cheaper under -race
				run(t, net, 2*time.Second, traffic(t, net, 1))
				stopped := net.Now()
				for net.Now().Sub(stopped) < 3*repair {
					run(t, net, 50*time.Millisecond, nil)
					if converged(t, net, mixedKeys) == "" {
						t.Logf("converged %v after the traffic stopped", net.Now().Sub(stopped))
						// Further rounds (with loss) must not undo it.
						run(t, net, repair, nil)
						if d := converged(t, net, mixedKeys); d != "" {
							t.Fatalf("diverged again:\n%s", d)
						}
						assertBusy(t, net)
						return
					}
				}
				t.Fatalf("not converged %v after the traffic stopped:\n%s", 3*repair, converged(t, net, mixedKeys))
			})
		}
	}
}

// TestCoreConvergenceNackRepairsAlone is TestCoreConvergenceUnderLoss with
// the periodic repair out of reach (an hour): only the repairs that serve
// nacks heal the losses, and the members that merged a repaired batch
// skip its repair (crdt.Repair). Skipping must lose nothing: the mesh
// converges all the same, and the skips did happen.
func TestCoreConvergenceNackRepairsAlone(t *testing.T) {
	for _, n := range []int{3, 10} {
		for seed := uint64(1); seed <= 3; seed++ {
			t.Run(fmt.Sprintf("%d_cores/seed_%d", n, seed), func(t *testing.T) {
				reportSeed(t, seed)
				net := clusterAt(t, n, seed, tMid, mixedRules(), func(c *node.CoreConfig) { c.RepairInterval = time.Hour })
				net.Delay, net.Jitter = 5*time.Millisecond, 50*time.Millisecond
				net.Loss, net.Duplicate = 0.05, 0.05
				net.ShareDecoded = n > 3
				run(t, net, 2*time.Second, traffic(t, net, 1))
				stopped := net.Now()
				for converged(t, net, mixedKeys) != "" {
					if net.Now().Sub(stopped) > 5*time.Second {
						t.Fatalf("not converged 5s after the traffic stopped:\n%s", converged(t, net, mixedKeys))
					}
					run(t, net, 50*time.Millisecond, nil)
				}
				var skipped, nacked uint64
				for i := range net.Len() {
					st := net.Core(i).Stats()
					skipped += st.RepairsSkipped
					nacked += st.NacksReceived
				}
				t.Logf("converged %v after the traffic stopped; %d nacks served, %d repair entries skipped", net.Now().Sub(stopped), nacked, skipped)
				if nacked == 0 || skipped == 0 {
					t.Fatalf("%d nacks served and %d repair entries skipped: the test did not exercise repairs", nacked, skipped)
				}
			})
		}
	}
}
