package crdt_test

// Property tests of the CRDT laws against a deliberately simple reference:
// a map from slot to value, merged by per-key max.
//
// Each property runs once per seed as a subtest named "seed=N", so a failure
// names its seed and `go test -run 'TestMergeLaws/seed=N' ./crdt/` replays it
// exactly.
//
// These tests were checked to fail when merge is broken (go1.26, seeds
// 1..300), then the code was restored:
//
//   - GCounter.Raise overwriting instead of taking the max (last writer
//     wins: `if v == old { return false }; g.vals[i].v = v;
//     g.total = g.total - old + v`): TestGCounterMatchesReference failed on
//     247 seeds, TestMergeLaws on 299, TestPNCounterMergeLaws on 300 and
//     TestDeltaApplication on 226 (seed=1: "delivery 0, after batch 6:
//     windows a/k1/60000/0 slot p1/1 went from [4 6] to [2 2]"); the unit
//     tests in counter_test.go failed too.
//   - GCounter.Merge skipping slots the receiver already holds (first
//     writer wins, Raise intact): TestMergeLaws failed on 280 seeds
//     (seed=1: "(a⊔b)⊔c: state ... reference ...") and
//     TestPNCounterMergeLaws on 286.

import (
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/ratemesh/ratemesh/crdt"
)

const propSeeds = 300

// forSeeds runs f once per seed in its own subtest with a rand seeded from
// it.
func forSeeds(t *testing.T, f func(t *testing.T, r *rand.Rand)) {
	t.Helper()
	for seed := uint64(1); seed <= propSeeds; seed++ {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			f(t, rand.New(rand.NewPCG(seed, 0x7a7e)))
		})
	}
}

// refG is the reference grow-only counter.
type refG map[crdt.SlotID]uint64

func (m refG) raise(id crdt.SlotID, v uint64) bool {
	if v > m[id] {
		m[id] = v
		return true
	}
	return false
}

func (m refG) merge(o refG) {
	for id, v := range o {
		m.raise(id, v)
	}
}

// sum adds the values, saturating at MaxUint64.
func (m refG) sum() uint64 {
	var s uint64
	for _, v := range m {
		if s+v < s {
			return math.MaxUint64
		}
		s += v
	}
	return s
}

// gop is one Raise.
type gop struct {
	id crdt.SlotID
	v  uint64
}

// genOps returns a random sequence of raises over a random number of slots,
// sometimes past the linear-search threshold, with occasional zero and
// huge values.
func genOps(r *rand.Rand) []gop {
	ids := []int{3, 8, 20, 100}[r.IntN(4)]
	ops := make([]gop, r.IntN(40))
	for i := range ops {
		ops[i].id = crdt.SlotID(r.IntN(ids))
		switch p := r.IntN(20); {
		case p == 0:
			ops[i].v = 0
		case p == 1:
			ops[i].v = math.MaxUint64 - r.Uint64N(4)
		case p == 2:
			ops[i].v = r.Uint64()
		default:
			ops[i].v = r.Uint64N(1000)
		}
	}
	return ops
}

// build applies ops to a fresh counter and to the reference, checking each
// Raise's growth report against the reference's.
func build(t *testing.T, ops []gop) (*crdt.GCounter, refG) {
	t.Helper()
	g := new(crdt.GCounter)
	ref := make(refG)
	for i, op := range ops {
		want := ref.raise(op.id, op.v)
		if got := g.Raise(op.id, op.v); got != want {
			t.Fatalf("op %d: Raise(%d, %d) = %v, reference says %v", i, op.id, op.v, got, want)
		}
	}
	return g, ref
}

// stateOf returns g's slots as a map.
func stateOf(g *crdt.GCounter) refG {
	m := make(refG)
	g.Each(func(id crdt.SlotID, v uint64) { m[id] = v })
	return m
}

// sameAs checks that g holds exactly the reference's state and sum.
func sameAs(t *testing.T, what string, g *crdt.GCounter, ref refG) {
	t.Helper()
	want := maps.Clone(ref)
	maps.DeleteFunc(want, func(_ crdt.SlotID, v uint64) bool { return v == 0 })
	if got := stateOf(g); !maps.Equal(got, want) {
		t.Fatalf("%s: state %v, reference %v", what, got, want)
	}
	var ids []crdt.SlotID
	g.Each(func(id crdt.SlotID, _ uint64) { ids = append(ids, id) })
	if !slices.IsSorted(ids) {
		t.Fatalf("%s: Each order %v, want ascending", what, ids)
	}
	if got, want := g.Value(), ref.sum(); got != want {
		t.Fatalf("%s: Value %d, reference sum %d", what, got, want)
	}
	for id, v := range ref {
		if got := g.Get(id); got != v {
			t.Fatalf("%s: Get(%d) = %d, reference %d", what, id, got, v)
		}
	}
}

