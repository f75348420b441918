package node_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ratemesh/ratemesh/crdt"
	"github.com/ratemesh/ratemesh/limiter"
	"github.com/ratemesh/ratemesh/node"
	"github.com/ratemesh/ratemesh/node/nodetest"
)

// inventedTable returns a full state of from's listing 1024 invented
// members alive (round r names a fresh set), as a member that lies, or
// relays garbage, would send it on the sync stream.
func inventedTable(from crdt.Slot, rulesHash uint64, r int) *crdt.Batch {
	b := &crdt.Batch{Version: crdt.Version, From: from, RulesHash: rulesHash, Flags: crdt.FlagFull | crdt.FlagLast}
	for i := range crdt.MaxMembers {
		b.Members = append(b.Members, crdt.MemberEntry{Peer: fmt.Sprintf("invented-%02d-%04d", r, i), Incarnation: 1, State: crdt.MemberAlive})
	}
	return b
}

// peersOf returns c's Peers as "peer@incarnation state" strings, and how
// many of them are invented.
func peersOf(c *node.Core, now time.Time) (ps []string, invented int) {
	for _, p := range c.Peers(now) {
		ps = append(ps, fmt.Sprintf("%s@%d %v", p.Peer, p.Incarnation, p.State))
		if strings.HasPrefix(p.Peer, "invented-") {
			invented++
		}
	}
	return ps, invented
}

// TestCoreMemberTableIsASuggestion: a member sends 10 full states, each
// listing 1024 invented members alive. A member table is its sender's word:
// the receiver's N does not grow, it does not fence itself, it knows none
// of them as a member (so none is saved as a known peer: the runtime saves
// exactly Peers' live members), and a joiner awaits at most
// MaxSuggestPerSender of them, until join_timeout. Before, the receiver
// counted 10,243 members, 10,240 of them suspect, and fenced itself for
// good.
func TestCoreMemberTableIsASuggestion(t *testing.T) {
	const seed = 81
	reportSeed(t, seed)
	rules := apiRule(limiter.FixedWindow, 1000)
	net := cluster(t, 3, seed, rules, nil) // strict
	net.Delay = 5 * time.Millisecond
	run(t, net, time.Second, nil)
	liar := net.Core(2)

	t.Run("ready", func(t *testing.T) {
		c := net.Core(0)
		for r := range 10 {
			if err := c.Step(net.Local(0), inventedTable(liar.Self(), liar.RulesHash(), r)); err != nil {
				t.Fatal(err)
			}
			run(t, net, 100*time.Millisecond, nil)
		}
		run(t, net, 3*time.Second, nil) // past suspect_after and reclaim_after of any invented member
		if n, scale := c.Members(); n != 3 || scale != 1 || c.Fenced() {
			t.Errorf("after 10 invented tables: Members() = %d, %v, fenced %v; want 3, 1, not fenced", n, scale, c.Fenced())
		}
		if ps, inv := peersOf(c, net.Local(0)); len(ps) != 3 || inv != 0 {
			t.Errorf("Peers() = %d entries, %d invented; want the 3 real members: %v", len(ps), inv, ps[:min(len(ps), 5)])
		}
		if got := node.Suggested(c); got != 0 {
			t.Errorf("a ready member keeps %d suggestions, want 0", got)
		}
		if got := allowN(t, net, 0, "api", "k", 10); got != 10 {
			t.Errorf("admitted %d of 10 after the invented tables", got)
		}
	})

	t.Run("joining", func(t *testing.T) {
		cfg := node.DefaultCoreConfig()
		j := net.AddThrough(newCore(t, "n03", net.Now(), rules, func(c *node.CoreConfig) { c.Join = true }), 0)
		c := net.Core(j)
		for r := range 10 {
			if err := c.Step(net.Local(j), inventedTable(liar.Self(), liar.RulesHash(), r)); err != nil {
				t.Fatal(err)
			}
		}
		if got := node.Suggested(c); got > node.MaxSuggestPerSender+2 {
			t.Errorf("the joiner awaits %d suggested peers; want at most %d from the liar and the seed's 2", got, node.MaxSuggestPerSender+2)
		}
		run(t, net, cfg.JoinTimeout-200*time.Millisecond, nil)
		if c.Joined() {
			t.Error("the joiner is ready before join_timeout with invented suggestions unheard")
		}
		if n, _ := c.Members(); n != 4 {
			t.Errorf("the joining member counts N = %d; want the 4 members it heard", n)
		}
		run(t, net, 400*time.Millisecond, nil)
		if !c.Joined() || c.Fenced() {
			t.Fatalf("after join_timeout: ready %v, fenced %v; want ready, not fenced", c.Joined(), c.Fenced())
		}
		if n, scale := c.Members(); n != 4 || scale != 1 || node.Suggested(c) != 0 {
			t.Errorf("after join_timeout: Members() = %d, %v, %d suggestions kept; want 4, 1, none", n, scale, node.Suggested(c))
		}
		if ps, inv := peersOf(c, net.Local(j)); len(ps) != 4 || inv != 0 {
			t.Errorf("Peers() = %d entries, %d invented; want the 4 real members", len(ps), inv)
		}
	})
}

