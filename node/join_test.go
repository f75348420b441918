package node_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/ratemesh/ratemesh/limiter"
	"github.com/ratemesh/ratemesh/node"
	"github.com/ratemesh/ratemesh/node/nodetest"
)

// TestCoreJoinWaitsForState: a core with Join set denies with ReasonJoining
// and RetryAfter = join_timeout − elapsed (rounded up to a millisecond)
// until a full-state exchange completes, then serves; with no peer it
// serves after join_timeout and says so in Ready.
func TestCoreJoinWaitsForState(t *testing.T) {
	const joinTimeout = 3 * time.Second
	joinCfg := func(c *node.CoreConfig) { c.Join, c.JoinTimeout = true, joinTimeout }

	t.Run("alone_times_out", func(t *testing.T) {
		const seed = 31
		reportSeed(t, seed)
		net := nodetest.New(seed, t0)
		net.Add(newCore(t, "j", t0, apiRule(limiter.FixedWindow, 10), joinCfg))
		var joinedAt time.Time
		var timedOut bool
		net.OnReady = func(_ int, now time.Time, rd node.Ready) {
			if rd.Joined {
				if !joinedAt.IsZero() {
					t.Errorf("Joined reported twice, at %v and %v", joinedAt.Sub(t0), now.Sub(t0))
				}
				joinedAt, timedOut = now, rd.JoinTimedOut
			}
		}
		c := net.Core(0)
		for _, at := range []time.Duration{0, 1234*time.Millisecond + 500*time.Microsecond, joinTimeout - time.Millisecond} {
			now := t0.Add(at)
			d, err := c.Allow(now, "api", "k", limiter.Request{})
			if err != nil {
				t.Fatal(err)
			}
			want := (joinTimeout - at + time.Millisecond - 1).Truncate(time.Millisecond)
			if d.Allowed || d.Reason != limiter.ReasonJoining || d.RetryAfter != want {
				t.Errorf("at %v: %+v; want denied, joining, retry after %v", at, d, want)
			}
			if c.Joined() {
				t.Errorf("ready at %v", at)
			}
		}
		if err := net.Run(joinTimeout+5*time.Millisecond, nil); err != nil {
			t.Fatal(err)
		}
		if !c.Joined() || !timedOut || !joinedAt.Equal(t0.Add(joinTimeout)) {
			t.Errorf("ready %v, joined at %v, timed out %v; want ready at %v by the timeout", c.Joined(), joinedAt.Sub(t0), timedOut, joinTimeout)
		}
		if got := allowN(t, net, 0, "api", "k", 20); got != 10 {
			t.Errorf("alone after the timeout admitted %d of 20, want the limit 10", got)
		}
		if got := c.Stats().Decisions[limiter.ReasonJoining]; got != 3 {
			t.Errorf("Stats counted %d joining decisions, want 3", got)
		}
	})

	t.Run("full_state_exchange", func(t *testing.T) {
		const seed = 32
		reportSeed(t, seed)
		net := cluster(t, 2, seed, apiRule(limiter.FixedWindow, 100), nil)
		net.Delay = 40 * time.Millisecond
		run(t, net, 500*time.Millisecond, nil)
		if got := allowN(t, net, 0, "api", "k", 20); got != 20 {
			t.Fatalf("admitted %d of 20", got)
		}
		run(t, net, 100*time.Millisecond, nil)
		var joinedAt time.Time
		var timedOut bool
		net.OnReady = func(i int, now time.Time, rd node.Ready) {
			if i == 2 && rd.Joined {
				joinedAt, timedOut = now, rd.JoinTimedOut
			}
		}
		start := net.Now()
		j := net.Add(newCore(t, "n02", start, apiRule(limiter.FixedWindow, 100), joinCfg))
		c := net.Core(j)
		run(t, net, 10*time.Millisecond, nil)
		d, err := c.Allow(net.Local(j), "api", "k", limiter.Request{})
		if err != nil {
			t.Fatal(err)
		}
		if want := joinTimeout - 10*time.Millisecond; d.Allowed || d.Reason != limiter.ReasonJoining || d.RetryAfter != want {
			t.Errorf("before the exchange: %+v; want denied, joining, retry after %v", d, want)
		}
		if e, err := c.Earliest(net.Local(j), "api", "k", limiter.Request{}); err != nil || e != joinTimeout-10*time.Millisecond {
			t.Errorf("Earliest while joining = %v, %v; want %v", e, err, joinTimeout-10*time.Millisecond)
		}
		// The full states cross (Delay); the peers answer the joiner's
		// FlagWant with a relay at their next Tick, which arrives a Delay
		// later: the joiner is ready then.
		sync := node.DefaultCoreConfig().SyncInterval
		run(t, net, 2*net.Delay+sync, nil)
		if d := joinedAt.Sub(start); !c.Joined() || timedOut || d < 2*net.Delay || d > 2*net.Delay+sync {
			t.Errorf("ready %v, joined %v after joining, timed out %v; want ready once the relayed state arrives (%v to %v)", c.Joined(), d, timedOut, 2*net.Delay, 2*net.Delay+sync)
		}
		if got := total(t, c, net.Local(j), "api", "k"); got != 20 {
			t.Errorf("the joiner knows a total of %d, want 20", got)
		}
		d, err = c.Allow(net.Local(j), "api", "k", limiter.Request{})
		if err != nil || !d.Allowed || d.Remaining != 79 {
			t.Errorf("after joining: %+v, %v; want admitted with 79 remaining", d, err)
		}
	})
}

