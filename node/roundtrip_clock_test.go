package node_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/ratemesh/ratemesh/crdt"
	"github.com/ratemesh/ratemesh/limiter"
	"github.com/ratemesh/ratemesh/node"
)

// TestCoreRoundTripClock runs 5 busy cores (each publishing every sync
// interval) with skewed clocks on a network whose batches take 20 ms, or
// 5 or 50 ms plus jitter: every core's
// estimate of every peer's clock comes from round trips and lies within
// 1 ms of the true offset, where the one-way estimate is off by the
// latency; so every core's Offset() is the median skew less its own, and
// every MeshMs agrees within 1 ms.
func TestCoreRoundTripClock(t *testing.T) {
	skews := []time.Duration{0, 37 * time.Millisecond, -120 * time.Millisecond, 250 * time.Millisecond, 3 * time.Millisecond}
	const median = 3 // ms: the median of skews
	for _, tt := range []struct {
		name          string
		delay, jitter time.Duration
	}{
		{"20ms", 20 * time.Millisecond, 0},
		{"5ms+5ms jitter", 5 * time.Millisecond, 5 * time.Millisecond},
		{"50ms+10ms jitter", 50 * time.Millisecond, 10 * time.Millisecond},
	} {
		t.Run(tt.name, func(t *testing.T) {
			const seed = 73
			reportSeed(t, seed)
			net := cluster(t, len(skews), seed, apiRule(limiter.FixedWindow, 1_000_000), nil)
			net.Delay, net.Jitter = tt.delay, tt.jitter
			for i, s := range skews {
				net.Skew(i, s)
			}
			// A request a millisecond, round robin, so every member
			// publishes every sync interval.
			k := 0
			run(t, net, 3200*time.Millisecond, func(time.Time) {
				k = (k + 1) % len(skews)
				if _, err := net.Core(k).Allow(net.Local(k), "api", "k", limiter.Request{}); err != nil {
					t.Fatal(err)
				}
			})

			byPeer := map[string]time.Duration{}
			for i := range skews {
				byPeer[net.Core(i).Self().Peer] = skews[i]
			}
			for i := range skews {
				c := net.Core(i)
				for _, p := range c.Peers(net.Local(i)) {
					if p.Self {
						continue
					}
					truth := byPeer[p.Peer] - skews[i]
					if !p.ClockRoundTrip {
						t.Errorf("member %d's estimate of %s is not from a round trip", i, p.Peer)
					}
					if d := p.ClockOffset - truth; d < -time.Millisecond || d > time.Millisecond {
						t.Errorf("member %d's estimate of %s: %v, true offset %v (off by %v)", i, p.Peer, p.ClockOffset, truth, d)
					}
					// The one-way estimate runs behind by at least the
					// least latency.
					if lag := truth - p.ClockOneWay; lag < tt.delay-time.Millisecond || lag > tt.delay+tt.jitter+time.Millisecond {
						t.Errorf("member %d's one-way estimate of %s: %v, true offset %v: lag %v, want within [%v, %v]",
							i, p.Peer, p.ClockOneWay, truth, lag, tt.delay, tt.delay+tt.jitter)
					}
				}
				want := median*time.Millisecond - skews[i]
				if got := c.Offset(); got < want-time.Millisecond || got > want+time.Millisecond {
					t.Errorf("member %d: Offset() = %v, want %v", i, got, want)
				}
				// Mesh time is the median clock: true time plus the median
				// skew.
				trueMs := net.Now().UnixMilli()
				if d := c.MeshMs(net.Local(i)) - trueMs - median; d < -1 || d > 1 {
					t.Errorf("member %d: mesh time off the median clock by %d ms", i, d)
				}
			}
		})
	}
}

