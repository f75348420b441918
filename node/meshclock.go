package node

import (
	"slices"
	"time"

	"github.com/ratemesh/ratemesh/crdt"
)

// Mesh time (docs/design.md, "Mesh time"). Windows open and close on mesh
// time: the local clock plus this member's estimated offset to the mesh,
// the median of the live members' raw clock offsets and its own (0), so a
// member whose clock runs ahead still opens windows with everyone else.
//
// Each batch carries its author's raw clock (Clock). A receiver estimates
// every member's offset from one-way samples (their Clock minus its own
// clock at receipt: the true offset less the batch's delay) and, when the
// member echoes the receiver's clock back (crdt.Echo), from round trips,
// which remove the delay (peerClock). meshClock keeps the member's own
// offset, the echoes it owes, and whether the offset is beyond max_skew.

// meshClock is this member's mesh time: its offset to the mesh and the
// echoes of other members' clocks it owes. Its invariants: offsetMs is the
// median of the samples as of the last update; every member in echoQ has
// echoQueued set, and no member is in it twice.
type meshClock struct {
	local    bool // CoreConfig.LocalClock: mesh time is the local clock
	maxSkew  time.Duration
	every    time.Duration // how often the offset is re-estimated: a heartbeat
	epochMs  int64         // the epoch of the members' clock estimates (see newMeshClock)
	lim      clockLimits   // which samples a stall took (see clockLimits)
	selfTag  uint32        // crdt.PeerTag of our peer ID: echoes of our clock carry it
	offsetMs int64
	samples  []int64   // scratch for update
	echoQ    []*member // members owing an echo, in the order they came to owe it
	// common are the capabilities every live member has announced
	// (caps.go): with capEcho our batches echo clocks, with capRepairs
	// they tag repairs (Core.nacked). Only echoes are a clock matter, but
	// update visits every member once a heartbeat anyway.
	common caps
	// echoSinceMs is our raw clock when every live member last came to
	// announce capEcho (0: from the start), so echoes go out since then:
	// an echo older than that says nothing of a member (Core.ackedBy).
	echoSinceMs int64
	next        time.Time // the next re-estimate
	// skewed is exceeded as of the last skewChange.
	skewed bool
	// rejected counts the samples refused as taken across a stall
	// (Stats.ClockSamplesRejected).
	rejected uint64
}

// clockLimits says which clock samples were taken across a stall, and so
// are not believed (docs/design.md, "Mesh time"). A round trip's offset
// is off by up to half its delay δ, a one-way sample's by its whole
// one-way delay, and a stall anywhere on the path (the peer stepping our
// batch late, our batch queued behind housekeeping, our own inbox backed
// up) is delay. So a round trip counts only if its δ is at most slackMs
// above the least δ of the peer's recent round trips (its floor), and
// never over maxDelayMs (delivery within max_skew each way); a one-way
// sample counts only if it is at most slackMs below the largest recent
// one (its top). The floor rises and the top sinks by slackMs every
// heartbeat (agePeers), so a path that really got slower, or a peer's
// clock that really stepped back, is believed again within
// (change / slackMs) heartbeats; a round trip shows a clock stepped back
// at once (it lowers the top, rtSample). Until then the estimate holds.
type clockLimits struct {
	slackMs    int64 // max_skew / 8 (at least 1 ms)
	maxDelayMs int64 // 2·max_skew
}

func newClockLimits(maxSkew time.Duration) clockLimits {
	return clockLimits{
		slackMs:    max(maxSkew.Milliseconds()/8, 1),
		maxDelayMs: max(2*maxSkew.Milliseconds(), 1),
	}
}

// newMeshClock returns the mesh clock of a member started at now. The
// epoch of the members' clock estimates is one heartbeat, so every epoch
// holds a sample even from idle members, and a peer's clock stepping back
// shows within two heartbeats.
func newMeshClock(cfg *CoreConfig, now time.Time) meshClock {
	return meshClock{
		local:   cfg.LocalClock,
		maxSkew: cfg.MaxSkew,
		every:   cfg.Heartbeat,
		epochMs: max(cfg.Heartbeat.Milliseconds(), 1),
		lim:     newClockLimits(cfg.MaxSkew),
		selfTag: crdt.PeerTag(cfg.Peer),
		next:    now,
	}
}

