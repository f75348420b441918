package crdt

import "math"

type slotVal struct {
	id SlotID
	v  uint64
}

// GCounter is a grow-only counter: one non-decreasing value per slot, merged
// by per-slot max. Its value is the sum over slots, kept up to date
// incrementally so reading it is O(1). Slots are held in a slice sorted by
// SlotID, which keeps a counter with few writers small and a counter with a
// thousand writers searchable in ten steps.
//
// The zero value is an empty counter, ready to use.
type GCounter struct {
	vals  []slotVal
	total uint64
}

func (g *GCounter) find(id SlotID) (int, bool) {
	vals := g.vals
	// Linear for the common few-writer case, binary beyond.
	if len(vals) <= 8 {
		for i := range vals {
			if vals[i].id >= id {
				return i, vals[i].id == id
			}
		}
		return len(vals), false
	}
	// sort.Search's closure is not inlined, and at a thousand writers the
	// search is the simulator's hottest loop: search by hand.
	lo, hi := 0, len(vals)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if vals[m].id < id {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return lo, lo < len(vals) && vals[lo].id == id
}

// Get returns the value of one slot (0 if it never wrote).
func (g *GCounter) Get(id SlotID) uint64 {
	if i, ok := g.find(id); ok {
		return g.vals[i].v
	}
	return 0
}

// Raise merges one slot's value: the slot becomes max(current, v). It
// reports whether the value grew.
func (g *GCounter) Raise(id SlotID, v uint64) bool {
	i, ok := g.find(id)
	if ok {
		old := g.vals[i].v
		if v <= old {
			return false
		}
		g.vals[i].v = v
		g.total = satAdd(g.total, v-old)
		return true
	}
	if v == 0 {
		return false
	}
	g.vals = append(g.vals, slotVal{})
	copy(g.vals[i+1:], g.vals[i:])
	g.vals[i] = slotVal{id: id, v: v}
	g.total = satAdd(g.total, v)
	return true
}

// Add increments one slot by d (saturating). Only the slot's owner calls it.
func (g *GCounter) Add(id SlotID, d uint64) {
	if d == 0 {
		return
	}
	g.Raise(id, satAdd(g.Get(id), d))
}

// Value returns the sum over all slots.
func (g *GCounter) Value() uint64 { return g.total }

// Len returns how many slots have a non-zero value.
func (g *GCounter) Len() int { return len(g.vals) }

// Merge raises every slot of g to at least its value in o.
func (g *GCounter) Merge(o *GCounter) {
	for _, sv := range o.vals {
		g.Raise(sv.id, sv.v)
	}
}

// Each calls f for every slot with a non-zero value, in SlotID order.
func (g *GCounter) Each(f func(id SlotID, v uint64)) {
	for _, sv := range g.vals {
		f(sv.id, sv.v)
	}
}

// PNCounter counts up and down (acquired and released leases) as two
// G-counters, so each half still merges by per-slot max. The zero value is an
// empty counter, ready to use.
type PNCounter struct {
	P GCounter // increments per slot
	N GCounter // decrements per slot
}

// Value returns Σ P − Σ N over all slots.
func (c *PNCounter) Value() int64 { return int64(c.P.Value()) - int64(c.N.Value()) }

// SlotValue returns P − N of one slot.
func (c *PNCounter) SlotValue(id SlotID) int64 { return int64(c.P.Get(id)) - int64(c.N.Get(id)) }

// ValueWhere returns Σ (P − N) over the slots for which live reports true,
// counting a slot's negative balance as zero (a slot can never hold fewer
// than no leases; a lagging N simply has not been heard yet).
func (c *PNCounter) ValueWhere(live func(SlotID) bool) int64 {
	var sum int64
	c.P.Each(func(id SlotID, p uint64) {
		if !live(id) {
			return
		}
		if d := int64(p) - int64(c.N.Get(id)); d > 0 {
			sum += d
		}
	})
	return sum
}

// Raise merges one slot's (p, n) pair. It reports whether either grew.
func (c *PNCounter) Raise(id SlotID, p, n uint64) bool {
	a := c.P.Raise(id, p)
	b := c.N.Raise(id, n)
	return a || b
}

// Merge raises every slot of c to at least its values in o.
func (c *PNCounter) Merge(o *PNCounter) {
	c.P.Merge(&o.P)
	c.N.Merge(&o.N)
}

func satAdd(a, b uint64) uint64 {
	if s := a + b; s >= a {
		return s
	}
	return math.MaxUint64
}
