package node

import (
	"fmt"
	"slices"
	"testing"

	"github.com/ratemesh/ratemesh/crdt"
)

func gapSeqs(s *inStream) []uint64 {
	out := make([]uint64, len(s.gaps))
	for i, g := range s.gaps {
		out[i] = g.seq
	}
	return out
}

// TestInStreamTrack follows one member's gossip sequence: gaps open on a
// jump, close when the late batch arrives, and too many collapse into a
// request for everything (seq 0).
func TestInStreamTrack(t *testing.T) {
	var s inStream
	steps := []struct {
		seq      uint64
		sent     int64
		entries  bool
		wantGaps []uint64
		wantLast uint64
	}{
		{5, 100, false, []uint64{}, 5},                        // the first batch sets where the sequence stands
		{6, 110, true, []uint64{}, 6},                         // in order
		{9, 140, false, []uint64{7, 8}, 9},                    // 7 and 8 lost, so far
		{8, 130, true, []uint64{7}, 9},                        // 8 arrives late: no longer a gap, lastSeq stays
		{8, 130, true, []uint64{7}, 9},                        // a duplicate changes nothing
		{10 + maxGaps, 200, false, []uint64{0}, 10 + maxGaps}, // too many lost: ask for everything
	}
	for i, st := range steps {
		b := &crdt.Batch{Seq: st.seq, Sent: st.sent}
		if st.entries {
			b.Windows = []crdt.WindowEntry{{Rule: "r", Key: "k", WindowMs: 1000}}
		}
		s.track(b)
		if got := gapSeqs(&s); !slices.Equal(got, st.wantGaps) || s.lastSeq != st.wantLast {
			t.Fatalf("step %d (seq %d): gaps %v, lastSeq %d; want %v, %d", i, st.seq, got, s.lastSeq, st.wantGaps, st.wantLast)
		}
	}
	if s.heardSent != 200 || s.entrySent != 130 {
		t.Errorf("heardSent %d, entrySent %d; want 200 (latest), 130 (latest with entries)", s.heardSent, s.entrySent)
	}
	s.reset()
	if s.seqKnown || len(s.gaps) != 0 || s.heardSent != 0 {
		t.Errorf("after reset: %+v, want nothing heard", s)
	}
	s.fullState(40)
	s.track(&crdt.Batch{Seq: 42})
	if got := gapSeqs(&s); !slices.Equal(got, []uint64{41}) {
		t.Errorf("after a full state at 40 and gossip 42: gaps %v, want [41]", got)
	}
}

// TestInStreamMerged checks what a receiver claims to have merged, which
// decides whether it skips a repair (crdt.Repair): only batches it surely
// merged whole, never a gap — nacked or no longer nacked — nor a batch
// from before the first it heard, a forgotten gap, or anything after a
// request for everything.
func TestInStreamMerged(t *testing.T) {
	merged := func(s *inStream, upTo uint64) []uint64 {
		var out []uint64
		for q := range upTo + 1 {
			if s.merged(q) {
				out = append(out, q)
			}
		}
		return out
	}
	var s inStream
	if got := merged(&s, 5); got != nil {
		t.Fatalf("nothing heard yet, merged %v", got)
	}
	s.track(&crdt.Batch{Seq: 3})
	s.track(&crdt.Batch{Seq: 6}) // 4 and 5 lost
	if got, want := merged(&s, 8), []uint64{3, 6}; !slices.Equal(got, want) {
		t.Fatalf("after 3 and 6: merged %v, want %v (not before the first heard, not the gaps)", got, want)
	}
	// The gaps stay after their last nack, so a repair of them still merges.
	m := &member{peer: "a", inc: 1, state: Alive, inStream: s}
	for range nackRepeats + 2 {
		takeNacks([]*member{m})
	}
	if got := gapSeqs(&m.inStream); !slices.Equal(got, []uint64{4, 5}) {
		t.Fatalf("after nacking %d times: gaps %v, want [4 5] held", nackRepeats+2, got)
	}
	if nacks, _ := takeNacks([]*member{m}); len(nacks) != 0 {
		t.Fatalf("held gaps nacked again: %v", nacks)
	}
	s = m.inStream
	s.fill(4) // a repair of 4 merged whole
	s.track(&crdt.Batch{Seq: 7})
	s.partial(7) // 7 carried an entry of a rule we do not hold
	if got, want := merged(&s, 8), []uint64{3, 4, 6}; !slices.Equal(got, want) {
		t.Fatalf("after filling 4 and a partial 7: merged %v, want %v", got, want)
	}
	// More gaps than maxGaps: the held ones are forgotten oldest first,
	// and merged turns false up to them.
	s.track(&crdt.Batch{Seq: 8 + maxGaps - 1}) // 8 … 8+maxGaps-2 lost: one more than room
	if got := [...]bool{s.merged(3), s.merged(5), s.merged(6), s.merged(7), s.merged(8 + maxGaps - 1)}; got != [...]bool{false, false, true, false, true} {
		t.Errorf("after forgetting gap 5: merged 3, 5, 6, 7, latest = %v, want false, false, true, false, true", got)
	}
	// Too many nacked gaps: everything again, and nothing counts as merged.
	s.track(&crdt.Batch{Seq: 10 + 3*maxGaps})
	if got := gapSeqs(&s); !slices.Equal(got, []uint64{0}) {
		t.Fatalf("gaps %v, want [0]", got)
	}
	if got := merged(&s, 10+3*maxGaps); got != nil {
		t.Errorf("after asking for everything: merged %v, want none", got)
	}
	s.reset()
	s.fullState(40)
	s.track(&crdt.Batch{Seq: 42})
	if got := merged(&s, 43); !slices.Equal(got, []uint64{42}) {
		t.Errorf("after a full state at 40 and gossip 42: merged %v, want [42] (a full state names no batch, and may be torn)", got)
	}
}

