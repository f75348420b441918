package node_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/ratemesh/ratemesh/crdt"
	"github.com/ratemesh/ratemesh/limiter"
	"github.com/ratemesh/ratemesh/node"
	"github.com/ratemesh/ratemesh/node/nodetest"
)

// recorder keeps what the members' Ticks reported, with the local time.
type recorder struct {
	changes [][]timedChange
	newInc  [][]uint64
}

type timedChange struct {
	at time.Time
	node.MemberChange
}

func record(net *nodetest.Network) *recorder {
	r := &recorder{changes: make([][]timedChange, net.Len()), newInc: make([][]uint64, net.Len())}
	net.OnReady = func(i int, now time.Time, rd node.Ready) {
		for _, ch := range rd.Changes {
			r.changes[i] = append(r.changes[i], timedChange{now, ch})
		}
		if rd.NewIncarnation != 0 {
			r.newInc[i] = append(r.newInc[i], rd.NewIncarnation)
		}
	}
	return r
}

// of returns member i's reported changes about peer since from.
func (r *recorder) of(i int, peer string, from time.Time) []timedChange {
	var out []timedChange
	for _, c := range r.changes[i] {
		if c.Peer == peer && !c.at.Before(from) {
			out = append(out, c)
		}
	}
	return out
}

// lastHeard records, per (receiver, sender), when the last batch that was
// sent while the link was up is delivered: its send time plus the delay.
type lastHeard map[[2]int]time.Time

func trackHeard(net *nodetest.Network) lastHeard {
	h := lastHeard{}
	net.Filter = func(from, to int, _ *crdt.Batch) bool {
		h[[2]int{to, from}] = net.Now().Add(net.Delay)
		return true
	}
	return h
}

func membersOf(c *node.Core) string {
	n, s := c.Members()
	return fmt.Sprintf("N=%d scale=%.3f", n, s)
}

