package node

import (
	"math"
	"testing"
	"time"
)

// TestClockSampleKeepsLeastDelayed checks the windowed maximum behind a
// member's clock estimate: a batch that queued long never drags the
// estimate down, not even once the faster samples have aged out (it is
// refused, and the estimate holds), and a real change of the peer's
// clock shows at once when it moves ahead, and within (change / slack)
// heartbeats when it steps back (the top sinks by a slack a heartbeat).
func TestClockSampleKeepsLeastDelayed(t *testing.T) {
	const epoch = 2000
	lim := newClockLimits(500 * time.Millisecond) // slack 62 ms
	steps := []struct {
		nowMs, sample, want int64
		refused             bool
	}{
		{0, -5, -5, false},
		{500, -300, -5, true},      // a batch that queued 300 ms: refused
		{1000, -3, -3, false},      // a faster one: kept
		{2500, -250, -3, true},     // next epoch: refused (top −3 − 62)
		{4100, -260, -3, true},     // two epochs on: still refused, the estimate holds
		{4200, 400, 400, false},    // the peer's clock jumped ahead: shows at once
		{9000, -100, 400, true},    // stepped back 500 ms: not believed yet
		{21000, -100, -100, false}, // the top has sunk to −96: believed
	}
	var m member
	lastEpoch := int64(0)
	for i, s := range steps {
		for e := s.nowMs / epoch; lastEpoch < e; lastEpoch++ {
			m.age(lim)
		}
		ok := m.clockSample(s.sample, s.nowMs, epoch, lim)
		if ok == s.refused {
			t.Errorf("step %d (sample %d at %d ms): accepted %v, want %v", i, s.sample, s.nowMs, ok, !s.refused)
		}
		if !m.hasClock || m.clockMs != s.want {
			t.Fatalf("step %d (sample %d at %d ms): estimate %d, want %d", i, s.sample, s.nowMs, m.clockMs, s.want)
		}
	}
}

// TestRoundTrip checks the NTP math on exchanges with known true offset
// θ₀ and delays out (d1, us to peer) and back (d2): a symmetric path gives
// θ₀ exactly, an asymmetric one is off by at most half the asymmetry (a
// one-way sample is off by d2 whole), and δ is always d1 + d2.
func TestRoundTrip(t *testing.T) {
	tests := []struct {
		name                    string
		theta0, d1, d2, held, t int64
	}{
		{"symmetric", 0, 5, 5, 0, 1_000},
		{"symmetric, peer ahead, held", 400, 25, 25, 180, 1_700_000_000_000},
		{"symmetric, peer behind", -137, 50, 50, 3, 1_700_000_000_000},
		{"zero delay", 12, 0, 0, 7, 5_000},
		{"asymmetric, slow back", 60, 2, 30, 10, 1_000_000},
		{"asymmetric, slow out", -60, 30, 2, 10, 1_000_000},
		{"asymmetric, odd", 1, 3, 8, 0, 0},
		{"negative times", 5, 4, 6, 1, -1_000_000},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t1 := tt.t
			t2 := t1 + tt.theta0 + tt.d1 // the peer's clock runs θ₀ ahead
			t3 := t2 + tt.held
			t4 := t3 - tt.theta0 + tt.d2
			theta, delta, ok := roundTrip(t1, t2, t3, t4)
			if !ok {
				t.Fatalf("roundTrip(%d, %d, %d, %d) refused", t1, t2, t3, t4)
			}
			if delta != tt.d1+tt.d2 {
				t.Errorf("delta %d, want %d", delta, tt.d1+tt.d2)
			}
			asym := abs(tt.d1 - tt.d2)
			if err := abs(theta - tt.theta0); 2*err > asym+1 { // +1: rounding down to whole ms
				t.Errorf("theta %d, true offset %d: off by %d, more than half the asymmetry %d", theta, tt.theta0, err, asym)
			}
			if tt.d1 == tt.d2 && theta != tt.theta0 {
				t.Errorf("symmetric path: theta %d, want exactly %d", theta, tt.theta0)
			}
			if oneWay := t3 - t4; tt.d2 > 0 && abs(oneWay-tt.theta0) != tt.d2 {
				t.Errorf("one-way sample %d is off by %d, want the back delay %d", oneWay, abs(oneWay-tt.theta0), tt.d2)
			}
		})
	}
}

// TestRoundTripRefuses checks that implausible exchanges are refused and
// that a millisecond clock's rounding (δ of -1) is taken as δ 0.
func TestRoundTripRefuses(t *testing.T) {
	tests := []struct {
		name           string
		t1, t2, t3, t4 int64
		ok             bool
		delta          int64
	}{
		{"received before sent", 1000, 1005, 1006, 999, false, 0},
		{"round trip too long", 0, 10, 20, maxRoundTripMs + 1, false, 0},
		{"longest round trip", 0, 10, 20, maxRoundTripMs, true, maxRoundTripMs - 10},
		{"echo sent before received", 1000, 1010, 1009, 1020, false, 0},
		{"held longer than the round trip", 1000, 1000, 1030, 1020, false, 0},
		{"rounding: delta -1", 1000, 1000, 1021, 1020, true, 0},
		{"overflowing t1", math.MinInt64, 0, 1, 10, false, 0},
		{"overflowing t2", 0, math.MinInt64, math.MaxInt64, 10, false, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, delta, ok := roundTrip(tt.t1, tt.t2, tt.t3, tt.t4)
			if ok != tt.ok || (ok && delta != tt.delta) {
				t.Errorf("roundTrip(%d, %d, %d, %d) = delta %d, ok %v; want delta %d, ok %v", tt.t1, tt.t2, tt.t3, tt.t4, delta, ok, tt.delta, tt.ok)
			}
		})
	}
}