// TestCoreJoinerAwaitsSuggestedMembers: a joiner through one seed of three
// members is not ready on the seed's relay alone: the seed's table names
// two more members, which it awaits until it hears them (their gossip
// reaches it within a heartbeat), so it never decides with N = 2. Their
// existence comes from their own batches, not from the table.
func TestCoreJoinerAwaitsSuggestedMembers(t *testing.T) {
	const seed = 83
	reportSeed(t, seed)
	rules := apiRule(limiter.FixedWindow, 1000)
	join := func(c *node.CoreConfig) { c.Join = true }
	net := cluster(t, 3, seed, rules, join)
	net.Delay = 5 * time.Millisecond
	run(t, net, time.Second, nil)
	j := net.AddThrough(newCore(t, "n03", net.Now(), rules, join), 0)
	c := net.Core(j)
	readyN := 0
	run(t, net, 2*time.Second, func(time.Time) {
		if c.Joined() && readyN == 0 {
			readyN, _ = c.Members()
		}
	})
	if readyN != 4 {
		t.Errorf("the joiner counted N = %d when it became ready; want 4", readyN)
	}
}

// TestCoreLoneEvictionAnnouncement: one member of five announces the
// eviction of two others and of the receiver itself (an operator's Evict
// on it alone, or a member that lies). Nobody adopts it: no member is
// evicted elsewhere and no member takes a new incarnation, for longer than
// an eviction is announced. Before, every receiver evicted the named
// members, and a named member re-incarnated and dropped its leases on one
// member's word. Then three of the five evict one member: a strict
// majority, which the others adopt and which makes it re-incarnate once.
func TestCoreLoneEvictionAnnouncement(t *testing.T) {
	const seed = 87
	reportSeed(t, seed)
	rules := []limiter.Rule{
		{Name: "api", Algorithm: limiter.FixedWindow, Limit: 1000, Window: time.Second},
		{Name: "cc", Algorithm: limiter.Concurrency, Limit: 100, LeaseTTL: 5 * time.Minute},
	}
	net := cluster(t, 5, seed, rules, nil)
	net.Delay = 5 * time.Millisecond
	rec := record(net)
	run(t, net, time.Second, nil)
	incs := make([]uint64, 5)
	for i := range 5 {
		incs[i] = net.Core(i).Self().Incarnation
	}
	if _, d, err := net.Core(0).Acquire(net.Local(0), "cc", "k", ""); err != nil || !d.Allowed {
		t.Fatalf("Acquire = %+v, %v", d, err)
	}
	for _, p := range []string{"n00", "n01", "n02"} {
		if err := net.Core(4).Evict(net.Local(4), p); err != nil {
			t.Fatal(err)
		}
	}
	run(t, net, 70*time.Second, nil) // past evictMemory (1 min)
	for i := range 5 {
		if len(rec.newInc[i]) != 0 || net.Core(i).Self().Incarnation != incs[i] {
			t.Errorf("member %d took new incarnations %v on one member's word", i, rec.newInc[i])
		}
	}
	for i := range 4 {
		if n, _ := net.Core(i).Members(); n != 5 {
			t.Errorf("member %d counts N = %d; want 5", i, n)
		}
	}
	if ls := net.Core(0).Leases(); len(ls) != 1 {
		t.Errorf("member 0 holds %d leases, want its 1", len(ls))
	}
	if got := total(t, net.Core(1), net.Local(1), "cc", "k"); got != 1 {
		t.Errorf("member 1 counts %d of member 0's leases, want 1", got)
	}

	at := net.Now()
	for _, i := range []int{1, 2, 3} {
		if err := net.Core(i).Evict(net.Local(i), "n00"); err != nil {
			t.Fatal(err)
		}
	}
	run(t, net, 2*time.Second, nil)
	if len(rec.newInc[0]) != 1 {
		t.Errorf("member 0 took new incarnations %v after a majority evicted it; want one", rec.newInc[0])
	}
	if ls := net.Core(0).Leases(); len(ls) != 0 {
		t.Errorf("member 0 still holds %d leases after its eviction by a majority", len(ls))
	}
	for i := 1; i < 5; i++ {
		if len(rec.newInc[i]) != 0 {
			t.Errorf("member %d took new incarnations %v", i, rec.newInc[i])
		}
		if n, _ := net.Core(i).Members(); i < 4 && n != 5 {
			t.Errorf("member %d counts N = %d after member 0 re-incarnated; want 5", i, n)
		}
	}
	// Member 4 had evicted member 0 alone; it adopted nothing then and
	// takes the new incarnation as a member now.
	if ch := rec.of(4, "n00", at); len(ch) == 0 || !ch[len(ch)-1].New || ch[len(ch)-1].To != node.Alive {
		t.Errorf("member 4 reported %+v about n00; want its new incarnation alive last", ch)
	}
}