// TestCoreMemberStates isolates one of three members and checks that each side
// sees the other turn suspect after suspect_after and dead after
// dead_after (available), or, under strict, that the majority evicts the
// isolated member after reclaim_after while the isolated member, a
// minority, fences itself and evicts nobody — at the exact instant (±1
// tick), reported in Ready.Changes, with N and the scale from Members();
// and that after healing everyone is a member again.
func TestCoreMemberStates(t *testing.T) {
	const (
		suspectAfter = 2 * time.Second
		deadAfter    = 3 * time.Second
		evictAfter   = 4 * time.Second
		tick         = time.Millisecond
	)
	cases := []struct {
		policy   node.Policy
		goneAt   time.Duration // silence that ends membership
		suspectN int
		suspectS float64 // scale while the isolated member is suspect
		loneS    float64 // the isolated member's scale then
		lone     string  // the isolated member's Members() once the others are gone
	}{
		{policy: node.Available, goneAt: deadAfter, suspectS: 1, loneS: 1, lone: "N=1 scale=1.000"},
		{policy: node.Strict, goneAt: evictAfter, suspectS: 2.0 / 3, loneS: 1.0 / 3, lone: "N=3 scale=0.333"},
	}
	for _, tc := range cases {
		t.Run(string(tc.policy), func(t *testing.T) {
			const seed = 11
			reportSeed(t, seed)
			net := cluster(t, 3, seed, apiRule(limiter.FixedWindow, 100), func(c *node.CoreConfig) {
				c.Policy = tc.policy
				c.SuspectAfter, c.DeadAfter, c.EvictAfter = suspectAfter, deadAfter, evictAfter
				c.ReclaimAfter = evictAfter // the majority's eviction
			})
			net.Delay = 5 * time.Millisecond
			rec := record(net)
			heard := trackHeard(net)
			run(t, net, time.Second, nil)
			for i := range 3 {
				if got := membersOf(net.Core(i)); got != "N=3 scale=1.000" {
					t.Fatalf("member %d before the cut: %s", i, got)
				}
			}
			cut := net.Now()
			net.Isolate(2)
			last := heard[[2]int{0, 2}] // when member 0 last hears member 2
			lastAt2 := heard[[2]int{2, 0}]

			run(t, net, last.Add(suspectAfter+5*tick).Sub(net.Now()), nil)
			if got, want := membersOf(net.Core(0)), fmt.Sprintf("N=3 scale=%.3f", tc.suspectS); got != want {
				t.Errorf("member 0 with 2 suspect: %s, want %s", got, want)
			}
			if got, want := membersOf(net.Core(2)), fmt.Sprintf("N=3 scale=%.3f", tc.loneS); got != want {
				t.Errorf("isolated member 2 with 0 and 1 suspect: %s, want %s", got, want)
			}
			run(t, net, last.Add(tc.goneAt+5*tick).Sub(net.Now()), nil)
			if got := membersOf(net.Core(0)); got != "N=2 scale=1.000" {
				t.Errorf("member 0 with 2 gone: %s, want N=2 scale=1.000", got)
			}
			if got := membersOf(net.Core(2)); got != tc.lone {
				t.Errorf("isolated member 2 alone: %s, want %s", got, tc.lone)
			}
			if fenced := net.Core(2).Fenced(); fenced != (tc.policy == node.Strict) {
				t.Errorf("isolated member 2 fenced %v under %s", fenced, tc.policy)
			}
			if st := state(t, net.Core(0), net.Local(0), "n02"); st != node.Dead {
				t.Errorf("member 0 sees n02 %v, want dead", st)
			}

			check := func(observer int, peer string, lastHeard time.Time) {
				t.Helper()
				got := rec.of(observer, peer, cut)
				want := []struct {
					from, to node.State
					at       time.Time
				}{
					{node.Alive, node.Suspect, lastHeard.Add(suspectAfter)},
					{node.Suspect, node.Dead, lastHeard.Add(tc.goneAt)},
				}
				if observer == 2 && tc.policy == node.Strict {
					want = want[:1] // a minority evicts nobody
				}
				if len(got) != len(want) {
					t.Fatalf("member %d reported %d changes of %s, want %d: %+v", observer, len(got), peer, len(want), got)
				}
				for k, w := range want {
					g := got[k]
					if g.From != w.from || g.To != w.to || g.New {
						t.Errorf("member %d change %d of %s: %v -> %v (new %v), want %v -> %v", observer, k, peer, g.From, g.To, g.New, w.from, w.to)
					}
					if d := g.at.Sub(w.at); d < -tick || d > tick {
						t.Errorf("member %d: %s %v -> %v at %v after the last batch, want %v (±1 tick)", observer, peer, g.From, g.To, g.at.Sub(lastHeard), w.at.Sub(lastHeard))
					}
				}
			}
			check(0, "n02", last)
			check(1, "n02", heard[[2]int{1, 2}])
			check(2, "n00", lastAt2)
			check(2, "n01", heard[[2]int{2, 1}])

			// Heal: everyone is a member again.
			old2 := net.Core(2).Self()
			net.Recover()
			run(t, net, time.Second, nil)
			for i := range 3 {
				if got := membersOf(net.Core(i)); got != "N=3 scale=1.000" {
					t.Errorf("member %d after healing: %s, want N=3 scale=1.000", i, got)
				}
				for _, p := range net.Core(i).Peers(net.Local(i)) {
					if p.State != node.Alive {
						t.Errorf("member %d after healing sees %s %v", i, p.Peer, p.State)
					}
				}
			}
			if tc.policy == node.Strict {
				if len(rec.newInc[2]) != 1 || net.Core(2).Self().Incarnation != rec.newInc[2][0] || rec.newInc[2][0] <= old2.Incarnation {
					t.Errorf("evicted member 2: new incarnations %v, Self %v (was %v); want one new incarnation", rec.newInc[2], net.Core(2).Self(), old2)
				}
				for _, i := range []int{0, 1} {
					if len(rec.newInc[i]) > 0 {
						// Member 2 evicted them too: mutual eviction makes
						// both sides take new incarnations (and drop leases).
						t.Logf("member %d also took a new incarnation on healing: %v", i, rec.newInc[i])
					}
				}
			} else if len(rec.newInc[2]) != 0 {
				t.Errorf("available: member 2 took a new incarnation %v; only eviction should do that", rec.newInc[2])
			}
		})
	}
}

