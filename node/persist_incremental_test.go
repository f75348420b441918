package node_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/ratemesh/ratemesh/limiter"
	"github.com/ratemesh/ratemesh/node"
)

func pkey(i int) string { return fmt.Sprintf("k%02d", i) }

// exportedKeys returns the sorted records of f as "rule/key/peer adm/att".
func exportedKeys(f node.Flush) []string {
	node.SortWindowRecords(f.Windows)
	var out []string
	for _, r := range f.Windows {
		out = append(out, fmt.Sprintf("%s/%s/%s %d/%d", r.Rule, r.Key, r.Slot.Peer, r.Admitted, r.Attempted))
	}
	return out
}

// TestPersisterExportsOnlyChanged: after changes to k of n persisted
// windows — the member's own admissions, published by a tick or not yet,
// and a peer's merged by Step — Export returns exactly those k windows'
// records; a merge that raises nothing exports nothing.
func TestPersisterExportsOnlyChanged(t *testing.T) {
	now := t0.Add(10 * time.Minute)
	a := newCore(t, "a", now, persistRules(), nil)
	b := newCore(t, "b", now, persistRules(), nil)
	pa := node.NewPersister(a, time.Minute)
	const n = 40
	for i := range n {
		c := a
		if i >= n/2 {
			c = b
		}
		mustAllow(t, c, now, "hour", pkey(i), 1)
	}
	exchange(t, b, a, now)
	f := persistOf(a, now)
	if len(f.Windows) != n {
		t.Fatalf("first export: %d records, want %d", len(f.Windows), n)
	}
	a.Persisted(&f, nil)
	if seen, indexed := node.PersisterTracked(pa); seen != n || indexed != n {
		t.Errorf("tracked %d windows (%d indexed), want %d", seen, indexed, n)
	}

	t1 := now.Add(100 * time.Millisecond)
	mustAllow(t, a, t1, "hour", pkey(3), 2)
	tick(a, t1) // gossip takes k03 from the container's dirty set
	mustAllow(t, a, t1, "hour", pkey(7), 1)
	mustAllow(t, a, t1, "sec", pkey(1), 1) // too short to persist
	mustAllow(t, b, t1, "hour", pkey(25), 1)
	mustAllow(t, b, t1, "hour", pkey(31), 3)
	exchange(t, b, a, t1)
	got := exportedKeys(persistOf(a, t1))
	want := []string{"hour/k03/a 3/3", "hour/k07/a 2/2", "hour/k25/b 2/2", "hour/k31/b 4/4"}
	if !slices.Equal(got, want) {
		t.Errorf("export after 4 changes = %q, want %q", got, want)
	}

	// b's full state again: merges that raise nothing. a's own k07 is
	// still waiting for gossip; it was exported and has not changed.
	t2 := t1.Add(time.Second)
	for _, bt := range fullState(t, b, t2, "a") {
		if err := a.Step(t2, bt); err != nil {
			t.Fatal(err)
		}
	}
	if f := persistOf(a, t2); !f.Empty() {
		t.Errorf("export after merges that raised nothing = %q, want none", exportedKeys(f))
	}
	if seen, indexed := node.PersisterTracked(pa); seen != n || indexed != n {
		t.Errorf("tracked %d windows (%d indexed), want %d", seen, indexed, n)
	}
}

