package node

import (
	"time"

	"github.com/ratemesh/ratemesh/crdt"
)

// State is a member's standing in this member's view.
type State uint8

// The member states.
const (
	Alive   State = iota // heard within suspect_after
	Suspect              // silent; still holds capacity
	Dead                 // silent past dead_after (available) or evicted
	Left                 // left gracefully
)

var stateNames = [...]string{"alive", "suspect", "dead", "left"}

func (s State) String() string {
	if int(s) < len(stateNames) {
		return stateNames[s]
	}
	return "unknown"
}

// MemberChange reports one member's state transition.
type MemberChange struct {
	Peer        string
	Incarnation uint64
	From, To    State
	// New reports a member seen for the first time (From is meaningless).
	New bool
}

// PeerInfo describes one member as this member sees it.
type PeerInfo struct {
	Peer        string
	Incarnation uint64
	State       State
	// LastSeen is the age of the last batch heard (0 for self).
	LastSeen time.Duration
	// RulesHash identifies the member's rules; RulesMatch compares it with
	// this member's.
	RulesHash  uint64
	RulesMatch bool
	Self       bool
	// ClockOffset is the member's raw clock minus this member's, as mesh
	// time uses it: from round trips when the member echoes this member's
	// clock (ClockRoundTrip), else from one-way samples.
	ClockOffset time.Duration
	// ClockRoundTrip reports that ClockOffset comes from a fresh round
	// trip rather than one-way samples.
	ClockRoundTrip bool
	// ClockOneWay is the one-way estimate alone: the member's raw clock
	// minus this member's less the least one-way latency.
	ClockOneWay time.Duration
}

type member struct {
	peer      string
	inc       uint64
	slot      crdt.SlotID
	state     State
	evicted   bool
	lastHeard time.Time
	rulesHash uint64

	// Gossip stream bookkeeping for the current incarnation.
	lastSeq   uint64 // highest gossip seq received
	seqKnown  bool   // lastSeq is where the sequence stands (from gossip or a full state)
	heardSent int64  // Sent of the latest gossip batch merged
	entrySent int64  // Sent of the latest gossip batch with entries merged
	ackW      int64  // the member's latest acknowledgement watermark
	gaps      []gap  // missing seqs still to nack

	// Clock estimation (the pure math is at the end of this file).
	// clockMs is the estimate of the member's raw clock minus ours that
	// mesh time uses: from round trips when the member echoes our clock,
	// from one-way samples otherwise.
	clockMs  int64
	hasClock bool
	clockRT  bool        // clockMs comes from a fresh round trip
	oneWayMs int64       // the one-way estimate alone, as of the latest sample
	oneWay   clockWindow // one-way samples: their Clock − our raw clock at receipt
	rt       clockWindow // round trips (NTP samples) of our batches they echoed
	// fwdMs is the forward delay (member to us) the latest fresh round trip
	// measured: the round-trip estimate minus the one-way one. When round
	// trips go stale (a big mesh echoes each member rarely) the one-way
	// estimate plus fwdMs stands in.
	fwdMs  int64
	hasFwd bool

	// The echo we owe the member: the Clock of its least-delayed batch
	// since we last echoed it, our raw clock at its receipt, and its
	// one-way sample (for picking the least delayed).
	tag         uint32 // crdt.PeerTag(peer)
	echoClock   int64
	echoAt      int64
	echoSample  int64
	echoPending bool
	echoQueued  bool  // in Core.echoQ
	echoedAt    int64 // our raw clock when we last echoed the member
	hasEchoed   bool
	echoes      bool // its latest batch set crdt.FlagEcho: it understands echoes
}

// gap is a missing seq of a member's gossip, nacked in nackRepeats
// consecutive batches of ours (seq 0: send everything again).
type gap struct {
	seq  uint64
	sent uint8 // how many of our batches have nacked it so far
}

// clockSample records one one-way clock sample (their Clock − our raw
// clock at receipt, in ms) taken at our raw time nowMs, with epochs of
// epochMs.
//
// A sample is the true offset minus the batch's one-way delay, so a single
// sample runs behind by however long the batch queued; on a loaded host
// that is hundreds of milliseconds, and members whose estimates differ by
// their queueing open windows apart. The least-delayed sample is the best
// one-way estimate, so it is the largest sample of the last one to two
// epochs: a slow batch never drags it down, and a real change of the
// peer's clock shows within two epochs. Even the best one-way sample still
// runs behind by the path's minimum latency; round trips (rtSample) remove
// that.
func (m *member) clockSample(sample, nowMs, epochMs int64) {
	e := floorDiv(nowMs, epochMs)
	m.oneWay.add(clockPoint{off: sample, delay: -sample}, e)
	m.estimate(e)
}

// rtSample records one round trip: an echo of our batch sent at our raw
// time t1, received by the member at t2 and echoed in its batch sent at t3
// (both its raw clock), which reached us at t4 = nowMs. It reports whether
// the echo was plausible (see roundTrip) and recorded. Of the round trips
// of the last one to two epochs the one of least delay counts, as with
// one-way samples, but chosen by its measured delay.
func (m *member) rtSample(t1, t2, t3, nowMs, epochMs int64) bool {
	theta, delta, ok := roundTrip(t1, t2, t3, nowMs)
	if !ok {
		return false
	}
	e := floorDiv(nowMs, epochMs)
	m.rt.add(clockPoint{off: theta, delay: delta}, e)
	m.estimate(e)
	return true
}

