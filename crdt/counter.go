package crdt

import (
	"encoding/binary"
	"math"
	"math/bits"
	"unsafe"
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
	// maxDenseID bounds the SlotIDs an array covers: a counter with a
	// slot at or beyond it keeps records, so that an array's cells (twice
	// its SlotIDs, interleaved) always fit its shape. A replica would
	// have interned 33 million slots first.
	maxDenseID = 1 << 25
)

// GCounter is a grow-only counter: one non-decreasing value per slot, merged
// by per-slot max. Its value is the sum over slots, kept up to date
// incrementally so reading it is O(1).
//
// A counter with one writer holds its slot in its own fields, with no
// array at all: a key touched by one member, the common case, costs its
// windows no allocation for their counters. A counter with a few writers
// keeps its slots in records sorted by SlotID, 12 bytes each, in one byte
// array. Once it has many writers and their SlotIDs are dense enough (SlotIDs are
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
// A counter is 24 bytes (TestCounterLayout): its array is a bare pointer,
// its length and representation packed in one word (shape), where a
// slice's header alone would take 24.
type GCounter struct {
	// p points to the counter's bytes. Dense: its array of little-endian
	// cells, SlotID i's value in cell i*step (the second counter of an
	// interleaved pair points one cell into the array the two share).
	// Sparse: the records of two slots or more, sorted by SlotID, with
	// room for recCap of them. It is nil exactly when the counter holds
	// one slot (whose value is total and SlotID n) or none.
	p     unsafe.Pointer
	total uint64
	// n is, dense, the non-zero slots; sparse, the records, or with none
	// the one slot's SlotID (SlotIDs are uint32: none of them overflows).
	n uint32
	m shape
}

// shape packs a counter's representation into one word:
//
//	bits 0–2   cell width: 0 sparse, else 1, 2, 3 or 4 for cells of 1,
//	           2, 4 or 8 bytes
//	bit 3      dense: interleaved with the window's other counter, every
//	           other cell this one's (step 2); sparse: the hint is for
//	           the pair (pairHint)
//	bit 4      a mark the counter keeps for its holder and never reads
//	           (Window.Dirty, Window.Queue)
//	bits 5–31  dense: the cells from p (at most maxCells); sparse: the
//	           size hint its holder gave it (hint)
type shape uint32

const (
	widthBits shape = 7
	pairBit   shape = 1 << 3
	markBit   shape = 1 << 4
	cellShift       = 5
	maxCells        = 1<<(32-cellShift) - 1
)

// recCap returns how many records the records of a sparse counter of n
// slots have room for: the next power of two, at least 2. The room
// follows from n, so a counter need not keep it: records of 2, 4, 8, …
// slots take 24, 48, 96, … bytes, each an allocation size class.
func recCap(n int) int { return 1 << bits.Len(uint(max(n, 2)-1)) }

// recID returns the SlotID of record i of a sparse counter's records d.
func recID(d []byte, i int) SlotID { return SlotID(binary.LittleEndian.Uint32(d[rec*i:])) }

// recVal returns the value of record i.
func recVal(d []byte, i int) uint64 { return binary.LittleEndian.Uint64(d[rec*i+4:]) }

// setRec sets record i.
func setRec(d []byte, i int, id SlotID, v uint64) {
	binary.LittleEndian.PutUint32(d[rec*i:], uint32(id))
	setRecVal(d, i, v)
}

// setRecVal sets the value of record i.
func setRecVal(d []byte, i int, v uint64) { binary.LittleEndian.PutUint64(d[rec*i+4:], v) }

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
func (g *GCounter) dense() bool { return g.m&widthBits != 0 }

// width returns a dense counter's cell width in bytes (0 when sparse).
func (g *GCounter) width() uint8 {
	if c := g.m & widthBits; c != 0 {
		return 1 << (c - 1)
	}
	return 0
}

// step returns the cells from one SlotID's cell to the next's in a dense
// counter's array: 2 when interleaved, else 1.
func (g *GCounter) step() int { return 1 + int(g.m>>3&1) }

