package node_test

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/ratemesh/ratemesh/crdt"
	"github.com/ratemesh/ratemesh/limiter"
	"github.com/ratemesh/ratemesh/node"
)

// leaseRules is one concurrency rule, "cc", of limit 10.
var leaseRules = []limiter.Rule{{Name: "cc", Algorithm: limiter.Concurrency, Limit: 10, LeaseTTL: time.Minute}}

// heldLeases returns the live leases c counts for peer's slot on ("cc",
// "k"), and whether it lists that slot at all.
func heldLeases(t *testing.T, c *node.Core, now time.Time, peer string) (uint64, bool) {
	t.Helper()
	rep, err := c.Usage(now, "cc", "k")
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range rep.Slots {
		if s.Peer == peer {
			return s.Admitted, true
		}
	}
	return 0, false
}

// authorBatch is a gossip batch of author's own lease counts.
func authorBatch(author crdt.Slot, seq uint64, now time.Time, acq, rel uint64) *crdt.Batch {
	return &crdt.Batch{
		From: author, Seq: seq, Sent: now.UnixMilli(), Clock: now.UnixMilli(),
		Leases: []crdt.LeaseEntry{{Rule: "cc", Key: "k", Acquired: acq, Released: rel}},
	}
}

// relayBatch is a full state of relayer's that relays (acq, rel) as
// author's lease counts.
func relayBatch(relayer, author crdt.Slot, seq uint64, now time.Time, acq, rel uint64) *crdt.Batch {
	return &crdt.Batch{
		From: relayer, Seq: seq, Sent: now.UnixMilli(), Clock: now.UnixMilli(),
		Flags: crdt.FlagFull | crdt.FlagRelay | crdt.FlagLast, Slots: []crdt.Slot{author},
		Leases: []crdt.LeaseEntry{{Slot: 1, Rule: "cc", Key: "k", Acquired: acq, Released: rel}},
	}
}

// TestRelayCannotLowerLeases: a relay that asserts acquired = released =
// 2⁴⁰ for a member holding 9 leases (what issue 24 found lowering every
// receiver's count of them to 0) leaves the receiver counting 9; and an
// honest relay still tells a receiver that has heard nothing of the
// member its true live count.
func TestRelayCannotLowerLeases(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	recv := newCore(t, "recv", now, leaseRules, nil)
	author := crdt.Slot{Peer: "author", Incarnation: 1}
	liar := crdt.Slot{Peer: "liar", Incarnation: 1}
	if err := recv.Step(now, authorBatch(author, 1, now, 9, 0)); err != nil {
		t.Fatal(err)
	}
	if got, _ := heldLeases(t, recv, now, "author"); got != 9 {
		t.Fatalf("after the author's batch: %d live leases, want 9", got)
	}
	const big = 1 << 40
	if err := recv.Step(now, relayBatch(liar, author, 1, now, big, big)); err != nil {
		t.Fatal(err)
	}
	if got, _ := heldLeases(t, recv, now, "author"); got != 9 {
		t.Errorf("after a relay of (2^40, 2^40): %d live leases, want 9", got)
	}
	if st := recv.Stats(); st.RelayLowering != 1 {
		t.Errorf("RelayLowering = %d, want 1", st.RelayLowering)
	}
	// Only the author lowers its count.
	if err := recv.Step(now, authorBatch(author, 2, now, 9, 4)); err != nil {
		t.Fatal(err)
	}
	if got, _ := heldLeases(t, recv, now, "author"); got != 5 {
		t.Errorf("after the author released 4: %d live leases, want 5", got)
	}

	// A joiner that knows the author but none of its counts yet learns
	// the true live count from an honest relay of (9, 5).
	joiner := newCore(t, "joiner", now, leaseRules, nil)
	if err := joiner.Step(now, authorBatch(author, 1, now, 0, 0)); err != nil {
		t.Fatal(err)
	}
	if err := joiner.Step(now, relayBatch(crdt.Slot{Peer: "honest", Incarnation: 1}, author, 1, now, 9, 5)); err != nil {
		t.Fatal(err)
	}
	if got, _ := heldLeases(t, joiner, now, "author"); got != 4 {
		t.Errorf("joiner after an honest relay of (9, 5): %d live leases, want 4", got)
	}
}