// TestTakeNacksRepeatsAndBounds checks that every gap is nacked in
// nackRepeats consecutive batches, counted once, at most crdt.MaxNacks per
// batch, and that the gaps of dead and left members are not nacked.
func TestTakeNacksRepeatsAndBounds(t *testing.T) {
	a := &member{peer: "a", inc: 1, state: Alive}
	a.gaps = []gap{{seq: 3}, {seq: 4}}
	d := &member{peer: "d", inc: 1, state: Dead}
	d.gaps = []gap{{seq: 9}}
	order := []*member{a, d}
	for round := range nackRepeats + 1 {
		nacks, first := takeNacks(order)
		want := []crdt.Nack{{Slot: crdt.Slot{Peer: "a", Incarnation: 1}, Seq: 3}, {Slot: crdt.Slot{Peer: "a", Incarnation: 1}, Seq: 4}}
		wantFirst := 0
		switch {
		case round == 0:
			wantFirst = 2
		case round >= nackRepeats:
			want = nil
		}
		if !slices.Equal(nacks, want) || first != wantFirst {
			t.Fatalf("round %d: nacks %v (first %d), want %v (first %d)", round, nacks, first, want, wantFirst)
		}
	}
	if got := gapSeqs(&a.inStream); !slices.Equal(got, []uint64{3, 4}) {
		t.Errorf("gaps after their last nack: %v, want [3 4] held until merged", got)
	}

	var big []*member
	for i := range 3 {
		m := &member{peer: fmt.Sprintf("m%d", i), inc: 1, state: Suspect}
		for q := range crdt.MaxNacks / 2 {
			m.gaps = append(m.gaps, gap{seq: uint64(q + 1)})
		}
		big = append(big, m)
	}
	total := 0
	for range 2 * nackRepeats {
		nacks, _ := takeNacks(big)
		if len(nacks) > crdt.MaxNacks {
			t.Fatalf("%d nacks in one batch, at most %d", len(nacks), crdt.MaxNacks)
		}
		total += len(nacks)
	}
	if want := 3 * crdt.MaxNacks / 2 * nackRepeats; total != want {
		t.Errorf("%d nacks over the batches, want every gap %d times: %d", total, nackRepeats, want)
	}
}

// TestAckAggregates checks the acknowledgement figures over the members:
// only alive members count.
func TestAckAggregates(t *testing.T) {
	mk := func(st State, heard, entry, ack int64) *member {
		m := &member{state: st}
		m.heardSent, m.entrySent, m.ackW = heard, entry, ack
		return m
	}
	tests := []struct {
		name          string
		order         []*member
		lastAck       int64
		wantWatermark int64
		wantFrontier  int64
		wantOwed      bool
	}{
		{"alone", nil, 0, 0, 1<<63 - 1, false},
		{"least of the alive", []*member{mk(Alive, 300, 250, 280), mk(Alive, 200, 200, 190), mk(Suspect, 10, 10, 5)}, 150, 200, 190, true},
		{"entries already acknowledged", []*member{mk(Alive, 300, 250, 280), mk(Alive, 200, 100, 190)}, 250, 200, 190, false},
		{"entries beyond the watermark", []*member{mk(Alive, 300, 290, 280), mk(Alive, 200, 100, 190)}, 150, 200, 190, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := watermark(tt.order); got != tt.wantWatermark {
				t.Errorf("watermark = %d, want %d", got, tt.wantWatermark)
			}
			if got := ackFrontier(tt.order); got != tt.wantFrontier {
				t.Errorf("ackFrontier = %d, want %d", got, tt.wantFrontier)
			}
			if got := ackOwed(tt.order, tt.lastAck); got != tt.wantOwed {
				t.Errorf("ackOwed(%d) = %v, want %v", tt.lastAck, got, tt.wantOwed)
			}
		})
	}
}
