package node_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ratemesh/ratemesh/crdt"
	"github.com/ratemesh/ratemesh/limiter"
	"github.com/ratemesh/ratemesh/node"
	"github.com/ratemesh/ratemesh/node/nodetest"
)

// reportSeed logs the seed of a failed test, so the failure can be
// replayed: the seed is the bug report.
func reportSeed(t testing.TB, seed uint64) {
	t.Helper()
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("replay with seed %d", seed)
		}
	})
}

// fullState returns what c answers a new connection from peer at now: its
// full state (Core.AntiEntropy).
func fullState(t testing.TB, c *node.Core, now time.Time, peer string) []*crdt.Batch {
	t.Helper()
	rd := antiEntropy(c, now, peer)
	if len(rd.Direct) != 1 || !slices.Equal(rd.Direct[0].To, []string{peer}) {
		t.Fatalf("AntiEntropy(%q) = %+v, want one Direct to it", peer, rd.Direct)
	}
	return rd.Direct[0].Batches
}

// relayTo ticks c at now and returns the relay of its whole view that the
// Tick addresses to peer (which asked for one with its full state).
func relayTo(t testing.TB, c *node.Core, now time.Time, peer string) []*crdt.Batch {
	t.Helper()
	for _, d := range tick(c, now).Direct {
		if slices.Contains(d.To, peer) {
			return d.Batches
		}
	}
	t.Fatalf("%s's Tick sends no relay to %s", c.Self().Peer, peer)
	return nil
}

// clusterAt builds n cores started at start on a fresh network.
func clusterAt(t testing.TB, n int, seed uint64, start time.Time, rules []limiter.Rule, mut func(*node.CoreConfig)) *nodetest.Network {
	t.Helper()
	net := nodetest.New(seed, start)
	for i := range n {
		net.Add(newCore(t, fmt.Sprintf("n%02d", i), start, rules, mut))
	}
	return net
}

// run advances the network and fails the test on a Step error.
func run(t testing.TB, net *nodetest.Network, d time.Duration, each func(time.Time)) {
	t.Helper()
	if err := net.Run(d, each); err != nil {
		t.Fatal(err)
	}
}

// ruleKey names one (rule, key) of a view.
type ruleKey struct{ rule, key string }

// view is what one core knows of every (rule, key): its Usage reports.
type view map[ruleKey]node.UsageReport

// viewOf returns core c's Usage of every rule × key at its local time now.
func viewOf(t testing.TB, c *node.Core, now time.Time, keys []string) view {
	t.Helper()
	v := make(view)
	for _, r := range c.RuleNames() {
		for _, k := range keys {
			rep, err := c.Usage(now, r, k)
			if err != nil {
				t.Fatal(err)
			}
			v[ruleKey{r, k}] = rep
		}
	}
	return v
}

// views returns every running member's view.
func views(t testing.TB, net *nodetest.Network, keys []string) []view {
	t.Helper()
	out := make([]view, net.Len())
	for i := range out {
		if !net.Down(i) {
			out[i] = viewOf(t, net.Core(i), net.Local(i), keys)
		}
	}
	return out
}

func sortedRuleKeys(v view) []ruleKey {
	rks := make([]ruleKey, 0, len(v))
	for rk := range v {
		rks = append(rks, rk)
	}
	slices.SortFunc(rks, func(a, b ruleKey) int {
		if c := strings.Compare(a.rule, b.rule); c != 0 {
			return c
		}
		return strings.Compare(a.key, b.key)
	})
	return rks
}

func fmtSlots(s []node.SlotUsage) string {
	var b strings.Builder
	for _, x := range s {
		fmt.Fprintf(&b, " %s/%d=%d/%d", x.Peer, x.Incarnation, x.Admitted, x.Attempted)
	}
	return b.String()
}

// diffViews describes how b differs from a (Window, Total and every
// slot's values), or returns "" when they are identical.
func diffViews(a, b view) string {
	var out []string
	for _, rk := range sortedRuleKeys(a) {
		x, y := a[rk], b[rk]
		if x.Window != y.Window || x.Total != y.Total || !slices.Equal(x.Slots, y.Slots) {
			out = append(out, fmt.Sprintf("%s/%s: window %d total %d [%s ] vs window %d total %d [%s ]",
				rk.rule, rk.key, x.Window, x.Total, fmtSlots(x.Slots), y.Window, y.Total, fmtSlots(y.Slots)))
		}
	}
	if len(a) != len(b) {
		out = append(out, fmt.Sprintf("%d vs %d (rule, key) pairs", len(a), len(b)))
	}
	return strings.Join(out, "\n")
}

