package crdt_test

import (
	"fmt"
	"math"
	"slices"
	"testing"

	"github.com/ratemesh/ratemesh/crdt"
)

// slotv is one (slot, value) pair as Each reports it.
type slotv struct {
	ID crdt.SlotID
	V  uint64
}

// eachOf returns what g.Each reports, in the order it reports it.
func eachOf(t *testing.T, g *crdt.GCounter) []slotv {
	t.Helper()
	var out []slotv
	g.Each(func(id crdt.SlotID, v uint64) { out = append(out, slotv{id, v}) })
	return out
}

// checkGCounter asserts that g holds exactly want (slot → value, zeros
// meaning absent), reports it in SlotID order, and sums it in Value.
func checkGCounter(t *testing.T, g *crdt.GCounter, want map[crdt.SlotID]uint64) {
	t.Helper()
	var sum uint64
	var wantEach []slotv
	for id, v := range want {
		if v == 0 {
			continue
		}
		wantEach = append(wantEach, slotv{id, v})
		if sum+v < sum {
			sum = math.MaxUint64
		} else {
			sum += v
		}
	}
	slices.SortFunc(wantEach, func(a, b slotv) int { return int(a.ID) - int(b.ID) })
	if got := eachOf(t, g); !slices.Equal(got, wantEach) {
		t.Errorf("Each = %v, want %v", got, wantEach)
	}
	if got := g.Value(); got != sum {
		t.Errorf("Value = %d, want %d", got, sum)
	}
	if got := g.Len(); got != len(wantEach) {
		t.Errorf("Len = %d, want %d", got, len(wantEach))
	}
	for id, v := range want {
		if got := g.Get(id); got != v {
			t.Errorf("Get(%d) = %d, want %d", id, got, v)
		}
	}
}

func TestGCounterZeroValue(t *testing.T) {
	var g crdt.GCounter
	checkGCounter(t, &g, map[crdt.SlotID]uint64{0: 0, 7: 0, math.MaxUint32: 0})
}

func TestGCounterRaise(t *testing.T) {
	type raise struct {
		id   crdt.SlotID
		v    uint64
		grew bool
	}
	tests := []struct {
		name   string
		raises []raise
		want   map[crdt.SlotID]uint64
	}{
		{
			name:   "first write",
			raises: []raise{{3, 5, true}},
			want:   map[crdt.SlotID]uint64{3: 5, 2: 0, 4: 0},
		},
		{
			name:   "zero on absent slot stores nothing",
			raises: []raise{{3, 0, false}},
			want:   map[crdt.SlotID]uint64{3: 0},
		},
		{
			name:   "higher value replaces",
			raises: []raise{{1, 5, true}, {1, 9, true}},
			want:   map[crdt.SlotID]uint64{1: 9},
		},
		{
			name:   "lower value never decreases",
			raises: []raise{{1, 9, true}, {1, 5, false}, {1, 0, false}},
			want:   map[crdt.SlotID]uint64{1: 9},
		},
		{
			name:   "equal value is a no-op",
			raises: []raise{{1, 9, true}, {1, 9, false}},
			want:   map[crdt.SlotID]uint64{1: 9},
		},
		{
			name:   "slots are independent",
			raises: []raise{{2, 4, true}, {0, 1, true}, {1, 2, true}, {2, 3, false}, {0, 7, true}},
			want:   map[crdt.SlotID]uint64{0: 7, 1: 2, 2: 4},
		},
		{
			name:   "largest slot ID",
			raises: []raise{{math.MaxUint32, 1, true}, {0, 1, true}},
			want:   map[crdt.SlotID]uint64{0: 1, math.MaxUint32: 1},
		},
		{
			name:   "total saturates",
			raises: []raise{{0, math.MaxUint64 - 1, true}, {1, 5, true}, {0, math.MaxUint64, true}},
			want:   map[crdt.SlotID]uint64{0: math.MaxUint64, 1: 5},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var g crdt.GCounter
			for i, r := range tt.raises {
				if got := g.Raise(r.id, r.v); got != r.grew {
					t.Errorf("raise %d: Raise(%d, %d) = %v, want %v", i, r.id, r.v, got, r.grew)
				}
			}
			checkGCounter(t, &g, tt.want)
		})
	}
}

