package crdt

import (
	"fmt"
	"runtime"
	"testing"
	"unsafe"
)

// BenchmarkKeyBytes measures what a key costs a replica (issue 28): keys
// keys of one rule, each touched once in one window by writers members
// (slots 0 to writers−1: the member's own slot and its peers', merged),
// dirty-marked and taken as a node's ticks would. It reports the Go heap
// the container holds after a GC, per key (B/key), and that heap broken
// down by structure, each per key:
//
//   - window-B: the Window objects;
//   - series-B: the Series objects;
//   - counters-B: the counters' own arrays (sparse slots or dense cells);
//   - winslice-B: each series' slice of window pointers;
//   - key-B: the key strings, at their allocation size;
//   - expiry-B: the expiry queue's entries (bucket slices and heap);
//   - map-B: the rule's table by key (keyTable);
//   - rest-B: the heap measured less all of the above (what the walk does
//     not see: the tiny allocator's packing, the dirty lists' slack).
//
// Run it once per count; to compare commits, build the test binary at
// each and run them in turn:
//
//	go test -run='^$' -bench=KeyBytes -benchtime=1x ./crdt/
func BenchmarkKeyBytes(b *testing.B) {
	for _, sc := range []struct{ keys, writers int }{
		{1_000_000, 1}, {1_000_000, 3}, {200_000, 10}, {200_000, 100},
	} {
		b.Run(fmt.Sprintf("keys=%d/writers=%d", sc.keys, sc.writers), func(b *testing.B) {
			for range b.N {
				keyBytes(b, sc.keys, sc.writers)
			}
		})
	}
}

func keyBytes(b *testing.B, keys, writers int) {
	const windowMs, index = 600_000, 2_833_333 // a 10-minute window, as the side-by-side harness uses
	base := liveHeap()
	c := NewContainer()
	r := c.Rule("api")
	for i := range keys {
		w := r.Ensure(fmt.Sprintf("acct:%d", i)).EnsureWindow(windowMs, index)
		w.Attempted.Add(0, 1)
		w.Admitted.Add(0, 1)
		c.MarkDirty(w)
		for id := 1; id < writers; id++ {
			w.Raise(SlotID(id), 1, 1)
		}
		if i%1024 == 1023 {
			c.TakeDirty() // a node's tick publishes what changed
		}
	}
	c.TakeDirty()
	total := liveHeap() - base
	fp := footprintOf(c)
	m := tableBytes(r)
	n := float64(keys)
	b.ReportMetric(float64(total)/n, "B/key")
	b.ReportMetric(float64(fp.windows)/n, "window-B")
	b.ReportMetric(float64(fp.series)/n, "series-B")
	b.ReportMetric(float64(fp.counters)/n, "counters-B")
	b.ReportMetric(float64(fp.winSlices)/n, "winslice-B")
	b.ReportMetric(float64(fp.keys)/n, "key-B")
	b.ReportMetric(float64(fp.expiry)/n, "expiry-B")
	b.ReportMetric(float64(m)/n, "map-B")
	b.ReportMetric(float64(int64(total)-int64(fp.sum())-int64(m))/n, "rest-B")
	if r.Len() != keys {
		b.Fatalf("%d keys held, want %d", r.Len(), keys)
	}
	runtime.KeepAlive(c)
}

// liveHeap returns the heap's live bytes after a full collection.
func liveHeap() uint64 {
	var ms runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// footprint is what a container's objects take, by structure, at their
// allocation sizes.
type footprint struct {
	series, windows, counters, winSlices, keys, expiry int
}

func (f footprint) sum() int {
	return f.series + f.windows + f.counters + f.winSlices + f.keys + f.expiry
}

// footprintOf walks c and sums its objects' allocation sizes.
func footprintOf(c *Container) footprint {
	var f footprint
	counter := func(g *GCounter) { f.counters += allocSize(g.allocated()) }
	for _, r := range c.rules {
		r.Each(func(s *Series) {
			f.series += allocSize(int(unsafe.Sizeof(*s)))
			f.keys += allocSize(len(s.Key))
			if !s.windowsInPlace() {
				f.winSlices += allocSize(cap(s.Windows()) * int(unsafe.Sizeof(s)))
			}
			if s.HasLeases() {
				l := s.Leases()
				f.series += allocSize(int(unsafe.Sizeof(*l)))
				counter(&l.P)
				counter(&l.N)
			}
			for _, w := range s.Windows() {
				f.windows += allocSize(int(unsafe.Sizeof(*w)))
				counter(&w.Admitted)
				counter(&w.Attempted)
			}
		})
	}
	q := &c.expiry
	ptr := int(unsafe.Sizeof(&Series{}))
	for _, b := range q.buckets {
		f.expiry += allocSize(cap(b) * ptr)
	}
	f.expiry += allocSize(cap(q.times)*8) + allocSize((cap(q.fresh)+cap(q.again)+cap(q.later))*ptr)
	return f
}

// tableBytes returns what r's table by key takes: its directory and
// segments.
func tableBytes(r *RuleSet) int {
	t := &r.keys
	n := allocSize(cap(t.dir) * 8)
	for i, s := range t.dir {
		if i > 0 && t.dir[i-1] == s {
			continue
		}
		n += allocSize(int(unsafe.Sizeof(*s))) + allocSize(cap(s.slots)*8) + allocSize(cap(s.tags))
	}
	return n
}

// allocSize returns the bytes an allocation of n bytes takes: its size
// class (the Go runtime's, internal/runtime/gc/sizeclasses.go) or, above
// them, whole pages.
func allocSize(n int) int {
	sizeClasses := [...]int{8, 16, 24, 32, 48, 64, 80, 96, 112, 128, 144, 160, 176, 192, 208, 224, 240, 256, 288, 320, 352, 384, 416, 448, 480, 512, 576, 640, 704, 768, 896, 1024, 1152, 1280, 1408, 1536, 1792, 2048, 2304, 2688, 3072, 3200, 3456, 4096, 4864, 5376, 6144, 6528, 6784, 6912, 8192, 9472, 9728, 10240, 10880, 12288, 13568, 14336, 16384, 18432, 19072, 20480, 21760, 24576, 27264, 28672, 32768}
	if n == 0 {
		return 0
	}
	for _, s := range sizeClasses {
		if n <= s {
			return s
		}
	}
	return (n + 8191) &^ 8191
}
