package crdt

import (
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

// TestWindowLayout pins the layout Window's comment relies on: the fields
// a merge touches in two cache lines of an object that starts on one.
func TestWindowLayout(t *testing.T) {
	var w Window
	if got := unsafe.Sizeof(w); got != 192 {
		t.Errorf("Window is %d bytes, want 192 (a size class aligned to cache lines)", got)
	}
	hot := unsafe.Offsetof(w.Admitted.vals) - unsafe.Offsetof(w.Admitted)
	for _, f := range []struct {
		name string
		lo   uintptr
	}{{"WindowMs", unsafe.Offsetof(w.WindowMs)}, {"Admitted", unsafe.Offsetof(w.Admitted)}, {"Attempted", unsafe.Offsetof(w.Attempted)}} {
		hi := f.lo + hot
		if f.name == "WindowMs" {
			hi = unsafe.Offsetof(w.Index) + 8
		}
		if f.lo/64 != (hi-1)/64 {
			t.Errorf("%s spans bytes %d to %d, across a cache line", f.name, f.lo, hi)
		}
	}
	if unsafe.Offsetof(w.WindowMs)/64 != unsafe.Offsetof(w.Admitted)/64 {
		t.Errorf("WindowMs and Admitted's dense fields are in different cache lines")
	}
}

// TestWindowTouch checks that Touch reads the slot's own admitted cell —
// in a paired window of one-byte cells, one with wider cells and one whose
// admitted counter alone is dense — and 0 where the counter is sparse or
// does not cover the slot.
func TestWindowTouch(t *testing.T) {
	val := func(id SlotID) uint64 { return uint64(id)%200 + 1 }
	paired, wide, alone, sparse := &Window{}, &Window{}, &Window{}, &Window{}
	pair(&paired.Admitted, &paired.Attempted, 1000)
	for id := range SlotID(1000) {
		paired.Raise(id, val(id), val(id)+7)
		wide.Raise(id, val(id)+1000*uint64(id%3), val(id)+5000)
		alone.Admitted.Raise(id, val(id))
	}
	sparse.Raise(3, 9, 9)
	if paired.Admitted.step != 2 || paired.Admitted.w != 1 || wide.Admitted.w < 2 || alone.Admitted.step != 1 || sparse.Admitted.dense() {
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
	if got := sparse.Touch(3); got != 0 {
		t.Errorf("sparse: Touch(3) = %d, want 0", got)
	}
}
