package node_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/ratemesh/ratemesh/crdt"
	"github.com/ratemesh/ratemesh/limiter"
	"github.com/ratemesh/ratemesh/node"
)

// TestCoreDecisionAfterStallSeesNewMembership pauses member 0 of three
// (strict) for 3 s: it neither ticks nor hears anything, and the others
// go on. The first decision after the pause comes before its first Tick.
// Before, it decided on the membership of before the pause (two alive
// peers: admitted); now the decision runs the wake-up's membership pass
// first: both peers, silent for suspect_after, turn suspect, and member 0,
// a minority, is fenced.
func TestCoreDecisionAfterStallSeesNewMembership(t *testing.T) {
	const seed = 17
	reportSeed(t, seed)
	net := cluster(t, 3, seed, apiRule(limiter.FixedWindow, 1000), func(c *node.CoreConfig) { c.Policy = node.Strict })
	net.Delay = 2 * time.Millisecond
	run(t, net, time.Second, nil)
	if d, err := net.Core(0).Allow(net.Local(0), "api", "k", limiter.Request{}); err != nil || !d.Allowed {
		t.Fatalf("before the pause: %+v, %v; want admitted", d, err)
	}
	net.Crash(0) // paused: no Tick, nothing heard
	run(t, net, 3*time.Second, nil)
	d, err := net.Core(0).Allow(net.Local(0), "api", "k", limiter.Request{})
	if err != nil {
		t.Fatal(err)
	}
	if d.Allowed || d.Reason != limiter.ReasonFenced {
		t.Fatalf("first decision after a 3 s pause: allowed %v, reason %v; want denied, fenced", d.Allowed, d.Reason)
	}
}

