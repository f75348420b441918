package node

import (
	"time"
	"unsafe"

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
	var ahead [stepAhead]aheadBatch
	for base := 0; base < n; base += stepAhead {
		k := min(stepAhead, n-base)
		for j := range k {
			a := &ahead[j]
			a.now, a.received, a.b = at(base + j)
		}
		c.touchSenders(ahead[:k])
		for j := range k {
			a := &ahead[j]
			if err := c.StepReceived(a.now, a.received, a.b); err != nil {
				return base + j, err
			}
			if len(c.deferred) >= deferMax {
				c.raiseDeferred()
			}
		}
	}
	return n, nil
}

// stepAhead is how many batches StepMany looks up the senders of before
// it steps them (touchSenders).
const stepAhead = 16

// aheadBatch is one of the batches StepMany is about to step.
type aheadBatch struct {
	now, received time.Time
	b             *crdt.Batch
}

// touchSenders looks up the members that sent the batches, in a loop that
// does nothing else, and reads every cache line of each member's state, so
// that their misses overlap instead of each stepped batch waiting for its
// own: a replica that hears a thousand members holds their state (over 300
// bytes each) in more memory than the caches, and stepping a batch reads
// most of its sender's.
func (c *Core) touchSenders(batch []aheadBatch) {
	var sink byte
	for i := range batch {
		m := c.members.byPeer[batch[i].b.From.Peer]
		if m == nil {
			continue
		}
		p := unsafe.Pointer(m)
		for off := uintptr(0); off < unsafe.Sizeof(*m); off += 64 {
			sink += *(*byte)(unsafe.Add(p, off))
		}
		sink += *(*byte)(unsafe.Add(p, unsafe.Sizeof(*m)-1)) // the last line, if the struct is not aligned to one
	}
	c.touched += sink
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