// TestPersisterForgetsEndedWindows: windows that ended leave the
// persister's bookkeeping without a walk.
func TestPersisterForgetsEndedWindows(t *testing.T) {
	now := t0.Add(10 * time.Minute)
	rules := append(persistRules(), limiter.Rule{Name: "min", Algorithm: limiter.SlidingWindow, Limit: 10, Window: 2 * time.Minute})
	a := newCore(t, "a", now, rules, nil)
	pa := node.NewPersister(a, time.Minute)
	const n = 10
	for i := range n {
		mustAllow(t, a, now, "hour", pkey(i), 1)
		mustAllow(t, a, now, "min", pkey(i), 1)
	}
	f := persistOf(a, now)
	if len(f.Windows) != 2*n {
		t.Fatalf("first export: %d records, want %d", len(f.Windows), 2*n)
	}
	a.Persisted(&f, nil)

	// The 2-minute windows of minute 10 end (with the next one) at minute
	// 14: they are forgotten then, not before.
	for _, tc := range []struct {
		at   time.Time
		want int
	}{{t0.Add(14*time.Minute - time.Millisecond), 2 * n}, {t0.Add(14 * time.Minute), n}} {
		if f := persistOf(a, tc.at); !f.Empty() {
			t.Errorf("export at %v without changes = %q", tc.at, exportedKeys(f))
		}
		if seen, indexed := node.PersisterTracked(pa); seen != tc.want || indexed != tc.want {
			t.Errorf("tracked %d windows (%d indexed) at %v, want %d", seen, indexed, tc.at, tc.want)
		}
	}
	t1 := now.Add(5 * time.Minute)
	mustAllow(t, a, t1, "hour", pkey(0), 1)
	mustAllow(t, a, t1, "min", pkey(0), 1)
	want := []string{"hour/k00/a 2/2", "min/k00/a 1/1"}
	if got := exportedKeys(persistOf(a, t1)); !slices.Equal(got, want) {
		t.Errorf("export at +5 min = %q, want %q", got, want)
	}
	if seen, indexed := node.PersisterTracked(pa); seen != n+1 || indexed != n+1 {
		t.Errorf("tracked %d windows (%d indexed), want the %d hour windows and the new 2-minute one", seen, indexed, n+1)
	}

	// Three hours on, every window has ended; only a new one is tracked.
	t2 := now.Add(3 * time.Hour)
	mustAllow(t, a, t2, "hour", pkey(5), 1)
	want = []string{"hour/k05/a 1/1"}
	if got := exportedKeys(persistOf(a, t2)); !slices.Equal(got, want) {
		t.Errorf("export at +3 h = %q, want %q", got, want)
	}
	if seen, indexed := node.PersisterTracked(pa); seen != 1 || indexed != 1 {
		t.Errorf("tracked %d windows (%d indexed) at +3 h, want 1", seen, indexed)
	}
	if f := persistOf(a, t2.Add(3*time.Hour)); !f.Empty() {
		t.Errorf("export with every window ended = %q", exportedKeys(f))
	}
	if seen, indexed := node.PersisterTracked(pa); seen != 0 || indexed != 0 {
		t.Errorf("tracked %d windows (%d indexed) with every window ended, want 0", seen, indexed)
	}
}

// TestPersisterFailedFlushExportsAll: after a failed write the next export
// carries every persisted window, changed or not, with all its slots.
func TestPersisterFailedFlushExportsAll(t *testing.T) {
	now := t0.Add(10 * time.Minute)
	a := newCore(t, "a", now, persistRules(), nil)
	b := newCore(t, "b", now, persistRules(), nil)
	node.NewPersister(a, time.Minute)
	const n = 12
	for i := range n {
		mustAllow(t, a, now, "hour", pkey(i), 1)
		mustAllow(t, b, now, "hour", pkey(i), 2)
	}
	exchange(t, b, a, now)
	f := persistOf(a, now)
	all := exportedKeys(f)
	if len(all) != 2*n {
		t.Fatalf("first export: %d records, want %d (two slots of %d windows)", len(all), 2*n, n)
	}
	a.Persisted(&f, nil)

	t1 := now.Add(time.Second)
	mustAllow(t, a, t1, "hour", pkey(4), 1)
	f = persistOf(a, t1)
	if got, want := exportedKeys(f), []string{"hour/k04/a 2/2", "hour/k04/b 2/2"}; !slices.Equal(got, want) {
		t.Fatalf("export after one change = %q, want %q", got, want)
	}
	a.Persisted(&f, errors.New("disk full"))
	t2 := t1.Add(time.Second)
	f = persistOf(a, t2)
	all[slices.Index(all, "hour/k04/a 1/1")] = "hour/k04/a 2/2"
	if got := exportedKeys(f); !slices.Equal(got, all) {
		t.Errorf("export after a failed write = %q, want every window %q", got, all)
	}
	a.Persisted(&f, nil)
	if f := persistOf(a, t2.Add(time.Second)); !f.Empty() {
		t.Errorf("export after the retry succeeded = %q, want none", exportedKeys(f))
	}
}