// TestCoreEchoes checks the echoes a core sends and takes, by hand: a
// peer that has not announced crdt.FlagEcho (an older version, whose
// decoder refuses the Echoes field) gets no echoes and is measured
// one-way; once it announces the flag, the core's next batch echoes its
// Clock with the time held; and an echo of the core's own Clock in a
// peer's batch gives the exact offset where one-way is off by the latency.
func TestCoreEchoes(t *testing.T) {
	const lat = 30 * time.Millisecond
	c := newCore(t, "n00", t0, apiRule(limiter.FixedWindow, 10), nil)
	now := t0
	tick := func(d time.Duration) *crdt.Batch {
		t.Helper()
		now = now.Add(d)
		// Heartbeats are due every 500 ms: move to the next one.
		for i := 0; i < 1000; i++ {
			rd := tick(c, now)
			if len(rd.Messages) > 0 {
				b := rd.Messages[0]
				if !b.Has(crdt.FlagEcho) {
					t.Fatalf("a batch without FlagEcho: flags %b", b.Flags)
				}
				return b
			}
			now = now.Add(time.Millisecond)
		}
		t.Fatal("no batch in a second")
		return nil
	}
	const peerAhead = 250 // ms: the peer's clock runs ahead
	peerClock := func(at time.Time) int64 { return at.UnixMilli() + peerAhead }
	step := func(b *crdt.Batch) {
		t.Helper()
		if err := c.Step(now, b); err != nil {
			t.Fatal(err)
		}
	}
	peer := crdt.Slot{Peer: "old", Incarnation: 1}
	var seq uint64
	batchOf := func(sentAt time.Time, flags uint64, echoes ...crdt.Echo) *crdt.Batch {
		seq++
		return &crdt.Batch{Version: crdt.Version, From: peer, Seq: seq, Sent: sentAt.UnixMilli(), Clock: peerClock(sentAt), Flags: flags, Echoes: echoes}
	}
	estimate := func() node.PeerInfo {
		t.Helper()
		for _, p := range c.Peers(now) {
			if p.Peer == peer.Peer {
				return p
			}
		}
		t.Fatal("the peer is not a member")
		return node.PeerInfo{}
	}

	tick(0)
	// An old peer: batches without FlagEcho, one-way only.
	step(batchOf(now.Add(-lat), 0))
	if b := tick(0); len(b.Echoes) != 0 {
		t.Fatalf("echoes %+v to a peer that did not announce FlagEcho", b.Echoes)
	}
	if p := estimate(); p.ClockRoundTrip || p.ClockOffset != (peerAhead*time.Millisecond-lat) {
		t.Errorf("old peer: estimate %v (round trip %v), want the one-way %v", p.ClockOffset, p.ClockRoundTrip, peerAhead*time.Millisecond-lat)
	}

	// It upgrades: the next batch of ours echoes its latest Clock.
	sent := now.Add(-lat)
	step(batchOf(sent, crdt.FlagEcho))
	received := now
	b := tick(40 * time.Millisecond)
	if len(b.Echoes) != 1 {
		t.Fatalf("echoes %+v, want one", b.Echoes)
	}
	held := now.Sub(received).Milliseconds()
	want := crdt.Echo{Peer: crdt.PeerTag("old"), Ago: b.Clock - peerClock(sent), Held: uint32(held)}
	if b.Echoes[0] != want {
		t.Errorf("echo %+v, want %+v", b.Echoes[0], want)
	}

	// The peer echoes our batch b: it arrived there lat later, was held
	// 7 ms, and the echo takes lat back.
	t2 := peerClock(now.Add(lat))
	t3 := t2 + 7
	now = now.Add(2*lat + 7*time.Millisecond)
	echo := batchOf(now.Add(-lat), crdt.FlagEcho, crdt.Echo{Peer: 1}, crdt.Echo{Peer: crdt.PeerTag("n00"), Ago: t3 - b.Clock, Held: 7})
	if echo.Clock != t3 {
		t.Fatalf("test arithmetic: Clock %d, t3 %d", echo.Clock, t3)
	}
	step(echo)
	if p := estimate(); !p.ClockRoundTrip || p.ClockOffset != peerAhead*time.Millisecond || p.ClockOneWay != peerAhead*time.Millisecond-lat {
		t.Errorf("after a round trip: estimate %v (round trip %v, one-way %v), want exactly %v from a round trip, one-way %v",
			p.ClockOffset, p.ClockRoundTrip, p.ClockOneWay, peerAhead*time.Millisecond, peerAhead*time.Millisecond-lat)
	}
	// Our next batch echoes the peer's echo batch, and the one after
	// that, without a new batch of the peer's, echoes nothing.
	if b2 := tick(0); len(b2.Echoes) != 1 || b2.Echoes[0].Ago != b2.Clock-echo.Clock {
		t.Errorf("echoes %+v, want one of Clock %d", b2.Echoes, echo.Clock)
	}
	if b3 := tick(0); len(b3.Echoes) != 0 {
		t.Errorf("the peer is echoed again without a new batch: %+v", b3.Echoes)
	}
}

