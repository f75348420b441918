package crdt

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"testing"
	"unsafe"
)

// walkCollect is the reference for Collect: the walk over every key of
// every rule that Collect did before it had a queue.
func walkCollect(c *Container, nowMs int64) int {
	dropped := 0
	for _, r := range c.rules {
		var all []*Series
		r.Each(func(s *Series) { all = append(all, s) })
		for _, s := range all {
			kept := s.Windows()[:0]
			for _, w := range s.Windows() {
				if w.Expired(nowMs) && !w.Dirty() {
					dropped++
					continue
				}
				kept = append(kept, w)
			}
			clear(s.Windows()[len(kept):])
			s.setWindows(kept)
			if len(s.Windows()) == 0 && s.Leases().P.Len() == 0 && s.Leases().N.Len() == 0 && !s.leasesDirty() {
				r.keys.del(s.Key)
			}
		}
	}
	return dropped
}

// dump describes everything Collect may change in c, sorted: each key of
// each rule and its windows with their values and marks.
func dump(c *Container) string {
	var lines []string
	for name, r := range c.rules {
		r.Each(func(s *Series) {
			key := s.Key
			var b strings.Builder
			fmt.Fprintf(&b, "%s/%s leases %d/%d dirty %v:", name, key, s.Leases().P.Value(), s.Leases().N.Value(), s.leasesDirty())
			for _, w := range s.Windows() {
				fmt.Fprintf(&b, " %d/%d=%d,%v", w.WindowMs, w.Index, w.Admitted.Value(), w.Dirty())
			}
			lines = append(lines, b.String())
		})
	}
	slices.Sort(lines)
	return strings.Join(lines, "\n")
}

// expiryOp is one step of TestCollectMatchesWalk, applied alike to the
// container that collects by queue and to the one the reference walks.
type expiryOp func(c *Container)

// randomOp draws a step at mesh time nowMs: a key touched in a current,
// old or future window (a decision, a merge of a late or early peer, a
// restore), a key made without a window, a lease counted or marked, a
// window marked dirty, or the marks taken.
func randomOp(r *rand.Rand, nowMs int64) expiryOp {
	rule := []string{"a", "b"}[r.IntN(2)]
	key := fmt.Sprintf("k%d", r.IntN(40))
	ms := []int64{10, 100, 250}[r.IntN(3)]
	idx := nowMs/ms + int64(r.IntN(7)) - 4 // two windows ahead to four behind
	switch n := r.IntN(20); {
	case n < 10:
		v, slot := uint64(r.IntN(3)), SlotID(r.IntN(3))
		dirty := r.IntN(3) == 0
		return func(c *Container) {
			w := c.Rule(rule).Ensure(key).EnsureWindow(ms, idx)
			w.Admitted.Raise(slot, v)
			if dirty {
				c.MarkDirty(w)
			}
		}
	case n < 12:
		return func(c *Container) { c.Rule(rule).Ensure(key) }
	case n < 13:
		return func(c *Container) { c.Rule(rule).Ensure(key).EnsureLeases().Raise(1, 1, 0) }
	case n < 14:
		return func(c *Container) { c.MarkLeasesDirty(c.Rule(rule).Ensure(key)) }
	case n < 16:
		return func(c *Container) {
			if s := c.Rule(rule).Series(key); s != nil && len(s.Windows()) > 0 {
				c.MarkDirty(s.Windows()[len(s.Windows())-1])
			}
		}
	default:
		return func(c *Container) { c.TakeDirty() }
	}
}

// inDueBucket checks what the queue's stale entries are told apart by:
// each series waiting in a bucket is in the bucket of its due(nil), the
// earliest CollectAt of its windows.
func inDueBucket(t *testing.T, c *Container) {
	t.Helper()
	for _, r := range c.rules {
		r.Each(func(s *Series) {
			if s.where() == inBucket && !slices.Contains(c.expiry.buckets[s.due(nil)], s) {
				t.Fatalf("%s waits in a bucket, not in that of its due time %d", s.Key, s.due(nil))
			}
		})
	}
}

