package crdt

import (
	"math"
	"sort"
	"unsafe"
)

// Window holds the counters of one (rule, key, window_ms, window index): the
// admitted credits and the attempted credits (admitted plus rejected, the
// demand signal), one value per slot each.
//
// A window is 80 bytes (TestCounterLayout). What a merge reads —
// WindowMs, Index and both counters — is its first 64 bytes. A window
// written by one member holds its counters in those bytes and nothing
// else. The window's own bookkeeping is in its counters' spare bits: the
// dirty mark (Dirty) is the admitted counter's mark bit, the repair mark
// (Queue) the attempted counter's, and the size hints (hint) the shape of
// a counter that is still sparse.
type Window struct {
	WindowMs  int64    // the window length in milliseconds; part of the identity
	Index     int64    // floor(mesh_ms / WindowMs)
	Admitted  GCounter // admitted credits per slot
	Attempted GCounter // attempted credits per slot (≥ admitted)

	// Acked is owner-side bookkeeping, never replicated: the owner's own
	// admitted value in this window that every live member has acknowledged.
	// The owner's value minus Acked is the usage the others may not have
	// seen yet.
	Acked uint64

	series *Series
}

// Queue marks w as queued in its owner's repair set (package node's
// outbox) and reports whether it was not queued already. Like Acked, the
// mark is the owner's bookkeeping and is never replicated; it costs the
// window no space (it is a spare bit of the attempted counter's shape).
func (w *Window) Queue() bool {
	if w.Attempted.m&markBit != 0 {
		return false
	}
	w.Attempted.m |= markBit
	return true
}

// Unqueue clears the mark Queue set.
func (w *Window) Unqueue() { w.Attempted.m &^= markBit }

// Dirty reports whether w is marked dirty (Container.MarkDirty) and not
// yet taken (TakeDirty).
func (w *Window) Dirty() bool { return w.Admitted.m&markBit != 0 }

// setDirty sets or clears the dirty mark, a spare bit of the admitted
// counter's shape.
func (w *Window) setDirty(on bool) {
	if on {
		w.Admitted.m |= markBit
	} else {
		w.Admitted.m &^= markBit
	}
}

// Sizes (in SlotIDs) of the arrays the window before this one (same
// length) held when this one was created: a key that many writers wrote
// keeps them, so this window's counters start as arrays that size,
// interleaved if the window before had them interleaved. They are kept
// in the shape of a sparse counter (GCounter.hint) and lost when it goes
// dense, as they are then spent.

// hintPair returns the size the counters are to be interleaved at, or 0.
func (w *Window) hintPair() int {
	if a := &w.Admitted; a.pairHint() {
		return a.hint()
	}
	return 0
}

// hintAdm returns the size the admitted counter alone is to go dense at,
// or 0.
func (w *Window) hintAdm() int {
	if a := &w.Admitted; !a.pairHint() {
		return a.hint()
	}
	return 0
}

// hintAtt returns the size the attempted counter alone is to go dense at,
// or 0.
func (w *Window) hintAtt() int { return w.Attempted.hint() }

// Raise merges one slot's admitted and attempted values, exactly as
// Admitted.Raise(id, admitted) and Attempted.Raise(id, attempted) would,
// and reports whether either grew. When both counters have many writers,
// they keep their values in one interleaved array, so a merge touches one
// place in memory instead of two.
func (w *Window) Raise(id SlotID, admitted, attempted uint64) bool {
	a, t := &w.Admitted, &w.Attempted
	const pairOf1 = pairBit | 1
	if a.m&(pairBit|widthBits) == pairOf1 && t.m&(pairBit|widthBits) == pairOf1 {
		// Interleaved one-byte cells: SlotID i's pair is cell 2i of each
		// (t's cells start one byte on).
		if c := 2 * int(id); c < a.cells() && c < t.cells() && admitted <= math.MaxUint8 && attempted <= math.MaxUint8 {
			ga := a.raise8((*uint8)(unsafe.Add(a.p, c)), admitted)
			gt := t.raise8((*uint8)(unsafe.Add(t.p, c)), attempted)
			return ga || gt
		}
	} else if !a.dense() && !t.dense() && (admitted|attempted) != 0 {
		if w.shouldPair(id, admitted, attempted) {
			pair(a, t, w.hintPair(), 1)
			return w.Raise(id, admitted, attempted)
		}
	}
	if (a.paired() || t.paired()) && w.repair(id, admitted, attempted) {
		return w.Raise(id, admitted, attempted)
	}
	if h := w.hintAdm(); !a.dense() && admitted != 0 && int(id) < h && a.maxID() < maxDenseID {
		a.toDense(h)
	}
	if h := w.hintAtt(); !t.dense() && attempted != 0 && int(id) < h && t.maxID() < maxDenseID {
		t.toDense(h)
	}
	// Raising to 0 never changes a counter: most slots of a limited key
	// attempt and are not admitted, so skip the admitted search then.
	ga := admitted != 0 && a.Raise(id, admitted)
	gt := attempted != 0 && t.Raise(id, attempted)
	return ga || gt
}