// TestCoreStrictHealNoCascade: 5 cores under strict, 300 requests a second
// offered for a limit of 100, split 2 | 3 for 31 s, then healed — with the
// majority members 3 and 4 heard by the minority 300 ms after member 2,
// as streams restart one after another. The majority reclaimed the
// minority during the split: each minority member takes one new
// incarnation when it learns so, and no majority member takes any. Before,
// a minority member that heard member 2 first held a majority of what it
// heard, reclaimed members 3 and 4 at once (silent for 31 s) and announced
// it; they took new incarnations, and the cascade reached all five. Now
// the minority declares nobody dead after the heal (a reclaim needs a
// majority that has held for reclaim_after), and one member's
// announcement would not make anyone re-incarnate anyway. No window
// admits more than the limit.
func TestCoreStrictHealNoCascade(t *testing.T) {
	const (
		seed  = 89
		limit = 100
		split = 31 * time.Second
		late  = 300 * time.Millisecond
	)
	reportSeed(t, seed)
	net := cluster(t, 5, seed, apiRule(limiter.FixedWindow, limit), nil)
	net.Delay = 5 * time.Millisecond
	rec := record(net)
	perWin, denied := map[int64]int{}, map[limiter.Reason]int{}
	drive := offerTo(t, net, []int{0, 1, 2, 3, 4}, 3*limit, perWin, denied)
	run(t, net, time.Second, drive)
	net.Partition([]int{0, 1}, []int{2, 3, 4})
	run(t, net, split, drive)
	for _, i := range []int{0, 1} {
		if !net.Core(i).Fenced() {
			t.Fatalf("minority member %d is not fenced before the heal", i)
		}
	}
	healed := net.Now()
	net.Filter = func(from, to int, _ *crdt.Batch) bool {
		return !(from >= 3 && to < 2 && net.Now().Sub(healed) < late)
	}
	net.Recover()
	run(t, net, 10*time.Second, drive)
	net.Filter = nil
	for i := range 5 {
		want := 0
		if i < 2 {
			want = 1 // reclaimed by the majority during the split
		}
		if len(rec.newInc[i]) != want {
			t.Errorf("member %d took new incarnations %v; want %d", i, rec.newInc[i], want)
		}
	}
	// The minority declares nobody dead from its own evidence.
	for _, i := range []int{0, 1} {
		for _, p := range []string{"n02", "n03", "n04"} {
			for _, ch := range rec.of(i, p, healed) {
				if ch.To == node.Dead {
					t.Errorf("minority member %d declared %s dead %v after the heal", i, p, ch.at.Sub(healed))
				}
			}
		}
	}
	for i := range 5 {
		c := net.Core(i)
		if n, scale := c.Members(); n != 5 || scale != 1 || c.Fenced() || !c.Joined() {
			t.Errorf("member %d after the heal: Members() = %d, %v, fenced %v, ready %v; want 5, 1, not fenced, ready", i, n, scale, c.Fenced(), c.Joined())
		}
	}
	first := t0.UnixMilli() / 1000
	for w := first; w <= net.Now().UnixMilli()/1000; w++ {
		if perWin[w] > limit {
			t.Errorf("window %d admitted %d, over the limit %d", w-first, perWin[w], limit)
		}
	}
	t.Logf("denied: %v", denied)
}