// noLower checks that every slot of g is at least its value in before.
func noLower(t *testing.T, what string, g *crdt.GCounter, before refG) {
	t.Helper()
	for id, v := range before {
		if got := g.Get(id); got < v {
			t.Fatalf("%s: slot %d decreased from %d to %d", what, id, v, got)
		}
	}
}

func TestGCounterMatchesReference(t *testing.T) {
	forSeeds(t, func(t *testing.T, r *rand.Rand) {
		ops := genOps(r)
		g, ref := build(t, ops)
		sameAs(t, "built", g, ref)
		// Add on top is a saturating increment of the slot.
		if len(ops) > 0 {
			id, d := ops[0].id, r.Uint64N(100)
			want := ref[id] + d
			if want < d {
				want = math.MaxUint64
			}
			g.Add(id, d)
			ref[id] = want
			sameAs(t, "after Add", g, ref)
		}
	})
}

func TestMergeLaws(t *testing.T) {
	forSeeds(t, func(t *testing.T, r *rand.Rand) {
		aOps, bOps, cOps := genOps(r), genOps(r), genOps(r)
		// Share some slots and values between the replicas, as replicas
		// that have heard each other do.
		if len(aOps) > 0 {
			bOps = append(bOps, aOps[:r.IntN(len(aOps))]...)
		}
		_, aRef := build(t, aOps)
		_, bRef := build(t, bOps)
		_, cRef := build(t, cOps)
		fresh := func(ops []gop) *crdt.GCounter { g, _ := build(t, ops); return g }

		// The least upper bound, by the reference.
		ab := maps.Clone(aRef)
		ab.merge(bRef)
		abc := maps.Clone(ab)
		abc.merge(cRef)

		// Commutative: a ⊔ b = b ⊔ a = reference.
		x := fresh(aOps)
		x.Merge(fresh(bOps))
		y := fresh(bOps)
		y.Merge(fresh(aOps))
		sameAs(t, "a⊔b", x, ab)
		sameAs(t, "b⊔a", y, ab)
		noLower(t, "a⊔b over a", x, aRef)
		noLower(t, "a⊔b over b", x, bRef)

		// Associative: (a ⊔ b) ⊔ c = a ⊔ (b ⊔ c) = reference.
		left := fresh(aOps)
		left.Merge(fresh(bOps))
		left.Merge(fresh(cOps))
		bc := fresh(bOps)
		bc.Merge(fresh(cOps))
		right := fresh(aOps)
		right.Merge(bc)
		sameAs(t, "(a⊔b)⊔c", left, abc)
		sameAs(t, "a⊔(b⊔c)", right, abc)

		// Idempotent: a ⊔ a = a, with a copy and with itself.
		z := fresh(aOps)
		z.Merge(fresh(aOps))
		sameAs(t, "a⊔copy(a)", z, aRef)
		z.Merge(z)
		sameAs(t, "a⊔a", z, aRef)
		// Merging what is already included changes nothing.
		x.Merge(fresh(aOps))
		x.Merge(fresh(bOps))
		sameAs(t, "(a⊔b)⊔a⊔b", x, ab)
	})
}

// refPN is the reference PN-counter.
type refPN struct{ p, n refG }