// Touch reads the memory Raise(id, ...) reads first, the slot's dense
// cell, and changes nothing. It returns the cell's low byte (that of
// Admitted.Get(id)) when the admitted counter is dense and covers id, else
// 0. A caller about to raise many windows' slots touches them all first in
// a loop that does nothing else, so their cache misses overlap many at a
// time rather than the few a loop of raises overlaps (node.Core.StepMany).
func (w *Window) Touch(id SlotID) byte {
	a := &w.Admitted
	if c := int(id) * a.step(); a.dense() && c < a.cells() {
		return *(*byte)(unsafe.Add(a.p, c*int(a.width())))
	}
	return 0
}

// shouldPair reports whether both (sparse) counters should move into one
// interleaved array before raising slot id: the window before had them
// so, or this raise would make either dense on its own. Pairing them when
// the first goes dense costs the other's array early, but a key that many
// members attempt is one that many are admitted to, and the pair is one
// cache miss per merge instead of two. Neither may hold a slot an array
// cannot cover (maxDenseID).
func (w *Window) shouldPair(id SlotID, admitted, attempted uint64) bool {
	a, t := &w.Admitted, &w.Attempted
	if max(int(id), a.maxID(), t.maxID()) >= maxDenseID {
		return false
	}
	return int(id) < w.hintPair() || a.wouldDense(id, admitted) || t.wouldDense(id, attempted)
}

// repair keeps the window's counters in one interleaved array when a raise
// does not fit the array they share — the slot lies beyond it, or a value
// is wider than its cells — or when one of them left it (GCounter.Raise
// or Add, which know nothing of the other, grew it alone): it moves both
// into a new interleaved array that fits, and reports whether it did.
// Growing each alone would leave two arrays, a cache miss each on every
// merge, and the bytes of two allocations (at three writers, two 3-byte
// arrays of 8 bytes each instead of one). A slot too far for an array
// (raiseDense) is left to the counters' own raises, which go sparse.
func (w *Window) repair(id SlotID, admitted, attempted uint64) bool {
	a, t := &w.Admitted, &w.Attempted
	if !a.dense() || !t.dense() {
		return false
	}
	fits := func(g *GCounter, v uint64) bool {
		return v == 0 || (int(id)*g.step() < g.cells() && v <= cellMax(g.width()))
	}
	if a.paired() && t.paired() && fits(a, admitted) && fits(t, attempted) {
		return false
	}
	size := max(a.ids(), t.ids())
	if int(id) >= size {
		if tooFar(id, max(a.n, t.n)) {
			return false
		}
		size = arraySize(int(id) + 1)
	}
	w8 := max(widthFor(admitted), widthFor(attempted))
	if !a.paired() || !t.paired() {
		pair(a, t, size, w8)
		return true
	}
	// Still one array: copy its cells, a's and t's alike, into the new
	// one (a's array starts at the first cell, t's at the second).
	ow := a.width()
	w8 = max(w8, ow)
	d := make([]byte, 2*size*int(w8))
	if w8 == ow {
		copy(d, a.array())
	} else {
		for c := range a.cells() {
			store(d, w8, c, loadAt(a.p, ow, c))
		}
	}
	a.setDense(d, w8, true, int(a.n))
	t.setDense(d[w8:], w8, true, int(t.n))
	return true
}

