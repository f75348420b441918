package crdt

import (
	"fmt"
	"testing"
	"unsafe"
)

// TestArraySize checks that an array by SlotID always covers what it must,
// and that a thousand members take exactly 4 KiB.
func TestArraySize(t *testing.T) {
	for n := 0; n <= 5000; n++ {
		got := arraySize(n)
		if got < n || got > n+n/16+1 {
			t.Fatalf("arraySize(%d) = %d, want within [%d, %d]", n, got, n, n+n/16+1)
		}
	}
	for _, n := range []int{965, 1000, 1001, 1024} {
		if got := arraySize(n); got != 1024 {
			t.Errorf("arraySize(%d) = %d, want 1024", n, got)
		}
	}
}

// held returns the bytes of g's array (from its pointer) or records: 0
// when it holds its one slot, or none, in its own fields.
func (g *GCounter) held() int {
	switch {
	case g.dense():
		return g.cells() * int(g.width())
	case g.p != nil:
		return int(g.n) * rec
	}
	return 0
}

// allocated returns the bytes of the allocation g's array or records
// take, or 0 when it has none or points into another's (the second of an
// interleaved pair).
func (g *GCounter) allocated() int {
	switch {
	case g.dense() && g.paired() && g.cells()%2 == 1:
		return 0
	case g.dense():
		return g.cells() * int(g.width())
	case g.p != nil:
		return recCap(int(g.n)) * rec
	}
	return 0
}

// TestCounterLayout pins the sizes GCounter's and Window's comments rely
// on: a counter of 24 bytes, a window of 80 whose first 64 bytes are what
// a merge reads (WindowMs, Index and both counters).
func TestCounterLayout(t *testing.T) {
	var w Window
	if got := unsafe.Sizeof(w.Admitted); got != 24 {
		t.Errorf("GCounter is %d bytes, want 24", got)
	}
	if got := unsafe.Sizeof(w); got != 80 {
		t.Errorf("Window is %d bytes, want 80", got)
	}
	if got := unsafe.Offsetof(w.Attempted) + unsafe.Sizeof(w.Attempted); unsafe.Offsetof(w.WindowMs) != 0 || unsafe.Offsetof(w.Index) != 8 || unsafe.Offsetof(w.Admitted) != 16 || got != 64 {
		t.Errorf("WindowMs, Index, Admitted and Attempted end at byte %d, want the first 64 bytes", got)
	}
	for n := 2; n <= 1<<12; n++ {
		if c := recCap(n); c < n || c&(c-1) != 0 || recCap(c) != c {
			t.Fatalf("recCap(%d) = %d, want the next power of two", n, c)
		}
	}
}

// TestWindowTouch checks that Touch reads the slot's own admitted cell —
// in a paired window of one-byte cells, one with wider cells and one whose
// admitted counter alone is dense — and 0 where the counter is sparse or
// does not cover the slot.
func TestWindowTouch(t *testing.T) {
	val := func(id SlotID) uint64 { return uint64(id)%200 + 1 }
	paired, wide, alone, sparse := &Window{}, &Window{}, &Window{}, &Window{}
	pair(&paired.Admitted, &paired.Attempted, 1000, 1)
	for id := range SlotID(1000) {
		paired.Raise(id, val(id), val(id)+7)
		wide.Raise(id, val(id)+1000*uint64(id%3), val(id)+5000)
		alone.Admitted.Raise(id, val(id))
	}
	for _, id := range []SlotID{30, 50, 80} { // records, whose bytes are no cells
		sparse.Raise(id, 9, 9)
	}
	if !paired.Admitted.paired() || paired.Admitted.width() != 1 || wide.Admitted.width() < 2 || !alone.Admitted.dense() || alone.Admitted.paired() || sparse.Admitted.dense() {
		t.Fatalf("set-up: want paired one-byte, wide, lone dense and sparse counters")
	}
	for name, w := range map[string]*Window{"paired": paired, "wide": wide, "alone": alone} {
		for id := range SlotID(1000) {
			if got, want := w.Touch(id), byte(w.Admitted.Get(id)); got != want {
				t.Fatalf("%s: Touch(%d) = %d, want %d", name, id, got, want)
			}
		}
		if got := w.Touch(1 << 20); got != 0 {
			t.Errorf("%s: Touch beyond the array = %d, want 0", name, got)
		}
	}
	if got := sparse.Touch(30); got != 0 {
		t.Errorf("sparse: Touch(30) = %d, want 0", got)
	}
}

