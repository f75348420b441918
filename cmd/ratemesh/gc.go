package main

import (
	"runtime"
	"runtime/debug"
	rtmetrics "runtime/metrics"
	"sync/atomic"
)

// gcHeadroom is how much serve lets the heap grow between two garbage
// collections at least. Go's default (GOGC=100) lets it grow by the live
// heap, and a node that holds few keys has a live heap of a few MB: under
// a flood of ShouldRateLimit calls (5–6 KB of garbage each) it collected
// twelve times a second. Every collection stops the world twice, and on a
// host whose cores other processes keep busy a stop waits until the OS
// runs every thread of the process: stops of 100–500 ms were measured
// (GODEBUG=gctrace=1), and each one made every call in flight miss
// Envoy's 20 ms deadline. 64 MiB of headroom makes that one collection
// every two seconds or so at 6,000 calls a second, for at most 64 MiB more
// memory.
const gcHeadroom = 64 << 20

// gcLeastPercent is the least GOGC serve sets: past gcHeadroom × 4 of live
// heap, the heap may grow by a quarter of it between collections rather
// than Go's default of all of it. A node's live heap is, past a few MB,
// the keys it holds, and they stay: at GOGC=100 a million keys of about
// 200 B each made RSS grow by about 420 B a key (the heap grew to twice
// the live keys before each collection, and the runtime keeps what it
// reached). The cost is collections at most four times as often as Go's
// default — never more often than every gcHeadroom of garbage, the rate
// the small heap above collects at.
const gcLeastPercent = 25

// gcTuner sets the garbage collector's percentage (GOGC) after every
// collection so that the heap may grow by headroom before the next, or
// by a quarter of the live heap when that is more (see gcPercent). It is
// on in serve unless the environment sets GOGC or GOMEMLIMIT (the
// operator's choice stands).
type gcTuner struct {
	headroom uint64
	stopped  atomic.Bool
	sample   []rtmetrics.Sample
	last     int // the percentage last set
}

// gcSentinel is garbage from its allocation on: its cleanup runs once a
// collection has found it unreachable, that is after every collection.
// (32 bytes: not a tiny allocation, which may share a block and be
// freed late.)
type gcSentinel struct{ _ [32]byte }

// startGCTuner starts a gcTuner with headroom unless the environment
// (getenv) sets GOGC or GOMEMLIMIT; stop ends it, leaving the percentage
// it last set. ok reports whether it started.
func startGCTuner(headroom uint64, getenv func(string) string) (stop func(), ok bool) {
	if getenv("GOGC") != "" || getenv("GOMEMLIMIT") != "" {
		return func() {}, false
	}
	t := &gcTuner{headroom: headroom, sample: []rtmetrics.Sample{{Name: "/gc/heap/live:bytes"}}, last: 100}
	t.tune()
	t.arm()
	return func() { t.stopped.Store(true) }, true
}

// arm registers the cleanup that tunes after the next collection.
func (t *gcTuner) arm() {
	runtime.AddCleanup(new(gcSentinel), func(t *gcTuner) {
		if t.stopped.Load() {
			return
		}
		t.tune()
		t.arm()
	}, t)
}

// tune sets the percentage from the live heap of the last collection.
func (t *gcTuner) tune() {
	rtmetrics.Read(t.sample)
	if p := gcPercent(t.headroom, t.sample[0].Value.Uint64()); p != t.last {
		debug.SetGCPercent(p)
		t.last = p
	}
}

// gcPercent is the GOGC that lets a heap of live bytes grow by headroom
// or by gcLeastPercent of live, whichever is more. Above Go's default,
// headroom × 100 / live is rounded up to a multiple of 100 (a live heap
// that wavers does not reset it every collection) and capped at headroom
// × 100 / 4 MiB: the runtime's least heap goal is 4 MiB × GOGC / 100, so a
// larger GOGC would let a small heap grow past live + headroom (at start,
// before the first collection has measured the live heap, the goal is
// headroom). Below it, the percentage is rounded up to a multiple of 5.
func gcPercent(headroom, live uint64) int {
	const runtimeMinHeap = 4 << 20
	top := headroom * 100 / runtimeMinHeap
	if live == 0 {
		return int(max((top+99)/100*100, 100))
	}
	p := min((headroom*100+live-1)/live, top)
	if p >= 100 {
		return int((p + 99) / 100 * 100)
	}
	return int(max((p+4)/5*5, gcLeastPercent))
}