// Series returns the key the window belongs to.
func (w *Window) Series() *Series { return w.series }

// Start returns the window's first millisecond.
func (w *Window) Start() int64 { return w.Index * w.WindowMs }

// End returns the first millisecond after the window.
func (w *Window) End() int64 { return (w.Index + 1) * w.WindowMs }

// Expired reports whether the window and the next one have both ended at
// nowMs, which is when the window stops mattering to any algorithm (a
// sliding window reads the previous window) and may be dropped.
func (w *Window) Expired(nowMs int64) bool { return nowMs >= w.CollectAt() }

// CollectAt returns the first millisecond at which the window is Expired:
// the end of the next window.
func (w *Window) CollectAt() int64 { return (w.Index + 2) * w.WindowMs }

// Series is everything held for one (rule, key): its windows, ascending by
// (WindowMs, Index), and for concurrency rules its lease counter. A series
// is used through its pointer, never copied: its windows' array may be in
// it.
//
// A series is 48 bytes (TestSeriesLayout): when Collect is due to look at
// it again follows from its windows (due); its first window's pointer and
// its lease counter share one word (one); and its windows are an array
// pointer and a length, the array's capacity following from the length
// (windowsCap).
type Series struct {
	Key string

	rule *RuleSet
	// one is, for a series with no lease counter (most), its first
	// window's pointer, as the windows' array while it has room: a key
	// touched in one window needs no array of its own, and a second
	// window moves the windows to an array of their own. For a series
	// with a lease counter (hasLeases), it is the *LeaseCounts, and the
	// windows always have an array of their own. See windowsInPlace,
	// Leases.
	one unsafe.Pointer
	// wins is the windows' array (of *Window), numWindows of them: &one,
	// an array of its own of at least windowsCap(numWindows), or nil when
	// there is none.
	wins unsafe.Pointer
	// charge is who made the series (EnsureCharged): 0, this member
	// itself (a decision, the disk), or a peer's charge (NewCharge).
	charge uint32
	// nwin's low 16 bits and nwinHi its high 8: how many windows.
	nwin   uint16
	nwinHi uint8
	// flags holds where the series waits for Collect (whereBits; see
	// expiry.go), hasLeasesFlag and leasesDirtyFlag.
	flags uint8
}

// MaxSeriesWindows is the most windows one series holds (24 bits of
// count). A key's windows of its rule's length are those from two windows
// back to max_skew ahead and those Collect has not yet reached; a merge of
// one past it is refused (CanEnsure).
const MaxSeriesWindows = 1<<24 - 1

const (
	whereBits     uint8 = 1<<3 - 1 // notQueued, inBucket, ...
	hasLeasesFlag uint8 = 1 << (iota + 2)
	leasesDirtyFlag
)

func (s *Series) hasLeases() bool   { return s.flags&hasLeasesFlag != 0 }
func (s *Series) leasesDirty() bool { return s.flags&leasesDirtyFlag != 0 }
func (s *Series) where() uint8      { return s.flags & whereBits }
func (s *Series) setWhere(w uint8)  { s.flags = s.flags&^whereBits | w }

func (s *Series) setLeasesDirty(on bool) {
	if on {
		s.flags |= leasesDirtyFlag
	} else {
		s.flags &^= leasesDirtyFlag
	}
}

// numWindows returns how many windows the series holds.
func (s *Series) numWindows() int { return int(s.nwin) | int(s.nwinHi)<<16 }

// setNumWindows sets how many windows the series holds.
func (s *Series) setNumWindows(n int) { s.nwin, s.nwinHi = uint16(n), uint8(n>>16) }

// Rule returns the rule set the series belongs to.
func (s *Series) Rule() *RuleSet { return s.rule }

// Windows returns the series' windows, ascending by (WindowMs, Index). The
// slice is the series' own: read it, never append to it or write it, and
// read it again after a window is made or collected.
func (s *Series) Windows() []*Window {
	return unsafe.Slice((**Window)(s.wins), s.numWindows())
}

// windowsFull reports whether the series holds MaxSeriesWindows windows:
// EnsureWindow must not be asked for a new one.
func (s *Series) windowsFull() bool { return s.numWindows() == MaxSeriesWindows }