// TestCoreLeaveIsImmediate: a graceful leave publishes the leaver's pending
// counts and removes it from N at once on the others, under both
// policies, and it never turns suspect.
func TestCoreLeaveIsImmediate(t *testing.T) {
	for _, policy := range []node.Policy{node.Strict, node.Available} {
		t.Run(string(policy), func(t *testing.T) {
			const seed = 12
			reportSeed(t, seed)
			net := cluster(t, 3, seed, apiRule(limiter.FixedWindow, 1000), func(c *node.CoreConfig) { c.Policy = policy })
			net.Delay = 5 * time.Millisecond
			rec := record(net)
			run(t, net, 100*time.Millisecond, nil)
			if got := allowN(t, net, 2, "api", "k", 7); got != 7 {
				t.Fatalf("member 2 admitted %d of 7", got)
			}
			left := net.Now()
			net.Leave(2) // the 7 credits are not published yet: Leave must carry them
			run(t, net, net.Delay+time.Millisecond, nil)
			for _, i := range []int{0, 1} {
				c := net.Core(i)
				if got := membersOf(c); got != "N=2 scale=1.000" {
					t.Errorf("member %d right after the leave: %s", i, got)
				}
				if st := state(t, c, net.Local(i), "n02"); st != node.Left {
					t.Errorf("member %d sees n02 %v, want left", i, st)
				}
				if got := total(t, c, net.Local(i), "api", "k"); got != 7 {
					t.Errorf("member %d: total %d, want the leaver's 7", i, got)
				}
				ch := rec.of(i, "n02", left)
				if len(ch) != 1 || ch[0].From != node.Alive || ch[0].To != node.Left {
					t.Errorf("member %d reported %+v, want one alive -> left", i, ch)
				}
			}
			run(t, net, 6*time.Second, nil) // past suspect_after and dead_after
			for _, i := range []int{0, 1} {
				if ch := rec.of(i, "n02", left); len(ch) != 1 {
					t.Errorf("member %d reported more changes of the leaver: %+v", i, ch)
				}
			}
			if _, err := net.Core(2).Allow(net.Local(2), "api", "k", limiter.Request{}); err != nil {
				t.Logf("the left core still answers Allow: %v", err)
			}
		})
	}
}

// TestCoreManualEvict evicts a connected member by hand on two members of
// three: it leaves their N at once, learns of its eviction from their next
// batches — a strict majority of the others announce it — takes a new
// incarnation (Ready.NewIncarnation, Self changes), drops its leases, and
// is a member again. Its old window counts keep counting everywhere; its
// old leases nowhere. (One member's word alone is not enough:
// TestCoreLoneEvictionAnnouncement.)
func TestCoreManualEvict(t *testing.T) {
	const seed = 13
	reportSeed(t, seed)
	rules := []limiter.Rule{
		{Name: "api", Algorithm: limiter.FixedWindow, Limit: 1000, Window: 10 * time.Second},
		{Name: "cc", Algorithm: limiter.Concurrency, Limit: 100, LeaseTTL: time.Minute},
	}
	net := cluster(t, 3, seed, rules, nil)
	net.Delay = 5 * time.Millisecond
	rec := record(net)
	run(t, net, 100*time.Millisecond, nil)
	c2 := net.Core(2)
	old := c2.Self()
	for range 3 {
		if _, d, err := c2.Acquire(net.Local(2), "cc", "k", ""); err != nil || !d.Allowed {
			t.Fatalf("Acquire = %+v, %v", d, err)
		}
	}
	if got := allowN(t, net, 2, "api", "k", 5); got != 5 {
		t.Fatalf("member 2 admitted %d of 5", got)
	}
	run(t, net, 100*time.Millisecond, nil)
	for i := range 3 {
		if got := total(t, net.Core(i), net.Local(i), "cc", "k"); got != 3 {
			t.Fatalf("member %d: %d leases before the eviction, want 3", i, got)
		}
	}

	if err := net.Core(0).Evict(net.Local(0), "nobody"); !errors.Is(err, node.ErrUnknownPeer) {
		t.Errorf("Evict(nobody) = %v, want ErrUnknownPeer", err)
	}
	at := net.Now()
	if err := net.Core(0).Evict(net.Local(0), "n02"); err != nil {
		t.Fatal(err)
	}
	if got := membersOf(net.Core(0)); got != "N=2 scale=1.000" {
		t.Errorf("member 0 right after Evict: %s", got)
	}
	if got := total(t, net.Core(0), net.Local(0), "cc", "k"); got != 0 {
		t.Errorf("member 0 right after Evict counts %d of n02's leases", got)
	}
	if err := net.Core(1).Evict(net.Local(1), "n02"); err != nil {
		t.Fatal(err)
	}
	run(t, net, time.Millisecond, nil)
	if ch := rec.of(0, "n02", at); len(ch) == 0 || ch[0].From != node.Alive || ch[0].To != node.Dead {
		t.Errorf("member 0 reported %+v, want alive -> dead first", ch)
	}
	// Members 0 and 1 announce the eviction in their next batches (a
	// heartbeat at the latest); an idle member 2 announces its new
	// incarnation in its own next heartbeat.
	run(t, net, 1200*time.Millisecond, nil)

	if len(rec.newInc[2]) != 1 {
		t.Fatalf("member 2 reported new incarnations %v, want one", rec.newInc[2])
	}
	now2 := c2.Self()
	if now2.Peer != old.Peer || now2.Incarnation != rec.newInc[2][0] || now2.Incarnation <= old.Incarnation {
		t.Errorf("member 2 is %v after learning of its eviction (was %v, Ready said %v)", now2, old, rec.newInc[2])
	}
	if ls := c2.Leases(); len(ls) != 0 {
		t.Errorf("member 2 still holds leases %v", ls)
	}
	for i := range 3 {
		c := net.Core(i)
		if got := membersOf(c); got != "N=3 scale=1.000" {
			t.Errorf("member %d after the re-incarnation: %s", i, got)
		}
		if i != 2 && state(t, c, net.Local(i), "n02") != node.Alive {
			t.Errorf("member %d sees n02 %v", i, state(t, c, net.Local(i), "n02"))
		}
		for _, p := range c.Peers(net.Local(i)) {
			if p.Peer == "n02" && p.Incarnation != now2.Incarnation {
				t.Errorf("member %d knows n02 as incarnation %d, want %d", i, p.Incarnation, now2.Incarnation)
			}
		}
		api, err := c.Usage(net.Local(i), "api", "k")
		if err != nil {
			t.Fatal(err)
		}
		if s, ok := slotOf(api, old); !ok || s.Admitted != 5 || api.Total != 5 {
			t.Errorf("member %d: old incarnation's window counts %+v (present %v), total %d; want 5 still counting", i, s, ok, api.Total)
		}
		if got := total(t, c, net.Local(i), "cc", "k"); got != 0 {
			t.Errorf("member %d counts %d leases of the old incarnation", i, got)
		}
	}
	if ch := rec.of(0, "n02", at); len(ch) != 2 || !ch[1].New || ch[1].To != node.Alive || ch[1].Incarnation != now2.Incarnation {
		t.Errorf("member 0 reported %+v, want alive -> dead, then the new incarnation alive", ch)
	}
	// It serves again as a member: its new slot counts.
	if got := allowN(t, net, 2, "api", "k", 2); got != 2 {
		t.Errorf("member 2 admitted %d of 2 after re-incarnating", got)
	}
	run(t, net, 100*time.Millisecond, nil)
	if got := total(t, net.Core(0), net.Local(0), "api", "k"); got != 7 {
		t.Errorf("member 0 total %d, want 5 old + 2 new", got)
	}
}

