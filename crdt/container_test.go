package crdt_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/ratemesh/ratemesh/crdt"
)

type winID struct{ ms, idx int64 }

// windowIDs returns the (WindowMs, Index) of s's windows in held order.
func windowIDs(t *testing.T, s *crdt.Series) []winID {
	t.Helper()
	out := make([]winID, 0, len(s.Windows()))
	for _, w := range s.Windows() {
		out = append(out, winID{w.WindowMs, w.Index})
	}
	return out
}

func TestContainerRule(t *testing.T) {
	c := crdt.NewContainer()
	if got := c.Lookup("api"); got != nil {
		t.Fatalf("Lookup on empty container = %v, want nil", got)
	}
	api := c.Rule("api")
	if api.Name != "api" {
		t.Errorf("Name = %q, want api", api.Name)
	}
	if c.Rule("api") != api || c.Lookup("api") != api {
		t.Errorf("Rule/Lookup return a different rule set on second call")
	}
	c.Rule("login")
	got := c.Rules()
	slices.Sort(got)
	if want := []string{"api", "login"}; !slices.Equal(got, want) {
		t.Errorf("Rules = %v, want %v", got, want)
	}

	if s := api.Series("k"); s != nil {
		t.Fatalf("Series on empty rule = %v, want nil", s)
	}
	s := api.Ensure("k")
	if s.Key != "k" || s.Rule() != api {
		t.Errorf("series = {Key %q, Rule %p}, want {k, %p}", s.Key, s.Rule(), api)
	}
	if api.Ensure("k") != s || api.Series("k") != s {
		t.Errorf("Ensure/Series return a different series on second call")
	}
	api.Ensure("j")
	if api.Len() != 2 {
		t.Errorf("Len = %d, want 2", api.Len())
	}
	var keys []string
	api.Each(func(s *crdt.Series) { keys = append(keys, s.Key) })
	slices.Sort(keys)
	if want := []string{"j", "k"}; !slices.Equal(keys, want) {
		t.Errorf("Each visited %v, want %v", keys, want)
	}
}

func TestWindowBounds(t *testing.T) {
	tests := []struct {
		ms, idx    int64
		start, end int64
		expiresAt  int64
	}{
		{1000, 0, 0, 1000, 2000},
		{1000, 5, 5000, 6000, 7000},
		{60_000, 28_000_000, 1_680_000_000_000, 1_680_000_060_000, 1_680_000_120_000},
		{1, 7, 7, 8, 9},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%d/%d", tt.ms, tt.idx), func(t *testing.T) {
			w := crdt.NewContainer().Rule("r").Ensure("k").EnsureWindow(tt.ms, tt.idx)
			if got := w.Start(); got != tt.start {
				t.Errorf("Start = %d, want %d", got, tt.start)
			}
			if got := w.End(); got != tt.end {
				t.Errorf("End = %d, want %d", got, tt.end)
			}
			if w.Expired(tt.expiresAt - 1) {
				t.Errorf("Expired(%d) = true, want false", tt.expiresAt-1)
			}
			if !w.Expired(tt.expiresAt) {
				t.Errorf("Expired(%d) = false, want true", tt.expiresAt)
			}
		})
	}
}