// CanEnsure reports whether EnsureWindow(windowMs, index) may be called:
// the window is held, or the series has room for it.
func (s *Series) CanEnsure(windowMs, index int64) bool {
	return !s.windowsFull() || s.Window(windowMs, index) != nil
}

// windowsCap is the capacity of an array of its own holding n windows:
// the power of two at least n, and at least 2. An array made for n
// windows has it, and keeps at least the capacity of fewer.
func windowsCap(n int) int {
	c := 2
	for c < n {
		c *= 2
	}
	return c
}

// windowsInPlace reports whether the windows' array is s.one.
func (s *Series) windowsInPlace() bool { return s.wins == unsafe.Pointer(&s.one) }

// setWindows makes ws, a prefix of the series' own array, its windows.
func (s *Series) setWindows(ws []*Window) {
	s.setNumWindows(len(ws))
	if len(ws) == 0 {
		if s.windowsInPlace() {
			s.one = nil
		}
		s.wins = nil
	}
}

// ownWindows moves the windows to an array of their own with room for n.
func (s *Series) ownWindows(n int) {
	a := make([]*Window, windowsCap(n))
	copy(a, s.Windows())
	if s.windowsInPlace() {
		s.one = nil
	}
	s.wins = unsafe.Pointer(unsafe.SliceData(a))
}

// LeaseCounts is a key's lease counter: the leases acquired (P) and
// released (N) in each slot, and the owner's acknowledged net.
type LeaseCounts struct {
	PNCounter
	// Acked is owner-side bookkeeping like Window.Acked: the owner's net
	// acquired leases every live member has acknowledged.
	Acked int64
}

// noLeases is the lease counter of a series that has none: empty, and
// never written (Leases hands it out for reading only).
var noLeases LeaseCounts

// Leases returns the series' lease counter to read: an empty one, shared,
// when the series has none (a windowed rule's never has). Write through
// EnsureLeases.
func (s *Series) Leases() *LeaseCounts {
	if !s.hasLeases() {
		return &noLeases
	}
	return (*LeaseCounts)(s.one)
}

// EnsureLeases returns the series' lease counter, making it if needed.
// Only a concurrency rule's keys need one: the others keep none, and the
// 56 bytes a counter takes.
func (s *Series) EnsureLeases() *LeaseCounts {
	if !s.hasLeases() {
		if s.windowsInPlace() {
			// The word goes to the lease counter: the window to an
			// array of its own.
			s.ownWindows(s.numWindows())
		}
		s.one = unsafe.Pointer(new(LeaseCounts))
		s.flags |= hasLeasesFlag
	}
	return (*LeaseCounts)(s.one)
}

// HasLeases reports whether the series has a lease counter.
func (s *Series) HasLeases() bool { return s.hasLeases() }

// due returns the earliest CollectAt of the series' windows but skip, or
// the largest int64 when there is none. A series waiting in a bucket of
// the expiry queue (inBucket) waits in the bucket of its due(nil): every
// push there is at that time, and nothing but a push or Collect changes
// the windows' earliest CollectAt (queueWindow).
func (s *Series) due(skip *Window) int64 {
	due := int64(math.MaxInt64)
	ws := s.Windows()
	for i := 0; i < len(ws); {
		w := ws[i]
		if w == skip {
			i++
			continue
		}
		// The windows of one length ascend, and so do their CollectAt:
		// the first of each length (but skip) is its earliest.
		due = min(due, w.CollectAt())
		i += sort.Search(len(ws)-i, func(j int) bool { return ws[i+j].WindowMs > w.WindowMs })
	}
	return due
}

// Window returns the window (windowMs, index), or nil.
func (s *Series) Window(windowMs, index int64) *Window {
	// Newest first: the windows ascend, and the current window is the
	// last. A key holds a few; past that, search.
	ws := s.Windows()
	if len(ws) > 8 {
		i := sort.Search(len(ws), func(i int) bool {
			w := ws[i]
			return w.WindowMs > windowMs || w.WindowMs == windowMs && w.Index >= index
		})
		if i < len(ws) && ws[i].WindowMs == windowMs && ws[i].Index == index {
			return ws[i]
		}
		return nil
	}
	for i := len(ws) - 1; i >= 0; i-- {
		if w := ws[i]; w.WindowMs == windowMs && w.Index == index {
			return w
		}
	}
	return nil
}

