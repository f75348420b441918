package crdt

import "fmt"

// Slot identifies one writer of the counters: a peer in one incarnation. A
// restarted peer takes a larger incarnation and so a fresh slot, which is why
// its values never need to go backwards.
type Slot struct {
	Peer        string `cbor:"0,keyasint"`
	Incarnation uint64 `cbor:"1,keyasint"`
}

// Is reports whether s and o are the same slot, as s == o does, but
// cheaper when they differ: peer IDs share their leading bytes (the
// multihash prefix of a libp2p ID) and most often their length, so the
// comparison looks at the incarnations and the peers' last bytes first.
// A receiver matches every nack of every batch against its own slot.
func (s Slot) Is(o Slot) bool {
	p, q := s.Peer, o.Peer
	return s.Incarnation == o.Incarnation && len(p) == len(q) &&
		(len(p) == 0 || p[len(p)-1] == q[len(q)-1]) && p == q
}

// String formats the slot as "peer/incarnation".
func (s Slot) String() string { return fmt.Sprintf("%s/%d", s.Peer, s.Incarnation) }

// SlotID is a replica-local short name for a Slot, assigned by a SlotTable.
// SlotIDs are never sent over the wire.
type SlotID uint32

// SlotTable interns Slots as dense SlotIDs so that counters can store small
// integers instead of strings. IDs are assigned in order of first sight and
// never reused. The zero value is not usable; call NewSlotTable.
type SlotTable struct {
	ids   map[Slot]SlotID
	slots []Slot
}

// NewSlotTable returns an empty table.
func NewSlotTable() *SlotTable {
	return &SlotTable{ids: make(map[Slot]SlotID)}
}

// Intern returns the ID of s, assigning the next free one on first sight.
func (t *SlotTable) Intern(s Slot) SlotID {
	if id, ok := t.ids[s]; ok {
		return id
	}
	id := SlotID(len(t.slots))
	t.ids[s] = id
	t.slots = append(t.slots, s)
	return id
}

// Lookup returns the ID of s if it has been interned.
func (t *SlotTable) Lookup(s Slot) (SlotID, bool) {
	id, ok := t.ids[s]
	return id, ok
}

// Slot returns the slot behind id. It panics on an ID the table never
// assigned, which is a programming error, not bad input.
func (t *SlotTable) Slot(id SlotID) Slot { return t.slots[id] }

// Len returns how many slots have been interned.
func (t *SlotTable) Len() int { return len(t.slots) }