// estimate sets clockMs at epoch e: the least-delayed fresh round trip
// (never below the one-way estimate, which bounds the offset from below);
// failing that, the one-way estimate plus the forward delay the last round
// trip measured; failing that, the one-way estimate alone.
func (m *member) estimate(e int64) {
	ow, okOW := m.oneWay.best(e)
	rt, okRT := m.rt.best(e)
	m.clockRT = okRT
	if okOW {
		m.oneWayMs = ow.off
	}
	switch {
	case okRT && okOW:
		m.clockMs = max(rt.off, ow.off)
		m.fwdMs, m.hasFwd = m.clockMs-ow.off, true
	case okRT:
		m.clockMs = rt.off
	case okOW && m.hasFwd:
		m.clockMs = ow.off + m.fwdMs
	case okOW:
		m.clockMs = ow.off
	default:
		return
	}
	m.hasClock = true
}

// echoesPerEpoch is how many echoes per clock epoch (a heartbeat) we send
// each member at most, so how many round trips it can measure to us: with
// one to two epochs to choose from, the least-delayed of up to 16 is
// nearly free of queueing, and a busy small mesh does not echo every peer
// in every batch (in steady, about one echo per batch instead of four).
const echoesPerEpoch = 8

// noteEcho records the batch we may echo back to the member: its Clock,
// received at our raw time nowMs. It keeps the least-delayed batch (largest
// one-way sample) since the last echo, or a newer one once the kept one is
// an epoch old. It reports whether an echo to the member is due: none
// was sent in the last 1/echoesPerEpoch of an epoch.
func (m *member) noteEcho(clock, nowMs, epochMs int64) bool {
	sample := clock - nowMs
	if !m.echoPending || sample >= m.echoSample || nowMs-m.echoAt >= epochMs {
		m.echoClock, m.echoAt, m.echoSample, m.echoPending = clock, nowMs, sample, true
	}
	since := nowMs - m.echoedAt
	return !m.hasEchoed || since < 0 || since >= epochMs/echoesPerEpoch
}

func (m *member) live() bool { return m.state == Alive || m.state == Suspect }

// slotMeta links a slot to its member, so lease counts of retired slots can
// be excluded.
type slotMeta struct {
	m   *member // nil for our own slots
	inc uint64
}

// clockPoint is one clock sample: an offset estimate (ms) and the delay
// that biases it; of two samples the one of less delay is the better.
type clockPoint struct{ off, delay int64 }

// clockWindow keeps the best (least-delayed) sample of the current epoch
// and of the one before it. Its zero value holds nothing.
type clockWindow struct {
	cur, prev clockPoint
	epoch     int64
	n         int  // samples held in cur: 0 or 1
	hasPrev   bool // prev holds the best of epoch-1
}

// add records p taken in epoch e. Within an epoch the least-delayed sample
// (on ties the latest) is kept; a new epoch pushes the current best to
// prev, where it counts for one more epoch.
func (w *clockWindow) add(p clockPoint, e int64) {
	switch {
	case w.n == 0:
		w.cur, w.epoch, w.n, w.hasPrev = p, e, 1, false
	case e == w.epoch:
		if p.delay <= w.cur.delay {
			w.cur = p
		}
	default:
		w.prev, w.hasPrev = w.cur, e == w.epoch+1
		w.cur, w.epoch = p, e
	}
}

// best returns the least-delayed sample of epochs e-1 and e, or false when
// there is none that recent.
func (w *clockWindow) best(e int64) (clockPoint, bool) {
	if w.n == 0 || w.epoch < e-1 {
		return clockPoint{}, false
	}
	b := w.cur
	if w.hasPrev && w.epoch >= e && w.prev.delay < b.delay {
		b = w.prev
	}
	return b, true
}

// maxRoundTripMs bounds a plausible round trip: an echo may be held up
// to crdt.MaxEchoHeldMs; anything longer is not an echo of our clock (a
// tag collision, or our clock stepped).
const maxRoundTripMs = 2 * crdt.MaxEchoHeldMs

// roundTrip returns the NTP offset and round-trip delay of one exchange:
// we sent at t1 (our raw clock), the peer received at t2 and sent its echo
// at t3 (its raw clock), and we received that at t4, all in ms:
//
//	θ = ((t2 − t1) + (t3 − t4)) / 2 (rounded down)
//	δ = (t4 − t1) − (t3 − t2)
//
// With the delays out (d₁, us to peer) and back (d₂), t2 − t1 = θ₀ + d₁ and
// t3 − t4 = θ₀ − d₂ for the true offset θ₀, so θ = θ₀ + (d₁ − d₂)/2: exact
// when the delays are equal, off by at most half their difference (and so
// by at most δ/2) otherwise, where a one-way sample is off by d₂ whole.
//
// ok is false for an implausible exchange: t4 before t1, a round trip
// over maxRoundTripMs, t3 before t2, or δ below -1 (millisecond clocks
// make a true δ of 0 read as -1 at worst; δ is then taken as 0).
func roundTrip(t1, t2, t3, t4 int64) (theta, delta int64, ok bool) {
	rtt := t4 - t1
	held := t3 - t2
	if t1 > t4 || rtt > maxRoundTripMs || rtt < 0 || t2 > t3 || held < 0 {
		return 0, 0, false
	}
	delta = rtt - held
	if delta < -1 {
		return 0, 0, false
	}
	// (t2 − t1) + (t3 − t4) = 2(t3 − t4) + δ.
	theta = (t3 - t4) + floorDiv(delta, 2)
	return theta, max(delta, 0), true
}

// floorDiv returns a / b rounded towards minus infinity (b > 0).
func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && a < 0 {
		q--
	}
	return q
}
