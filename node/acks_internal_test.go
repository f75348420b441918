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