// EnsureWindow returns the window (windowMs, index), creating it if needed.
// A series holding MaxSeriesWindows makes no more: it panics, so a caller
// that merges what others send asks CanEnsure first.
func (s *Series) EnsureWindow(windowMs, index int64) *Window {
	if w := s.Window(windowMs, index); w != nil {
		return w
	}
	if s.windowsFull() {
		panic("crdt: a series holding MaxSeriesWindows windows asked for another")
	}
	w := &Window{WindowMs: windowMs, Index: index, series: s}
	ws := s.Windows()
	i := len(ws)
	for i > 0 {
		p := ws[i-1]
		if p.WindowMs < windowMs || (p.WindowMs == windowMs && p.Index < index) {
			if p.WindowMs == windowMs {
				w.hint(p)
			}
			break
		}
		i--
	}
	n := len(ws)
	switch {
	case n == 0 && !s.hasLeases():
		s.wins = unsafe.Pointer(&s.one)
	case n == 0 || s.windowsInPlace() || n+1 > windowsCap(n):
		s.ownWindows(n + 1)
	}
	ws = unsafe.Slice((**Window)(s.wins), n+1)
	copy(ws[i+1:], ws[i:n])
	ws[i] = w
	s.setNumWindows(n + 1)
	s.rule.windows++
	s.rule.c.queueWindow(s, w)
	return w
}

// hint sizes w's counters after p's, the window before it.
func (w *Window) hint(p *Window) {
	if p.Admitted.paired() && p.Attempted.paired() {
		w.Admitted.setHint(p.Attempted.ids(), true)
		return
	}
	if p.Admitted.dense() {
		w.Admitted.setHint(p.Admitted.ids(), false)
	}
	if p.Attempted.dense() {
		w.Attempted.setHint(p.Attempted.ids(), false)
	}
}

// RuleSet holds the series of one rule, by key. A key's string is held
// once, in its series (keyTable).
type RuleSet struct {
	Name    string
	keys    keyTable
	windows int // windows held over every series
	c       *Container
}

// Series returns the series of key, or nil.
func (r *RuleSet) Series(key string) *Series { return r.keys.get(key) }

// Ensure returns the series of key, creating it if needed.
func (r *RuleSet) Ensure(key string) *Series {
	if s := r.keys.get(key); s != nil {
		return s
	}
	return r.make(key, 0)
}

// EnsureCharged is Ensure for a key a peer's entry names: a key it makes
// is charged to charge (a peer's, from NewCharge) as long as it is held.
// It makes none, and returns nil, once the keys held on charge's account
// reach budget: a peer cannot make this member hold more keys than its
// budget, whatever it invents. A key already held is returned whoever
// asks.
func (r *RuleSet) EnsureCharged(key string, charge uint32, budget int) *Series {
	if s := r.keys.get(key); s != nil {
		return s
	}
	if r.c.charged[charge] >= budget {
		return nil
	}
	return r.make(key, charge)
}

// make makes the series of key, which the rule does not hold, charged to
// charge.
func (r *RuleSet) make(key string, charge uint32) *Series {
	s := &Series{Key: key, rule: r, charge: charge}
	r.c.charged[charge]++
	r.keys.put(s)
	// A new series may get no window (a lease counter never raised), and
	// Collect deletes such a one: it looks at every new series that has
	// no window by then.
	r.c.expiry.pushNew(s)
	r.c.made++
	r.c.keys++
	return s
}

// Len returns how many keys the rule holds.
func (r *RuleSet) Len() int { return r.keys.n }

// Windows returns how many windows the rule holds over all its keys.
func (r *RuleSet) Windows() int { return r.windows }

// Full reports whether a new key would be one too many: the rule holds
// max keys or more, or the container holds its cap (SetMaxKeys) or more
// over every rule. Ensure never refuses a key — merging a peer's counts
// must not — so a decision asks Full before it makes one.
func (r *RuleSet) Full(max int) bool {
	return r.keys.n >= max || (r.c.maxKeys > 0 && r.c.keys >= r.c.maxKeys)
}

