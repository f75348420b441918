package node

import (
	"time"

	"github.com/ratemesh/ratemesh/crdt"
)

// Entries for a window ahead of mesh time (docs/design.md, "Mesh time").
//
// A window that begins more than max_skew after this member's mesh time
// is one its author opened on a clock that differs from ours by more than
// max_skew: a member that served before its first offset estimate (with
// no peers configured, it serves at once), or this member itself, behind.
// Its counts are real admissions all the same, and every member must end
// up counting them, or the members disagree about that window for good:
// the author counts them and its batch is acknowledged, so it never
// publishes them again but in a repair, which comes after a repair
// interval (5 s), when a short window has been collected. Before, such
// entries were dropped. They are held, up to maxFutureHeld per sender and
// maxFutureAhead ahead, and merged as soon as their window comes within
// max_skew; an entry beyond either bound is dropped as before
// (Stats.DroppedFuture), and its batch is not merged whole (a repair of
// it merges).

const (
	// maxFutureHeld bounds the entries held for later per sender: a
	// member that lies about windows ahead costs at most this many.
	maxFutureHeld = 4096
	// maxFutureAhead bounds how far past max_skew a held window may
	// begin: a clock off by more than this loses the counts of its first
	// decisions in the windows it opened.
	maxFutureAhead = time.Minute
)

// futureSlot names a window entry held until its window comes within
// max_skew of mesh time: one slot's values in one window of one key.
type futureSlot struct {
	rule, key        string
	windowMs, window int64
	id               crdt.SlotID
}

// futureEntry is a held entry: its values, and the sender first charged
// for it (for a key it makes, and against maxFutureHeld).
type futureEntry struct {
	futureSlot
	admitted, attempted uint64
	by                  *member
}

// futureHold is the entries held, in arrival order, each slot once (a
// later entry of it raises the values: they are absolute), where each is
// (at), how many each sender holds, and the least start of their windows.
type futureHold struct {
	entries []futureEntry
	at      map[futureSlot]int
	held    map[*member]int
	firstMs int64
}

// holdFuture holds entry e, of a window ahead of max_skew at nowMs, from
// sender by; it reports false when e is beyond the bounds, for dropping.
func (c *Core) holdFuture(nowMs int64, e *crdt.WindowEntry, id crdt.SlotID, by *member) bool {
	f := &c.future
	start := e.Window * e.WindowMs
	if start > nowMs+(c.cfg.MaxSkew+maxFutureAhead).Milliseconds() {
		return false
	}
	fs := futureSlot{rule: e.Rule, key: e.Key, windowMs: e.WindowMs, window: e.Window, id: id}
	if i, ok := f.at[fs]; ok {
		h := &f.entries[i]
		h.admitted, h.attempted = max(h.admitted, e.Admitted), max(h.attempted, e.Attempted)
		return true
	}
	if f.held[by] >= maxFutureHeld {
		return false
	}
	if f.held == nil {
		f.held, f.at = make(map[*member]int), make(map[futureSlot]int)
	}
	if len(f.entries) == 0 || start < f.firstMs {
		f.firstMs = start
	}
	f.held[by]++
	f.at[fs] = len(f.entries)
	f.entries = append(f.entries, futureEntry{futureSlot: fs, admitted: e.Admitted, attempted: e.Attempted, by: by})
	c.stats.FutureHeld++
	return true
}

// mergeFuture merges the held entries whose window has come within
// max_skew of mesh time nowMs, in the order they arrived.
func (c *Core) mergeFuture(nowMs int64) {
	f := &c.future
	skewMs := c.cfg.MaxSkew.Milliseconds()
	if len(f.entries) == 0 || f.firstMs > nowMs+skewMs {
		return
	}
	keep := f.entries[:0]
	f.firstMs = 0
	for _, e := range f.entries {
		start := e.window * e.windowMs
		if start > nowMs+skewMs {
			if len(keep) == 0 || start < f.firstMs {
				f.firstMs = start
			}
			keep = append(keep, e)
			continue
		}
		f.held[e.by]--
		l := c.lookupLimiter(e.rule)
		if l == nil {
			c.stats.DroppedUnknownRule++
			continue
		}
		if e.windowMs != l.Rule().WindowMs() { // a reload changed the rule's window
			c.stats.DroppedWindowLength++
			continue
		}
		w := c.windowFor(l.Set(), e.key, e.windowMs, e.window, e.by)
		if w == nil {
			continue
		}
		if w.Raise(e.id, e.admitted, e.attempted) {
			c.stats.EntriesMerged++
			c.notePersist(w)
		}
	}
	clear(f.entries[len(keep):])
	f.entries = keep
	for m, n := range f.held {
		if n == 0 {
			delete(f.held, m)
		}
	}
	clear(f.at)
	for i := range f.entries {
		f.at[f.entries[i].futureSlot] = i
	}
}