// TestRelayLeasesOnlyRaise is the property behind it, over random
// sequences: an author acquires and releases leases and publishes its
// absolute counts, some of which the receiver loses or gets out of order,
// interleaved with relays from other members asserting anything the
// decoder and the plausibility check let through (released ≤ acquired,
// acquired − released within a bound). At every step the receiver counts
// at least the live leases the author's own batches it merged establish
// (the largest acquired count heard minus the largest released count
// heard) and never more than that plus the bound.
func TestRelayLeasesOnlyRaise(t *testing.T) {
	const bound = 160 // mesh.PlausibleBound of a limit of 10
	for seed := uint64(1); seed <= 200; seed++ {
		rng := rand.New(rand.NewPCG(seed, 0))
		now := time.Unix(1_700_000_000, 0)
		recv := newCore(t, "recv", now, leaseRules, nil)
		author := crdt.Slot{Peer: "author", Incarnation: 1}
		relayers := []crdt.Slot{{Peer: "r1", Incarnation: 1}, {Peer: "r2", Incarnation: 1}}
		relaySeq := map[string]uint64{}
		var acq, rel uint64 // the author's true counts
		var heardAcq, heardRel uint64
		var seq uint64
		var pending []*crdt.Batch // the author's batches not yet delivered
		deliver := func(b *crdt.Batch) {
			if err := recv.Step(now, b); err != nil {
				t.Fatalf("seed %d: %v", seed, err)
			}
			heardAcq, heardRel = max(heardAcq, b.Leases[0].Acquired), max(heardRel, b.Leases[0].Released)
		}
		seq++
		deliver(authorBatch(author, seq, now, 0, 0))
		for step := range 80 {
			now = now.Add(time.Millisecond)
			switch op := rng.IntN(10); {
			case op < 4: // the author acquires or releases, and publishes
				if acq > rel && rng.IntN(2) == 0 {
					rel += uint64(1 + rng.IntN(int(acq-rel)))
				} else {
					acq += uint64(1 + rng.IntN(3))
				}
				seq++
				pending = append(pending, authorBatch(author, seq, now, acq, rel))
			case op < 6 && len(pending) > 0: // one of them arrives, or is lost
				i := rng.IntN(len(pending))
				b := pending[i]
				pending = append(pending[:i], pending[i+1:]...)
				if rng.IntN(4) > 0 {
					deliver(b)
				}
			default: // a relay asserting anything plausible
				r := relayers[rng.IntN(len(relayers))]
				var a, d uint64
				switch rng.IntN(3) {
				case 0: // an honest relay of the author's true counts
					a, d = acq, rel
				case 1: // a lowering one: everything released
					a = heardAcq + uint64(rng.IntN(1<<20))
					d = a - uint64(rng.IntN(2))
				default: // anything
					d = uint64(rng.IntN(1 << 20))
					a = d + uint64(rng.IntN(bound+1))
				}
				relaySeq[r.Peer]++
				if err := recv.Step(now, relayBatch(r, author, relaySeq[r.Peer], now, a, d)); err != nil {
					t.Fatalf("seed %d: %v", seed, err)
				}
			}
			got, _ := heldLeases(t, recv, now, "author") // none listed: none held
			floor := heardAcq - heardRel
			if got < floor {
				t.Fatalf("seed %d step %d: the receiver counts %d live leases of the author, below the %d its own batches established (acquired %d, released %d)", seed, step, got, floor, heardAcq, heardRel)
			}
			if got > floor+bound {
				t.Fatalf("seed %d step %d: the receiver counts %d live leases of the author, over %d + the bound %d", seed, step, got, floor, bound)
			}
		}
	}
}
