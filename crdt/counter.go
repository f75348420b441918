package crdt

import (
	"encoding/binary"
	"math"
	"math/bits"
)

// rec is the size of one slot of a sparse counter's records: its SlotID
// (4 bytes) and its value (8), little-endian.
const rec = 12

// Representation bounds of a GCounter.
const (
	// denseMin is the number of slots from which a counter switches to a
	// dense array even when the array is larger than its records (within
	// denseSpan), for the speed of a merge at many writers. Below it, a
	// counter of two slots or more is dense only when the array takes no
	// more bytes than the records: a few members whose SlotIDs are
	// small, the common mesh, keep a window's counts in a few bytes.
	denseMin = 16
	// denseSpan bounds the dense array: a counter switches to it when its
	// largest SlotID is below denseSpan × its slots (a cell of 1 to 8
	// bytes per SlotID against 12 per slot of the sorted records, so at
	// most 2.7 to 21× the memory),
	// and goes back to sorted when a raise would grow it past twice that.
	denseSpan = 32
)

// GCounter is a grow-only counter: one non-decreasing value per slot, merged
// by per-slot max. Its value is the sum over slots, kept up to date
// incrementally so reading it is O(1).
//
// A counter with one writer holds its slot in its own fields, with no
// array at all: a key touched by one member, the common case, costs its
// windows no allocation for their counters. A counter with a few writers
// keeps its slots in records sorted by SlotID, 12 bytes each, in one byte
// slice. Once it has many writers and their SlotIDs are dense enough (SlotIDs are
// a replica's interned indices, small and dense), it keeps its values in an
// array indexed by SlotID instead, so that a merge at a thousand writers is
// one memory access, not a binary search and an insertion. The array's
// cells are as narrow as its values allow — 1, 2, 4 or 8 bytes, widened
// when a value outgrows them — because at a thousand writers the counters
// are most of a replica's memory and each merge's cost is the cache miss
// on its cell: a window's counts per writer are mostly small. A window's
// two counters may share one array, interleaved (see Window.Raise). The
// representation never shows: every method behaves the same in each.
//
// The zero value is an empty counter, ready to use.
//
// A counter is 40 bytes, so a Window's two counters each sit in one cache
// line (Window).
type GCounter struct {
	// d is, when dense, the array: little-endian cells of w bytes, SlotID
	// i's value in cell i*step. When sparse, it is empty for no slot or
	// one (whose value is total and SlotID n), else the records of two
	// slots or more, sorted by SlotID (rec bytes each).
	d     []byte
	total uint64
	n     uint32 // dense: non-zero slots; sparse with one slot: its SlotID (SlotIDs are uint32: neither overflows)
	w     uint8  // dense: cell width in bytes, 1, 2, 4 or 8 (0 when sparse)
	step  uint8  // dense: 1, or 2 when interleaved with the window's other counter
}

// recID returns the SlotID of record i of a sparse counter's records d.
func recID(d []byte, i int) SlotID { return SlotID(binary.LittleEndian.Uint32(d[rec*i:])) }

// recVal returns the value of record i.
func recVal(d []byte, i int) uint64 { return binary.LittleEndian.Uint64(d[rec*i+4:]) }

// setRecVal sets the value of record i.
func setRecVal(d []byte, i int, v uint64) { binary.LittleEndian.PutUint64(d[rec*i+4:], v) }

// appendRec appends a record.
func appendRec(d []byte, id SlotID, v uint64) []byte {
	d = binary.LittleEndian.AppendUint32(d, uint32(id))
	return binary.LittleEndian.AppendUint64(d, v)
}