// TestGCounterOneSlotInPlace checks that a counter written by one slot
// keeps it in its own fields, allocating nothing, through Add and Raise;
// that a second slot moves both into an array when it is no larger than
// their records, and into records otherwise; and that a dense counter
// sent back to sparse with one slot or none holds it in place again.
func TestGCounterOneSlotInPlace(t *testing.T) {
	var g GCounter
	if n := testing.AllocsPerRun(100, func() {
		g.Add(7, 1)
		g.Raise(7, g.Get(7)+1)
		g.Raise(7, 0)
		g.Raise(3, 0)
	}); n != 0 || g.held() != 0 {
		t.Fatalf("one slot: %v allocations a run, %d bytes of records; want none", n, g.held())
	}
	if got, want := g.Get(7), uint64(2*101); got != want || g.Value() != want || g.Len() != 1 || g.Get(3) != 0 {
		t.Fatalf("one slot: Get(7) %d, Value %d, Len %d, Get(3) %d; want %d, %d, 1, 0", got, g.Value(), g.Len(), g.Get(3), want, want)
	}
	far := g
	g.Raise(3, 5)
	if !g.dense() || g.held() != 8 || g.Len() != 2 || g.Get(3) != 5 || g.Get(7) != 202 || g.Value() != 207 {
		t.Fatalf("two slots: dense %v of %d bytes, Len %d, Get(3) %d, Get(7) %d, Value %d; want an array of 8, 2, 5, 202, 207", g.dense(), g.held(), g.Len(), g.Get(3), g.Get(7), g.Value())
	}
	far.Raise(100, 5) // 101 cells against 24 bytes of records
	if far.dense() || far.held() != 2*rec || far.Len() != 2 || far.Get(100) != 5 || far.Get(7) != 202 || far.Value() != 207 {
		t.Fatalf("two far slots: dense %v, %d bytes, Len %d, Get(100) %d, Get(7) %d, Value %d; want records of %d, 2, 5, 202, 207", far.dense(), far.held(), far.Len(), far.Get(100), far.Get(7), far.Value(), 2*rec)
	}

	for _, slots := range []int{0, 1} {
		var a, b GCounter
		for id := range slots {
			a.Raise(SlotID(id+4), 9)
		}
		b.Raise(2, 1)
		pair(&a, &b, 64, 1)
		if !a.dense() || !b.dense() {
			t.Fatalf("%d slots: pair left a sparse counter", slots)
		}
		far := SlotID(1 << 20)
		a.Raise(far, 3) // too far for the array: back to sparse
		want := map[SlotID]uint64{far: 3}
		if slots == 1 {
			want[4] = 9
		}
		if a.dense() || a.Len() != len(want) || (slots == 0 && a.held() != 0) {
			t.Fatalf("%d slots: dense %v, Len %d, %d bytes of records after a far raise", slots, a.dense(), a.Len(), a.held())
		}
		got := map[SlotID]uint64{}
		a.Each(func(id SlotID, v uint64) { got[id] = v })
		if fmt.Sprint(got) != fmt.Sprint(want) || a.Value() != uint64(3+9*slots) {
			t.Fatalf("%d slots: slots %v, Value %d; want %v, %d", slots, got, a.Value(), want, 3+9*slots)
		}
	}
}

// TestWindowOneWriterAllocations checks what a window written by one
// member costs beyond the window itself: nothing, however often it is
// raised, merged or added to.
func TestWindowOneWriterAllocations(t *testing.T) {
	w := NewContainer().Rule("r").Ensure("k").EnsureWindow(1000, 1)
	if n := testing.AllocsPerRun(100, func() {
		w.Attempted.Add(2, 1)
		w.Admitted.Add(2, 1)
		w.Raise(2, w.Admitted.Get(2), w.Attempted.Get(2)+1)
	}); n != 0 {
		t.Fatalf("%v allocations a run, want 0", n)
	}
	if w.Admitted.Get(2) != 101 || w.Attempted.Get(2) != 202 {
		t.Fatalf("admitted %d, attempted %d; want 101, 202", w.Admitted.Get(2), w.Attempted.Get(2))
	}
}