// paired reports whether the counter is dense and interleaved with
// another.
func (g *GCounter) paired() bool { return g.m&pairBit != 0 && g.dense() }

// cells returns how many cells a dense counter's array holds from p.
func (g *GCounter) cells() int { return int(g.m >> cellShift) }

// ids returns how many SlotIDs a dense counter's array covers.
func (g *GCounter) ids() int { return (g.cells() + g.step() - 1) / g.step() }

// array returns a dense counter's cells as bytes.
func (g *GCounter) array() []byte {
	return unsafe.Slice((*byte)(g.p), g.cells()*int(g.width()))
}

// recs returns a sparse counter's records, with their room as capacity
// (nil when it holds none).
func (g *GCounter) recs() []byte {
	if g.p == nil {
		return nil
	}
	return unsafe.Slice((*byte)(g.p), recCap(int(g.n))*rec)[:rec*int(g.n)]
}

// setDense makes the counter dense: the cells of width w of d (every
// other one of them if paired), n of them non-zero. It keeps the mark.
func (g *GCounter) setDense(d []byte, w uint8, paired bool, n int) {
	cells := len(d) / int(w)
	if cells > maxCells {
		// Every caller covers SlotIDs below maxDenseID only.
		panic("crdt: a counter's array of more than maxCells cells")
	}
	m := g.m&markBit | shape(cells)<<cellShift | shape(bits.TrailingZeros8(w)+1)
	if paired {
		m |= pairBit
	}
	g.p, g.n, g.m = unsafe.Pointer(unsafe.SliceData(d)), uint32(n), m
}

// setSparse makes the counter sparse: the records d (made with room for
// recCap of them), or with none, the one slot id (whose value is total)
// or none. It keeps the mark, and the hint of a counter that was sparse.
func (g *GCounter) setSparse(d []byte, id SlotID) {
	if g.dense() {
		g.m &= markBit
	}
	if len(d) == 0 {
		g.p, g.n = nil, uint32(id)
		return
	}
	g.p, g.n = unsafe.Pointer(unsafe.SliceData(d)), uint32(len(d)/rec)
}

// hint returns the size hint of a sparse counter, in SlotIDs (0 when
// dense or none): the size of the array the counter is to go dense at
// (Window.Raise), which its holder set (setHint) and going dense spends.
func (g *GCounter) hint() int {
	if g.dense() {
		return 0
	}
	return int(g.m >> cellShift)
}

// pairHint reports whether a sparse counter's hint is for an interleaved
// pair.
func (g *GCounter) pairHint() bool { return !g.dense() && g.m&pairBit != 0 }

// setHint sets a sparse counter's size hint to size SlotIDs (at most
// maxCells), for a pair or for the counter alone.
func (g *GCounter) setHint(size int, forPair bool) {
	m := g.m&(widthBits|markBit) | shape(min(size, maxCells))<<cellShift
	if forPair {
		m |= pairBit
	}
	g.m = m
}

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

// loadAt returns cell c of the array of width w at p; the caller has
// checked that the array holds it.
func loadAt(p unsafe.Pointer, w uint8, c int) uint64 {
	switch w {
	case 1:
		return uint64(*(*uint8)(unsafe.Add(p, c)))
	case 2:
		return uint64(binary.LittleEndian.Uint16((*[2]byte)(unsafe.Add(p, 2*c))[:]))
	case 4:
		return uint64(binary.LittleEndian.Uint32((*[4]byte)(unsafe.Add(p, 4*c))[:]))
	}
	return binary.LittleEndian.Uint64((*[8]byte)(unsafe.Add(p, 8*c))[:])
}

// storeAt sets cell c of the array of width w at p to v (which fits); the
// caller has checked that the array holds it.
func storeAt(p unsafe.Pointer, w uint8, c int, v uint64) {
	switch w {
	case 1:
		*(*uint8)(unsafe.Add(p, c)) = uint8(v)
	case 2:
		binary.LittleEndian.PutUint16((*[2]byte)(unsafe.Add(p, 2*c))[:], uint16(v))
	case 4:
		binary.LittleEndian.PutUint32((*[4]byte)(unsafe.Add(p, 4*c))[:], uint32(v))
	default:
		binary.LittleEndian.PutUint64((*[8]byte)(unsafe.Add(p, 8*c))[:], v)
	}
}