// find returns where id is, or would go, among a sparse counter's records
// d, and whether it is there.
func find(d []byte, id SlotID) (int, bool) {
	n := len(d) / rec
	// Linear for the common few-writer case, binary beyond.
	if n <= 8 {
		for i := range n {
			if got := recID(d, i); got >= id {
				return i, got == id
			}
		}
		return n, false
	}
	// sort.Search's closure is not inlined: search by hand.
	lo, hi := 0, n
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if recID(d, m) < id {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return lo, lo < n && recID(d, lo) == id
}

// dense reports whether the counter holds an array by SlotID.
func (g *GCounter) dense() bool { return g.w != 0 }

// cells returns how many cells a dense counter's array holds.
func (g *GCounter) cells() int { return len(g.d) / int(g.w) }

// ids returns how many SlotIDs a dense counter's array covers.
func (g *GCounter) ids() int { return (g.cells() + int(g.step) - 1) / int(g.step) }

// widthFor returns the narrowest cell width that holds v.
func widthFor(v uint64) uint8 {
	switch {
	case v <= math.MaxUint8:
		return 1
	case v <= math.MaxUint16:
		return 2
	case v <= math.MaxUint32:
		return 4
	}
	return 8
}

// cellMax returns the largest value a cell of width w holds.
func cellMax(w uint8) uint64 { return math.MaxUint64 >> (64 - 8*uint(w)) }

// load returns cell c of a dense array of width w.
func load(d []byte, w uint8, c int) uint64 {
	switch w {
	case 1:
		return uint64(d[c])
	case 2:
		return uint64(binary.LittleEndian.Uint16(d[2*c:]))
	case 4:
		return uint64(binary.LittleEndian.Uint32(d[4*c:]))
	}
	return binary.LittleEndian.Uint64(d[8*c:])
}

// store sets cell c of a dense array of width w to v (which fits).
func store(d []byte, w uint8, c int, v uint64) {
	switch w {
	case 1:
		d[c] = uint8(v)
	case 2:
		binary.LittleEndian.PutUint16(d[2*c:], uint16(v))
	case 4:
		binary.LittleEndian.PutUint32(d[4*c:], uint32(v))
	default:
		binary.LittleEndian.PutUint64(d[8*c:], v)
	}
}

// Get returns the value of one slot (0 if it never wrote).
func (g *GCounter) Get(id SlotID) uint64 { return g.get(id) }

// get is Get in one call, whatever the representation: Get itself inlines
// into its callers (the limiter's decision path reads the owner's slot
// several times a decision), as it did when it only called find.
func (g *GCounter) get(id SlotID) uint64 {
	if g.w != 0 {
		if c := int(id) * int(g.step); c < g.cells() {
			return load(g.d, g.w, c)
		}
		return 0
	}
	if len(g.d) == 0 {
		if g.total != 0 && SlotID(g.n) == id {
			return g.total
		}
		return 0
	}
	if i, ok := find(g.d, id); ok {
		return recVal(g.d, i)
	}
	return 0
}

// Raise merges one slot's value: the slot becomes max(current, v). It
// reports whether the value grew.
func (g *GCounter) Raise(id SlotID, v uint64) bool {
	if g.w == 1 {
		// The common dense case, by hand: one byte per cell.
		if c := int(id) * int(g.step); c < len(g.d) && v <= math.MaxUint8 {
			return g.raise8(&g.d[c], v)
		}
		return g.raiseDense(id, v)
	}
	if g.w != 0 {
		if c := int(id) * int(g.step); c < g.cells() && v <= cellMax(g.w) {
			return g.raiseCell(c, v)
		}
		return g.raiseDense(id, v)
	}
	if len(g.d) == 0 {
		switch {
		case g.total == 0: // no slot yet: this one is held in place
			if v == 0 {
				return false
			}
			g.n, g.total = uint32(id), v
			return true
		case SlotID(g.n) == id:
			if v <= g.total {
				return false
			}
			g.total = v
			return true
		case v == 0:
			return false
		}
		if g.wouldDense(id, v) {
			g.toDense(0)
			return g.Raise(id, v)
		}
		// A second slot: both go to records.
		one, ov := SlotID(g.n), g.total
		g.d, g.n = appendRec(make([]byte, 0, 2*rec), one, ov), 0
	}
	i, ok := find(g.d, id)
	if ok {
		old := recVal(g.d, i)
		if v <= old {
			return false
		}
		setRecVal(g.d, i, v)
		g.total = satAdd(g.total, v-old)
		return true
	}
	if v == 0 {
		return false
	}
	if g.wouldDense(id, v) {
		g.toDense(0)
		return g.Raise(id, v)
	}
	var zero [rec]byte
	g.d = append(g.d, zero[:]...)
	copy(g.d[rec*(i+1):], g.d[rec*i:])
	binary.LittleEndian.PutUint32(g.d[rec*i:], uint32(id))
	setRecVal(g.d, i, v)
	g.total = satAdd(g.total, v)
	return true
}

// raise8 raises the one-byte cell p of a dense counter to v (≤ 255).
// Nothing in it branches on the cell's old value: the load of a cell is
// mostly a cache miss, and a branch on it that the CPU mispredicts
// (whether a merge grows a slot does not follow a pattern) would keep the
// next merges' misses from overlapping with this one.
func (g *GCounter) raise8(p *uint8, v uint64) bool {
	old := uint64(*p)
	nv := max(old, v)
	*p = uint8(nv)
	g.n += uint32(b2i(old == 0) & b2i(v != 0))
	g.total += nv - old // at most 255 per cell: a dense counter of one-byte cells cannot overflow it
	return nv != old
}

// b2i is 1 for true, 0 for false, without a branch.
func b2i(b bool) int {
	var i int
	if b {
		i = 1
	}
	return i
}

// raiseCell raises cell c of a dense counter to v, which fits the width.
func (g *GCounter) raiseCell(c int, v uint64) bool {
	old := load(g.d, g.w, c)
	if v <= old {
		return false
	}
	if old == 0 {
		g.n++
	}
	store(g.d, g.w, c, v)
	g.total = satAdd(g.total, v-old)
	return true
}

// raiseDense is Raise of a dense counter when the slot lies beyond the
// array or the value does not fit its cells.
func (g *GCounter) raiseDense(id SlotID, v uint64) bool {
	if v <= g.get(id) {
		return false
	}
	switch {
	case int(id) >= g.ids():
		if int(id) >= 2*denseSpan*(int(g.n)+1) {
			// Too sparse for an array: back to the sorted slice.
			g.toSparse()
			return g.Raise(id, v)
		}
		g.grow(arraySize(int(id)+1), max(g.w, widthFor(v)))
	default:
		g.grow(g.ids(), widthFor(v))
	}
	return g.Raise(id, v)
}

// wouldDense reports whether raising slot id to v would make a sparse
// counter dense (see Raise).
func (g *GCounter) wouldDense(id SlotID, v uint64) bool {
	n := g.Len()
	if v != 0 {
		n++ // at most; a counter paired a raise early is no harm
	}
	return denseFits(n, max(int(id), g.maxID()), max(v, g.maxVal()))
}

// denseFits reports whether a sparse counter of n slots, the largest
// SlotID maxID and the largest value maxVal is to be dense: from denseMin
// slots on when its SlotIDs are dense enough, and from two when its array
// would take no more bytes than its records.
func denseFits(n, maxID int, maxVal uint64) bool {
	if n >= denseMin {
		return maxID < denseSpan*n
	}
	return n >= 2 && arraySize(maxID+1)*int(widthFor(maxVal)) <= rec*n
}

// arraySize returns how many SlotIDs an array covering n should cover: a
// sixteenth more for SlotIDs still to come, or the next power of two when
// that is no more (1000 members fit 1024 cells, exactly an allocation size
// class, instead of 1062).
func arraySize(n int) int {
	size := n + n/16
	if p := 1 << bits.Len(uint(max(n-1, 0))); p <= size {
		return p
	}
	return size
}

// maxID returns the largest SlotID of a sparse counter, or -1.
func (g *GCounter) maxID() int {
	switch {
	case len(g.d) > 0:
		return int(recID(g.d, len(g.d)/rec-1))
	case g.total != 0:
		return int(g.n)
	}
	return -1
}

// maxVal returns the largest value of a sparse counter.
func (g *GCounter) maxVal() uint64 {
	if len(g.d) == 0 {
		return g.total
	}
	var m uint64
	for i := range len(g.d) / rec {
		m = max(m, recVal(g.d, i))
	}
	return m
}

// toDense moves a sparse counter's slots into an array indexed by SlotID,
// covering at least size SlotIDs, with cells as narrow as its values allow.
func (g *GCounter) toDense(size int) {
	size = max(size, arraySize(g.maxID()+1))
	w := widthFor(g.maxVal())
	d, n := make([]byte, size*int(w)), 0
	g.each(func(id SlotID, v uint64) {
		store(d, w, int(id), v)
		n++
	})
	g.d, g.w, g.step, g.n = d, w, 1, uint32(n)
}

// toSparse moves a dense counter's slots back into sorted records, or
// into its own fields when it has one slot or none.
func (g *GCounter) toSparse() {
	recs := make([]byte, 0, (int(g.n)+1)*rec)
	g.each(func(id SlotID, v uint64) { recs = appendRec(recs, id, v) })
	g.d, g.w, g.step, g.n = recs, 0, 0, 0
	if len(recs) <= rec {
		if len(recs) == rec {
			g.n = uint32(recID(recs, 0)) // its value is the total
		}
		g.d = nil
	}
}

// grow moves a dense counter's values into an array of its own covering
// size SlotIDs with cells of width w (never narrower than they are).
func (g *GCounter) grow(size int, w uint8) {
	w = max(w, g.w)
	d := make([]byte, size*int(w))
	for c, i := 0, 0; c < g.cells(); c, i = c+int(g.step), i+1 {
		store(d, w, i, load(g.d, g.w, c))
	}
	g.d, g.w, g.step = d, w, 1
}

// pair moves two counters into one interleaved array covering at least
// size SlotIDs, with cells at least w bytes wide (and as wide as their
// values need): a's value of SlotID i in cell 2i, b's in cell 2i+1, so
// that one memory access reaches both.
func pair(a, b *GCounter, size int, w uint8) {
	top, big := -1, uint64(0)
	scan := func(id SlotID, v uint64) { top, big = max(top, int(id)), max(big, v) }
	a.each(scan)
	b.each(scan)
	size = max(size, arraySize(top+1))
	w = max(w, widthFor(big))
	d := make([]byte, 2*size*int(w))
	a.each(func(id SlotID, v uint64) { store(d, w, 2*int(id), v) })
	b.each(func(id SlotID, v uint64) { store(d, w, 2*int(id)+1, v) })
	na, nb := uint32(a.Len()), uint32(b.Len())
	a.d, a.w, a.step, a.n = d, w, 2, na
	b.d, b.w, b.step, b.n = d[w:], w, 2, nb
}

// Add increments one slot by d (saturating). Only the slot's owner calls it.
func (g *GCounter) Add(id SlotID, d uint64) {
	if d == 0 {
		return
	}
	// The slot present (the owner's, on every decision after its first):
	// find it here and add in place, where Raise(id, Get(id)+d) would
	// look for it twice.
	if g.w != 0 {
		if c := int(id) * int(g.step); c < g.cells() {
			old := load(g.d, g.w, c)
			if nv := satAdd(old, d); nv <= cellMax(g.w) {
				store(g.d, g.w, c, nv)
				g.n += uint32(b2i(old == 0))
				g.total = satAdd(g.total, nv-old)
				return
			}
		}
	} else {
		if len(g.d) == 0 {
			if g.total == 0 || SlotID(g.n) == id { // none yet, or the one slot
				g.n, g.total = uint32(id), satAdd(g.total, d)
				return
			}
		} else if len(g.d) <= 8*rec {
			for i := range len(g.d) / rec {
				if got := recID(g.d, i); got == id {
					old := recVal(g.d, i)
					nv := satAdd(old, d)
					setRecVal(g.d, i, nv)
					g.total = satAdd(g.total, nv-old)
					return
				} else if got > id {
					break
				}
			}
		}
	}
	g.Raise(id, satAdd(g.Get(id), d))
}

// Value returns the sum over all slots.
func (g *GCounter) Value() uint64 { return g.total }

// Len returns how many slots have a non-zero value.
func (g *GCounter) Len() int {
	switch {
	case g.dense():
		return int(g.n)
	case len(g.d) > 0:
		return len(g.d) / rec
	}
	return b2i(g.total != 0)
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
	if g.w != 0 {
		for c, id := 0, SlotID(0); c < g.cells(); c, id = c+int(g.step), id+1 {
			if v := load(g.d, g.w, c); v != 0 {
				f(id, v)
			}
		}
		return
	}
	if len(g.d) == 0 {
		if g.total != 0 {
			f(SlotID(g.n), g.total)
		}
		return
	}
	for i := range len(g.d) / rec {
		f(recID(g.d, i), recVal(g.d, i))
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
