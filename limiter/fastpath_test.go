package limiter

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ratemesh/ratemesh/crdt"
)

// TestAllowFastPathMatchesGeneral drives two limiters of the same plain
// rule through the same random run — requests of every kind, merges from
// other members, acknowledgements, windows turning — one with AllowInto's
// fast path and one forced through the general one (decide, then record),
// and requires the same decision every time and the same counters after
// every step: the fast path is an exact shortcut, never a second opinion.
func TestAllowFastPathMatchesGeneral(t *testing.T) {
	rules := []Rule{
		{Name: "fixed", Algorithm: FixedWindow, Limit: 20, Window: time.Second},
		{Name: "sliding", Algorithm: SlidingWindow, Limit: 20, Window: time.Second},
		{Name: "small", Algorithm: SlidingWindow, Limit: 3, Window: time.Second},
		{Name: "shadow", Algorithm: FixedWindow, Limit: 5, Window: time.Second, Shadow: true},
		{Name: "extra", Algorithm: SlidingWindow, Limit: 10, Window: time.Second,
			Overrides: map[string]uint64{"k1": 4},
			Classes:   map[string]Class{"gold": {Multiplier: 2}, "free": {Unlimited: true}},
			Costs:     map[string]Cost{"bulk": {Each: 3}}},
	}
	for _, r := range rules {
		for seed := uint64(1); seed <= 8; seed++ {
			t.Run(fmt.Sprintf("%s/seed=%d", r.Name, seed), func(t *testing.T) {
				fast, fc := newLimiter(t, r)
				slow, sc := newLimiter(t, r)
				if !fast.plain {
					t.Fatalf("rule %s is not plain: the test would not reach the fast path", r.Name)
				}
				slow.plain = false // the general path, as for any other rule
				runBoth(t, rand.New(rand.NewPCG(seed, 28)), r, fast, fc, slow, sc)
			})
		}
	}
}

func runBoth(t *testing.T, rng *rand.Rand, r Rule, fast *Limiter, fc *crdt.Container, slow *Limiter, sc *crdt.Container) {
	t.Helper()
	keys := []string{"k1", "k2", "k3"}
	nowMs := t0 + rng.Int64N(1000)
	admitted := 0
	for step := range 400 {
		nowMs += rng.Int64N(40) // a few steps a window; now and then a skipped one
		if rng.IntN(50) == 0 {
			nowMs += 1000 + rng.Int64N(1500)
		}
		key := keys[rng.IntN(len(keys))]
		switch rng.IntN(10) {
		case 0, 1: // another member's usage arrives, on both replicas alike
			idx := floorDiv(nowMs, 1000) - rng.Int64N(2)
			id := crdt.SlotID(1 + rng.IntN(40)) // past 16 writers the counters go dense
			adm := uint64(rng.IntN(8))
			att := adm + uint64(rng.IntN(4))
			for _, c := range []*crdt.Container{fc, sc} {
				w := c.Rule(r.Name).Ensure(key).EnsureWindow(1000, idx)
				w.Admitted.Raise(id, w.Admitted.Get(id)+adm)
				w.Attempted.Raise(id, w.Attempted.Get(id)+att)
			}
			continue
		case 2: // the mesh acknowledges some of this member's usage
			for _, c := range []*crdt.Container{fc, sc} {
				if s := c.Rule(r.Name).Series(key); s != nil {
					for _, w := range s.Windows() {
						w.Acked = max(w.Acked, w.Admitted.Get(self)-min(w.Admitted.Get(self), 1))
					}
				}
			}
			continue
		}
		req := Request{}
		switch rng.IntN(8) {
		case 0:
			req.Cost, req.HasCost = uint64(rng.IntN(4)), true // peeks included
		case 1:
			req.Cost, req.HasCost = r.Limit+1+uint64(rng.IntN(3)), true // never admissible
		case 2:
			if r.Classes != nil {
				req.Class = []string{"gold", "free"}[rng.IntN(2)]
			}
		case 3:
			if r.Costs != nil {
				req.Type, req.Units = "bulk", uint64(1+rng.IntN(2))
			}
		}
		env := Env{
			NowMs:    nowMs,
			Members:  1 + rng.IntN(5),
			Rank:     rng.IntN(5),
			Scale:    []float64{0, 1, 0.5, 0.75}[rng.IntN(4)],
			AckDelay: 40 * time.Millisecond,
		}
		var df, ds Decision
		ef := fast.AllowInto(&df, key, &req, &env)
		es := slow.AllowInto(&ds, key, &req, &env)
		if (ef == nil) != (es == nil) || df != ds {
			t.Fatalf("step %d, %q %+v at %+v:\nfast path %+v (%v)\ngeneral   %+v (%v)", step, key, req, env, df, ef, ds, es)
		}
		if got, want := dumpSeries(fc.Rule(r.Name).Series(key)), dumpSeries(sc.Rule(r.Name).Series(key)); got != want {
			t.Fatalf("step %d, %q %+v at %+v: the counters differ\nfast path %s\ngeneral   %s", step, key, req, env, got, want)
		}
		if got, want := fc.Dirty(), sc.Dirty(); got != want {
			t.Fatalf("step %d: %d dirty windows after the fast path, %d after the general one", step, got, want)
		}
		if df.Reason == ReasonAdmitted {
			admitted++
		}
		if rng.IntN(20) == 0 { // a flush
			fc.TakeDirty()
			sc.TakeDirty()
		}
	}
	if got, want := dumpRule(fc, r.Name), dumpRule(sc, r.Name); got != want {
		t.Fatalf("the counters differ at the end\nfast path %s\ngeneral   %s", got, want)
	}
	if admitted < 20 {
		t.Fatalf("only %d requests admitted within the share: the run hardly exercised the fast path", admitted)
	}
}

// dumpRule renders every counter of rule name in c, keys in order.
func dumpRule(c *crdt.Container, name string) string {
	rs := c.Lookup(name)
	if rs == nil {
		return "none"
	}
	var ss []*crdt.Series
	rs.Each(func(s *crdt.Series) { ss = append(ss, s) })
	slices.SortFunc(ss, func(a, b *crdt.Series) int { return strings.Compare(a.Key, b.Key) })
	var out strings.Builder
	for _, s := range ss {
		out.WriteString(dumpSeries(s))
	}
	return out.String()
}

// dumpSeries renders the windows of s (nil for none): per window its
// acknowledged part, totals and every slot's values.
func dumpSeries(s *crdt.Series) string {
	if s == nil {
		return "none\n"
	}
	b := []byte(s.Key + ":")
	slot := func(id crdt.SlotID, v uint64) {
		b = append(b, ' ')
		b = strconv.AppendUint(b, uint64(id), 10)
		b = append(b, '=')
		b = strconv.AppendUint(b, v, 10)
	}
	for _, w := range s.Windows() {
		b = append(b, " ["...)
		b = strconv.AppendInt(b, w.Index, 10)
		b = append(b, " acked "...)
		b = strconv.AppendUint(b, w.Acked, 10)
		b = append(b, " adm "...)
		b = strconv.AppendUint(b, w.Admitted.Value(), 10)
		w.Admitted.Each(slot)
		b = append(b, " att "...)
		b = strconv.AppendUint(b, w.Attempted.Value(), 10)
		w.Attempted.Each(slot)
		b = append(b, ']')
	}
	return string(append(b, '\n'))
}