// TestCollectMatchesWalk runs random sequences of inserts, merges, marks
// and collections at advancing (now and then retreating) mesh time on two
// containers: one collects with the queue, in slices of a random budget
// until none is left (or an unbounded Collect finishes them), the other
// with the reference walk. After every
// collection both must hold exactly the same keys and windows and have
// dropped as many windows, and no slice may look at more series than its
// budget.
func TestCollectMatchesWalk(t *testing.T) {
	for seed := uint64(1); seed <= 200; seed++ {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			r := rand.New(rand.NewPCG(seed, 0xe291))
			queued, walked := NewContainer(), NewContainer()
			nowMs := int64(r.IntN(1000))
			for step := range 400 {
				for range r.IntN(12) {
					op := randomOp(r, nowMs)
					op(queued)
					op(walked)
					inDueBucket(t, queued)
				}
				if r.IntN(10) == 0 {
					nowMs -= int64(r.IntN(30)) // mesh time may step back a little
				} else {
					nowMs += int64(r.IntN(120))
				}
				want := walkCollect(walked, nowMs)
				got, calls := 0, 0
				for more := true; more; calls++ {
					if calls > 1000 {
						t.Fatalf("step %d: CollectSome still has more after %d calls", step, calls)
					}
					most := 1 + r.IntN(8)
					looked, skipped := queued.expiry.looked, queued.expiry.skipped
					n, m := queued.CollectSome(nowMs, most)
					looked, skipped = queued.expiry.looked-looked, queued.expiry.skipped-skipped
					if looked > uint64(most) || looked*staleCost+skipped > uint64(most*staleCost+staleCost-1) {
						t.Fatalf("step %d: CollectSome(%d, %d) looked at %d series and skipped %d entries", step, nowMs, most, looked, skipped)
					}
					got, more = got+n, m
					if more && r.IntN(4) == 0 {
						// An unbounded Collect finishes what a bounded one left.
						got, more = got+queued.Collect(nowMs), false
					}
				}
				if got != want {
					t.Fatalf("step %d, now %d: queue dropped %d windows, walk %d", step, nowMs, got, want)
				}
				inDueBucket(t, queued)
				if g, w := dump(queued), dump(walked); g != w {
					t.Fatalf("step %d, now %d: queue holds\n%s\nwalk holds\n%s", step, nowMs, g, w)
				}
			}
		})
	}
}

// TestCollectKeepsMarkedAndLeased checks the keys Collect must keep: a
// key whose expired window is marked dirty (until its mark is taken), one
// whose lease counter is marked, and one whose lease counter holds a
// value (for good), while the unmarked keys beside them go.
func TestCollectKeepsMarkedAndLeased(t *testing.T) {
	c := NewContainer()
	r := c.Rule("r")
	for i := range 100 {
		r.Ensure(fmt.Sprintf("plain%d", i)).EnsureWindow(1000, 0)
	}
	dirty := r.Ensure("dirty")
	c.MarkDirty(dirty.EnsureWindow(1000, 0))
	marked := r.Ensure("marked")
	c.MarkLeasesDirty(marked)
	leased := r.Ensure("leased")
	leased.EnsureLeases().Raise(3, 1, 1)
	leased.EnsureWindow(1000, 0)

	if got := c.Collect(5000); got != 101 {
		t.Fatalf("Collect(5000) = %d, want 101 (every window but the dirty one)", got)
	}
	if got, want := keysOf(r), []string{"dirty", "leased", "marked"}; !slices.Equal(got, want) {
		t.Fatalf("keys after Collect = %v, want %v", got, want)
	}
	// Nothing is due: the next Collect looks only at the two marked keys.
	before := c.expiry.looked
	if got := c.Collect(5000); got != 0 {
		t.Fatalf("second Collect(5000) = %d, want 0", got)
	}
	if looked := c.expiry.looked - before; looked != 2 {
		t.Errorf("second Collect looked at %d series, want 2 (the marked ones)", looked)
	}
	c.TakeDirty()
	if got := c.Collect(5000); got != 1 {
		t.Fatalf("Collect after TakeDirty = %d, want 1", got)
	}
	if got, want := keysOf(r), []string{"leased"}; !slices.Equal(got, want) {
		t.Fatalf("keys after TakeDirty and Collect = %v, want %v", got, want)
	}
	// The leased key, with no window left, is in no queue; a new window
	// queues it again and is collected in its turn.
	leased.EnsureWindow(1000, 10)
	before = c.expiry.looked
	if got := c.Collect(11_999); got != 0 || c.expiry.looked != before {
		t.Fatalf("Collect(11999) = %d looking at %d series, want 0 and 0", got, c.expiry.looked-before)
	}
	if got := c.Collect(12_000); got != 1 || r.Series("leased") != leased {
		t.Fatalf("Collect(12000) = %d, leased kept %v; want 1, true", got, r.Series("leased") == leased)
	}
}