// meshMs returns the mesh time at the local time now (the local clock
// under CoreConfig.LocalClock).
func (k *meshClock) meshMs(now time.Time) int64 {
	if k.local {
		return now.UnixMilli()
	}
	return now.UnixMilli() + k.offsetMs
}

// step takes the clock readings of b, from m, received at now (as early
// as the receiver knows: see Core.StepReceived): a one-way sample of b's
// Clock, a round trip if b echoes our clock, and the echo we owe m in
// return. Samples taken across a stall are counted in rejected.
func (k *meshClock) step(now time.Time, m *member, b *crdt.Batch) {
	nowMs, epochMs := now.UnixMilli(), k.epochMs
	if !m.clockSample(b.Clock-nowMs, nowMs, epochMs, k.lim) {
		k.rejected++
	}
	m.caps = capsOf(b.Flags)
	k.common &= m.caps // at once; update raises it again
	for _, e := range b.Echoes {
		if e.Peer == k.selfTag {
			// t1 = our Clock it echoes, t2 = when it arrived, t3 = b.Clock.
			plausible, ok := m.rtSample(b.Clock-e.Ago, b.Clock-int64(e.Held), b.Clock, nowMs, epochMs, k.lim)
			if !ok {
				k.rejected++
			}
			if plausible {
				m.heardUsMs = nowMs
			}
			break
		}
	}
	if m.noteEcho(b.Clock, nowMs, epochMs) && !m.echoQueued {
		k.echoQ = append(k.echoQ, m)
		m.echoQueued = true
	}
}

// all reports whether every live member has announced the capabilities c
// (as of the last update, or lower since: a batch without them lowers
// common at once).
func (k *meshClock) all(c caps) bool { return k.common&c == c }

// echoesPerBatch is how many peers' clocks one batch echoes at most. A
// batch is broadcast, so it cannot echo every peer of a big mesh. One echo
// (about 10 bytes) per batch gives every peer of a ten-node mesh several
// round trips a heartbeat at a 20 ms sync interval, and in a mesh of a
// thousand one every 1000 of our batches, which the forward delay learned
// from the last round trip bridges (peerClock.estimate). Four per batch
// kept the nodes' mesh clocks no closer (within 2 ms in clock-skew either
// way) and cost an idle 60-node mesh (hermes-60) 58 % more bytes than no
// echoes, against 17 % for one.
const echoesPerBatch = 1

// takeEchoes returns the echoes for the batch we send at our raw time
// nowMs: the members that have owed one longest first, so echoes rotate
// over every member heard since its last echo (and not echoed in the
// last 1/echoesPerEpoch of an epoch). It returns none while any
// live member has not announced crdt.FlagEcho (a peer of an older version
// refuses a batch carrying echoes); every member then measures one-way.
func (k *meshClock) takeEchoes(nowMs int64) []crdt.Echo {
	if len(k.echoQ) == 0 || !k.all(capEcho) {
		return nil
	}
	var out []crdt.Echo
	i := 0
	for ; i < len(k.echoQ) && len(out) < echoesPerBatch; i++ {
		m := k.echoQ[i]
		pending := m.echoPending
		m.echoQueued, m.echoPending = false, false
		held, ago := nowMs-m.echoAt, nowMs-m.echoClock
		if !pending || !m.live() || m.evicted || held < 0 || held > crdt.MaxEchoHeldMs ||
			m.echoClock < -crdt.MaxValue || m.echoClock > crdt.MaxValue || ago < -crdt.MaxValue || ago > crdt.MaxValue {
			continue
		}
		out = append(out, crdt.Echo{Peer: m.tag, Ago: ago, Held: uint32(held)})
		m.echoedAt, m.hasEchoed = nowMs, true
	}
	n := copy(k.echoQ, k.echoQ[i:])
	clear(k.echoQ[n:])
	k.echoQ = k.echoQ[:n]
	return out
}

// tick re-estimates the offset once a heartbeat, over the members in
// order.
func (k *meshClock) tick(now time.Time, order []*member) {
	if !now.Before(k.next) {
		k.agePeers(order)
		echoing := k.all(capEcho)
		k.update(order)
		if !echoing && k.all(capEcho) {
			k.echoSinceMs = now.UnixMilli()
		}
		k.next = now.Add(k.every)
	}
}