// TestCoreEchoesRotate checks that echoes rotate: a core that heard ten
// peers echoes the one that has waited longest in each batch (one echo per
// batch, node's echoesPerBatch), in the order it heard them, until every
// one has had its echo.
func TestCoreEchoesRotate(t *testing.T) {
	c := newCore(t, "n00", t0, apiRule(limiter.FixedWindow, 1_000_000), nil)
	now := t0
	tick(c, now)
	var order []uint32
	for i := range 10 {
		p := fmt.Sprintf("p%02d", 9-i) // heard in reverse name order
		order = append(order, crdt.PeerTag(p))
		b := &crdt.Batch{Version: crdt.Version, From: crdt.Slot{Peer: p, Incarnation: 1}, Seq: 1, Sent: now.UnixMilli(), Clock: now.UnixMilli(), Flags: crdt.FlagEcho}
		if err := c.Step(now, b); err != nil {
			t.Fatal(err)
		}
	}
	const perBatch = 1 // echoesPerBatch
	var got [][]uint32
	for len(got) < 10/perBatch+1 {
		now = now.Add(20 * time.Millisecond)
		// A change makes a batch due at every sync.
		if d, err := c.Allow(now, "api", "k", limiter.Request{}); err != nil || !d.Allowed {
			t.Fatalf("Allow = %+v, %v", d, err)
		}
		rd := tick(c, now)
		if len(rd.Messages) == 0 {
			t.Fatal("no batch after a change")
		}
		var tags []uint32
		for _, e := range rd.Messages[0].Echoes {
			tags = append(tags, e.Peer)
		}
		got = append(got, tags)
	}
	var want [][]uint32
	for i := 0; i < 10; i += perBatch {
		want = append(want, order[i:min(i+perBatch, 10)])
	}
	want = append(want, nil)
	for i := range want {
		if !slices.Equal(got[i], want[i]) {
			t.Errorf("batch %d echoes %v, want %v", i, got[i], want[i])
		}
	}
}

// TestCoreClockStallSameClocks runs 3 busy cores whose clocks agree (three
// processes on one host) over a 2 ms network; after 2 s, member 0's
// batches start taking 1.1 s more to reach the others (its outbound queue
// stalls behind housekeeping), for longer than the one to two heartbeats
// a clock estimate keeps. Every round trip member 0 measures then has its
// offset biased by +550 ms, and before round trips carried a bound on
// their delay member 0 believed it: its mesh offset crossed max_skew
// though no clock is off. Now no member's offset leaves ±3 ms, none
// reports skew, and member 0 counts the refused samples.
func TestCoreClockStallSameClocks(t *testing.T) {
	const seed = 91
	reportSeed(t, seed)
	net := cluster(t, 3, seed, apiRule(limiter.FixedWindow, 1_000_000), nil)
	net.Delay = 2 * time.Millisecond
	start := net.Now()
	net.Slow = func(from, to int) time.Duration {
		if from == 0 && net.Now().Sub(start) >= 2*time.Second {
			return 1100 * time.Millisecond
		}
		return 0
	}
	net.OnReady = func(i int, now time.Time, rd node.Ready) {
		if rd.Skew != nil {
			t.Errorf("member %d at %v: skew reported %+v though every clock agrees", i, now.Sub(start), *rd.Skew)
		}
	}
	k := 0
	run(t, net, 6*time.Second, func(now time.Time) {
		k = (k + 1) % 3
		if _, err := net.Core(k).Allow(net.Local(k), "api", "k", limiter.Request{}); err != nil {
			t.Fatal(err)
		}
		if now.Sub(start) < 500*time.Millisecond {
			return
		}
		for i := range 3 {
			if off := net.Core(i).Offset(); off < -3*time.Millisecond || off > 3*time.Millisecond {
				t.Fatalf("member %d at %v: offset %v, want within 3 ms of 0", i, now.Sub(start), off)
			}
		}
	})
	if net.Core(0).Stats().ClockSamplesRejected == 0 {
		t.Error("member 0 refused no clock sample")
	}
}

// TestStepReceivedSamplesAtArrival steps a batch 600 ms after it arrived
// (it queued in the runtime's inbox): the clock sample is taken at its
// arrival, so the one-way estimate of a peer whose clock equals ours is
// the 2 ms it travelled, not the 602 ms until it was stepped; stepped
// with Step at the later time, it would have been −602 ms.
func TestStepReceivedSamplesAtArrival(t *testing.T) {
	rules := apiRule(limiter.FixedWindow, 1000)
	a := newCore(t, "a", t0, rules, nil)
	b := newCore(t, "b", t0, rules, nil)
	bs := tick(b, t0).Messages
	if len(bs) == 0 {
		t.Fatal("b's first Tick sent nothing")
	}
	arrived := t0.Add(2 * time.Millisecond)
	stepped := arrived.Add(600 * time.Millisecond)
	for _, m := range bs {
		if err := a.StepReceived(stepped, arrived, m); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range a.Peers(stepped) {
		if p.Peer == "b" && p.ClockOneWay != -2*time.Millisecond {
			t.Errorf("one-way estimate of b: %v, want -2ms (the path, not the queue)", p.ClockOneWay)
		}
	}
}