// TestCollectSomeDrains checks that a bounded Collect looks at no more
// series than its budget, that the series due are spread over calls in
// the order they were queued, and that the calls together leave exactly
// what one unbounded Collect would.
func TestCollectSomeDrains(t *testing.T) {
	const keys, most = 10_000, 1000
	c := NewContainer()
	r := c.Rule("r")
	for i := range keys {
		r.Ensure(fmt.Sprintf("k%05d", i)).EnsureWindow(1000, 0)
	}
	// Each new key was queued by its window at once: until they expire
	// there is nothing to look at and nothing stale to skip.
	for _, now := range []int64{1000, 1999} {
		if n, more := c.CollectSome(now, most); n != 0 || more || c.expiry.looked != 0 || c.expiry.skipped != 0 {
			t.Fatalf("CollectSome(%d) = %d, %v after looking at %d series and skipping %d; want 0, false, 0, 0",
				now, n, more, c.expiry.looked, c.expiry.skipped)
		}
	}
	total, calls := 0, 0
	for more := true; more; calls++ {
		before := c.expiry.looked
		var n int
		n, more = c.CollectSome(2000, most)
		if looked := c.expiry.looked - before; looked > most {
			t.Fatalf("call %d looked at %d series, want at most %d", calls, looked, most)
		}
		if more && n != most {
			t.Fatalf("call %d dropped %d windows and has more, want %d", calls, n, most)
		}
		// The earliest queued go first: k00000.. in the first call.
		if first := fmt.Sprintf("k%05d", calls*most); more && r.Series(first) != nil {
			t.Fatalf("after call %d %s is kept", calls, first)
		}
		total += n
	}
	if total != keys || calls != keys/most || r.Len() != 0 {
		t.Fatalf("dropped %d windows in %d calls, %d keys left; want %d, %d, 0", total, calls, r.Len(), keys, keys/most)
	}
}

// TestSeriesLayout pins what Series's comment relies on: the series fits
// the 48-byte size class (its due time derived, its first window and its
// lease counter sharing a word).
func TestSeriesLayout(t *testing.T) {
	if got := unsafe.Sizeof(Series{}); got > 48 {
		t.Errorf("Series is %d bytes, want at most 48", got)
	}
}

func keysOf(r *RuleSet) []string {
	var keys []string
	r.Each(func(s *Series) { keys = append(keys, s.Key) })
	slices.Sort(keys)
	return keys
}

// TestSeriesFirstWindowInPlace checks that a series' first window needs
// no array of its own, and that its windows stay in order as more come
// and go.
func TestSeriesFirstWindowInPlace(t *testing.T) {
	c := NewContainer()
	s := c.Rule("r").Ensure("k")
	w5 := s.EnsureWindow(1000, 5)
	if !s.windowsInPlace() || len(s.Windows()) != 1 {
		t.Fatalf("the first window is in an array of its own")
	}
	w4, w6 := s.EnsureWindow(1000, 4), s.EnsureWindow(1000, 6)
	if !slices.Equal(s.Windows(), []*Window{w4, w5, w6}) || s.windowsInPlace() {
		t.Fatalf("windows %v, want 4, 5, 6 in an array of their own", s.Windows())
	}
	c.Collect(7000) // 4 and 5 are collectable, 6 is not
	if !slices.Equal(s.Windows(), []*Window{w6}) || s.Window(1000, 5) != nil || s.Window(1000, 6) != w6 {
		t.Fatalf("after a collection: windows %v, want 6", s.Windows())
	}
}