// agePeers lets every member's round-trip floor rise and its one-way top
// sink by one slack: once a heartbeat (see clockLimits).
func (k *meshClock) agePeers(order []*member) {
	for _, m := range order {
		m.age(k.lim)
	}
}

// age lets the round-trip floor rise and the one-way top sink by one
// slack: a heartbeat passed.
func (p *peerClock) age(lim clockLimits) {
	p.rtFloor = min(p.rtFloor+lim.slackMs, lim.maxDelayMs)
	if p.owTop > -crdt.MaxValue {
		p.owTop -= lim.slackMs
	}
}

// update estimates the clock offset to the mesh: the median of the live
// members' raw clock offsets and our own (0), so every member converges on
// the mesh's median clock. It also notes the capabilities every live
// member has announced (common).
func (k *meshClock) update(order []*member) {
	k.samples = append(k.samples[:0], 0)
	k.common = capsOf(announced)
	for _, m := range order {
		if m.live() && m.hasClock {
			k.samples = append(k.samples, m.clockMs)
		}
		if m.live() && !m.evicted {
			k.common &= m.caps
		}
	}
	slices.Sort(k.samples)
	n := len(k.samples)
	if n%2 == 1 {
		k.offsetMs = k.samples[n/2]
	} else {
		k.offsetMs = (k.samples[n/2-1] + k.samples[n/2]) / 2
	}
}

// offset returns the estimated offset to the mesh.
func (k *meshClock) offset() time.Duration { return time.Duration(k.offsetMs) * time.Millisecond }

// exceeded reports whether the estimated offset is beyond max_skew.
func (k *meshClock) exceeded() bool {
	return time.Duration(abs(k.offsetMs))*time.Millisecond > k.maxSkew
}

// skewChange returns the change of exceeded since the last call that
// returned one (initially: not exceeded), or nil.
func (k *meshClock) skewChange() *SkewChange {
	if ex := k.exceeded(); ex != k.skewed {
		k.skewed = ex
		return &SkewChange{Exceeded: ex, Offset: k.offset()}
	}
	return nil
}

func abs(x int64) int64 {
	if x < 0 {
		return -x
	}
	return x
}

// peerClock is what this member knows of another member's clock: the
// estimate of its offset that mesh time uses, the samples behind it, and
// the echo of its clock this member owes it. Its zero value knows nothing.
type peerClock struct {
	// clockMs is the estimate of the member's raw clock minus ours that
	// mesh time uses: from round trips when the member echoes our clock,
	// from one-way samples otherwise.
	clockMs int64
	// heardUsMs is our raw clock when the member last echoed our clock
	// (a plausible round trip, believed or not): proof that it hears us
	// and counts us a member (it echoes only members it steps). 0: never.
	heardUsMs int64
	oneWay    clockWindow // one-way samples: their Clock − our raw clock at receipt
	rt        clockWindow // round trips (NTP samples) of our batches they echoed
	// fwdMs is the forward delay (member to us) the latest fresh round trip
	// measured: the round-trip estimate minus the one-way one. When round
	// trips go stale (a big mesh echoes each member rarely) the one-way
	// estimate plus fwdMs stands in.
	fwdMs int64

	// owTop is the largest one-way sample of late, sinking by a slack
	// every heartbeat; rtFloor the least round-trip delay of late, rising
	// by a slack every heartbeat (see clockLimits). They mean something
	// once oneWay, rt hold a sample.
	owTop, rtFloor int64

	// The echo we owe the member: the Clock of its least-delayed batch
	// since we last echoed it and our raw clock at its receipt (their
	// difference is its one-way sample, for picking the least delayed).
	echoClock int64
	echoAt    int64
	echoedAt  int64 // our raw clock when we last echoed the member

	// The flags last, together, so they take one word (the member is read
	// on every batch it sends; see member).
	hasClock    bool
	clockRT     bool // clockMs comes from a fresh round trip
	hasFwd      bool // fwdMs holds a measurement
	echoPending bool
	echoQueued  bool // in meshClock.echoQ
	hasEchoed   bool
	caps        caps // the capability flags of its latest batch (caps.go)
}