// TestWindowKeepsPair checks that a window's counters stay in one
// interleaved array as writers come (the array grows as a pair) and as
// values widen (through Window.Raise, or through the owner's Add on one
// counter, after which the next merge pairs them again), and that a slot
// too far for an array still sends the counters back to sparse.
func TestWindowKeepsPair(t *testing.T) {
	paired := func(w *Window) bool {
		a, b := &w.Admitted, &w.Attempted
		return a.paired() && b.paired() && b.p == unsafe.Add(a.p, a.width())
	}
	w := NewContainer().Rule("r").Ensure("k").EnsureWindow(1000, 1)
	w.Attempted.Add(0, 1)
	w.Admitted.Add(0, 1)
	for id := SlotID(1); id < 3; id++ {
		w.Raise(id, 1, 1)
	}
	if !paired(w) || w.Admitted.held() != 6 || w.Admitted.width() != 1 {
		t.Fatalf("three writers: paired %v, %d bytes of width %d; want one array of 6 one-byte cells", paired(w), w.Admitted.held(), w.Admitted.width())
	}
	w.Raise(1, 300, 70_000) // wider than a byte, and than two
	if !paired(w) || w.Admitted.width() != 4 {
		t.Fatalf("wide values: paired %v, width %d; want a pair of 4-byte cells", paired(w), w.Admitted.width())
	}
	w.Admitted.Add(0, 1<<40) // the owner's count, on one counter alone
	if paired(w) {
		t.Fatalf("set-up: the owner's add kept the pair")
	}
	w.Raise(2, 2, 2)
	if !paired(w) || w.Admitted.width() != 8 {
		t.Fatalf("after the owner's add: paired %v, width %d; want a pair of 8-byte cells", paired(w), w.Admitted.width())
	}
	want := map[SlotID][2]uint64{0: {1 + 1<<40, 1}, 1: {300, 70_000}, 2: {2, 2}}
	for id, v := range want {
		if w.Admitted.Get(id) != v[0] || w.Attempted.Get(id) != v[1] {
			t.Errorf("slot %d: %d, %d; want %d, %d", id, w.Admitted.Get(id), w.Attempted.Get(id), v[0], v[1])
		}
	}
	if w.Admitted.Value() != 1+1<<40+302 || w.Attempted.Value() != 70_003 || w.Admitted.Len() != 3 || w.Attempted.Len() != 3 {
		t.Errorf("values %d, %d, lens %d, %d", w.Admitted.Value(), w.Attempted.Value(), w.Admitted.Len(), w.Attempted.Len())
	}
	w.Raise(1<<20, 1, 1)
	if w.Admitted.dense() || w.Attempted.dense() || w.Admitted.Get(1<<20) != 1 || w.Attempted.Len() != 4 {
		t.Fatalf("a far slot: dense %v, %v; want both sparse", w.Admitted.dense(), w.Attempted.dense())
	}
}