func TestEnsureWindowSortedAndIdempotent(t *testing.T) {
	tests := []struct {
		name   string
		ensure []winID
		want   []winID
	}{
		{"one", []winID{{1000, 3}}, []winID{{1000, 3}}},
		{"ascending", []winID{{1000, 1}, {1000, 2}, {1000, 3}}, []winID{{1000, 1}, {1000, 2}, {1000, 3}}},
		{"descending", []winID{{1000, 3}, {1000, 2}, {1000, 1}}, []winID{{1000, 1}, {1000, 2}, {1000, 3}}},
		{"middle", []winID{{1000, 1}, {1000, 3}, {1000, 2}}, []winID{{1000, 1}, {1000, 2}, {1000, 3}}},
		{"repeats", []winID{{1000, 2}, {1000, 2}, {1000, 1}, {1000, 2}, {1000, 1}}, []winID{{1000, 1}, {1000, 2}}},
		{
			"window length sorts first",
			[]winID{{60_000, 1}, {1000, 90}, {1000, 89}, {60_000, 0}, {500, 200}},
			[]winID{{500, 200}, {1000, 89}, {1000, 90}, {60_000, 0}, {60_000, 1}},
		},
		{"same index different length", []winID{{2000, 5}, {1000, 5}}, []winID{{1000, 5}, {2000, 5}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := crdt.NewContainer().Rule("r").Ensure("k")
			seen := make(map[winID]*crdt.Window)
			for _, id := range tt.ensure {
				w := s.EnsureWindow(id.ms, id.idx)
				if w.WindowMs != id.ms || w.Index != id.idx || w.Series() != s {
					t.Fatalf("EnsureWindow(%d, %d) = {%d, %d, series %p}, want series %p",
						id.ms, id.idx, w.WindowMs, w.Index, w.Series(), s)
				}
				if prev, ok := seen[id]; ok && prev != w {
					t.Errorf("EnsureWindow(%d, %d) made a second window", id.ms, id.idx)
				}
				seen[id] = w
			}
			if got := windowIDs(t, s); !slices.Equal(got, tt.want) {
				t.Errorf("windows = %v, want %v", got, tt.want)
			}
			for id, w := range seen {
				if got := s.Window(id.ms, id.idx); got != w {
					t.Errorf("Window(%d, %d) = %p, want %p", id.ms, id.idx, got, w)
				}
			}
			if got := s.Window(7, 7); got != nil {
				t.Errorf("Window of an absent id = %p, want nil", got)
			}
		})
	}
}

func TestDirtyTracking(t *testing.T) {
	c := crdt.NewContainer()
	s1 := c.Rule("r").Ensure("a")
	s2 := c.Rule("r").Ensure("b")
	w1 := s1.EnsureWindow(1000, 1)
	w2 := s1.EnsureWindow(1000, 2)
	w3 := s2.EnsureWindow(1000, 1)

	if ws, ls := c.TakeDirty(); len(ws) != 0 || len(ls) != 0 {
		t.Fatalf("TakeDirty on a clean container = %v, %v", ws, ls)
	}

	c.MarkDirty(w2)
	c.MarkDirty(w1)
	c.MarkDirty(w2)
	c.MarkLeasesDirty(s2)
	c.MarkDirty(w3)
	c.MarkLeasesDirty(s1)
	c.MarkLeasesDirty(s2)
	c.MarkDirty(w1)
	if got := c.Dirty(); got != 5 {
		t.Errorf("Dirty = %d, want 5", got)
	}
	ws, ls := c.TakeDirty()
	if want := []*crdt.Window{w2, w1, w3}; !slices.Equal(ws, want) {
		t.Errorf("dirty windows = %v, want %v (first-marked order)", ws, want)
	}
	if want := []*crdt.Series{s2, s1}; !slices.Equal(ls, want) {
		t.Errorf("dirty leases = %v, want %v (first-marked order)", ls, want)
	}
	if got := c.Dirty(); got != 0 {
		t.Errorf("Dirty after TakeDirty = %d, want 0", got)
	}
	if ws, ls := c.TakeDirty(); len(ws) != 0 || len(ls) != 0 {
		t.Errorf("second TakeDirty = %v, %v, want nothing", ws, ls)
	}

	// The marks were cleared, so marking again records again.
	c.MarkDirty(w1)
	c.MarkLeasesDirty(s1)
	ws, ls = c.TakeDirty()
	if !slices.Equal(ws, []*crdt.Window{w1}) || !slices.Equal(ls, []*crdt.Series{s1}) {
		t.Errorf("TakeDirty after re-marking = %v, %v; want [w1], [s1]", ws, ls)
	}
	// The slice the caller got is not reused by later marks.
	c.MarkDirty(w3)
	if ws[0] != w1 {
		t.Errorf("a later MarkDirty overwrote the slice TakeDirty returned")
	}
}