// oneWayEstimate returns the one-way estimate alone as of the latest
// sample: the least-delayed one-way sample of that sample's epoch and the
// one before.
func (p *peerClock) oneWayEstimate() int64 {
	b, _ := p.oneWay.best(p.oneWay.epoch)
	return b.off
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
//
// A stall longer than the epochs (a batch queued for seconds behind
// housekeeping) would still be believed, so a sample more than a slack
// below the recent top is refused (see clockLimits) and clockSample
// reports false; the estimate then holds.
func (p *peerClock) clockSample(sample, nowMs, epochMs int64, lim clockLimits) bool {
	if p.oneWay.hasCur && sample < p.owTop-lim.slackMs {
		return false
	}
	if !p.oneWay.hasCur || sample > p.owTop {
		p.owTop = sample
	}
	e := floorDiv(nowMs, epochMs)
	p.oneWay.add(clockPoint{off: sample, delay: -sample}, e)
	p.estimate(e)
	return true
}

// rtSample records one round trip: an echo of our batch sent at our raw
// time t1, received by the member at t2 and echoed in its batch sent at t3
// (both its raw clock), which reached us at t4 = nowMs. It reports whether
// the echo was plausible (see roundTrip), and whether its delay was
// believable (see clockLimits): only then is it recorded. Of the round
// trips of the last one to two epochs the one of least delay counts, as
// with one-way samples, but chosen by its measured delay.
//
// The true offset lies within δ/2 of θ, and no one-way sample can exceed
// it: a one-way top above θ + δ/2 is from before the peer's clock stepped
// back, and is lowered to that at once.
func (p *peerClock) rtSample(t1, t2, t3, nowMs, epochMs int64, lim clockLimits) (plausible, ok bool) {
	theta, delta, plausible := roundTrip(t1, t2, t3, nowMs)
	if !plausible {
		return false, true
	}
	bound := lim.maxDelayMs
	if p.rt.hasCur {
		bound = min(bound, p.rtFloor+lim.slackMs)
	}
	if delta > bound {
		return true, false
	}
	if !p.rt.hasCur || delta < p.rtFloor {
		p.rtFloor = delta
	}
	if hi := theta + (delta+1)/2; p.oneWay.hasCur && p.owTop > hi {
		p.owTop = hi
	}
	e := floorDiv(nowMs, epochMs)
	p.rt.add(clockPoint{off: theta, delay: delta}, e)
	p.estimate(e)
	return true, true
}

// estimate sets clockMs at epoch e: the least-delayed fresh round trip
// (never below the one-way estimate, which bounds the offset from below);
// failing that, the one-way estimate plus the forward delay the last round
// trip measured; failing that, the one-way estimate alone.
func (p *peerClock) estimate(e int64) {
	ow, okOW := p.oneWay.best(e)
	rt, okRT := p.rt.best(e)
	p.clockRT = okRT
	switch {
	case okRT && okOW:
		p.clockMs = max(rt.off, ow.off)
		p.fwdMs, p.hasFwd = p.clockMs-ow.off, true
	case okRT:
		p.clockMs = rt.off
	case okOW && p.hasFwd:
		p.clockMs = ow.off + p.fwdMs
	case okOW:
		p.clockMs = ow.off
	default:
		return
	}
	p.hasClock = true
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
func (p *peerClock) noteEcho(clock, nowMs, epochMs int64) bool {
	if !p.echoPending || clock-nowMs >= p.echoClock-p.echoAt || nowMs-p.echoAt >= epochMs {
		p.echoClock, p.echoAt, p.echoPending = clock, nowMs, true
	}
	since := nowMs - p.echoedAt
	return !p.hasEchoed || since < 0 || since >= epochMs/echoesPerEpoch
}

// clockPoint is one clock sample: an offset estimate (ms) and the delay
// that biases it; of two samples the one of less delay is the better.
type clockPoint struct{ off, delay int64 }

// clockWindow keeps the best (least-delayed) sample of the current epoch
// and of the one before it. Its zero value holds nothing.
type clockWindow struct {
	cur, prev clockPoint
	epoch     int64
	hasCur    bool // cur holds a sample
	hasPrev   bool // prev holds the best of epoch-1
}

// add records p taken in epoch e. Within an epoch the least-delayed sample
// (on ties the latest) is kept; a new epoch pushes the current best to
// prev, where it counts for one more epoch.
func (w *clockWindow) add(p clockPoint, e int64) {
	switch {
	case !w.hasCur:
		w.cur, w.epoch, w.hasCur, w.hasPrev = p, e, true, false
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
	if !w.hasCur || w.epoch < e-1 {
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