// Get returns the value of one slot (0 if it never wrote).
func (g *GCounter) Get(id SlotID) uint64 { return g.get(id) }

// get is Get in one call, whatever the representation: Get itself inlines
// into its callers (the limiter's decision path reads the owner's slot
// several times a decision), as it did when it only called find.
func (g *GCounter) get(id SlotID) uint64 {
	if g.p == nil { // one slot or none, in place (an array or records has p)
		if g.total != 0 && SlotID(g.n) == id {
			return g.total
		}
		return 0
	}
	if g.m&widthBits == 0 {
		d := g.recs()
		if i, ok := find(d, id); ok {
			return recVal(d, i)
		}
		return 0
	}
	if c := int(id) * g.step(); c < g.cells() {
		return loadAt(g.p, g.width(), c)
	}
	return 0
}

// Raise merges one slot's value: the slot becomes max(current, v). It
// reports whether the value grew.
func (g *GCounter) Raise(id SlotID, v uint64) bool {
	m := g.m
	if m&widthBits == 1 {
		// The common dense case, by hand: one byte per cell.
		if c := int(id) << (m >> 3 & 1); c < int(m>>cellShift) && v <= math.MaxUint8 {
			return g.raise8((*uint8)(unsafe.Add(g.p, c)), v)
		}
		return g.raiseDense(id, v)
	}
	if m&widthBits != 0 {
		if c := int(id) * g.step(); c < g.cells() && v <= cellMax(g.width()) {
			return g.raiseCell(c, v)
		}
		return g.raiseDense(id, v)
	}
	if g.p == nil {
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
		d := make([]byte, rec, recCap(2)*rec)
		setRec(d, 0, SlotID(g.n), g.total)
		g.setSparse(d, 0)
	}
	d := g.recs()
	i, ok := find(d, id)
	if ok {
		old := recVal(d, i)
		if v <= old {
			return false
		}
		setRecVal(d, i, v)
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
	if n := int(g.n); n+1 <= recCap(n) {
		d = d[:rec*(n+1)]
		copy(d[rec*(i+1):], d[rec*i:])
	} else {
		nd := make([]byte, rec*(n+1), rec*recCap(n+1))
		copy(nd, d[:rec*i])
		copy(nd[rec*(i+1):], d[rec*i:])
		d = nd
	}
	setRec(d, i, id, v)
	g.setSparse(d, 0)
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
	w := g.width()
	old := loadAt(g.p, w, c)
	if v <= old {
		return false
	}
	if old == 0 {
		g.n++
	}
	storeAt(g.p, w, c, v)
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
		if tooFar(id, g.n) {
			// Too sparse for an array: back to the sorted records.
			g.toSparse()
			return g.Raise(id, v)
		}
		g.grow(arraySize(int(id)+1), max(g.width(), widthFor(v)))
	default:
		g.grow(g.ids(), widthFor(v))
	}
	return g.Raise(id, v)
}

