package crdt

import "math"

type slotVal struct {
	id SlotID
	v  uint64
}

// Representation bounds of a GCounter.
const (
	// denseMin is the number of slots from which a counter may switch to
	// a dense array: below it, a sorted slice is smaller and as fast.
	denseMin = 16
	// denseSpan bounds the dense array: a counter switches to it when its
	// largest SlotID is below denseSpan × its slots (4 bytes per SlotID
	// against 16 per slot of the sorted slice, so at most 4× the memory),
	// and goes back to sorted when a raise would grow it past twice that.
	denseSpan = 32
)

// GCounter is a grow-only counter: one non-decreasing value per slot, merged
// by per-slot max. Its value is the sum over slots, kept up to date
// incrementally so reading it is O(1).
//
// A counter with few writers keeps its slots in a slice sorted by SlotID.
// Once it has many writers and their SlotIDs are dense enough (SlotIDs are
// a replica's interned indices, small and dense), it keeps its values in an
// array indexed by SlotID instead — 32-bit while every value fits, 64-bit
// after — so that a merge at a thousand writers is one memory access, not a
// binary search and an insertion. The representation never shows: every
// method behaves the same in each.
//
// The zero value is an empty counter, ready to use.
type GCounter struct {
	vals  []slotVal // sparse: non-zero slots, sorted by SlotID (nil when dense)
	d32   []uint32  // dense: value by SlotID, every value < 1<<32
	d64   []uint64  // dense wide: value by SlotID
	n     int       // non-zero slots when dense
	total uint64
}