func TestGCounterAdd(t *testing.T) {
	type add struct {
		id crdt.SlotID
		d  uint64
	}
	tests := []struct {
		name string
		adds []add
		want map[crdt.SlotID]uint64
	}{
		{"zero delta on absent slot", []add{{1, 0}}, map[crdt.SlotID]uint64{1: 0}},
		{"accumulates", []add{{1, 2}, {1, 3}, {1, 0}}, map[crdt.SlotID]uint64{1: 5}},
		{"per slot", []add{{1, 2}, {2, 3}, {1, 4}}, map[crdt.SlotID]uint64{1: 6, 2: 3}},
		{"saturates at MaxUint64", []add{{1, math.MaxUint64 - 2}, {1, 5}, {1, 1}}, map[crdt.SlotID]uint64{1: math.MaxUint64}},
		{"saturated in one step", []add{{1, math.MaxUint64}, {1, math.MaxUint64}}, map[crdt.SlotID]uint64{1: math.MaxUint64}},
		{"sum saturates across slots", []add{{1, math.MaxUint64 / 2}, {2, math.MaxUint64/2 + 2}}, map[crdt.SlotID]uint64{1: math.MaxUint64 / 2, 2: math.MaxUint64/2 + 2}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var g crdt.GCounter
			for _, a := range tt.adds {
				g.Add(a.id, a.d)
			}
			checkGCounter(t, &g, tt.want)
		})
	}
}

// TestGCounterManySlots drives the counter past the linear-search threshold
// (8 slots) so that Get, Raise and Each go through the binary search, with
// slots inserted in a scrambled order and absent IDs probed between them.
func TestGCounterManySlots(t *testing.T) {
	for _, n := range []int{7, 8, 9, 17, 100} {
		t.Run(fmt.Sprintf("%d slots", n), func(t *testing.T) {
			var g crdt.GCounter
			want := make(map[crdt.SlotID]uint64)
			// Even IDs 2..2n, inserted in a scrambled (but fixed) order.
			for i := 0; i < n; i++ {
				id := crdt.SlotID(2 * (1 + (i*11)%n)) // 11 is coprime with every n
				if !g.Raise(id, uint64(id)*10) {
					t.Fatalf("n=%d: Raise(%d) on a fresh slot reported no growth", n, id)
				}
				want[id] = uint64(id) * 10
			}
			if len(want) != n {
				t.Fatalf("n=%d: test bug, %d distinct ids", n, len(want))
			}
			// Odd IDs, below, between and above, are absent.
			for id := crdt.SlotID(1); id <= crdt.SlotID(2*n+1); id += 2 {
				want[id] = 0
			}
			want[0] = 0
			checkGCounter(t, &g, want)

			// Raising existing slots through the binary path updates in place.
			for id := crdt.SlotID(2); id <= crdt.SlotID(2*n); id += 2 {
				g.Raise(id, uint64(id)*10-1) // lower: ignored
				g.Raise(id, uint64(id)*10+1)
				want[id] = uint64(id)*10 + 1
			}
			checkGCounter(t, &g, want)
		})
	}
}

func TestGCounterMerge(t *testing.T) {
	var a, b crdt.GCounter
	a.Raise(1, 10)
	a.Raise(2, 5)
	b.Raise(2, 7)
	b.Raise(3, 1)
	b.Raise(1, 3)
	a.Merge(&b)
	checkGCounter(t, &a, map[crdt.SlotID]uint64{1: 10, 2: 7, 3: 1})
	// o is unchanged.
	checkGCounter(t, &b, map[crdt.SlotID]uint64{1: 3, 2: 7, 3: 1})
	// Merging with itself changes nothing.
	a.Merge(&a)
	checkGCounter(t, &a, map[crdt.SlotID]uint64{1: 10, 2: 7, 3: 1})
	// Merging an empty counter changes nothing.
	a.Merge(&crdt.GCounter{})
	checkGCounter(t, &a, map[crdt.SlotID]uint64{1: 10, 2: 7, 3: 1})
}

