package node

import (
	"time"

	"github.com/ratemesh/ratemesh/crdt"
)

// slotCache remembers, for one batch being merged, the SlotID its sender's
// entries (slot index 0, nearly all of them) resolve to, so the member
// lookup behind it runs once per batch instead of once per entry.
type slotCache struct {
	from   crdt.SlotID
	fromOK bool
}

// slotOf is entrySlot(b, i) through the batch's cache. entrySlot's answer
// for a slot cannot change while one batch merges: nothing in between
// touches the members or re-interns a known slot.
func (c *Core) slotOf(b *crdt.Batch, i uint32, sc *slotCache) crdt.SlotID {
	if i != 0 {
		return c.entrySlot(b, i)
	}
	if !sc.fromOK {
		sc.from, sc.fromOK = c.entrySlot(b, 0), true
	}
	return sc.from
}

// deferredRaise is one window entry of a batch that StepMany resolved and
// whose raise it defers: its window, its SlotID and its values.
type deferredRaise struct {
	w        *crdt.Window
	id       crdt.SlotID
	adm, att uint64
	grew     bool // raiseDeferred: the raise grew a value
}

// deferMax is how many raises StepMany defers at most before it merges
// them: enough misses to overlap, few enough that the cells raiseDeferred
// touches are still in the nearest caches when it raises them. (In the
// scale-1000 scenario 32 ran about 5 % faster than without the touches;
// 128 with them, no faster.)
const deferMax = 32

// StepMany steps n batches in order — the ith is at(i)'s batch, merged at
// now and received at received — exactly as n calls of StepReceived would,
// and returns the index of the
// first that fails with its error (n and nil when none does; the batches
// before it are stepped). The difference is when the window entries merge:
// Step resolves an entry's window and raises its counter at once, where
// StepMany resolves the entries of several batches (up to deferMax) and
// then raises them all in one loop. Nothing in Step reads another member's
// counts, so the result is the same, but a replica that hears a thousand
// members holds its counters in more memory than the CPU caches, each
// raise is a miss, and in one loop of independent raises the misses
// overlap instead of each waiting for the one before. The runtime steps
// the batches queued in its inbox this way, and the simulator a
// receiver's pending deliveries.
func (c *Core) StepMany(n int, at func(i int) (now, received time.Time, b *crdt.Batch)) (int, error) {
	c.deferring = true
	defer func() {
		c.deferring = false
		c.raiseDeferred()
	}()
	for i := range n {
		now, received, b := at(i)
		if err := c.StepReceived(now, received, b); err != nil {
			return i, err
		}
		if len(c.deferred) >= deferMax {
			c.raiseDeferred()
		}
	}
	return n, nil
}

// raiseDeferred merges the entries whose raises StepMany deferred, in the
// order they came. The loop that raises stores whether each grew and
// branches on none of it: whether a merge grows a slot follows no
// pattern, and a mispredicted branch would wait for that raise's cache
// miss before the next began.
func (c *Core) raiseDeferred() {
	// First only read the cells, in a loop that does nothing else, so
	// their misses overlap as many at a time as the CPU allows; the raises
	// then find them in cache.
	var sink byte
	for i := range c.deferred {
		sink += c.deferred[i].w.Touch(c.deferred[i].id)
	}
	c.touched += sink
	for i := range c.deferred {
		h := &c.deferred[i]
		h.grew = h.w.Raise(h.id, h.adm, h.att)
	}
	for i := range c.deferred {
		if h := &c.deferred[i]; h.grew {
			c.stats.EntriesMerged++
			c.notePersist(h.w)
		}
	}
	clear(c.deferred)
	c.deferred = c.deferred[:0]
}
