package node

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/ratemesh/ratemesh/crdt"
)

// TestMeshClockStallNotBelieved feeds a member's mesh clock the batches of
// two peers whose clocks equal ours (the three processes of a soak on one
// host), each sending every 20 ms over a 2 ms path, through three phases
// of 3 s, each longer than the one to two heartbeats the estimate keeps:
//
//   - normal: round trips of δ 9 ms;
//   - our batches stall 1.1 s before the peers step them (queued behind
//     housekeeping): every round trip's θ is biased by +550 ms;
//   - the peers' batches stall 1.1 s on the way to us, and echo nothing:
//     every one-way sample is biased by −1.1 s.
//
// Before samples carried a bound on their delay, each stall was believed
// once it outlasted the estimate's epochs, and the offset crossed
// max_skew (500 ms) though the clocks agree. Now the offset never moves
// by more than 3 ms, skew is never reported, and the samples are counted
// as refused.
func TestMeshClockStallNotBelieved(t *testing.T) {
	cfg := clockCfg()
	cfg.Heartbeat = 500 * time.Millisecond
	k := newMeshClock(cfg, tIn)
	peers := []*member{
		{peer: "a", state: Alive, tag: crdt.PeerTag("a")},
		{peer: "b", state: Alive, tag: crdt.PeerTag("b")},
	}
	type arrival struct {
		t4   int64 // our raw clock at receipt
		from *member
		b    *crdt.Batch
	}
	const (
		path  = 2    // ms each way
		held  = 5    // ms a peer holds an echo
		stall = 1100 // ms
		phase = 3000 // ms
	)
	start := tIn.UnixMilli()
	var q []arrival
	for ms := int64(0); ms < 3*phase; ms += 20 {
		for i, m := range peers {
			t3 := start + ms + int64(i) // the peer's send, on its clock (= ours)
			b := &crdt.Batch{Clock: t3, Flags: crdt.FlagEcho}
			d1, d2 := int64(path), int64(path)
			switch {
			case ms < phase:
			case ms < 2*phase:
				d1 = stall
			default:
				d2 = stall
			}
			if ms < 2*phase {
				// It echoes our batch sent d1 + held before t3.
				t1 := t3 - held - d1
				b.Echoes = []crdt.Echo{{Peer: k.selfTag, Ago: t3 - t1, Held: held}}
			}
			q = append(q, arrival{t4: t3 + d2, from: m, b: b})
		}
	}
	slices.SortStableFunc(q, func(x, y arrival) int { return int(x.t4 - y.t4) })
	next := start
	for _, a := range q {
		for ; next <= a.t4; next += 20 {
			now := time.UnixMilli(next)
			k.tick(now, peers)
			if sk := k.skewChange(); sk != nil {
				t.Fatalf("at %d ms: skew reported %+v though every clock agrees", next-start, *sk)
			}
			if next-start >= 200 && (k.offsetMs < -3 || k.offsetMs > 3) {
				t.Fatalf("at %d ms: offset %d ms, want within 3 ms of 0 (peers' estimates %s)", next-start, k.offsetMs, clockEstimates(peers))
			}
		}
		k.step(time.UnixMilli(a.t4), a.from, a.b)
	}
	if k.rejected == 0 {
		t.Error("no sample counted as refused")
	}
}

func clockEstimates(ms []*member) string {
	s := ""
	for _, m := range ms {
		s += fmt.Sprintf("%s %d ms (rt %v) ", m.peer, m.clockMs, m.clockRT)
	}
	return s
}