// converged returns "" when every running member holds the same view,
// or the first difference found.
func converged(t testing.TB, net *nodetest.Network, keys []string) string {
	t.Helper()
	vs := views(t, net, keys)
	first := -1
	for i, v := range vs {
		if v == nil {
			continue
		}
		if first < 0 {
			first = i
			continue
		}
		if d := diffViews(vs[first], v); d != "" {
			return fmt.Sprintf("member %d vs member %d:\n%s", first, i, d)
		}
	}
	return ""
}

// slotKey names one slot's values in a view: (rule, key, window, slot).
type slotKey struct {
	rule, key string
	window    int64
	slot      crdt.Slot
}

// slotValues flattens a view into per-slot (admitted, attempted) values.
func slotValues(v view) map[slotKey][2]uint64 {
	out := make(map[slotKey][2]uint64)
	for rk, rep := range v {
		for _, s := range rep.Slots {
			out[slotKey{rk.rule, rk.key, rep.Window, crdt.Slot{Peer: s.Peer, Incarnation: s.Incarnation}}] = [2]uint64{s.Admitted, s.Attempted}
		}
	}
	return out
}

// lowered returns the slot values of before that after holds lower. A
// window that ended between the two is not compared (it was collected,
// not lowered). For a concurrency rule only the acquired count must not
// fall (held leases fall on release), and a slot absent from after is
// not compared (a retired incarnation's leases stop counting). skip, if
// not nil, excludes further slots.
func lowered(before, after view, skip func(slotKey) bool) []string {
	a := slotValues(after)
	var out []string
	for k, v := range slotValues(before) {
		if skip != nil && skip(k) {
			continue
		}
		rep := after[ruleKey{k.rule, k.key}]
		if rep.Window != k.window {
			continue
		}
		w, ok := a[k]
		if rep.WindowMs == 0 {
			if ok && w[1] < v[1] {
				out = append(out, fmt.Sprintf("%s/%s slot %s: acquired %d -> %d", k.rule, k.key, k.slot, v[1], w[1]))
			}
			continue
		}
		if w[0] < v[0] || w[1] < v[1] {
			out = append(out, fmt.Sprintf("%s/%s window %d slot %s: %v -> %v", k.rule, k.key, k.window, k.slot, v, w))
		}
	}
	slices.Sort(out)
	return out
}

// own returns core c's own slot in rep.
func own(c *node.Core, rep node.UsageReport) node.SlotUsage {
	for _, s := range rep.Slots {
		if s.Peer == c.Self().Peer && s.Incarnation == c.Self().Incarnation {
			return s
		}
	}
	return node.SlotUsage{}
}

// unacked returns u for (rule, key) at core c: its own admitted credits of
// the current window that not every alive member has acknowledged.
func unacked(t testing.TB, c *node.Core, now time.Time, rule, key string) uint64 {
	t.Helper()
	rep, err := c.Usage(now, rule, key)
	if err != nil {
		t.Fatal(err)
	}
	s := c.Container().Lookup(rule).Series(key)
	if s == nil {
		return 0
	}
	w := s.Window(rep.WindowMs, rep.Window)
	if w == nil {
		return 0
	}
	if o := own(c, rep).Admitted; o > w.Acked {
		return o - w.Acked
	}
	return 0
}

// allowN asks core i for n requests of cost 1 at its current local time
// and returns how many were admitted.
func allowN(t testing.TB, net *nodetest.Network, i int, rule, key string, n int) int {
	t.Helper()
	got := 0
	for range n {
		d, err := net.Core(i).Allow(net.Local(i), rule, key, limiter.Request{})
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed {
			got++
		}
	}
	return got
}

// total returns core c's merged Total of (rule, key) at now.
func total(t testing.TB, c *node.Core, now time.Time, rule, key string) uint64 {
	t.Helper()
	rep, err := c.Usage(now, rule, key)
	if err != nil {
		t.Fatal(err)
	}
	return rep.Total
}

// state returns how core c sees peer.
func state(t testing.TB, c *node.Core, now time.Time, peer string) node.State {
	t.Helper()
	for _, p := range c.Peers(now) {
		if p.Peer == peer {
			return p.State
		}
	}
	t.Fatalf("%s does not know %s", c.Self().Peer, peer)
	return 0
}

// tick ticks c at now and returns the Ready it hands over.
func tick(c *node.Core, now time.Time) node.Ready {
	c.Tick(now)
	return c.Ready()
}

// antiEntropy has c answer new connections from peers at now and returns
// the Ready it hands over.
func antiEntropy(c *node.Core, now time.Time, peers ...string) node.Ready {
	c.AntiEntropy(now, peers...)
	return c.Ready()
}

// flush flushes c at now and returns the Ready it hands over.
func flush(c *node.Core, now time.Time) node.Ready {
	c.Flush(now)
	return c.Ready()
}

// leave has c leave at now and returns the Ready it hands over.
func leave(c *node.Core, now time.Time) node.Ready {
	c.Leave(now)
	return c.Ready()
}