func TestPNCounterMergeLaws(t *testing.T) {
	type pnop struct {
		id   crdt.SlotID
		p, n uint64
	}
	gen := func(r *rand.Rand) []pnop {
		ops := make([]pnop, r.IntN(30))
		ids := []int{3, 20}[r.IntN(2)]
		for i := range ops {
			// Bounded, so that sums fit an int64 exactly.
			ops[i] = pnop{crdt.SlotID(r.IntN(ids)), r.Uint64N(1 << 40), r.Uint64N(1 << 40)}
		}
		return ops
	}
	buildPN := func(ops []pnop) (*crdt.PNCounter, refPN) {
		c := new(crdt.PNCounter)
		ref := refPN{make(refG), make(refG)}
		for _, op := range ops {
			c.Raise(op.id, op.p, op.n)
			ref.p.raise(op.id, op.p)
			ref.n.raise(op.id, op.n)
		}
		return c, ref
	}
	check := func(t *testing.T, what string, c *crdt.PNCounter, ref refPN, live func(crdt.SlotID) bool) {
		t.Helper()
		sameAs(t, what+" P", &c.P, ref.p)
		sameAs(t, what+" N", &c.N, ref.n)
		if got, want := c.Value(), int64(ref.p.sum())-int64(ref.n.sum()); got != want {
			t.Fatalf("%s: Value %d, reference %d", what, got, want)
		}
		var where int64
		for _, id := range slices.Sorted(maps.Keys(ref.p)) {
			if d := int64(ref.p[id]) - int64(ref.n[id]); live(id) && d > 0 {
				where += d
			}
			if got, want := c.SlotValue(id), int64(ref.p[id])-int64(ref.n[id]); got != want {
				t.Fatalf("%s: SlotValue(%d) = %d, reference %d", what, id, got, want)
			}
		}
		if got := c.ValueWhere(live); got != where {
			t.Fatalf("%s: ValueWhere %d, reference %d", what, got, where)
		}
	}
	forSeeds(t, func(t *testing.T, r *rand.Rand) {
		aOps, bOps, cOps := gen(r), gen(r), gen(r)
		mask := r.Uint64()
		live := func(id crdt.SlotID) bool { return mask&(1<<(id%64)) != 0 }
		fresh := func(ops []pnop) *crdt.PNCounter { c, _ := buildPN(ops); return c }
		a, aRef := buildPN(aOps)
		_, bRef := buildPN(bOps)
		_, cRef := buildPN(cOps)
		check(t, "a", a, aRef, live)

		ab := refPN{maps.Clone(aRef.p), maps.Clone(aRef.n)}
		ab.p.merge(bRef.p)
		ab.n.merge(bRef.n)
		abc := refPN{maps.Clone(ab.p), maps.Clone(ab.n)}
		abc.p.merge(cRef.p)
		abc.n.merge(cRef.n)

		x := fresh(aOps)
		x.Merge(fresh(bOps))
		check(t, "a⊔b", x, ab, live)
		y := fresh(bOps)
		y.Merge(fresh(aOps))
		check(t, "b⊔a", y, ab, live)

		left := fresh(aOps)
		left.Merge(fresh(bOps))
		left.Merge(fresh(cOps))
		bc := fresh(bOps)
		bc.Merge(fresh(cOps))
		right := fresh(aOps)
		right.Merge(bc)
		check(t, "(a⊔b)⊔c", left, abc, live)
		check(t, "a⊔(b⊔c)", right, abc, live)

		a.Merge(a)
		a.Merge(fresh(aOps))
		check(t, "a⊔a", a, aRef, live)
	})
}

// update is one owner write as a delta carries it: the absolute values of
// one slot in one window (lease false) or lease counter (lease true).
type update struct {
	slot  crdt.Slot
	lease bool
	e     crdt.WindowEntry // for leases: Admitted = acquired, Attempted = released
}

// cell names one slot of one counter in the snapshot of a container.
type cell struct {
	lease            bool
	rule, key        string
	windowMs, window int64
	slot             crdt.Slot
}

func (c cell) String() string {
	if c.lease {
		return fmt.Sprintf("leases %s/%s slot %s", c.rule, c.key, c.slot)
	}
	return fmt.Sprintf("windows %s/%s/%d/%d slot %s", c.rule, c.key, c.windowMs, c.window, c.slot)
}

// genHistory returns what a few owners wrote: every write carries the
// owner's absolute values, which never decrease, and keeps attempted ≥
// admitted and released ≤ acquired.
func genHistory(r *rand.Rand) []update {
	owners := []crdt.Slot{{Peer: "p0", Incarnation: 1}, {Peer: "p1", Incarnation: 1}, {Peer: "p1", Incarnation: 2}, {Peer: "p2", Incarnation: 5}}
	owners = owners[:1+r.IntN(len(owners))]
	cur := make(map[cell][2]uint64)
	var hist []update
	for range r.IntN(60) {
		c := cell{
			lease: r.IntN(4) == 0,
			rule:  []string{"a", "b"}[r.IntN(2)],
			key:   fmt.Sprint("k", r.IntN(3)),
			slot:  owners[r.IntN(len(owners))],
		}
		if !c.lease {
			c.windowMs = []int64{1000, 60_000}[r.IntN(2)]
			c.window = int64(r.IntN(3))
		}
		v := cur[c]
		if c.lease {
			v[0] += r.Uint64N(3)
			v[1] = min(v[0], v[1]+r.Uint64N(3))
		} else {
			d := r.Uint64N(3)
			v[0] += d
			v[1] += d + r.Uint64N(3)
		}
		cur[c] = v
		hist = append(hist, update{c.slot, c.lease, crdt.WindowEntry{
			Rule: c.rule, Key: c.key, WindowMs: c.windowMs, Window: c.window, Admitted: v[0], Attempted: v[1],
		}})
	}
	return hist
}

