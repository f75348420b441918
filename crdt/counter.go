package crdt

import (
	"math"
	"math/bits"
)

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
// binary search and an insertion. A window's two counters may share one
// array, interleaved (see Window.Raise). The representation never shows:
// every method behaves the same in each.
//
// The zero value is an empty counter, ready to use.
type GCounter struct {
	vals  []slotVal // sparse: non-zero slots, sorted by SlotID (nil when dense)
	d32   []uint32  // dense: the value of SlotID i is d32[i*step], every value < 1<<32
	d64   []uint64  // dense wide: the value of SlotID i is d64[i]
	step  int       // d32's stride: 2 when interleaved with the window's other counter
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

// dense reports whether the counter holds an array by SlotID.
func (g *GCounter) dense() bool { return g.d32 != nil || g.d64 != nil }

// ids returns how many SlotIDs a dense counter's array covers.
func (g *GCounter) ids() int {
	if g.d32 != nil {
		return (len(g.d32) + g.step - 1) / g.step
	}
	return len(g.d64)
}

// Get returns the value of one slot (0 if it never wrote).
func (g *GCounter) Get(id SlotID) uint64 { return g.get(id) }

// get is Get in one call, whatever the representation: Get itself inlines
// into its callers (the limiter's decision path reads the owner's slot
// several times a decision), as it did when it only called find.
func (g *GCounter) get(id SlotID) uint64 {
	if d := g.d32; d != nil {
		if i := int(id) * g.step; i < len(d) {
			return uint64(d[i])
		}
		return 0
	}
	if d := g.d64; d != nil {
		if int(id) < len(d) {
			return d[id]
		}
		return 0
	}
	vals := g.vals
	if len(vals) <= 8 {
		for i := range vals {
			if vals[i].id >= id {
				if vals[i].id == id {
					return vals[i].v
				}
				return 0
			}
		}
		return 0
	}
	lo, hi := 0, len(vals)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if vals[m].id < id {
			lo = m + 1
		} else {
			hi = m
		}
	}
	if lo < len(vals) && vals[lo].id == id {
		return vals[lo].v
	}
	return 0
}

// Raise merges one slot's value: the slot becomes max(current, v). It
// reports whether the value grew.
func (g *GCounter) Raise(id SlotID, v uint64) bool {
	if d := g.d32; d != nil {
		if i := int(id) * g.step; i < len(d) && v <= math.MaxUint32 {
			return g.raise32(&d[i], v)
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
		g.toDense(0)
	}
	return true
}

// raise32 raises the 32-bit cell p of a dense counter to v (< 1<<32).
func (g *GCounter) raise32(p *uint32, v uint64) bool {
	old := *p
	if v <= uint64(old) {
		return false
	}
	if old == 0 {
		g.n++
	}
	*p = uint32(v)
	g.total = satAdd(g.total, v-uint64(old))
	return true
}

// raiseDense is Raise of a dense counter when the slot lies beyond the
// array or the value does not fit 32 bits.
func (g *GCounter) raiseDense(id SlotID, v uint64) bool {
	if v <= g.Get(id) {
		return false
	}
	if int(id) >= g.ids() {
		if int(id) >= 2*denseSpan*(g.n+1) {
			// Too sparse for an array: back to the sorted slice.
			g.toSparse()
			return g.Raise(id, v)
		}
		g.grow(arraySize(int(id)+1), v > math.MaxUint32)
	} else if g.d32 != nil && v > math.MaxUint32 {
		g.grow(g.ids(), true)
	}
	return g.Raise(id, v)
}

// wouldDense reports whether raising slot id to v would make a sparse
// counter dense (see Raise).
func (g *GCounter) wouldDense(id SlotID, v uint64) bool {
	n := len(g.vals)
	if v != 0 {
		n++ // at most; a counter paired a raise early is no harm
	}
	return n >= denseMin && max(int(id), g.maxID()) < denseSpan*n
}

// arraySize returns how many SlotIDs an array covering n should cover: a
// sixteenth more for SlotIDs still to come, or the next power of two when
// that is no more (1000 members fit 1024 entries, 4 KiB, exactly an
// allocation size class, instead of 1062 in a class of 4864 bytes).
func arraySize(n int) int {
	size := n + n/16
	if p := 1 << bits.Len(uint(max(n-1, 0))); p <= size {
		return p
	}
	return size
}

// maxID returns the largest SlotID of a sparse counter, or -1.
func (g *GCounter) maxID() int {
	if len(g.vals) == 0 {
		return -1
	}
	return int(g.vals[len(g.vals)-1].id)
}

// wide reports whether a sparse counter holds a value beyond 32 bits.
func (g *GCounter) wide() bool {
	for _, sv := range g.vals {
		if sv.v > math.MaxUint32 {
			return true
		}
	}
	return false
}

// toDense moves a sparse counter's slots into an array indexed by SlotID,
// covering at least size SlotIDs.
func (g *GCounter) toDense(size int) {
	size = max(size, arraySize(g.maxID()+1))
	if g.wide() {
		g.d64 = make([]uint64, size)
		for _, sv := range g.vals {
			g.d64[sv.id] = sv.v
		}
	} else {
		g.d32, g.step = make([]uint32, size), 1
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
	g.vals, g.d32, g.d64, g.step, g.n = vals, nil, nil, 0, 0
}

// grow moves a dense counter's values into an array of its own covering
// size SlotIDs, 64-bit if wide.
func (g *GCounter) grow(size int, wide bool) {
	if g.d32 != nil && !wide {
		d := make([]uint32, size)
		for i, j := 0, 0; i < len(g.d32); i, j = i+g.step, j+1 {
			d[j] = g.d32[i]
		}
		g.d32, g.step = d, 1
		return
	}
	d := make([]uint64, size)
	if g.d32 != nil {
		for i, j := 0, 0; i < len(g.d32); i, j = i+g.step, j+1 {
			d[j] = uint64(g.d32[i])
		}
	} else {
		copy(d, g.d64)
	}
	g.d64, g.d32, g.step = d, nil, 0
}

// pair moves two sparse counters with 32-bit values into one interleaved
// array covering at least size SlotIDs: a's value of SlotID i at 2i, b's at
// 2i+1, so that one memory access reaches both.
func pair(a, b *GCounter, size int) {
	size = max(size, arraySize(max(a.maxID(), b.maxID())+1))
	d := make([]uint32, 2*size)
	for _, sv := range a.vals {
		d[2*sv.id] = uint32(sv.v)
	}
	for _, sv := range b.vals {
		d[2*sv.id+1] = uint32(sv.v)
	}
	a.d32, a.step, a.n, a.vals = d, 2, len(a.vals), nil
	b.d32, b.step, b.n, b.vals = d[1:], 2, len(b.vals), nil
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
	if g.dense() {
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
		for i, id := 0, SlotID(0); i < len(g.d32); i, id = i+g.step, id+1 {
			if v := g.d32[i]; v != 0 {
				f(id, uint64(v))
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