// TestCoreRestartOnMinoritySideFences: 5 cores under strict split 2 | 3;
// minority member 0 restarts and rejoins through member 1, the only one
// it can reach. Member 1's member table lists the majority suspect, but a
// table is no evidence; the peers member 0 saw itself in its last run
// (CoreConfig.Known, saved by the runtime) are: it counts them suspect
// and fences itself, and never decides as if member 1 and itself were the
// mesh. Without them it would be ready and unfenced with N = 2 beside a
// majority deciding at the whole limit. After the heal it is a member
// like any other.
func TestCoreRestartOnMinoritySideFences(t *testing.T) {
	const seed = 91
	for _, known := range []bool{true, false} {
		t.Run(fmt.Sprintf("known_%v", known), func(t *testing.T) {
			net, cfg := fencedMinority(t, seed)
			run(t, net, cfg.DeadAfter, nil) // the majority reclaims the minority
			net.Crash(0)
			run(t, net, 100*time.Millisecond, nil)
			now := net.Local(0)
			c := newCore(t, "n00", now, apiRule(limiter.FixedWindow, 1000), func(cc *node.CoreConfig) {
				cc.Incarnation = node.NextIncarnation(net.Core(0).Self().Incarnation, now)
				cc.Join = true
				if known {
					cc.Known = []string{"n01", "n02", "n03", "n04", "n00", "n02"}
				}
			})
			var joinedAt, fencedAt time.Time
			net.OnReady = func(i int, now time.Time, rd node.Ready) {
				if i != 0 {
					return
				}
				if rd.Joined && joinedAt.IsZero() {
					joinedAt = now
				}
				if rd.Fence != nil && rd.Fence.Fenced && fencedAt.IsZero() {
					fencedAt = now
				}
			}
			net.ReplaceThrough(0, c, 1)
			run(t, net, cfg.JoinTimeout+time.Second, nil)
			net.OnReady = nil
			if known && (fencedAt.IsZero() || joinedAt.IsZero() || fencedAt.Before(joinedAt)) {
				t.Errorf("the fence was reported at %v, the join at %v; want the fence reported, not before the join", fencedAt, joinedAt)
			}
			n, _ := c.Members()
			if !known {
				if c.Fenced() || n != 2 {
					t.Errorf("without known peers: fenced %v, N = %d; the case this guards against is unfenced with N = 2", c.Fenced(), n)
				}
				return
			}
			if !c.Joined() || !c.Fenced() || n != 5 {
				t.Fatalf("restarted on the minority side: ready %v, fenced %v, N = %d; want ready, fenced, 5", c.Joined(), c.Fenced(), n)
			}
			d, err := c.Allow(net.Local(0), "api", "k", limiter.Request{})
			if err != nil {
				t.Fatal(err)
			}
			if d.Allowed || d.Reason != limiter.ReasonFenced {
				t.Errorf("decision %+v; want denied, fenced", d)
			}
			net.Recover()
			run(t, net, cfg.JoinTimeout+time.Second, nil)
			for i := range 5 {
				if n, _ := net.Core(i).Members(); n != 5 || net.Core(i).Fenced() {
					t.Errorf("member %d after the heal: N = %d, fenced %v; want 5, not fenced", i, n, net.Core(i).Fenced())
				}
			}
			if got := allowN(t, net, 0, "api", "k", 10); got != 10 {
				t.Errorf("member 0 admitted %d of 10 after the heal", got)
			}
		})
	}
}