// Each calls f for every series; the order is unspecified (it differs from
// run to run, as a map's does), so callers that need determinism sort. f
// must not add keys to the rule or drop any.
func (r *RuleSet) Each(f func(*Series)) { r.keys.each(f) }

// Container holds every rule's windowed counters and lease counters, and the
// set of windows and lease counters whose own slot changed since the last
// TakeDirty. The zero value is not usable; call NewContainer.
type Container struct {
	rules       map[string]*RuleSet
	dirtyWin    []*Window
	dirtyLeases []*Series
	expiry      expiryQueue
	made        uint64 // series made, ever
	keys        int    // series held over every rule set
	maxKeys     int    // RuleSet.Full's cap on keys; 0: none
	// charged counts the series held on each charge's account (0: this
	// member's own and restored keys; see EnsureCharged).
	charged []int
}

// NewContainer returns an empty container.
func NewContainer() *Container {
	return &Container{rules: make(map[string]*RuleSet), charged: []int{0}}
}

// NewCharge returns a new account to charge the keys a peer makes to
// (RuleSet.EnsureCharged), holding none.
func (c *Container) NewCharge() uint32 {
	c.charged = append(c.charged, 0)
	return uint32(len(c.charged) - 1)
}

// Charged returns how many keys are held on charge's account.
func (c *Container) Charged(charge uint32) int { return c.charged[charge] }

// Rule returns the rule set called name, creating it if needed.
func (c *Container) Rule(name string) *RuleSet {
	if r := c.rules[name]; r != nil {
		return r
	}
	r := &RuleSet{Name: name, keys: newKeyTable(), c: c}
	c.rules[name] = r
	return r
}

// Keys returns how many keys (series) the container holds over every
// rule set.
func (c *Container) Keys() int { return c.keys }

// SetMaxKeys caps the keys RuleSet.Full allows over every rule set; 0
// (the default) sets no cap.
func (c *Container) SetMaxKeys(n int) { c.maxKeys = max(n, 0) }

// MaxKeys returns the cap SetMaxKeys set; 0: none.
func (c *Container) MaxKeys() int { return c.maxKeys }

// Made returns how many series the container has made (RuleSet.Ensure of
// a key it did not hold), ever.
func (c *Container) Made() uint64 { return c.made }

// Lookup returns the rule set called name, or nil.
func (c *Container) Lookup(name string) *RuleSet { return c.rules[name] }

// Rules returns the names of the rule sets held, unsorted.
func (c *Container) Rules() []string {
	names := make([]string, 0, len(c.rules))
	for n := range c.rules {
		names = append(names, n)
	}
	return names
}

// MarkDirty records that the owner's slot in w changed and must be
// published. Marking twice before TakeDirty records it once.
func (c *Container) MarkDirty(w *Window) {
	if !w.Dirty() {
		w.setDirty(true)
		c.dirtyWin = append(c.dirtyWin, w)
	}
}

// MarkLeasesDirty records that the owner's slot in s.Leases changed.
func (c *Container) MarkLeasesDirty(s *Series) {
	if !s.leasesDirty() {
		s.setLeasesDirty(true)
		c.dirtyLeases = append(c.dirtyLeases, s)
	}
}

// TakeDirty returns the windows and lease counters marked dirty since the
// last call, in the order they were first marked, and clears the marks.
func (c *Container) TakeDirty() ([]*Window, []*Series) {
	ws, ls := c.dirtyWin, c.dirtyLeases
	for _, w := range ws {
		w.setDirty(false)
	}
	for _, s := range ls {
		s.setLeasesDirty(false)
	}
	c.dirtyWin, c.dirtyLeases = nil, nil
	return ws, ls
}

// DirtyWindows returns the windows marked dirty since the last TakeDirty,
// in the order they were first marked, without clearing the marks. The
// slice is the container's own: read it before the next MarkDirty or
// TakeDirty, and do not modify it.
func (c *Container) DirtyWindows() []*Window { return c.dirtyWin }

// Dirty reports how many windows and lease counters are marked dirty.
func (c *Container) Dirty() int { return len(c.dirtyWin) + len(c.dirtyLeases) }