// reference returns the expected state after every update has arrived: per
// cell, the max of what was written, with all-zero cells absent.
func reference(hist []update) map[cell][2]uint64 {
	m := make(map[cell][2]uint64)
	for _, u := range hist {
		c := cell{u.lease, u.e.Rule, u.e.Key, u.e.WindowMs, u.e.Window, u.slot}
		v := m[c]
		m[c] = [2]uint64{max(v[0], u.e.Admitted), max(v[1], u.e.Attempted)}
	}
	maps.DeleteFunc(m, func(_ cell, v [2]uint64) bool { return v == [2]uint64{} })
	return m
}

// pack puts updates into one batch: from itself when every update is one
// owner's and the coin says so, else from a relay naming them in Slots.
func pack(r *rand.Rand, seq uint64, us []update) *crdt.Batch {
	b := &crdt.Batch{Version: crdt.Version, Seq: seq, From: crdt.Slot{Peer: "relay", Incarnation: 1}}
	if r.IntN(2) == 0 && !slices.ContainsFunc(us, func(u update) bool { return u.slot != us[0].slot }) {
		b.From = us[0].slot
	}
	index := func(s crdt.Slot) uint32 {
		if s == b.From {
			return 0
		}
		if i := slices.Index(b.Slots, s); i >= 0 {
			return uint32(i + 1)
		}
		b.Slots = append(b.Slots, s)
		return uint32(len(b.Slots))
	}
	for _, u := range us {
		i := index(u.slot)
		if u.lease {
			b.Leases = append(b.Leases, crdt.LeaseEntry{Slot: i, Rule: u.e.Rule, Key: u.e.Key, Acquired: u.e.Admitted, Released: u.e.Attempted})
		} else {
			e := u.e
			e.Slot = i
			b.Windows = append(b.Windows, e)
		}
	}
	return b
}

// apply merges a received batch into c: each entry raises its slot.
func apply(c *crdt.Container, st *crdt.SlotTable, b *crdt.Batch) {
	for _, e := range b.Windows {
		id := st.Intern(b.SlotOf(e.Slot))
		w := c.Rule(e.Rule).Ensure(e.Key).EnsureWindow(e.WindowMs, e.Window)
		w.Admitted.Raise(id, e.Admitted)
		w.Attempted.Raise(id, e.Attempted)
	}
	for _, e := range b.Leases {
		id := st.Intern(b.SlotOf(e.Slot))
		c.Rule(e.Rule).Ensure(e.Key).EnsureLeases().Raise(id, e.Acquired, e.Released)
	}
}

// snapshot returns every non-zero slot value held in c, named by Slot (not
// SlotID, which depends on the order slots were first seen).
func snapshot(t *testing.T, c *crdt.Container, st *crdt.SlotTable) map[cell][2]uint64 {
	t.Helper()
	m := make(map[cell][2]uint64)
	put := func(base cell, half int) func(crdt.SlotID, uint64) {
		return func(id crdt.SlotID, v uint64) {
			base.slot = st.Slot(id)
			x := m[base]
			x[half] = v
			m[base] = x
		}
	}
	for _, name := range c.Rules() {
		c.Lookup(name).Each(func(s *crdt.Series) {
			for i, w := range s.Windows() {
				if i > 0 {
					p := s.Windows()[i-1]
					if p.WindowMs > w.WindowMs || p.WindowMs == w.WindowMs && p.Index >= w.Index {
						t.Fatalf("%s/%s: windows out of order at %d", name, s.Key, i)
					}
				}
				base := cell{rule: name, key: s.Key, windowMs: w.WindowMs, window: w.Index}
				w.Admitted.Each(put(base, 0))
				w.Attempted.Each(put(base, 1))
			}
			base := cell{lease: true, rule: name, key: s.Key}
			s.Leases().P.Each(put(base, 0))
			s.Leases().N.Each(put(base, 1))
		})
	}
	return m
}