// TestCoreStaleWhenUnacknowledged cuts member 0 of three (strict) off one
// way from 2 s to 4 s: it hears the others, they do not hear it (its
// output queue stalled). Nothing made it fence before: it went on
// deciding as one of three while the others would reclaim it after
// reclaim_after. Now, once they have not acknowledged it for staleAfter
// (1.54 s with these settings), it denies every decision as stale, well
// before the others could reclaim it; the others, which hear each other,
// stay fresh; and once its batches flow again and the others echo them,
// it decides again.
func TestCoreStaleWhenUnacknowledged(t *testing.T) {
	const seed = 29
	reportSeed(t, seed)
	net := cluster(t, 3, seed, apiRule(limiter.FixedWindow, 1_000_000), func(c *node.CoreConfig) { c.Policy = node.Strict })
	net.Delay = 2 * time.Millisecond
	start := net.Now()
	cut := false
	net.Filter = func(from, to int, _ *crdt.Batch) bool { return !(cut && from == 0) }
	decide := func(i int) limiter.Decision {
		t.Helper()
		d, err := net.Core(i).Allow(net.Local(i), "api", "k", limiter.Request{})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	k := 0
	busy := func(time.Time) { k = (k + 1) % 3; decide(k) }
	run(t, net, 2*time.Second, busy)
	cut = true
	staleBy := 1540*time.Millisecond + 100*time.Millisecond
	sawStale := false
	run(t, net, 2*time.Second, func(now time.Time) {
		busy(now)
		if now.Sub(start) < 2*time.Second+staleBy {
			return
		}
		if d := decide(0); d.Allowed || d.Reason != limiter.ReasonStale {
			t.Fatalf("member 0 at %v, unacknowledged since 2 s: allowed %v, reason %v; want denied, stale", now.Sub(start), d.Allowed, d.Reason)
		}
		sawStale = true
		for i := 1; i < 3; i++ {
			if net.Core(i).Stale() {
				t.Fatalf("member %d at %v: stale, though it hears and is heard by member %d", i, now.Sub(start), 3-i)
			}
		}
	})
	if !sawStale {
		t.Fatal("never checked member 0 while stale")
	}
	cut = false
	run(t, net, 2*time.Second, busy)
	if d := decide(0); !d.Allowed {
		t.Fatalf("member 0 2 s after its batches flow again: %+v; want admitted", d)
	}
}

// TestCoreStaleAvailableHoldsToShare is TestCoreStaleWhenUnacknowledged
// under available: a stale member does not fence, but decides as if the
// others had spent their shares (its limit scaled to 1/N), and the
// denials that causes say stale.
func TestCoreStaleAvailableHoldsToShare(t *testing.T) {
	const seed = 31
	reportSeed(t, seed)
	net := cluster(t, 3, seed, apiRule(limiter.FixedWindow, 3000), func(c *node.CoreConfig) { c.Policy = node.Available })
	net.Delay = 2 * time.Millisecond
	cut := false
	net.Filter = func(from, to int, _ *crdt.Batch) bool { return !(cut && from == 0) }
	run(t, net, 2*time.Second, nil)
	cut = true
	run(t, net, 1700*time.Millisecond, nil)
	if !net.Core(0).Stale() {
		t.Fatal("member 0 not stale 1.7 s after its batches stopped reaching anyone")
	}
	// Windows of 1 s: decide in a fresh one.
	now := net.Local(0).Truncate(time.Second).Add(time.Second)
	net.Advance(now.Sub(net.Local(0)))
	admitted := 0
	var last limiter.Decision
	for range 3000 {
		d, err := net.Core(0).Allow(net.Local(0), "api", "k", limiter.Request{})
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed {
			admitted++
		}
		last = d
	}
	// Its share of 3000 among 3, held to 1/3: P + 3(u + 1) ≤ 1000.
	if admitted > 1000/3+1 || admitted == 0 {
		t.Errorf("stale member admitted %d of 3000 in a window, want at most %d and some", admitted, 1000/3+1)
	}
	if last.Reason != limiter.ReasonStale {
		t.Errorf("last denial's reason %v, want stale", last.Reason)
	}
}

// TestCoreStaleWhenNotCounted isolates member 0 of three (strict) for
// 2.5 s: the others turn it suspect (their watermarks move on without it)
// and it fences. Then it hears them again, but they still do not hear it
// (its output stalled). Its fence lifts; their watermarks look fresh, as
// they no longer await it. Before, it then decided as one of three while
// they held it suspect and would reclaim it. Now the members that echoed
// it before but have not lately do not count as acknowledging it: once it
// serves again, it is stale.
func TestCoreStaleWhenNotCounted(t *testing.T) {
	const seed = 37
	reportSeed(t, seed)
	net := cluster(t, 3, seed, apiRule(limiter.FixedWindow, 1_000_000), func(c *node.CoreConfig) {
		// Serve again 1 s after the fence lifts, before the others
		// reclaim member 0 (reclaim_after 5 s of silence).
		c.Policy, c.JoinTimeout = node.Strict, time.Second
	})
	net.Delay = 2 * time.Millisecond
	start := net.Now()
	deaf, mute := false, false // others do not hear 0; 0 does not hear the others
	net.Filter = func(from, to int, _ *crdt.Batch) bool {
		return !(deaf && from == 0) && !(mute && to == 0)
	}
	k := 0
	busy := func(time.Time) {
		k = (k + 1) % 3
		if _, err := net.Core(k).Allow(net.Local(k), "api", "k", limiter.Request{}); err != nil {
			t.Fatal(err)
		}
	}
	run(t, net, 2*time.Second, busy)
	deaf, mute = true, true
	run(t, net, 2500*time.Millisecond, busy)
	if !net.Core(0).Fenced() {
		t.Fatal("member 0 not fenced after 2.5 s alone")
	}
	mute = false
	served := false
	run(t, net, 2*time.Second, func(now time.Time) {
		busy(now)
		c := net.Core(0)
		if !c.Joined() || c.Fenced() {
			return
		}
		served = true
		d, err := c.Allow(net.Local(0), "api", "k", limiter.Request{})
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed {
			t.Fatalf("member 0 at %v, heard by nobody for %v: admitted (stale %v)", now.Sub(start), now.Sub(start)-2*time.Second, c.Stale())
		}
	})
	if !served {
		t.Fatalf("member 0 never served again (ready %v, fenced %v): nothing checked", net.Core(0).Joined(), net.Core(0).Fenced())
	}
}

// TestCoreNotStaleWhenAnEcholessMemberLeaves: while a member of a release
// before crdt.FlagEcho is live, nobody echoes clocks (it would refuse the
// field), so every member's last echo of the others grows old. When it
// leaves, echoes start again, but until each member has echoed the others
// once their last echoes are older than a member's longest gap between
// two echoes: the others counted as not acknowledging, and under strict
// every member denied as stale for a moment (found by
// TestServeKeyFloodAdversary's liar, which set no flags). Echoes count
// again only a gap's length after they became possible.
func TestCoreNotStaleWhenAnEcholessMemberLeaves(t *testing.T) {
	const seed = 85
	reportSeed(t, seed)
	net := cluster(t, 3, seed, apiRule(limiter.FixedWindow, 100), nil) // strict
	net.Delay = 5 * time.Millisecond
	var stale []string
	net.OnReady = func(i int, now time.Time, rd node.Ready) {
		if rd.Stale != nil && rd.Stale.Stale {
			stale = append(stale, fmt.Sprintf("member %d at %v: %+v", i, now.Sub(t0), *rd.Stale))
		}
	}
	seq := uint64(0)
	old := func(flags uint64) { // a heartbeat of the old member to everyone, acknowledging all
		seq++
		for i := range 3 {
			now := net.Local(i)
			b := heartbeatOf("old", seq, now, flags)
			b.Ack = net.Core(i).MeshMs(now)
			if err := net.Core(i).Step(now, b); err != nil {
				t.Fatal(err)
			}
		}
	}
	run(t, net, time.Second, nil) // meshed, echoing
	for range 100 {               // 5 s with the old member live
		old(0)
		run(t, net, 50*time.Millisecond, nil)
	}
	old(crdt.FlagLeaving)
	for range 40 {
		run(t, net, 50*time.Millisecond, nil)
		if _, err := net.Core(0).Allow(net.Local(0), "api", "k", limiter.Request{}); err != nil {
			t.Fatal(err)
		}
	}
	if len(stale) > 0 {
		t.Errorf("members turned stale after the echoless member left: %v", stale)
	}
	for i := range 3 {
		if net.Core(i).Stale() {
			t.Errorf("member %d stale at the end", i)
		}
	}
}
