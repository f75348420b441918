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
	// Flags are the capability flags the member's latest batch announced
	// (crdt.FlagEcho, crdt.FlagRepairs, crdt.FlagSkipsUnknown; for self,
	// those this member sets): during a rolling upgrade, a member without
	// crdt.FlagSkipsUnknown runs a release from before issue 25, which
	// refuses any field it does not know (docs/design.md, "Wire
	// compatibility").
	Flags uint64
}

// member is another member as this one knows it: its identity and
// standing (membership.go), the gossip stream received from it (inStream,
// acks.go) and its clock (peerClock, meshclock.go).
//
// Step reads and writes nearly all of a member for every batch it hears,
// and a replica of a big mesh holds its members in more memory than the
// CPU caches: each cache line of the struct is a miss. Its fields are
// ordered so no padding adds a line, and it fits a 320-byte size class,
// whose objects start on a cache line (TestMemberLayout).
type member struct {
	peer      string
	inc       uint64
	slot      crdt.SlotID
	tag       uint32 // crdt.PeerTag(peer): echoes of its clock carry it
	lastHeard time.Time
	rulesHash uint64
	state     State
	evicted   bool
	// suspectServing: suspect as of this member's last membership pass
	// while not fenced (noteFence). Frozen while fenced, it tells the
	// members it decided without before the fence from those whose
	// silence fenced it.
	suspectServing bool
	// atKeyBudget: at its key budget (Core.overKeyBudget); charge is the
	// account the keys its entries make here are charged to
	// (crdt.RuleSet.EnsureCharged; 0 until it makes one).
	atKeyBudget bool
	charge      uint32

	inStream
	peerClock
}

func (m *member) live() bool { return m.state == Alive || m.state == Suspect }

// slotMeta links a slot to its member, so lease counts of retired slots can
// be excluded.
type slotMeta struct {
	m   *member // nil for our own slots
	inc uint64
}