func TestPNCounter(t *testing.T) {
	type raise struct {
		id   crdt.SlotID
		p, n uint64
		grew bool
	}
	tests := []struct {
		name      string
		raises    []raise
		value     int64
		slotValue map[crdt.SlotID]int64
	}{
		{"empty", nil, 0, map[crdt.SlotID]int64{0: 0}},
		{"acquire", []raise{{1, 3, 0, true}}, 3, map[crdt.SlotID]int64{1: 3}},
		{"acquire and release", []raise{{1, 3, 0, true}, {1, 3, 2, true}}, 1, map[crdt.SlotID]int64{1: 1}},
		{"stale pair changes nothing", []raise{{1, 5, 4, true}, {1, 3, 2, false}}, 1, map[crdt.SlotID]int64{1: 1}},
		{"halves merge independently", []raise{{1, 5, 1, true}, {1, 2, 4, true}}, 1, map[crdt.SlotID]int64{1: 1}},
		{"several slots", []raise{{1, 5, 1, true}, {2, 2, 2, true}, {3, 1, 0, true}}, 5, map[crdt.SlotID]int64{1: 4, 2: 0, 3: 1}},
		// N ahead of P: a release heard before its acquire.
		{"negative slot balance", []raise{{1, 0, 2, true}, {2, 3, 0, true}}, 1, map[crdt.SlotID]int64{1: -2, 2: 3}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var c crdt.PNCounter
			for i, r := range tt.raises {
				if got := c.Raise(r.id, r.p, r.n); got != r.grew {
					t.Errorf("raise %d: Raise(%d, %d, %d) = %v, want %v", i, r.id, r.p, r.n, got, r.grew)
				}
			}
			if got := c.Value(); got != tt.value {
				t.Errorf("Value = %d, want %d", got, tt.value)
			}
			for id, want := range tt.slotValue {
				if got := c.SlotValue(id); got != want {
					t.Errorf("SlotValue(%d) = %d, want %d", id, got, want)
				}
			}
		})
	}
}

func TestPNCounterValueWhere(t *testing.T) {
	var c crdt.PNCounter
	c.Raise(1, 5, 1) // +4
	c.Raise(2, 1, 3) // -2, clamped to 0
	c.Raise(3, 2, 0) // +2
	c.Raise(4, 0, 7) // N only: -7, clamped to 0
	c.Raise(5, 6, 6) // 0

	all := func(crdt.SlotID) bool { return true }
	only := func(ids ...crdt.SlotID) func(crdt.SlotID) bool {
		return func(id crdt.SlotID) bool { return slices.Contains(ids, id) }
	}
	tests := []struct {
		name string
		live func(crdt.SlotID) bool
		want int64
	}{
		{"all live", all, 6},
		{"none live", only(), 0},
		{"filter keeps one", only(1), 4},
		{"filter drops one", only(2, 3, 4, 5), 2},
		{"only negative slots", only(2, 4), 0},
		{"unknown slot", only(9), 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := c.ValueWhere(tt.live); got != tt.want {
				t.Errorf("ValueWhere = %d, want %d", got, tt.want)
			}
		})
	}
	// Value does not clamp: 4 - 2 + 2 - 7 + 0.
	if got := c.Value(); got != -3 {
		t.Errorf("Value = %d, want -3", got)
	}
}

func TestPNCounterMerge(t *testing.T) {
	var a, b crdt.PNCounter
	a.Raise(1, 5, 1)
	a.Raise(2, 1, 0)
	b.Raise(1, 4, 3)
	b.Raise(3, 2, 2)
	a.Merge(&b)
	for id, want := range map[crdt.SlotID][2]uint64{1: {5, 3}, 2: {1, 0}, 3: {2, 2}} {
		if p, n := a.P.Get(id), a.N.Get(id); p != want[0] || n != want[1] {
			t.Errorf("slot %d = (%d, %d), want (%d, %d)", id, p, n, want[0], want[1])
		}
	}
	if got := a.Value(); got != 3 {
		t.Errorf("Value = %d, want 3", got)
	}
}

