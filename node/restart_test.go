package node_test

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/ratemesh/ratemesh/crdt"
	"github.com/ratemesh/ratemesh/limiter"
	"github.com/ratemesh/ratemesh/node"
	"github.com/ratemesh/ratemesh/node/nodetest"
)

func TestCoreNextIncarnation(t *testing.T) {
	ms := t0.UnixMilli()
	cases := []struct {
		name      string
		persisted uint64
		now       time.Time
		want      uint64
	}{
		{"no disk: unix ms", 0, t0, uint64(ms)},
		{"disk behind the clock", uint64(ms) - 5000, t0, uint64(ms)},
		{"clock behind the disk", uint64(ms) + 5000, t0, uint64(ms) + 5001},
		{"same millisecond", uint64(ms), t0, uint64(ms) + 1},
		{"clock before 1970", 0, time.Unix(-10, 0), 1},
	}
	for _, tc := range cases {
		if got := node.NextIncarnation(tc.persisted, tc.now); got != tc.want {
			t.Errorf("%s: NextIncarnation(%d, %v) = %d, want %d", tc.name, tc.persisted, tc.now, got, tc.want)
		}
	}
}

func restartRules() []limiter.Rule {
	return []limiter.Rule{
		{Name: "api", Algorithm: limiter.FixedWindow, Limit: 100000, Window: 10 * time.Second},
		{Name: "cc", Algorithm: limiter.Concurrency, Limit: 1000, LeaseTTL: time.Minute},
	}
}

// restart crashes nothing: it builds member i's next core, with an
// incarnation from node.NextIncarnation, and swaps it in.
func restart(t testing.TB, net *nodetest.Network, i int, seed uint64) *node.Core {
	t.Helper()
	old := net.Core(i)
	now := net.Local(i)
	rules := make([]limiter.Rule, 0)
	for _, name := range old.RuleNames() {
		r, _ := old.Rule(name)
		rules = append(rules, *r)
	}
	c := newCore(t, old.Self().Peer, now, rules, func(cfg *node.CoreConfig) {
		cfg.Incarnation = node.NextIncarnation(old.Self().Incarnation, now)
	})
	net.Replace(i, c)
	return c
}

