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
	// ClockOffset is the member's raw clock minus this member's, as last
	// measured (latency included).
	ClockOffset time.Duration
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
	gaps      []uint64
	clockMs   int64 // raw clock offset estimate: the least-delayed recent sample (see clockSample)
	hasClock  bool

	// The windowed maximum behind clockMs: the largest sample of the
	// current clock epoch and of the one before it.
	clockCur, clockPrev int64
	clockEpoch          int64
	hasPrev             bool
}

// clockSample records one raw clock sample (their Clock − our raw clock at
// receipt, in ms) taken at our raw time nowMs, with epochs of epochMs.
//
// A sample is the true offset minus the batch's one-way delay, so a single
// sample runs behind by however long the batch queued; on a loaded host
// that is hundreds of milliseconds, and members whose estimates differ by
// their queueing open windows apart. The least-delayed sample is the best
// estimate, so clockMs is the largest sample of the last one to two epochs:
// a slow batch never drags it down, and a real change of the peer's clock
// shows within two epochs.
func (m *member) clockSample(sample, nowMs, epochMs int64) {
	e := nowMs / epochMs
	switch {
	case !m.hasClock:
		m.clockCur, m.clockEpoch, m.hasPrev = sample, e, false
	case e == m.clockEpoch:
		m.clockCur = max(m.clockCur, sample)
	default:
		m.clockPrev, m.hasPrev = m.clockCur, e == m.clockEpoch+1
		m.clockCur, m.clockEpoch = sample, e
	}
	m.clockMs, m.hasClock = m.clockCur, true
	if m.hasPrev {
		m.clockMs = max(m.clockCur, m.clockPrev)
	}
}

func (m *member) live() bool { return m.state == Alive || m.state == Suspect }

// slotMeta links a slot to its member, so lease counts of retired slots can
// be excluded.
type slotMeta struct {
	m   *member // nil for our own slots
	inc uint64
}