func TestSlotTable(t *testing.T) {
	st := crdt.NewSlotTable()
	a := crdt.Slot{Peer: "a", Incarnation: 1}
	a2 := crdt.Slot{Peer: "a", Incarnation: 2}
	b := crdt.Slot{Peer: "b", Incarnation: 1}
	if _, ok := st.Lookup(a); ok {
		t.Fatalf("Lookup on empty table found %v", a)
	}
	ids := []crdt.SlotID{st.Intern(a), st.Intern(a2), st.Intern(b), st.Intern(a)}
	if want := []crdt.SlotID{0, 1, 2, 0}; !slices.Equal(ids, want) {
		t.Fatalf("Intern IDs = %v, want %v", ids, want)
	}
	if st.Len() != 3 {
		t.Errorf("Len = %d, want 3", st.Len())
	}
	for id, s := range []crdt.Slot{a, a2, b} {
		if got := st.Slot(crdt.SlotID(id)); got != s {
			t.Errorf("Slot(%d) = %v, want %v", id, got, s)
		}
		if got, ok := st.Lookup(s); !ok || got != crdt.SlotID(id) {
			t.Errorf("Lookup(%v) = %d, %v; want %d, true", s, got, ok, id)
		}
	}
	if got := a2.String(); got != "a/2" {
		t.Errorf("String = %q, want %q", got, "a/2")
	}
}

// BenchmarkGCounterRaise measures merging into a counter with a thousand
// writers, where every Raise goes through the binary search and half of
// them grow a slot.
func BenchmarkGCounterRaise(b *testing.B) {
	const slots = 1000
	var g crdt.GCounter
	for i := range slots {
		g.Raise(crdt.SlotID(i), 1)
	}
	b.ReportAllocs()
	var i uint64
	for b.Loop() {
		g.Raise(crdt.SlotID(i%slots), i/2+1)
		i++
	}
	if g.Len() != slots {
		b.Fatalf("Len = %d, want %d", g.Len(), slots)
	}
}

// BenchmarkWindowRaise measures merging one slot into a window picked at
// random among many, as a replica merging gossip does: at 3 writers over
// 100,000 keys (sparse counters, a cache miss on the window) and at 1000
// writers over 2,000 keys (interleaved arrays, 4 MB of cells, a miss on
// the window and one on the cell).
func BenchmarkWindowRaise(b *testing.B) {
	for _, sc := range []struct{ writers, keys int }{{3, 100_000}, {1000, 2_000}} {
		b.Run(fmt.Sprintf("writers=%d", sc.writers), func(b *testing.B) {
			c := crdt.NewContainer()
			r := c.Rule("api")
			ws := make([]*crdt.Window, sc.keys)
			for i := range ws {
				ws[i] = r.Ensure(fmt.Sprintf("k%d", i)).EnsureWindow(1000, 5)
				for id := range sc.writers {
					ws[i].Raise(crdt.SlotID(id), 1, 2)
				}
			}
			x := uint64(0x9e3779b97f4a7c15)
			b.ReportAllocs()
			var i uint64
			for b.Loop() {
				x ^= x << 13
				x ^= x >> 7
				x ^= x << 17
				w := ws[x%uint64(sc.keys)]
				v := i>>20 + 2 // grows slowly: most merges change nothing, as repeats
				w.Raise(crdt.SlotID((x>>32)%uint64(sc.writers)), v, v+1)
				i++
			}
		})
	}
}

// TestSlotIs checks Slot.Is against ==.
func TestSlotIs(t *testing.T) {
	slots := []crdt.Slot{{}, {Peer: "a", Incarnation: 1}, {Peer: "a", Incarnation: 2}, {Peer: "b", Incarnation: 1},
		{Peer: "ab", Incarnation: 1}, {Peer: "ba", Incarnation: 1}, {Peer: "xa", Incarnation: 1}, {Peer: "", Incarnation: 1}}
	for _, s := range slots {
		for _, o := range slots {
			if s.Is(o) != (s == o) {
				t.Errorf("%v.Is(%v) = %t, want %t", s, o, s.Is(o), s == o)
			}
		}
	}
}