// TestPersisterIncrementalMatchesFullWalk runs seeded random sequences of
// admissions on three members, gossip between them (with skewed clocks,
// so mesh time moves), leases, rule changes, restores, exports and
// flushes that fail, and checks every export against the first version's
// walk over every window (node.RefPersister) on the same core.
func TestPersisterIncrementalMatchesFullWalk(t *testing.T) {
	rulesA := append(persistRules(),
		limiter.Rule{Name: "min", Algorithm: limiter.SlidingWindow, Limit: 6, Window: 2 * time.Minute},
		limiter.Rule{Name: "half", Algorithm: limiter.FixedWindow, Limit: 6, Window: 30 * time.Second})
	// rulesB changes "hour" to a 2-minute window and drops "min".
	rulesB := []limiter.Rule{
		{Name: "hour", Algorithm: limiter.FixedWindow, Limit: 10, Window: 2 * time.Minute},
		{Name: "sec", Algorithm: limiter.FixedWindow, Limit: 10, Window: time.Second},
		{Name: "cc", Algorithm: limiter.Concurrency, Limit: 5, LeaseTTL: time.Minute},
		{Name: "half", Algorithm: limiter.FixedWindow, Limit: 6, Window: 30 * time.Second},
	}
	seeds := 40
	if testing.Short() {
		seeds = 8
	}
	var exports, nonEmpty, records int
	for seed := range uint64(seeds) {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) {
			exports, nonEmpty, records = comparePersisters(t, seed, rulesA, rulesB, exports, nonEmpty, records)
		})
	}
	if exports < 15*seeds || nonEmpty < exports/2 || records < 4*exports {
		t.Errorf("the comparison saw too little: %d exports, %d with windows, %d records", exports, nonEmpty, records)
	}
	t.Logf("%d exports compared, %d with windows, %d records", exports, nonEmpty, records)
}