// TestCoreLateBatchDoesNotUndoLeave: a batch the leaver sent before its
// leave announcement but that arrives after it (reordered, or a
// duplicate) still counts, but does not bring the member back: it stays
// left, out of N, and never turns suspect.
func TestCoreLateBatchDoesNotUndoLeave(t *testing.T) {
	for _, policy := range []node.Policy{node.Strict, node.Available} {
		t.Run(string(policy), func(t *testing.T) {
			mut := func(c *node.CoreConfig) { c.Policy = policy }
			rules := apiRule(limiter.FixedWindow, 100)
			a := newCore(t, "a", t0, rules, mut)
			b := newCore(t, "b", t0, rules, mut)
			now := t0
			stepAll(t, a, now, fullState(t, b, now, "a"))
			stepAll(t, b, now, fullState(t, a, now, "b"))
			tick(a, now)
			if _, err := b.Allow(now, "api", "k", limiter.Request{}); err != nil {
				t.Fatal(err)
			}
			early := tick(b, now).Messages
			now = now.Add(30 * time.Millisecond)
			if _, err := b.Allow(now, "api", "k", limiter.Request{}); err != nil {
				t.Fatal(err)
			}
			left := leave(b, now).Messages
			now = now.Add(5 * time.Millisecond)
			stepAll(t, a, now, left)
			stepAll(t, a, now, early) // late
			stepAll(t, a, now, left)  // duplicate
			stepAll(t, a, now, early) // duplicate, late
			if st := state(t, a, now, "b"); st != node.Left {
				t.Errorf("after a late batch the leaver is %v, want left", st)
			}
			if got := total(t, a, now, "api", "k"); got != 2 {
				t.Errorf("total %d, want the leaver's 2", got)
			}
			var changes []node.MemberChange
			for range 200 { // 10 s: past suspect_after, dead_after
				now = now.Add(50 * time.Millisecond)
				changes = append(changes, tick(a, now).Changes...)
			}
			if n, scale := a.Members(); n != 1 || scale != 1 {
				t.Errorf("Members() = %d, %v; want 1, 1", n, scale)
			}
			for _, ch := range changes {
				if ch.Peer == "b" && ch.To != node.Left {
					t.Errorf("the leaver changed again: %+v", ch)
				}
			}
		})
	}
}