// TestCoreKeyBudget: a member whose node.max_keys is far above the others'
// (or that invents keys) makes 5000 keys while the others' cap is 100.
// Each of them holds at most its key budget of them (keyBudget: 100 +
// 1024), counts the rest as dropped, and reports the peer once; the keys
// of an honest member and keys already held still merge, so a key held
// before the flood keeps its limit exactly across the mesh. Before, every
// member held all 5000 keys: a peer could grow another's memory without
// bound and fill its cap.
func TestCoreKeyBudget(t *testing.T) {
	const (
		seed     = 83
		maxKeys  = 100
		budget   = maxKeys + 1024
		invented = 5000
	)
	reportSeed(t, seed)
	rules := apiRule(limiter.FixedWindow, 10)
	rules[0].Window = time.Minute // nothing expires during the test
	net := nodetest.New(seed, t0)
	for i := range 3 {
		net.Add(newCore(t, fmt.Sprintf("n%02d", i), t0, rules, func(c *node.CoreConfig) {
			c.MaxKeys = maxKeys
			if i == 2 {
				c.MaxKeys = 1_000_000
			}
		}))
	}
	var reported []node.KeyBudgetChange
	net.OnReady = func(i int, _ time.Time, rd node.Ready) {
		if i == 0 {
			reported = append(reported, rd.KeyBudget...)
		}
	}
	// spend asks each member in turn for one request of key, rounds
	// times, and returns how many were admitted.
	spend := func(key string, rounds int) int {
		got := 0
		for range rounds {
			for i := range 3 {
				got += allowN(t, net, i, "api", key, 1)
				run(t, net, 50*time.Millisecond, nil)
			}
		}
		return got
	}
	run(t, net, time.Second, nil)
	if got := spend("held", 1); got != 3 {
		t.Fatalf("admitted %d of 3 before the flood", got)
	}
	liar := net.Core(2)
	for i := range invented {
		if got := allowN(t, net, 2, "api", fmt.Sprintf("invented-%04d", i), 1); got != 1 {
			t.Fatalf("the liar's key %d denied", i)
		}
		if i%100 == 99 {
			run(t, net, 20*time.Millisecond, nil)
		}
	}
	run(t, net, time.Second, nil)
	c := net.Core(0)
	if got := c.Container().Keys(); got > budget+1 {
		t.Errorf("member 0 holds %d keys, want at most the liar's budget %d and the key held before", got, budget+1)
	}
	if got, want := c.Stats().DroppedKeyBudget, uint64(invented-budget); got < want {
		t.Errorf("DroppedKeyBudget = %d, want at least %d", got, want)
	}
	if len(reported) != 1 || reported[0].Peer != liar.Self().Peer || reported[0].Keys != budget || reported[0].Budget != budget {
		t.Errorf("reported %+v, want the liar once at %d of %d keys", reported, budget, budget)
	}
	// Keys already held merge from anyone, the liar included: the key
	// held before the flood is exact across the three members.
	if got := spend("held", 10); got != 7 {
		t.Errorf("after the flood the held key admitted %d more, want exactly 7 (limit 10, 3 used)", got)
	}
	// The cost the design accepts: the liar's keys count toward the
	// others' own cap, so a key new to them is denied key_cap, as a
	// liar can deny any key by inflating its count.
	d, err := c.Allow(net.Local(0), "api", "new", limiter.Request{})
	if err != nil || d.Allowed || d.Reason != limiter.ReasonKeyCap {
		t.Errorf("a new key at a member the liar filled: %+v, %v; want denied key_cap", d, err)
	}
}