// TestCoreJoinerHitMidWindow: 4 cores spend 90% of a 20 s window's limit; a
// fifth joins mid-window and is hit at once with far more than the rest:
// it admits no more than the remaining 10% (+2% of the limit) in that
// window, and neither does the mesh.
func TestCoreJoinerHitMidWindow(t *testing.T) {
	const (
		limit = 1000
		win   = 20 * time.Second
	)
	for seed := uint64(41); seed <= 43; seed++ {
		t.Run(fmt.Sprintf("seed_%d", seed), func(t *testing.T) {
			reportSeed(t, seed)
			rules := []limiter.Rule{{Name: "api", Algorithm: limiter.FixedWindow, Limit: limit, Window: win}}
			net := cluster(t, 4, seed, rules, func(c *node.CoreConfig) { c.Join = true })
			net.Delay = 5 * time.Millisecond
			run(t, net, 10*time.Millisecond, nil)
			spent := 0
			for spent < limit*9/10 {
				spent += allowN(t, net, spent%4, "api", "k", 1)
				run(t, net, 2*time.Millisecond, nil)
			}
			run(t, net, 100*time.Millisecond, nil)
			if got := total(t, net.Core(0), net.Local(0), "api", "k"); got != limit*9/10 {
				t.Fatalf("the four admitted %d, want %d", got, limit*9/10)
			}
			run(t, net, 5*time.Second, nil) // mid-window
			start := net.Now()
			j := net.Add(newCore(t, "n04", start, rules, func(c *node.CoreConfig) { c.Join = true }))
			joiner := 0
			denied := map[limiter.Reason]int{}
			run(t, net, 2*time.Second, func(time.Time) {
				for range 20 {
					d, err := net.Core(j).Allow(net.Local(j), "api", "k", limiter.Request{})
					if err != nil {
						t.Fatal(err)
					}
					if d.Allowed {
						joiner++
					} else {
						denied[d.Reason]++
					}
				}
			})
			mesh := total(t, net.Core(0), net.Local(0), "api", "k")
			t.Logf("the joiner admitted %d (denied %v); the mesh counts %d", joiner, denied, mesh)
			if joiner > limit/10+limit*2/100 {
				t.Errorf("the joiner admitted %d in the window, over the remaining 10%% + 2%% = %d", joiner, limit/10+limit*2/100)
			}
			if joiner < limit/20 {
				t.Errorf("the joiner admitted only %d of the remaining %d", joiner, limit/10)
			}
			if mesh > limit*102/100 {
				t.Errorf("the mesh counts %d in the window, over 1.02 × the limit", mesh)
			}
			if denied[limiter.ReasonJoining] == 0 {
				t.Error("the joiner never answered joining: it decided before its first exchange")
			}
		})
	}
}

// TestCoreJoinWaitsForEveryExpectedState checks that a joiner told of two
// connections stays joining until both peers' full states have arrived:
// deciding on the first member's view alone would let it spend what the
// second member already used.
func TestCoreJoinWaitsForEveryExpectedState(t *testing.T) {
	const seed = 37
	reportSeed(t, seed)
	rule := apiRule(limiter.FixedWindow, 100)
	a := newCore(t, "a", t0, rule, nil)
	b := newCore(t, "b", t0, rule, nil)
	j := newCore(t, "j", t0, rule, func(c *node.CoreConfig) { c.Join, c.JoinTimeout = true, 3*time.Second })
	for range 60 {
		if _, err := b.Allow(t0, "api", "k", limiter.Request{}); err != nil {
			t.Fatal(err)
		}
	}
	j.ExpectState("a")
	j.ExpectState("b")
	now := t0.Add(10 * time.Millisecond)
	// j's full states ask a and b for their whole view (FlagWant); each
	// answers with a relay in its next Tick's Ready.
	stepAll(t, a, now, fullState(t, j, now, "a"))
	stepAll(t, b, now, fullState(t, j, now, "b"))
	stepAll(t, j, now, relayTo(t, a, now, "j"))
	if j.Joined() {
		t.Fatal("ready after a's full state while b's is still expected")
	}
	j.ExpectState("a") // a repeated connection of a peer already heard: nothing to wait for
	stepAll(t, j, now, relayTo(t, b, now, "j"))
	if !j.Joined() {
		t.Fatal("not ready after every expected full state arrived")
	}
	rep, err := j.Usage(now, "api", "k")
	if err != nil {
		t.Fatal(err)
	}
	if rep.Total != 60 {
		t.Errorf("joiner sees %d used, want b's 60", rep.Total)
	}
}