// steady has every running member allow one request of key k every
// round.
func steady(t testing.TB, net *nodetest.Network) func(time.Time) {
	return func(time.Time) {
		for i := range net.Len() {
			if !net.Down(i) {
				if _, err := net.Core(i).Allow(net.Local(i), "api", "k", limiter.Request{}); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
}

func slotOf(rep node.UsageReport, s crdt.Slot) (node.SlotUsage, bool) {
	for _, x := range rep.Slots {
		if x.Peer == s.Peer && x.Incarnation == s.Incarnation {
			return x, true
		}
	}
	return node.SlotUsage{}, false
}

func sumSlots(rep node.UsageReport) uint64 {
	var s uint64
	for _, x := range rep.Slots {
		s += x.Admitted
	}
	return s
}

// TestCoreRestart crashes a member holding window counts and leases and
// restarts it with a new incarnation: on the others, no merged value ever
// falls, the old incarnation's window counts go on counting in Total until
// the window ends, and its leases stop counting as soon as the new
// incarnation is heard.
func TestCoreRestart(t *testing.T) {
	const seed = 5
	reportSeed(t, seed)
	keys := []string{"k"}
	net := cluster(t, 3, seed, restartRules(), nil)
	net.Delay = 5 * time.Millisecond
	run(t, net, 2*time.Second, steady(t, net))
	for i, n := range []int{2, 0, 4} {
		for range n {
			if _, d, err := net.Core(i).Acquire(net.Local(i), "cc", "k", ""); err != nil || !d.Allowed {
				t.Fatalf("member %d: Acquire = %+v, %v", i, d, err)
			}
		}
	}
	run(t, net, 100*time.Millisecond, steady(t, net))
	before := views(t, net, keys)
	oldSlot := net.Core(2).Self()

	net.Crash(2)
	run(t, net, 300*time.Millisecond, steady(t, net))
	during := views(t, net, keys)
	// What member 2 published before it crashed: its last changes, not yet
	// published, died with it.
	oldOwn, _ := slotOf(during[0][ruleKey{"api", "k"}], oldSlot)
	if crashed, _ := slotOf(before[2][ruleKey{"api", "k"}], oldSlot); oldOwn.Admitted == 0 || crashed.Admitted-oldOwn.Admitted > 25 {
		t.Fatalf("member 2 had admitted %d before the crash and the others know %d", crashed.Admitted, oldOwn.Admitted)
	}
	for _, i := range []int{0, 1} {
		if got, _ := slotOf(during[i][ruleKey{"api", "k"}], oldSlot); got != oldOwn {
			t.Errorf("member %d knows member 2's slot as %+v, member 0 as %+v", i, got, oldOwn)
		}
		if got := during[i][ruleKey{"cc", "k"}].Total; got != 6 {
			t.Errorf("member %d while 2 is down (not yet suspect): %d live leases, want 6", i, got)
		}
	}

	c := restart(t, net, 2, seed*100+50)
	if c.Self().Incarnation <= oldSlot.Incarnation {
		t.Fatalf("new incarnation %d is not above the old %d", c.Self().Incarnation, oldSlot.Incarnation)
	}
	run(t, net, net.Delay+time.Millisecond, nil) // the anti-entropy exchange arrives
	after := views(t, net, keys)

	for _, i := range []int{0, 1} {
		for _, ref := range []view{before[i], during[i]} {
			if l := lowered(ref, after[i], nil); len(l) > 0 {
				t.Errorf("member %d lowered merged values:\n%v", i, l)
			}
		}
		api := after[i][ruleKey{"api", "k"}]
		if got, ok := slotOf(api, oldSlot); !ok || got != oldOwn {
			t.Errorf("member %d: old incarnation's window slot = %+v (present %v), want %+v", i, got, ok, oldOwn)
		}
		if api.Total != sumSlots(api) {
			t.Errorf("member %d: Total %d, slots sum to %d", i, api.Total, sumSlots(api))
		}
		cc := after[i][ruleKey{"cc", "k"}]
		if _, ok := slotOf(cc, oldSlot); ok || cc.Total != 2 {
			t.Errorf("member %d: leases after the restart: total %d, slots%s; want member 0's 2 only", i, cc.Total, fmtSlots(cc.Slots))
		}
		for _, p := range net.Core(i).Peers(net.Local(i)) {
			if p.Peer == oldSlot.Peer && (p.Incarnation != c.Self().Incarnation || p.State != node.Alive) {
				t.Errorf("member %d sees %s as incarnation %d %v, want %d alive", i, p.Peer, p.Incarnation, p.State, c.Self().Incarnation)
			}
		}
	}
	if ls := c.Leases(); len(ls) != 0 {
		t.Errorf("the restarted core holds leases %v", ls)
	}
	// The restarted core learns the others' slots by anti-entropy; the old
	// incarnation's counts only the others hold (and a Store would keep).
	if l := lowered(before[2], after[2], func(k slotKey) bool { return k.slot == oldSlot }); len(l) > 0 {
		t.Errorf("the restarted core knows less of the others than before the crash:\n%v", l)
	}
	if _, ok := slotOf(after[2][ruleKey{"api", "k"}], oldSlot); !ok {
		t.Logf("the restarted core does not know its old incarnation's %d admitted credits of this window: only a Store restores them", oldOwn.Admitted)
	}

	// The old counts count until the window ends.
	end := t0.Add(10 * time.Second)
	run(t, net, end.Sub(net.Now())-time.Millisecond, steady(t, net))
	for _, i := range []int{0, 1} {
		api, err := net.Core(i).Usage(net.Local(i), "api", "k")
		if err != nil {
			t.Fatal(err)
		}
		if got, ok := slotOf(api, oldSlot); !ok || got != oldOwn {
			t.Errorf("member %d just before the window ends: old slot %+v (present %v), want %+v", i, got, ok, oldOwn)
		}
	}
	run(t, net, 50*time.Millisecond, steady(t, net))
	for _, i := range []int{0, 1} {
		api, err := net.Core(i).Usage(net.Local(i), "api", "k")
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := slotOf(api, oldSlot); ok {
			t.Errorf("member %d: the old incarnation has counts in the next window: %s", i, fmtSlots(api.Slots))
		}
	}
}

// TestCoreRestartNeverLowersProperty restarts random members at random times
// under random traffic, and checks after every round that no member's
// merged value fell: a restarted core with a new incarnation never lowers
// a merged value.
func TestCoreRestartNeverLowersProperty(t *testing.T) {
	for seed := uint64(1); seed <= 8; seed++ {
		t.Run(fmt.Sprintf("seed_%d", seed), func(t *testing.T) {
			reportSeed(t, seed)
			rng := rand.New(rand.NewPCG(seed, 0x9a7)) // the plan's own source
			n := 3 + rng.IntN(3)
			net := clusterAt(t, n, seed, tMid, mixedRules(), nil)
			// Jitter beyond the sync interval reorders batches.
			net.Delay, net.Jitter, net.Duplicate = 3*time.Millisecond, 40*time.Millisecond, 0.1
			work := traffic(t, net, 2)
			prev := views(t, net, mixedKeys)
			restarts := 0
			for round := range 60 {
				run(t, net, 25*time.Millisecond, work)
				if rng.IntN(8) == 0 {
					i := rng.IntN(n)
					if net.Down(i) {
						restart(t, net, i, seed*1000+uint64(round))
						restarts++
						prev[i] = nil // a new core: compare from now on
					} else {
						net.Crash(i)
					}
				}
				cur := views(t, net, mixedKeys)
				for i := range n {
					if prev[i] == nil || cur[i] == nil {
						continue
					}
					if l := lowered(prev[i], cur[i], nil); len(l) > 0 {
						t.Fatalf("round %d: member %d lowered merged values:\n%v", round, i, l)
					}
				}
				prev = cur
			}
			t.Logf("%d members, %d restarts", n, restarts)
		})
	}
}