// TestWindowHintsAndMarks checks the bookkeeping a window keeps in its
// counters' spare bits: a window after one whose counters were
// interleaved pairs its own at that size on the first merge below it,
// after the owner's own count held in place and a few records; one after
// a window whose admitted counter alone was dense makes its admitted
// counter dense at that size; and the dirty and repair marks stay set
// through every change of representation, until cleared.
func TestWindowHintsAndMarks(t *testing.T) {
	c := NewContainer()
	s := c.Rule("r").Ensure("k")
	w5 := s.EnsureWindow(1000, 5)
	for id := range SlotID(1000) {
		w5.Raise(id, 1, 1)
	}
	h := w5.Admitted.ids()
	if !w5.Admitted.paired() || h < 1000 {
		t.Fatalf("set-up: window 5 paired %v over %d SlotIDs, want 1000 or more", w5.Admitted.paired(), h)
	}
	w6 := s.EnsureWindow(1000, 6)
	c.MarkDirty(w6)
	w6.Queue()
	marked := func(what string) {
		t.Helper()
		if !w6.Dirty() || w6.Queue() {
			t.Fatalf("%s: dirty %v, queued %v; want both", what, w6.Dirty(), !w6.Queue())
		}
	}
	if w6.hintPair() != h || w6.hintAdm() != 0 || w6.hintAtt() != 0 {
		t.Fatalf("window 6 hints %d, %d, %d; want a pair of %d", w6.hintPair(), w6.hintAdm(), w6.hintAtt(), h)
	}
	w6.Admitted.Add(7, 300) // the owner's count, in place
	w6.Attempted.Add(7, 300)
	w6.Raise(2000, 1, 1) // beyond the hint: records, the hint kept
	marked("records")
	if w6.Admitted.dense() || w6.hintPair() != h {
		t.Fatalf("after a slot beyond the hint: dense %v, hint %d; want records and the hint", w6.Admitted.dense(), w6.hintPair())
	}
	w6.Raise(500, 1, 1)
	marked("paired")
	if !w6.Admitted.paired() || !w6.Attempted.paired() || w6.Admitted.ids() < h || w6.Admitted.width() != 2 {
		t.Fatalf("after a slot below the hint: paired %v, %v over %d SlotIDs of width %d; want a pair of 2-byte cells over %d or more", w6.Admitted.paired(), w6.Attempted.paired(), w6.Admitted.ids(), w6.Admitted.width(), h)
	}
	w6.Raise(600, 1<<40, 1<<40) // wider cells
	w6.Raise(1<<24, 1, 1)       // too far: records again
	marked("wide, then records")
	if w6.Admitted.dense() || w6.Attempted.dense() {
		t.Fatalf("after a far slot: dense %v, %v; want records", w6.Admitted.dense(), w6.Attempted.dense())
	}
	for id, v := range map[SlotID]uint64{7: 300, 2000: 1, 500: 1, 600: 1 << 40, 1 << 24: 1} {
		if w6.Admitted.Get(id) != v || w6.Attempted.Get(id) != v {
			t.Errorf("slot %d: %d, %d; want %d", id, w6.Admitted.Get(id), w6.Attempted.Get(id), v)
		}
	}
	if ws, _ := c.TakeDirty(); len(ws) != 1 || ws[0] != w6 || w6.Dirty() {
		t.Fatalf("TakeDirty: %d windows, window 6 dirty %v", len(ws), w6.Dirty())
	}
	w6.Unqueue()
	if !w6.Queue() {
		t.Fatalf("Unqueue left the mark")
	}

	// Admitted dense alone (an owner's raises of many slots), attempted
	// sparse: the next window's admitted counter alone goes dense.
	w10 := s.EnsureWindow(1000, 10)
	for id := range SlotID(40) {
		w10.Admitted.Raise(id, 1)
	}
	w11 := s.EnsureWindow(1000, 11)
	if w11.hintAdm() != w10.Admitted.ids() || w11.hintPair() != 0 || w11.hintAtt() != 0 {
		t.Fatalf("window 11 hints %d, %d, %d; want the admitted counter's %d", w11.hintPair(), w11.hintAdm(), w11.hintAtt(), w10.Admitted.ids())
	}
	w11.Raise(3, 1, 0)
	if !w11.Admitted.dense() || w11.Admitted.paired() || w11.Admitted.ids() != w10.Admitted.ids() {
		t.Fatalf("window 11: dense %v, paired %v over %d SlotIDs", w11.Admitted.dense(), w11.Admitted.paired(), w11.Admitted.ids())
	}
}

// TestWindowFarSlots checks that a window whose counters hold a slot no
// array can cover (maxDenseID or beyond) keeps them in records, whatever
// the hints of the window before it and however many slots come.
func TestWindowFarSlots(t *testing.T) {
	s := NewContainer().Rule("r").Ensure("k")
	w5 := s.EnsureWindow(1000, 5)
	for id := range SlotID(100) {
		w5.Raise(id, 1, 1)
	}
	w6 := s.EnsureWindow(1000, 6)
	far := SlotID(maxDenseID + 7)
	w6.Raise(far, 3, 4)
	w6.Admitted.Raise(far+1, 5)
	want := map[SlotID][2]uint64{far: {3, 4}, far + 1: {5, 0}}
	for id := range SlotID(40) {
		w6.Raise(id, 1, 2) // below the hint, then past denseMin slots
		want[id] = [2]uint64{1, 2}
	}
	if w6.Admitted.dense() || w6.Attempted.dense() {
		t.Fatalf("dense %v, %v; want records", w6.Admitted.dense(), w6.Attempted.dense())
	}
	for id, v := range want {
		if w6.Admitted.Get(id) != v[0] || w6.Attempted.Get(id) != v[1] {
			t.Fatalf("slot %d: %d, %d; want %d, %d", id, w6.Admitted.Get(id), w6.Attempted.Get(id), v[0], v[1])
		}
	}
}