// TestCoreHoldsFutureEntriesBounded: entries for a window beyond max_skew
// ahead are held and merged once it comes within, up to maxFutureHeld
// (4096) per sender and a minute past max_skew; a member that lies about
// windows ahead costs no more. A later entry of a held slot raises it in
// place rather than taking room.
func TestCoreHoldsFutureEntriesBounded(t *testing.T) {
	rules := apiRule(limiter.FixedWindow, 1_000_000)
	c := newCore(t, "n00", t0, rules, nil)
	from := crdt.Slot{Peer: "liar", Incarnation: 1}
	nowMs := c.MeshMs(t0)
	ahead := nowMs/1000 + 10 // a window 10 s ahead
	b := &crdt.Batch{Version: crdt.Version, From: from, Seq: 1, Sent: nowMs, Clock: nowMs, RulesHash: c.RulesHash()}
	for i := range 5000 {
		b.Windows = append(b.Windows, crdt.WindowEntry{Rule: "api", Key: fmt.Sprintf("k%04d", i), WindowMs: 1000, Window: ahead, Admitted: 1, Attempted: 1})
	}
	b.Windows = append(b.Windows, crdt.WindowEntry{Rule: "api", Key: "far", WindowMs: 1000, Window: nowMs/1000 + 120, Admitted: 1, Attempted: 1})
	if err := c.Step(t0, b); err != nil {
		t.Fatal(err)
	}
	// The same slots again, raised: held in place.
	b2 := &crdt.Batch{Version: crdt.Version, From: from, Seq: 2, Sent: nowMs + 20, Clock: nowMs + 20, RulesHash: c.RulesHash()}
	b2.Windows = append(b2.Windows, crdt.WindowEntry{Rule: "api", Key: "k0000", WindowMs: 1000, Window: ahead, Admitted: 3, Attempted: 4})
	if err := c.Step(t0.Add(20*time.Millisecond), b2); err != nil {
		t.Fatal(err)
	}
	st := c.Stats()
	if st.FutureHeld != 4096 || st.DroppedFuture != 5000-4096+1 {
		t.Fatalf("held %d, dropped %d; want 4096 held and %d dropped", st.FutureHeld, st.DroppedFuture, 5000-4096+1)
	}
	if got := c.Container().Keys(); got != 0 {
		t.Fatalf("%d keys made before their window came near, want 0", got)
	}
	// Tick until the window is within max_skew (500 ms): all 4096 merge.
	for at := t0; at.Before(t0.Add(10 * time.Second)); at = at.Add(20 * time.Millisecond) {
		c.Tick(at)
		c.Ready()
	}
	if got := c.Container().Keys(); got != 4096 {
		t.Fatalf("%d keys after the window came near, want 4096", got)
	}
	u, err := c.UsageOfWindow(t0.Add(10*time.Second), "api", "k0000", ahead)
	if err != nil || u.Total != 3 {
		t.Errorf("the raised held entry counts %d admitted, want 3 (%+v, %v)", u.Total, u, err)
	}
}

// TestCoreDropsForeignWindowLengths: entries for a window length that is
// not the rule's are dropped and counted, for a key held or not. Before,
// every length a member named made a window of its own: one key could be
// made to hold thousands of windows no decision reads, each relayed on.
func TestCoreDropsForeignWindowLengths(t *testing.T) {
	rules := apiRule(limiter.FixedWindow, 1_000_000)
	c := newCore(t, "n00", t0, rules, nil)
	from := crdt.Slot{Peer: "liar", Incarnation: 1}
	nowMs := c.MeshMs(t0)
	b := &crdt.Batch{Version: crdt.Version, From: from, Seq: 1, Sent: nowMs, Clock: nowMs, RulesHash: c.RulesHash()}
	const lengths = 1000
	for ms := int64(1000); ms < 1000+lengths; ms++ {
		b.Windows = append(b.Windows, crdt.WindowEntry{Rule: "api", Key: "k", WindowMs: ms, Window: nowMs / ms, Admitted: 1, Attempted: 1})
	}
	if err := c.Step(t0, b); err != nil {
		t.Fatal(err)
	}
	if got := c.Stats().DroppedWindowLength; got != lengths-1 {
		t.Errorf("DroppedWindowLength = %d, want %d (every length but the rule's 1000 ms)", got, lengths-1)
	}
	if got := c.Container().Rule("api").Windows(); got != 1 {
		t.Errorf("the key holds %d windows, want 1", got)
	}
	u, err := c.UsageOfWindow(t0, "api", "k", nowMs/1000)
	if err != nil || u.Total != 1 {
		t.Errorf("the rule's own window counts %d admitted, want 1 (%+v, %v)", u.Total, u, err)
	}
}