// comparePersisters runs one seeded sequence for
// TestPersisterIncrementalMatchesFullWalk and adds to its counts.
func comparePersisters(t *testing.T, seed uint64, rulesA, rulesB []limiter.Rule, exports, nonEmpty, records int) (int, int, int) {
	rng := rand.New(rand.NewPCG(seed, 7))
	reportSeed(t, seed)
	now := t0.Add(time.Duration(rng.IntN(3600)) * time.Second)

	// An earlier incarnation of a leaves state on disk.
	a0 := newCore(t, "a", now, rulesA, nil)
	for range 20 {
		mustAllow(t, a0, now, []string{"hour", "min"}[rng.IntN(2)], pkey(rng.IntN(12)), 1)
	}
	node.NewPersister(a0, time.Minute)
	saved := persistOf(a0, now)
	now = now.Add(time.Duration(rng.IntN(5000)) * time.Millisecond)
	// Under the available policy: time jumps make members silent, and a
	// strict minority would fence itself and admit nothing to export.
	available := func(cfg *node.CoreConfig) { cfg.Policy = node.Available }
	a := newCore(t, "a", now, rulesA, func(cfg *node.CoreConfig) {
		cfg.Incarnation = node.NextIncarnation(a0.Self().Incarnation, now)
		available(cfg)
	})
	skew := []time.Duration{0, time.Duration(rng.IntN(800)) * time.Millisecond, -time.Duration(rng.IntN(800)) * time.Millisecond}
	cores := []*node.Core{a, newCore(t, "b", now.Add(skew[1]), rulesA, available), newCore(t, "c", now.Add(skew[2]), rulesA, available)}
	p := node.NewPersister(a, time.Minute)
	ref := node.NewRefPersister(a, time.Minute)
	p.Restore(now, saved.Windows, saved.Leases)
	ref.Restored(now, saved.Leases)

	var pending, refPending *node.Flush
	var leases []string
	useB := false
	for step := range 500 {
		switch r := rng.IntN(100); {
		case r < 35:
			i := rng.IntN(3)
			rule := []string{"hour", "hour", "min", "sec", "half"}[rng.IntN(5)]
			if _, err := cores[i].Allow(now.Add(skew[i]), rule, pkey(rng.IntN(12)), limiter.Request{Cost: uint64(1 + rng.IntN(2)), HasCost: true}); err != nil && !errors.Is(err, node.ErrUnknownRule) {
				t.Fatalf("seed %d step %d: Allow: %v", seed, step, err)
			}
		case r < 50:
			i := rng.IntN(3)
			for _, bt := range tick(cores[i], now.Add(skew[i])).Messages {
				for j, c := range cores {
					if j != i && rng.IntN(5) > 0 { // some batches are lost
						if err := c.Step(now.Add(skew[j]), bt); err != nil {
							t.Fatalf("seed %d step %d: Step: %v", seed, step, err)
						}
					}
				}
			}
		case r < 58:
			if len(leases) > 0 && rng.IntN(2) == 0 {
				k := rng.IntN(len(leases))
				_ = a.Release(now, leases[k]) // it may have expired
				leases = slices.Delete(leases, k, k+1)
			} else if l, d, err := a.Acquire(now, "cc", pkey(rng.IntN(3)), ""); err != nil {
				t.Fatalf("seed %d step %d: Acquire: %v", seed, step, err)
			} else if d.Allowed {
				leases = append(leases, l.ID)
			}
		case r < 70:
			if pending == nil {
				f, rf := persistOf(a, now), ref.Export(now)
				exports++
				if len(f.Windows) > 0 {
					nonEmpty++
					records += len(f.Windows)
				}
				node.SortWindowRecords(f.Windows)
				node.SortWindowRecords(rf.Windows)
				if !reflect.DeepEqual(f, rf) {
					t.Fatalf("seed %d step %d: Export =\n%+v\nthe full walk =\n%+v", seed, step, f, rf)
				}
				pending, refPending = &f, &rf
			}
		case r < 80:
			if pending != nil {
				var err error
				if rng.IntN(5) == 0 {
					err = errors.New("disk full")
				}
				a.Persisted(pending, err)
				ref.Done(refPending, err)
				pending, refPending = nil, nil
			}
		case r < 97:
			d := time.Duration(rng.IntN(2000)) * time.Millisecond
			switch rng.IntN(20) {
			case 0:
				d = time.Duration(rng.IntN(3600)) * time.Second
			case 1, 2, 3:
				d = time.Duration(rng.IntN(180)) * time.Second
			}
			now = now.Add(d)
		default:
			rules := rulesA
			if useB = !useB; useB {
				rules = rulesB
			}
			if err := a.SetRules(rules); err != nil {
				t.Fatal(err)
			}
		}
	}
	return exports, nonEmpty, records
}

// TestPersisterSkipsCollectedWindows: a window the core collected is not
// exported even when it changed before and the export's mesh time is
// earlier than the collection's (mesh time may step back), as the walk
// over the held windows would not find it.
func TestPersisterSkipsCollectedWindows(t *testing.T) {
	now := t0.Add(10 * time.Minute)
	rules := append(persistRules(), limiter.Rule{Name: "min", Algorithm: limiter.FixedWindow, Limit: 10, Window: 2 * time.Minute})
	a := newCore(t, "a", now, rules, nil)
	node.NewPersister(a, time.Minute)
	ref := node.NewRefPersister(a, time.Minute)
	persistOf(a, now)
	ref.Export(now)
	t1 := now.Add(time.Minute)
	mustAllow(t, a, t1, "min", pkey(1), 1)
	mustAllow(t, a, t1, "hour", pkey(1), 1)
	tick(a, t1)                    // gossip takes both changes
	tick(a, t1.Add(4*time.Minute)) // the 2-minute window is collected
	f, rf := persistOf(a, t1), ref.Export(t1)
	want := []string{"hour/k01/a 1/1"}
	if got, ref := exportedKeys(f), exportedKeys(rf); !slices.Equal(got, want) || !slices.Equal(ref, want) {
		t.Errorf("export of a collected window's change = %q (the walk: %q), want %q", got, ref, want)
	}
}