func (g *GCounter) find(id SlotID) (int, bool) {
	vals := g.vals
	// Linear for the common few-writer case, binary beyond.
	if len(vals) <= 8 {
		for i := range vals {
			if vals[i].id >= id {
				return i, vals[i].id == id
			}
		}
		return len(vals), false
	}
	// sort.Search's closure is not inlined: search by hand.
	lo, hi := 0, len(vals)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if vals[m].id < id {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return lo, lo < len(vals) && vals[lo].id == id
}

// Get returns the value of one slot (0 if it never wrote).
func (g *GCounter) Get(id SlotID) uint64 {
	switch {
	case g.d32 != nil:
		if int(id) < len(g.d32) {
			return uint64(g.d32[id])
		}
		return 0
	case g.d64 != nil:
		if int(id) < len(g.d64) {
			return g.d64[id]
		}
		return 0
	}
	if i, ok := g.find(id); ok {
		return g.vals[i].v
	}
	return 0
}

// Raise merges one slot's value: the slot becomes max(current, v). It
// reports whether the value grew.
func (g *GCounter) Raise(id SlotID, v uint64) bool {
	if d := g.d32; d != nil {
		if int(id) < len(d) && v <= math.MaxUint32 {
			old := d[id]
			if v <= uint64(old) {
				return false
			}
			if old == 0 {
				g.n++
			}
			d[id] = uint32(v)
			g.total = satAdd(g.total, v-uint64(old))
			return true
		}
		return g.raiseDense(id, v)
	}
	if d := g.d64; d != nil {
		if int(id) < len(d) {
			old := d[id]
			if v <= old {
				return false
			}
			if old == 0 {
				g.n++
			}
			d[id] = v
			g.total = satAdd(g.total, v-old)
			return true
		}
		return g.raiseDense(id, v)
	}
	i, ok := g.find(id)
	if ok {
		old := g.vals[i].v
		if v <= old {
			return false
		}
		g.vals[i].v = v
		g.total = satAdd(g.total, v-old)
		return true
	}
	if v == 0 {
		return false
	}
	g.vals = append(g.vals, slotVal{})
	copy(g.vals[i+1:], g.vals[i:])
	g.vals[i] = slotVal{id: id, v: v}
	g.total = satAdd(g.total, v)
	if n := len(g.vals); n >= denseMin && int(g.vals[n-1].id) < denseSpan*n {
		g.toDense()
	}
	return true
}

// raiseDense is Raise of a dense counter when the slot lies beyond the
// array or the value does not fit 32 bits.
func (g *GCounter) raiseDense(id SlotID, v uint64) bool {
	if v <= g.Get(id) {
		return false
	}
	if size := len(g.d32) + len(g.d64); int(id) >= size {
		if int(id) >= 2*denseSpan*(g.n+1) {
			// Too sparse for an array: back to the sorted slice.
			g.toSparse()
			return g.Raise(id, v)
		}
		g.grow(int(id) + 1 + int(id)/16)
	}
	if g.d32 != nil && v > math.MaxUint32 {
		g.widen()
	}
	return g.Raise(id, v)
}

// toDense moves a sparse counter's slots into an array indexed by SlotID.
func (g *GCounter) toDense() {
	maxID := int(g.vals[len(g.vals)-1].id)
	size := maxID + 1 + maxID/16
	wide := false
	for _, sv := range g.vals {
		if sv.v > math.MaxUint32 {
			wide = true
			break
		}
	}
	if wide {
		g.d64 = make([]uint64, size)
		for _, sv := range g.vals {
			g.d64[sv.id] = sv.v
		}
	} else {
		g.d32 = make([]uint32, size)
		for _, sv := range g.vals {
			g.d32[sv.id] = uint32(sv.v)
		}
	}
	g.n = len(g.vals)
	g.vals = nil
}

// toSparse moves a dense counter's slots back into a sorted slice.
func (g *GCounter) toSparse() {
	vals := make([]slotVal, 0, g.n+1)
	g.each(func(id SlotID, v uint64) { vals = append(vals, slotVal{id, v}) })
	g.vals, g.d32, g.d64, g.n = vals, nil, nil, 0
}

// grow extends a dense counter's array to size SlotIDs.
func (g *GCounter) grow(size int) {
	if g.d32 != nil {
		d := make([]uint32, size)
		copy(d, g.d32)
		g.d32 = d
		return
	}
	d := make([]uint64, size)
	copy(d, g.d64)
	g.d64 = d
}

// widen switches a dense counter to 64-bit values.
func (g *GCounter) widen() {
	d := make([]uint64, len(g.d32))
	for i, v := range g.d32 {
		d[i] = uint64(v)
	}
	g.d64, g.d32 = d, nil
}

// Add increments one slot by d (saturating). Only the slot's owner calls it.
func (g *GCounter) Add(id SlotID, d uint64) {
	if d == 0 {
		return
	}
	g.Raise(id, satAdd(g.Get(id), d))
}

// Value returns the sum over all slots.
func (g *GCounter) Value() uint64 { return g.total }

// Len returns how many slots have a non-zero value.
func (g *GCounter) Len() int {
	if g.d32 != nil || g.d64 != nil {
		return g.n
	}
	return len(g.vals)
}

// Merge raises every slot of g to at least its value in o.
func (g *GCounter) Merge(o *GCounter) {
	if o == g {
		return
	}
	o.each(func(id SlotID, v uint64) { g.Raise(id, v) })
}

// Each calls f for every slot with a non-zero value, in SlotID order.
func (g *GCounter) Each(f func(id SlotID, v uint64)) { g.each(f) }

func (g *GCounter) each(f func(id SlotID, v uint64)) {
	switch {
	case g.d32 != nil:
		for i, v := range g.d32 {
			if v != 0 {
				f(SlotID(i), uint64(v))
			}
		}
	case g.d64 != nil:
		for i, v := range g.d64 {
			if v != 0 {
				f(SlotID(i), v)
			}
		}
	default:
		for _, sv := range g.vals {
			f(sv.id, sv.v)
		}
	}
}

// PNCounter counts up and down (acquired and released leases) as two
// G-counters, so each half still merges by per-slot max. The zero value is an
// empty counter, ready to use.
type PNCounter struct {
	P GCounter // increments per slot
	N GCounter // decrements per slot
}

// Value returns Σ P − Σ N over all slots.
func (c *PNCounter) Value() int64 { return int64(c.P.Value()) - int64(c.N.Value()) }

// SlotValue returns P − N of one slot.
func (c *PNCounter) SlotValue(id SlotID) int64 { return int64(c.P.Get(id)) - int64(c.N.Get(id)) }

// ValueWhere returns Σ (P − N) over the slots for which live reports true,
// counting a slot's negative balance as zero (a slot can never hold fewer
// than no leases; a lagging N simply has not been heard yet).
func (c *PNCounter) ValueWhere(live func(SlotID) bool) int64 {
	var sum int64
	c.P.Each(func(id SlotID, p uint64) {
		if !live(id) {
			return
		}
		if d := int64(p) - int64(c.N.Get(id)); d > 0 {
			sum += d
		}
	})
	return sum
}

// Raise merges one slot's (p, n) pair. It reports whether either grew.
func (c *PNCounter) Raise(id SlotID, p, n uint64) bool {
	a := c.P.Raise(id, p)
	b := c.N.Raise(id, n)
	return a || b
}

// Merge raises every slot of c to at least its values in o.
func (c *PNCounter) Merge(o *PNCounter) {
	c.P.Merge(&o.P)
	c.N.Merge(&o.N)
}

func satAdd(a, b uint64) uint64 {
	if s := a + b; s >= a {
		return s
	}
	return math.MaxUint64
}