// TestDeltaApplication delivers a history of absolute-value deltas in random
// orders, with duplicates, packed into batches that go through Encode and
// DecodeBatch, and checks that every delivery ends in the reference state
// and that no value ever goes down on the way.
func TestDeltaApplication(t *testing.T) {
	forSeeds(t, func(t *testing.T, r *rand.Rand) {
		hist := genHistory(r)
		want := reference(hist)
		for d := range 3 {
			// A permutation of the history plus duplicates of random
			// updates (a re-send, a repair, an anti-entropy answer).
			delivery := slices.Clone(hist)
			for range r.IntN(len(hist) + 1) {
				delivery = append(delivery, hist[r.IntN(len(hist))])
			}
			r.Shuffle(len(delivery), func(i, j int) { delivery[i], delivery[j] = delivery[j], delivery[i] })

			c := crdt.NewContainer()
			st := crdt.NewSlotTable()
			prev := map[cell][2]uint64{}
			for n, seq := 0, uint64(1); len(delivery) > 0; n, seq = n+1, seq+1 {
				k := 1 + r.IntN(min(8, len(delivery)))
				data, err := pack(r, seq, delivery[:k]).Encode()
				if err != nil {
					t.Fatalf("delivery %d: Encode: %v", d, err)
				}
				delivery = delivery[k:]
				b, err := crdt.DecodeBatch(data)
				if err != nil {
					t.Fatalf("delivery %d: DecodeBatch: %v", d, err)
				}
				apply(c, st, b)
				got := snapshot(t, c, st)
				for cl, v := range prev {
					if g := got[cl]; g[0] < v[0] || g[1] < v[1] {
						t.Fatalf("delivery %d, after batch %d: %s went from %d to %d", d, n, cl, v, g)
					}
				}
				prev = got
			}
			if !maps.Equal(prev, want) {
				union := maps.Clone(want)
				maps.Copy(union, prev)
				for _, cl := range slices.SortedFunc(maps.Keys(union), func(a, b cell) int { return strings.Compare(a.String(), b.String()) }) {
					if prev[cl] != want[cl] {
						t.Errorf("%s = %d, want %d", cl, prev[cl], want[cl])
					}
				}
				t.Fatalf("delivery %d: state differs from the reference (%d cells, want %d)", d, len(prev), len(want))
			}
		}
	})
}

// TestGCounterRepresentations drives counters through every representation
// a GCounter switches between — a sorted slice, a dense 32-bit array, a
// dense 64-bit array once a value needs it, a grown array, and back to the
// sorted slice when a far SlotID would make the array too sparse — and
// checks the whole state against the reference after every Raise, and the
// merge laws across counters in different representations.
func TestGCounterRepresentations(t *testing.T) {
	forSeeds(t, func(t *testing.T, r *rand.Rand) {
		gen := func() []gop {
			// Dense IDs, then occasionally a far one; values mostly small,
			// sometimes past 32 bits.
			span := []int{20, 64, 300, 1200}[r.IntN(4)]
			ops := make([]gop, 1+r.IntN(400))
			for i := range ops {
				id := r.IntN(span)
				if r.IntN(50) == 0 {
					id = span*(2+r.IntN(200)) + r.IntN(span)
				}
				ops[i].id = crdt.SlotID(id)
				switch p := r.IntN(60); {
				case p == 0:
					ops[i].v = 0
				case p == 1:
					ops[i].v = 1<<32 - 1 + r.Uint64N(3)
				case p == 2:
					ops[i].v = math.MaxUint64 - r.Uint64N(4)
				default:
					ops[i].v = r.Uint64N(1000)
				}
			}
			return ops
		}
		aOps, bOps := gen(), gen()
		g := new(crdt.GCounter)
		ref := make(refG)
		for i, op := range aOps {
			want := ref.raise(op.id, op.v)
			if got := g.Raise(op.id, op.v); got != want {
				t.Fatalf("op %d: Raise(%d, %d) = %v, reference says %v", i, op.id, op.v, got, want)
			}
			sameAs(t, fmt.Sprintf("after op %d", i), g, ref)
			if got, want := g.Len(), len(stateOf(g)); got != want {
				t.Fatalf("after op %d: Len %d, %d slots", i, got, want)
			}
		}
		b, bRef := build(t, bOps)
		ab := maps.Clone(ref)
		ab.merge(bRef)
		x, _ := build(t, aOps)
		x.Merge(b)
		sameAs(t, "a⊔b", x, ab)
		b.Merge(g)
		sameAs(t, "b⊔a", b, ab)
		b.Merge(x)
		sameAs(t, "(b⊔a)⊔(a⊔b)", b, ab)
		if got, want := b.Len(), len(stateOf(b)); got != want {
			t.Fatalf("merged: Len %d, %d slots", got, want)
		}
	})
}