func TestCollectBoundary(t *testing.T) {
	// Window (1000, 5) covers [5000, 6000); it and its successor have
	// ended at 7000.
	tests := []struct {
		name    string
		nowMs   int64
		dirty   bool
		dropped int
	}{
		{"inside the window", 5500, false, 0},
		{"inside the next window", 6500, false, 0},
		{"one ms before", 6999, false, 0},
		{"at the boundary", 7000, false, 1},
		{"long after", 1 << 40, false, 1},
		{"dirty one ms before", 6999, true, 0},
		{"dirty at the boundary", 7000, true, 0},
		{"dirty long after", 1 << 40, true, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := crdt.NewContainer()
			r := c.Rule("r")
			s := r.Ensure("k")
			w := s.EnsureWindow(1000, 5)
			w.Admitted.Add(0, 1)
			if tt.dirty {
				c.MarkDirty(w)
			}
			if got := c.Collect(tt.nowMs); got != tt.dropped {
				t.Errorf("Collect(%d) = %d, want %d", tt.nowMs, got, tt.dropped)
			}
			if kept := s.Window(1000, 5) != nil; kept != (tt.dropped == 0) {
				t.Errorf("window kept = %v, want %v", kept, tt.dropped == 0)
			}
			// A series with no window left and no leases goes with it.
			if got := r.Series("k") != nil; got != (tt.dropped == 0) {
				t.Errorf("series kept = %v, want %v", got, tt.dropped == 0)
			}
			if tt.dirty {
				// The dirty window survives until it has been taken, and
				// the next Collect drops it.
				ws, _ := c.TakeDirty()
				if !slices.Equal(ws, []*crdt.Window{w}) {
					t.Errorf("TakeDirty = %v, want [w]", ws)
				}
				want := 0
				if tt.nowMs >= 7000 {
					want = 1
				}
				if got := c.Collect(tt.nowMs); got != want {
					t.Errorf("Collect after TakeDirty = %d, want %d", got, want)
				}
			}
		})
	}
}

func TestCollect(t *testing.T) {
	c := crdt.NewContainer()
	api := c.Rule("api")
	conc := c.Rule("conc")

	// "mixed": three 1 s windows and two 60 s windows; at now = 122 000
	// (1000, 120) and (60 000, 0) have ended with their successors.
	mixed := api.Ensure("mixed")
	for _, id := range []winID{{1000, 120}, {1000, 121}, {1000, 123}, {60_000, 0}, {60_000, 1}} {
		mixed.EnsureWindow(id.ms, id.idx).Admitted.Add(0, 1)
	}
	// "old": only expired windows: the series goes.
	old := api.Ensure("old")
	old.EnsureWindow(1000, 1)
	old.EnsureWindow(1000, 2)
	// "empty": no windows at all: goes.
	api.Ensure("empty")
	// "leased": a lease counter with a live lease: stays.
	leased := conc.Ensure("leased")
	leased.EnsureLeases().Raise(0, 1, 0)
	// "released": every lease released, net zero: stays, because peers
	// remember the slot's values and it must never restart from zero.
	released := conc.Ensure("released")
	released.EnsureLeases().Raise(0, 3, 3)
	released.EnsureWindow(1000, 1) // and its expired window goes
	// "released-only": N heard, P not yet: stays.
	conc.Ensure("released-only").EnsureLeases().Raise(4, 0, 1)
	// "lease-dirty": marked dirty but no counts yet: stays until taken.
	leaseDirty := conc.Ensure("lease-dirty")
	c.MarkLeasesDirty(leaseDirty)

	if got := c.Collect(122_000); got != 2+2+1 {
		t.Errorf("Collect = %d, want 5", got)
	}
	if got, want := windowIDs(t, mixed), []winID{{1000, 121}, {1000, 123}, {60_000, 1}}; !slices.Equal(got, want) {
		t.Errorf("mixed windows = %v, want %v", got, want)
	}
	for _, gone := range []string{"old", "empty"} {
		if api.Series(gone) != nil {
			t.Errorf("series %q kept, want removed", gone)
		}
	}
	for _, kept := range []string{"leased", "released", "released-only", "lease-dirty"} {
		if conc.Series(kept) == nil {
			t.Errorf("series %q removed, want kept", kept)
		}
	}
	if got := len(released.Windows()); got != 0 {
		t.Errorf("released has %d windows, want 0", got)
	}
	if got := released.Leases().Value(); got != 0 {
		t.Errorf("released lease value = %d, want 0", got)
	}
	if api.Len() != 1 || conc.Len() != 4 {
		t.Errorf("Len = %d, %d; want 1, 4", api.Len(), conc.Len())
	}

	// Collecting again at the same instant drops nothing.
	if got := c.Collect(122_000); got != 0 {
		t.Errorf("second Collect = %d, want 0", got)
	}
	// Once its mark is taken, the lease-less series goes.
	c.TakeDirty()
	if got := c.Collect(122_000); got != 0 {
		t.Errorf("third Collect = %d, want 0", got)
	}
	if conc.Series("lease-dirty") != nil {
		t.Errorf("lease-dirty kept after TakeDirty, want removed")
	}
	if conc.Series("released") == nil {
		t.Errorf("released removed, want kept forever")
	}
	// Far in the future everything windowed is gone; lease series stay.
	if got := c.Collect(1 << 50); got != 3 {
		t.Errorf("final Collect = %d, want 3", got)
	}
	if api.Len() != 0 || conc.Len() != 3 {
		t.Errorf("Len = %d, %d; want 0, 3", api.Len(), conc.Len())
	}
}