// TestSeriesLeasesShareTheWord checks the word a series' first window and
// its lease counter share: a lease counter made after a window moves the
// window to an array of its own, one made first keeps every window out
// of the word, and neither is lost as windows come and go.
func TestSeriesLeasesShareTheWord(t *testing.T) {
	c := NewContainer()
	r := c.Rule("r")
	after, first := r.Ensure("after"), r.Ensure("first")
	w1 := after.EnsureWindow(1000, 1)
	l := after.EnsureLeases()
	l.Raise(3, 2, 1)
	first.EnsureLeases().Raise(4, 5, 0)
	v1 := first.EnsureWindow(1000, 1)
	runtime.GC()
	for _, s := range []*Series{after, first} {
		if s.windowsInPlace() || !s.HasLeases() || len(s.Windows()) != 1 {
			t.Fatalf("%s: windows in place %v, leases %v, %d windows; want one window in an array, and leases", s.Key, s.windowsInPlace(), s.HasLeases(), len(s.Windows()))
		}
	}
	if after.Windows()[0] != w1 || after.Window(1000, 1) != w1 || first.Window(1000, 1) != v1 || after.Leases() != l {
		t.Fatalf("windows or lease counter lost")
	}
	w2 := after.EnsureWindow(1000, 2)
	c.Collect(3000) // window 1 is collectable, 2 is not
	if !slices.Equal(after.Windows(), []*Window{w2}) || first.Window(1000, 1) != nil {
		t.Fatalf("after collecting: windows %v and %v", after.Windows(), first.Windows())
	}
	c.Collect(5000)
	w7 := after.EnsureWindow(1000, 7)
	runtime.GC()
	if after.windowsInPlace() || after.Windows()[0] != w7 || after.Leases() != l || l.SlotValue(3) != 1 || first.Leases().SlotValue(4) != 5 {
		t.Fatalf("after every window went: in place %v, leases %v, %d", after.windowsInPlace(), after.Leases() == l, l.SlotValue(3))
	}
	if r.Series("after") != after || r.Series("first") != first {
		t.Fatalf("a series with leases was collected")
	}
}

// TestSeriesManyWindows: a series' window count is 24 bits and its array's
// capacity follows from the count: past 65,536 windows they stay in order
// as they are made out of order, and collecting most keeps the rest.
func TestSeriesManyWindows(t *testing.T) {
	c := NewContainer()
	s := c.Rule("r").Ensure("k")
	const n = 70_000
	// Ascending but every 1000th, then those between the others.
	for _, skipped := range []bool{false, true} {
		for idx := range int64(n) {
			if (idx%1000 == 500) != skipped {
				continue
			}
			if got := s.EnsureWindow(1, idx); got.Index != idx {
				t.Fatalf("EnsureWindow(1, %d) returned window %d", idx, got.Index)
			}
		}
	}
	ws := s.Windows()
	if len(ws) != n || s.numWindows() != n || c.Rule("r").Windows() != n {
		t.Fatalf("%d windows (count %d, rule %d), want %d", len(ws), s.numWindows(), c.Rule("r").Windows(), n)
	}
	for i, w := range ws {
		if w.Index != int64(i) || w.Series() != s {
			t.Fatalf("window %d has index %d", i, w.Index)
		}
	}
	if s.Window(1, 12345) != ws[12345] || s.Window(1, n) != nil {
		t.Fatal("Window finds the wrong one")
	}
	c.Collect(n - 9) // windows 0 .. n-11 are collectable (CollectAt: index + 2)
	ws = s.Windows()
	if len(ws) != 10 || ws[0].Index != n-10 || ws[9].Index != n-1 {
		t.Fatalf("after collecting: %d windows from %d, want 10 from %d", len(ws), ws[0].Index, n-10)
	}
	c.Collect(n + 2)
	if s.Windows() != nil || s.wins != nil || c.Keys() != 0 {
		t.Fatalf("after collecting every window: %d left, array %v, %d keys", len(s.Windows()), s.wins, c.Keys())
	}
}