// satAddRef is a + b, or the largest uint64 when that overflows.
func satAddRef(a, b uint64) uint64 {
	if a+b < a {
		return math.MaxUint64
	}
	return a + b
}

// TestWindowRaiseMatchesReference drives the windows of one series through
// Window.Raise (which may keep both counters in one interleaved array, and
// sizes a window's arrays after the window before it) mixed with direct
// raises of and additions to either counter (as the owner's own
// admissions are counted),
// and checks both counters against the reference every 16 steps and at
// the end.
func TestWindowRaiseMatchesReference(t *testing.T) {
	forSeeds(t, func(t *testing.T, r *rand.Rand) {
		s := crdt.NewContainer().Rule("r").Ensure("k")
		span := []int{40, 300, 1000}[r.IntN(3)]
		val := func() uint64 {
			// Mostly small, sometimes at a cell width's edge (1, 2, 4 and
			// 8 bytes), so windows widen their cells as they go.
			switch p := r.IntN(80); {
			case p == 0:
				return 0
			case p == 1:
				return 1<<32 - 1 + r.Uint64N(3)
			case p == 2:
				return 1<<8 - 1 + r.Uint64N(3)
			case p == 3:
				return 1<<16 - 1 + r.Uint64N(3)
			case p == 4:
				return math.MaxUint64 - r.Uint64N(2)
			default:
				return r.Uint64N(50)
			}
		}
		for idx := range int64(4) {
			w := s.EnsureWindow(1000, idx)
			adm, att := make(refG), make(refG)
			defer func() {
				sameAs(t, fmt.Sprintf("window %d admitted", idx), &w.Admitted, adm)
				sameAs(t, fmt.Sprintf("window %d attempted", idx), &w.Attempted, att)
			}()
			for i := range 300 + r.IntN(300) {
				id := crdt.SlotID(r.IntN(span))
				if r.IntN(100) == 0 {
					id = crdt.SlotID(span*(2+r.IntN(100)) + r.IntN(span))
				}
				what := fmt.Sprintf("window %d, op %d", idx, i)
				switch r.IntN(10) {
				case 0:
					v := val()
					want := adm.raise(id, v)
					if got := w.Admitted.Raise(id, v); got != want {
						t.Fatalf("%s: Admitted.Raise(%d, %d) = %v, reference %v", what, id, v, got, want)
					}
				case 1:
					v := val()
					want := att.raise(id, v)
					if got := w.Attempted.Raise(id, v); got != want {
						t.Fatalf("%s: Attempted.Raise(%d, %d) = %v, reference %v", what, id, v, got, want)
					}
				case 2:
					// The owner's own count: a saturating add, in place
					// when the cell holds the sum, widening it when not.
					d := val()
					w.Attempted.Add(id, d)
					att[id] = satAddRef(att[id], d)
					w.Admitted.Add(id, d/2)
					adm[id] = satAddRef(adm[id], d/2)
				default:
					a := val()
					v := a + val()
					if r.IntN(3) == 0 {
						a = 0
					}
					// Touch reads the admitted cell's low byte (0 when sparse).
					if got := w.Touch(id); got != 0 && got != byte(adm[id]) {
						t.Fatalf("%s: Touch(%d) = %d, want 0 or %d", what, id, got, byte(adm[id]))
					}
					wa := adm.raise(id, a)
					wt := att.raise(id, v)
					if got := w.Raise(id, a, v); got != (wa || wt) {
						t.Fatalf("%s: Raise(%d, %d, %d) = %v, reference %v", what, id, a, v, got, wa || wt)
					}
				}
				if i%16 != 0 {
					continue
				}
				sameAs(t, what+" admitted", &w.Admitted, adm)
				sameAs(t, what+" attempted", &w.Attempted, att)
				if got, want := w.Admitted.Len()+w.Attempted.Len(), len(stateOf(&w.Admitted))+len(stateOf(&w.Attempted)); got != want {
					t.Fatalf("%s: Len %d, %d slots", what, got, want)
				}
			}
		}
	})
}