// TestWindowLookupAfterCollect checks that a window Collect dropped is
// never found again (Series remembers the window it last found), and that
// lookups find every live window whichever was found last.
func TestWindowLookupAfterCollect(t *testing.T) {
	c := crdt.NewContainer()
	s := c.Rule("r").Ensure("k")
	w0 := s.EnsureWindow(1000, 0)
	w1 := s.EnsureWindow(1000, 1)
	h0 := s.EnsureWindow(60_000, 0)
	for range 2 {
		for _, want := range []*crdt.Window{w0, w1, h0, w1, w0} {
			if got := s.Window(want.WindowMs, want.Index); got != want {
				t.Fatalf("Window(%d, %d) = %p, want %p", want.WindowMs, want.Index, got, want)
			}
		}
	}
	if got := s.Window(1000, 2); got != nil {
		t.Fatalf("Window(1000, 2) = %+v, want nil", got)
	}
	s.Window(1000, 0) // remembered last
	if n := c.Collect(2000); n != 1 {
		t.Fatalf("Collect(2000) dropped %d windows, want 1 (window 0 of 1 s)", n)
	}
	if got := s.Window(1000, 0); got != nil {
		t.Fatalf("Window(1000, 0) after Collect = %p, want nil", got)
	}
	if got := s.EnsureWindow(1000, 0); got == w0 || got.Admitted.Value() != 0 {
		t.Fatalf("EnsureWindow(1000, 0) after Collect returned the collected window")
	}
	if got := s.Window(1000, 1); got != w1 {
		t.Fatalf("Window(1000, 1) = %p, want %p", got, w1)
	}
}

// BenchmarkFillAndCollect measures what the container's keys cost to make
// and to drop: keys keys made and touched once in one window, then
// collected once it expired, reported per key (make-ns, collect-ns) over
// the whole of each phase.
func BenchmarkFillAndCollect(b *testing.B) {
	const keys = 200_000
	names := make([]string, keys)
	for i := range names {
		names[i] = fmt.Sprintf("acct:%d", i)
	}
	var fill, collect time.Duration
	for range b.N {
		c := crdt.NewContainer()
		r := c.Rule("api")
		start := time.Now()
		for _, k := range names {
			w := r.Ensure(k).EnsureWindow(1000, 5)
			w.Attempted.Add(0, 1)
			w.Admitted.Add(0, 1)
		}
		fill += time.Since(start)
		start = time.Now()
		if got := c.Collect(7000); got != keys || r.Len() != 0 {
			b.Fatalf("collected %d windows, %d keys left; want %d, 0", got, r.Len(), keys)
		}
		collect += time.Since(start)
	}
	b.ReportMetric(float64(fill.Nanoseconds())/float64(b.N*keys), "make-ns/key")
	b.ReportMetric(float64(collect.Nanoseconds())/float64(b.N*keys), "collect-ns/key")
}

