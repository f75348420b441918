package node_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/ratemesh/ratemesh/limiter"
	"github.com/ratemesh/ratemesh/node"
)

// TestCoreJoinThroughOneSeed: three cores spend 830 of a 1000-per-20 s
// window; a fourth joins knowing only core 0 (one bootstrap address) and is
// hammered at once. The seed's full state relays every member's slots and
// its member table, so the joiner admits at most what is left of the window
// plus 2% of the limit, and counts every member in N from its first answer
// on. (Before relaying, the joiner merged the seed's slot alone and
// admitted about 300 with 170 left.)
func TestCoreJoinThroughOneSeed(t *testing.T) {
	const (
		limit = 1000
		spend = 830
		win   = 20 * time.Second
	)
	for seed := uint64(51); seed <= 53; seed++ {
		t.Run(fmt.Sprintf("seed_%d", seed), func(t *testing.T) {
			reportSeed(t, seed)
			rules := []limiter.Rule{{Name: "api", Algorithm: limiter.FixedWindow, Limit: limit, Window: win}}
			join := func(c *node.CoreConfig) { c.Join = true }
			net := cluster(t, 3, seed, rules, join)
			net.Delay = 5 * time.Millisecond
			run(t, net, 10*time.Millisecond, nil)
			spent := 0
			for spent < spend {
				spent += allowN(t, net, spent%3, "api", "k", 1)
				run(t, net, 2*time.Millisecond, nil)
			}
			run(t, net, 3*time.Second, nil)
			start := net.Now()
			j := net.AddThrough(newCore(t, "n03", start, rules, join), 0)
			c := net.Core(j)
			joiner, readyN := 0, 0
			run(t, net, 2*time.Second, func(time.Time) {
				if c.Joined() && readyN == 0 {
					readyN, _ = c.Members()
					rep, err := c.Usage(net.Local(j), "api", "k")
					if err != nil {
						t.Fatal(err)
					}
					if len(rep.Slots) != 3 || rep.Total != spend {
						t.Errorf("on becoming ready the joiner holds %d slots totalling %d; want all 3 members' slots, %d", len(rep.Slots), rep.Total, spend)
					}
				}
				joiner += allowN(t, net, j, "api", "k", 20)
			})
			mesh := total(t, net.Core(1), net.Local(1), "api", "k")
			t.Logf("the joiner admitted %d with %d left; the mesh counts %d", joiner, limit-spend, mesh)
			if readyN != 4 {
				t.Errorf("the joiner counted N = %d when it became ready, want 4", readyN)
			}
			if max := limit - spend + limit*2/100; joiner > max {
				t.Errorf("the joiner admitted %d, over what was left plus 2%% (%d)", joiner, max)
			}
			if joiner < (limit-spend)/4 {
				t.Errorf("the joiner admitted only %d of the %d left", joiner, limit-spend)
			}
			if mesh > limit*102/100 {
				t.Errorf("the mesh counts %d in the window, over 1.02 × the limit", mesh)
			}
		})
	}
}

// TestCoreRestartThroughOneSeedTakesPeersView: a member admitted 75 in a
// 60 s window, all of it published, but its disk holds only 60 (the last
// flush was before the last admissions). Restarted through one seed, it
// takes the peers' view of its previous incarnation's slot — the seed
// relays it — so its disk is a floor, not the final word: it agrees with
// the peers on 75 as soon as it is ready.
func TestCoreRestartThroughOneSeedTakesPeersView(t *testing.T) {
	const seed = 57
	reportSeed(t, seed)
	rules := []limiter.Rule{{Name: "api", Algorithm: limiter.FixedWindow, Limit: 1000, Window: time.Minute}}
	net := cluster(t, 3, seed, rules, nil)
	run(t, net, 10*time.Millisecond, nil)
	old := net.Core(1).Self()
	if got := allowN(t, net, 1, "api", "k", 75); got != 75 {
		t.Fatalf("admitted %d of 75", got)
	}
	run(t, net, 200*time.Millisecond, nil)
	for i := range 3 {
		if got := total(t, net.Core(i), net.Local(i), "api", "k"); got != 75 {
			t.Fatalf("member %d counts %d before the crash, want 75", i, got)
		}
	}
	net.Crash(1)
	run(t, net, 100*time.Millisecond, nil)
	now := net.Local(1)
	c := newCore(t, old.Peer, now, rules, func(cfg *node.CoreConfig) {
		cfg.Incarnation = node.NextIncarnation(old.Incarnation, now)
		cfg.Join = true
	})
	p := node.NewPersister(c, 0)
	win := now.UnixMilli() / time.Minute.Milliseconds()
	p.Restore(now, []node.WindowRecord{{Rule: "api", Key: "k", WindowMs: time.Minute.Milliseconds(), Window: win, Slot: old, Admitted: 60, Attempted: 60}}, nil)
	if got := total(t, c, now, "api", "k"); got != 60 {
		t.Fatalf("restored from disk: %d, want the stale 60", got)
	}
	net.ReplaceThrough(1, c, 0)
	for !c.Joined() {
		run(t, net, time.Millisecond, nil)
	}
	if got := total(t, c, net.Local(1), "api", "k"); got != 75 {
		t.Errorf("ready after the restart, the member counts %d; want the peers' 75", got)
	}
	if got := allowN(t, net, 1, "api", "k", 2000); got > 1000-75 {
		t.Errorf("the restarted member admitted %d more, over the %d left", got, 1000-75)
	}
}
