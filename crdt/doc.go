// Package crdt holds ratemesh's replicated data: grow-only and
// positive-negative counters keyed by writer slot, the windowed container
// that holds them per (rule, key, window_ms, window index), and the CBOR wire
// format of a batch of deltas.
//
// Everything here is pure data: no clocks, no goroutines, no I/O. A replica
// is driven like this:
//
//	slots := crdt.NewSlotTable()
//	self := slots.Intern(crdt.Slot{Peer: "me", Incarnation: inc})
//	c := crdt.NewContainer()
//	w := c.Rule("api").Ensure("acct:1").EnsureWindow(1000, nowMs/1000)
//	w.Admitted.Add(self, 1) // a local admission
//	c.MarkDirty(w)
//	// every sync interval: encode c.TakeDirty() into a Batch and publish it;
//	// on receipt of a peer's Batch: Raise each entry's slot in its window.
//	c.Collect(nowMs) // drop windows that, and whose successors, have ended
//
// Merge is per-slot max, so applying a delta twice, late or out of order
// changes nothing. A slot is only ever written by its owner; the owner's
// values never decrease.
//
// None of the types here is safe for concurrent use; the owner serialises
// access.
package crdt