// TestContainerCountsKeysAndWindows checks the counts the key cap and the
// keys/windows gauges read without walking: keys over every rule set,
// windows per rule set, as series and windows are made and collected,
// and RuleSet.Full against a rule's cap and the container's.
func TestContainerCountsKeysAndWindows(t *testing.T) {
	c := crdt.NewContainer()
	a, b := c.Rule("a"), c.Rule("b")
	a.Ensure("k1").EnsureWindow(1000, 1)
	a.Ensure("k1").EnsureWindow(1000, 2)
	a.Ensure("k2").EnsureWindow(1000, 2)
	b.Ensure("k1").EnsureWindow(60_000, 0)
	if c.Keys() != 3 || a.Windows() != 3 || b.Windows() != 1 {
		t.Fatalf("keys %d, windows a %d b %d; want 3, 3, 1", c.Keys(), a.Windows(), b.Windows())
	}
	if a.Full(3) || !a.Full(2) {
		t.Errorf("Full(3) = %t, Full(2) = %t with 2 keys held; want false, true", a.Full(3), a.Full(2))
	}
	c.SetMaxKeys(3)
	if !a.Full(100) || !b.Full(100) {
		t.Errorf("at the container's cap 3 with 3 keys: Full = %t, %t; want true", a.Full(100), b.Full(100))
	}
	// At 10 s every 1 s window is collectable (CollectAt: the end of the
	// window after it); the 60 s one is not.
	c.Collect(10_000)
	if c.Keys() != 1 || a.Windows() != 0 || b.Windows() != 1 || a.Len() != 0 {
		t.Fatalf("after collecting: keys %d, windows a %d b %d, a holds %d; want 1, 0, 1, 0", c.Keys(), a.Windows(), b.Windows(), a.Len())
	}
	if a.Full(100) {
		t.Error("Full after collection freed the cap")
	}
}

// TestEnsureChargedBudget checks a peer's key budget: the keys its entries
// make are charged to it until they go, a key beyond its budget is not
// made, a key already held is returned to anyone, and another account is
// not affected.
func TestEnsureChargedBudget(t *testing.T) {
	c := crdt.NewContainer()
	r := c.Rule("a")
	liar, honest := c.NewCharge(), c.NewCharge()
	for _, k := range []string{"x1", "x2"} {
		if s := r.EnsureCharged(k, liar, 2); s == nil {
			t.Fatalf("key %s refused within the budget", k)
		} else {
			s.EnsureWindow(1000, 1)
		}
	}
	if s := r.EnsureCharged("x3", liar, 2); s != nil {
		t.Fatal("a third key made on a budget of 2")
	}
	r.Ensure("own").EnsureWindow(1000, 1)
	if s := r.EnsureCharged("own", liar, 2); s == nil || s.Key != "own" {
		t.Fatalf("a key already held refused to a peer at its budget: %v", s)
	}
	if s := r.EnsureCharged("h1", honest, 2); s == nil {
		t.Fatal("another peer's key refused because of the first one's budget")
	} else {
		s.EnsureWindow(60_000, 0)
	}
	if got := []int{c.Charged(0), c.Charged(liar), c.Charged(honest), c.Keys()}; !slices.Equal(got, []int{1, 2, 1, 4}) {
		t.Fatalf("charged (own, liar, honest) and keys %v, want [1 2 1 4]", got)
	}
	c.Collect(10_000) // the 1 s windows go, the 60 s one stays
	if got := []int{c.Charged(0), c.Charged(liar), c.Charged(honest), c.Keys()}; !slices.Equal(got, []int{0, 0, 1, 1}) {
		t.Fatalf("after collecting: charged and keys %v, want [0 0 1 1]", got)
	}
	if s := r.EnsureCharged("x3", liar, 2); s == nil {
		t.Fatal("a key refused after the peer's keys were collected")
	}
}