// TestClockEstimateRoundTrips drives one member's estimate through round
// trips and one-way samples (true offset 100 ms, one-way latency about
// 20 ms): the least-delayed round trip of the last one to two epochs
// counts, chosen by its delay and not its value; a round trip never puts
// the estimate below the one-way lower bound; without round trips the
// one-way estimate stands, corrected by the forward delay the last round
// trip measured once round trips go stale.
func TestClockEstimateRoundTrips(t *testing.T) {
	const epoch = 1000
	type step struct {
		nowMs int64
		// a one-way sample when rt is false; else a round trip echoing
		// our clock t1 = nowMs − rtt, held by the peer for held ms, with
		// out and back delays d1, d2 (rtt = d1 + held + d2).
		rt                bool
		sample            int64
		d1, d2, held      int64
		want              int64
		wantRT, wantClock bool
	}
	const theta0 = 100
	steps := []step{
		{nowMs: 0, sample: 80, want: 80, wantClock: true},   // one-way only: off by the latency
		{nowMs: 100, sample: 70, want: 80, wantClock: true}, // a slower batch: ignored
		{nowMs: 200, rt: true, d1: 20, d2: 20, held: 5, want: 100, wantRT: true, wantClock: true},
		{nowMs: 300, rt: true, d1: 40, d2: 10, held: 0, want: 100, wantRT: true, wantClock: true}, // δ 50 > 40: ignored though its value differs
		{nowMs: 400, rt: true, d1: 18, d2: 20, held: 9, want: 99, wantRT: true, wantClock: true},  // δ 38: the new best (off by half of 2)
		{nowMs: 1200, sample: 81, want: 99, wantRT: true, wantClock: true},                        // next epoch: epoch 0's round trip still counts
		{nowMs: 1300, rt: true, d1: 30, d2: 30, held: 0, want: 99, wantRT: true, wantClock: true}, // δ 60: epoch 0's δ 38 is better
		{nowMs: 2100, sample: 80, want: 100, wantRT: true, wantClock: true},                       // epoch 0 aged out: epoch 1's δ 60 counts
		{nowMs: 3500, sample: 79, want: 80 + 19, wantRT: false, wantClock: true},                  // round trips stale: one-way (epoch 2's 80) + forward delay 19 (100 − 81)
		{nowMs: 3600, rt: true, d1: 2, d2: 60, held: 0, want: 80, wantRT: true, wantClock: true},  // θ 71, below the one-way bound: the bound
		{nowMs: 3700, sample: 500, want: 500, wantRT: true, wantClock: true},                      // the peer's clock jumped ahead: the bound shows it at once
	}
	var m member
	lim := newClockLimits(500 * time.Millisecond)
	for i, s := range steps {
		if s.rt {
			rtt := s.d1 + s.held + s.d2
			t1 := s.nowMs - rtt
			t2 := t1 + theta0 + s.d1
			if _, ok := m.rtSample(t1, t2, t2+s.held, s.nowMs, epoch, lim); !ok {
				t.Fatalf("step %d: round trip refused", i)
			}
		} else {
			m.clockSample(s.sample, s.nowMs, epoch, lim)
		}
		if m.clockMs != s.want || m.clockRT != s.wantRT || m.hasClock != s.wantClock {
			t.Fatalf("step %d at %d ms: estimate %d (round trip %v, has %v), want %d (%v, %v)",
				i, s.nowMs, m.clockMs, m.clockRT, m.hasClock, s.want, s.wantRT, s.wantClock)
		}
	}
}

// TestNoteEchoKeepsLeastDelayed checks which of a peer's batches we echo:
// the least-delayed (largest one-way sample) since the last echo, or a
// newer one once the kept one is an epoch old; and when an echo is due:
// at most echoesPerEpoch times an epoch.
func TestNoteEchoKeepsLeastDelayed(t *testing.T) {
	const epoch = 1000
	var m member
	steps := []struct {
		echoedAt          int64 // > 0: we echoed the member then, before this step
		clock, nowMs      int64
		due               bool
		wantClock, wantAt int64
	}{
		{clock: 1000, nowMs: 990, due: true, wantClock: 1000, wantAt: 990},   // sample +10
		{clock: 1100, nowMs: 1100, due: true, wantClock: 1000, wantAt: 990},  // +0: slower, kept the first
		{clock: 1200, nowMs: 1185, due: true, wantClock: 1200, wantAt: 1185}, // +15: faster, taken
		{clock: 2300, nowMs: 2300, due: true, wantClock: 2300, wantAt: 2300}, // kept one over an epoch old: replaced
		{echoedAt: 2310, clock: 2400, nowMs: 2360, due: false, wantClock: 2400, wantAt: 2360},
		{clock: 2500, nowMs: 2434, due: false, wantClock: 2500, wantAt: 2434}, // 124 ms after the echo: not yet
		{clock: 2500, nowMs: 2435, due: true, wantClock: 2500, wantAt: 2434},  // 125 ms: due (the batch kept is still the faster one)
	}
	for i, s := range steps {
		if s.echoedAt > 0 {
			m.echoedAt, m.hasEchoed, m.echoPending = s.echoedAt, true, false
		}
		if due := m.noteEcho(s.clock, s.nowMs, epoch); due != s.due {
			t.Errorf("step %d: due %v, want %v", i, due, s.due)
		}
		if !m.echoPending || m.echoClock != s.wantClock || m.echoAt != s.wantAt {
			t.Fatalf("step %d: echo of clock %d received at %d (pending %v), want %d at %d", i, m.echoClock, m.echoAt, m.echoPending, s.wantClock, s.wantAt)
		}
	}
}
