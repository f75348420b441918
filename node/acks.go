package node

import (
	"math"
	"slices"

	"github.com/ratemesh/ratemesh/crdt"
)

// Acknowledgements and nacks (docs/design.md, "Acknowledgements").
//
// Every gossip batch carries Ack, the mesh time up to which its author has
// merged the gossip of every member it holds alive: the least Sent time of
// their latest batches (watermark). An author counts its own batch as
// acknowledged once every alive member's Ack has passed the batch's Sent
// time (ackFrontier; the outbox applies it). Loss is caught by sequence
// numbers: a receiver that sees a gap in a member's gossip lists it in the
// Nacks of its next nackRepeats batches, and the author publishes the
// missing batch's entries again (outbox.nacked).
//
// inStream is the receiving side of one member's gossip; the functions
// below aggregate it over the members.

const (
	maxGaps = 64 // missing seqs tracked per member before asking for everything
	// nackRepeats is how many consecutive batches of ours nack one gap.
	// Our acknowledgement watermark passes a gap at once (the nack says
	// what it excludes), so a nack lost on its way would leave the gap
	// acknowledged and its entries missing here for good; three copies
	// make that a cube of the loss rate. The author serves the first copy
	// and ignores the others (outbox.nacked).
	nackRepeats = 3
)

// inStream is the gossip stream received from one incarnation of a member:
// where its sequence stands, the gaps still to nack, and the Sent times
// behind our acknowledgement watermark. Its invariants: every gap is below
// lastSeq, at most maxGaps are held, and a gap of seq 0 (send everything
// again) is alone. The zero value has heard nothing.
type inStream struct {
	lastSeq   uint64 // highest gossip seq received
	seqKnown  bool   // lastSeq is where the sequence stands (from gossip or a full state)
	heardSent int64  // Sent of the latest gossip batch merged
	entrySent int64  // Sent of the latest gossip batch with entries merged
	ackW      int64  // the member's latest acknowledgement watermark
	gaps      []gap  // missing seqs still to nack
}

// gap is a missing seq of a member's gossip, nacked in nackRepeats
// consecutive batches of ours (seq 0: send everything again).
type gap struct {
	seq  uint64
	sent uint8 // how many of our batches have nacked it so far
}

// reset forgets the stream: the member took a new incarnation, whose
// sequence starts again.
func (s *inStream) reset() {
	s.lastSeq, s.seqKnown, s.heardSent, s.entrySent, s.ackW, s.gaps = 0, false, 0, 0, 0, s.gaps[:0]
}

// track follows the member's gossip sequence with gossip batch b: gaps
// become nacks, and the latest Sent time feeds our acknowledgement
// watermark.
func (s *inStream) track(b *crdt.Batch) {
	switch {
	case !s.seqKnown || b.Seq == s.lastSeq+1:
	case b.Seq > s.lastSeq+1:
		for q := s.lastSeq + 1; q < b.Seq; q++ {
			if len(s.gaps) >= maxGaps {
				s.gaps = append(s.gaps[:0], gap{}) // seq 0: send everything again
				break
			}
			s.gaps = append(s.gaps, gap{seq: q})
		}
	default: // a late or duplicate batch may fill a gap
		if i := slices.IndexFunc(s.gaps, func(g gap) bool { return g.seq == b.Seq }); i >= 0 {
			s.gaps = slices.Delete(s.gaps, i, i+1)
		}
	}
	s.lastSeq, s.seqKnown = max(s.lastSeq, b.Seq), true
	s.heardSent = max(s.heardSent, b.Sent)
	if len(b.Windows)+len(b.Leases) > 0 {
		s.entrySent = max(s.entrySent, b.Sent)
	}
}

// fullState notes a full state of the member carrying everything up to
// seq: a later gap in the gossip sequence is a lost batch to nack.
func (s *inStream) fullState(seq uint64) {
	if !s.seqKnown {
		s.lastSeq, s.seqKnown = seq, true
	}
}

// acked records the member's acknowledgement watermark ack.
func (s *inStream) acked(ack int64) {
	if ack > s.ackW {
		s.ackW = ack
	}
}

// takeNacks appends to nacks the member's gaps (its slot is slot), up to
// crdt.MaxNacks in all, each in nackRepeats consecutive calls, and returns
// them with how many gaps were nacked for the first time.
func (s *inStream) takeNacks(slot crdt.Slot, nacks []crdt.Nack) ([]crdt.Nack, int) {
	first := 0
	keep := s.gaps[:0]
	for _, g := range s.gaps {
		if len(nacks) < crdt.MaxNacks {
			nacks = append(nacks, crdt.Nack{Slot: slot, Seq: g.seq})
			if g.sent == 0 {
				first++
			}
			g.sent++
		}
		if g.sent < nackRepeats {
			keep = append(keep, g)
		}
	}
	s.gaps = keep
	return nacks, first
}

// takeNacks returns the nacks for our next batch: every gap of a member
// that is neither dead nor gone, at most crdt.MaxNacks (the rest wait for
// the next batch), and how many gaps it nacks for the first time.
func takeNacks(order []*member) ([]crdt.Nack, int) {
	var nacks []crdt.Nack
	first := 0
	for _, m := range order {
		if len(m.gaps) == 0 || m.state == Dead || m.state == Left {
			continue
		}
		var n int
		nacks, n = m.takeNacks(crdt.Slot{Peer: m.peer, Incarnation: m.inc}, nacks)
		first += n
	}
	return nacks, first
}

// ackFrontier returns the mesh time up to which every alive member has
// acknowledged our batches; with no alive member, everything is.
func ackFrontier(order []*member) int64 {
	f := int64(math.MaxInt64)
	for _, m := range order {
		if m.state == Alive && m.ackW < f {
			f = m.ackW
		}
	}
	return f
}

// watermark is our acknowledgement: every alive member's gossip merged up
// to this mesh time (0, nothing, when we have heard none).
func watermark(order []*member) int64 {
	w := int64(math.MaxInt64)
	for _, m := range order {
		if m.state == Alive && m.heardSent < w {
			w = m.heardSent
		}
	}
	if w == math.MaxInt64 {
		return 0
	}
	return w
}

// ackOwed reports whether our watermark has passed a batch with entries
// that lastAck, the Ack of our last batch, did not cover yet. The author
// counts those entries as acknowledged only when every alive member's Ack
// reaches them, and a member's watermark often passes them only after its
// own acknowledging batch has gone out (it waits for the others' batches
// too): without one more batch the author's u would stay up until our next
// heartbeat. Batches without entries never make an ack owed, so this adds
// at most one batch per member after a burst and never ping-pongs.
func ackOwed(order []*member, lastAck int64) bool {
	w := watermark(order)
	if w <= lastAck {
		return false
	}
	for _, m := range order {
		if m.state == Alive && m.entrySent > lastAck && m.entrySent <= w {
			return true
		}
	}
	return false
}
