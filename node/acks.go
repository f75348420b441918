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
	// make that a cube of the loss rate. The author serves the first copy;
	// the others change nothing (outbox.need).
	nackRepeats = 3
)

// inStream is the gossip stream received from one incarnation of a member:
// where its sequence stands, the gaps still to nack or not merged yet, and
// the Sent times behind our acknowledgement watermark. Its invariants:
// every gap is below lastSeq, at most maxGaps are held, and a gap of seq 0
// (send everything again) is alone. The zero value has heard nothing.
type inStream struct {
	lastSeq   uint64 // highest gossip seq received
	seqKnown  bool   // lastSeq is where the sequence stands (from gossip or a full state)
	heardSent int64  // Sent of the latest gossip batch merged
	entrySent int64  // Sent of the latest gossip batch with entries merged
	ackW      int64  // the member's latest acknowledgement watermark
	// base and floor bound what merged says: the seqs below base came
	// before the gossip we heard first (with no full state covering
	// them), and a seq at or below floor may have been a gap we forgot.
	base, floor uint64
	gaps        []gap // missing seqs: nacked nackRepeats times, then held until merged
}

// gap is a missing seq of a member's gossip, nacked in nackRepeats
// consecutive batches of ours (seq 0: send everything again), then held,
// no longer nacked, until the batch or a repair of it (crdt.Repair) is
// merged, so that merged stays false for it.
type gap struct {
	seq  uint64
	sent uint8 // how many of our batches have nacked it so far
}

// reset forgets the stream: the member took a new incarnation, whose
// sequence starts again.
func (s *inStream) reset() {
	s.lastSeq, s.seqKnown, s.heardSent, s.entrySent, s.ackW, s.gaps = 0, false, 0, 0, 0, s.gaps[:0]
	s.base, s.floor = 0, 0
}

// track follows the member's gossip sequence with gossip batch b: gaps
// become nacks, and the latest Sent time feeds our acknowledgement
// watermark.
func (s *inStream) track(b *crdt.Batch) {
	switch {
	case !s.seqKnown:
		s.base = b.Seq
	case b.Seq == s.lastSeq+1:
	case b.Seq > s.lastSeq+1:
		for q := s.lastSeq + 1; q < b.Seq; q++ {
			if !s.addGap(gap{seq: q}) {
				s.floor = max(s.floor, b.Seq-1)
				s.gaps = append(s.gaps[:0], gap{}) // seq 0: send everything again
				break
			}
		}
	default: // a late or duplicate batch may fill a gap
		s.fill(b.Seq)
	}
	s.lastSeq, s.seqKnown = max(s.lastSeq, b.Seq), true
	s.heardSent = max(s.heardSent, b.Sent)
	if len(b.Windows)+len(b.Leases) > 0 {
		s.entrySent = max(s.entrySent, b.Sent)
	}
}

// addGap holds g, making room by forgetting the oldest gap no longer
// nacked (merged turns false up to it); it reports false when every held
// gap is still being nacked.
func (s *inStream) addGap(g gap) bool {
	if len(s.gaps) < maxGaps {
		s.gaps = append(s.gaps, g)
		return true
	}
	i := slices.IndexFunc(s.gaps, func(g gap) bool { return g.sent >= nackRepeats })
	if i < 0 {
		return false
	}
	s.floor = max(s.floor, s.gaps[i].seq)
	s.gaps = append(slices.Delete(s.gaps, i, i+1), g)
	return true
}

// fill notes that batch seq, or a repair of all it carried, is merged.
func (s *inStream) fill(seq uint64) {
	if i := slices.IndexFunc(s.gaps, func(g gap) bool { return g.seq == seq }); i >= 0 {
		s.gaps = slices.Delete(s.gaps, i, i+1)
	}
}

// partial notes that gossip batch seq, just tracked, was not merged whole
// (an entry of a rule we do not hold, or of a window beyond the skew
// bound): merged turns false for it, so a repair of it is merged.
func (s *inStream) partial(seq uint64) {
	if slices.ContainsFunc(s.gaps, func(g gap) bool { return g.seq == seq }) {
		return
	}
	if !s.addGap(gap{seq: seq, sent: nackRepeats}) {
		s.floor = max(s.floor, seq)
	}
}

// merged reports whether we are sure to have merged every entry of the
// member's gossip batch seq: it is at or below lastSeq, at or above the
// first gossip batch we heard, above any gap we forgot, and no gap. A repair of such a batch (crdt.Repair) brings
// nothing new: what it raises since went out in later batches of their
// own, and we merge those or nack them. When unsure it reports false.
func (s *inStream) merged(seq uint64) bool {
	if !s.seqKnown || seq > s.lastSeq || seq < s.base || seq <= s.floor {
		return false
	}
	for _, g := range s.gaps {
		if g.seq == seq || g.seq == 0 {
			return false
		}
	}
	return true
}

// fullState notes a full state of the member carrying everything up to
// seq: a later gap in the gossip sequence is a lost batch to nack.
func (s *inStream) fullState(seq uint64) {
	if !s.seqKnown {
		// Not merged for repairs (merged): a full state may arrive torn
		// or merge only in part, and it names no batch.
		s.lastSeq, s.seqKnown, s.base = seq, true, seq+1
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
		if g.sent < nackRepeats && len(nacks) < crdt.MaxNacks {
			nacks = append(nacks, crdt.Nack{Slot: slot, Seq: g.seq})
			if g.sent == 0 {
				first++
			}
			g.sent++
		}
		if g.sent < nackRepeats || g.seq != 0 {
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

// Merged reports whether the core is sure to have merged every entry of
// gossip batch seq of slot from, so that it skips window entries tagged as
// a repair of that batch (crdt.Repair); false when unsure.
func (c *Core) Merged(from crdt.Slot, seq uint64) bool {
	m := c.members.byPeer[from.Peer]
	return m != nil && m.inc == from.Incarnation && !m.evicted && m.merged(seq)
}