// tooFar reports whether an array with n non-zero slots is too sparse to
// cover SlotID id: id lies beyond twice denseSpan per slot, or beyond
// maxDenseID.
func tooFar(id SlotID, n uint32) bool {
	return int(id) >= 2*denseSpan*(int(n)+1) || id >= maxDenseID
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
// would take no more bytes than its records; never with a SlotID of
// maxDenseID or more.
func denseFits(n, maxID int, maxVal uint64) bool {
	switch {
	case maxID >= maxDenseID:
		return false
	case n >= denseMin:
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
	case g.p != nil:
		return int(recID(g.recs(), int(g.n)-1))
	case g.total != 0:
		return int(g.n)
	}
	return -1
}

// maxVal returns the largest value of a sparse counter.
func (g *GCounter) maxVal() uint64 {
	if g.p == nil {
		return g.total
	}
	var m uint64
	d := g.recs()
	for i := range int(g.n) {
		m = max(m, recVal(d, i))
	}
	return m
}

// toDense moves a sparse counter's slots into an array indexed by SlotID,
// covering at least size SlotIDs, with cells as narrow as its values allow.
func (g *GCounter) toDense(size int) {
	size = max(size, arraySize(g.maxID()+1), 1)
	w := widthFor(g.maxVal())
	d, n := make([]byte, size*int(w)), 0
	g.each(func(id SlotID, v uint64) {
		store(d, w, int(id), v)
		n++
	})
	g.setDense(d, w, false, n)
}

// toSparse moves a dense counter's slots back into sorted records, or
// into its own fields when it has one slot or none.
func (g *GCounter) toSparse() {
	n := int(g.n)
	if n <= 1 {
		var one SlotID
		g.each(func(id SlotID, _ uint64) { one = id }) // its value is the total
		g.setSparse(nil, one)
		return
	}
	d := make([]byte, rec*n, rec*recCap(n))
	i := 0
	g.each(func(id SlotID, v uint64) {
		setRec(d, i, id, v)
		i++
	})
	g.setSparse(d, 0)
}

// grow moves a dense counter's values into an array of its own covering
// size SlotIDs with cells of width w (never narrower than they are).
func (g *GCounter) grow(size int, w uint8) {
	ow, st := g.width(), g.step()
	w = max(w, ow)
	d := make([]byte, size*int(w))
	for c, i := 0, 0; c < g.cells(); c, i = c+st, i+1 {
		store(d, w, i, loadAt(g.p, ow, c))
	}
	g.setDense(d, w, false, int(g.n))
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
	size = max(size, arraySize(top+1), 1)
	w = max(w, widthFor(big))
	d := make([]byte, 2*size*int(w))
	a.each(func(id SlotID, v uint64) { store(d, w, 2*int(id), v) })
	b.each(func(id SlotID, v uint64) { store(d, w, 2*int(id)+1, v) })
	a.setDense(d, w, true, a.Len())
	b.setDense(d[w:], w, true, b.Len())
}

// Add increments one slot by d (saturating). Only the slot's owner calls it.
func (g *GCounter) Add(id SlotID, d uint64) {
	if d == 0 {
		return
	}
	// The slot present (the owner's, on every decision after its first):
	// find it here and add in place, where Raise(id, Get(id)+d) would
	// look for it twice.
	if g.p == nil { // one slot or none, in place (an array or records has p)
		if g.total == 0 || SlotID(g.n) == id { // none yet, or the one slot
			g.n, g.total = uint32(id), satAdd(g.total, d)
			return
		}
	} else if g.m&widthBits == 0 {
		if g.n <= 8 {
			recs := g.recs()
			for i := range int(g.n) {
				if got := recID(recs, i); got == id {
					old := recVal(recs, i)
					nv := satAdd(old, d)
					setRecVal(recs, i, nv)
					g.total = satAdd(g.total, nv-old)
					return
				} else if got > id {
					break
				}
			}
		}
	} else if c := int(id) * g.step(); c < g.cells() {
		w := g.width()
		old := loadAt(g.p, w, c)
		if nv := satAdd(old, d); nv <= cellMax(w) {
			storeAt(g.p, w, c, nv)
			g.n += uint32(b2i(old == 0))
			g.total = satAdd(g.total, nv-old)
			return
		}
	}
	g.Raise(id, satAdd(g.Get(id), d))
}

// Value returns the sum over all slots.
func (g *GCounter) Value() uint64 { return g.total }

// Len returns how many slots have a non-zero value.
func (g *GCounter) Len() int {
	if g.p != nil {
		return int(g.n) // dense: the non-zero cells; sparse: the records
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
	if w := g.width(); w != 0 {
		p, st, cells := g.p, g.step(), g.cells()
		for c, id := 0, SlotID(0); c < cells; c, id = c+st, id+1 {
			if v := loadAt(p, w, c); v != 0 {
				f(id, v)
			}
		}
		return
	}
	if g.p == nil {
		if g.total != 0 {
			f(SlotID(g.n), g.total)
		}
		return
	}
	d := g.recs()
	for i := range int(g.n) {
		f(recID(d, i), recVal(d, i))
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
