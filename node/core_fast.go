package node

import "github.com/ratemesh/ratemesh/crdt"

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
