package crdt

import (
	"errors"
	"fmt"
	"unicode/utf8"

	"github.com/fxamacker/cbor/v2"
)

// Version is the wire format version written into every Batch. A decoder
// refuses any other: a new version is a wire this one cannot read, and
// travels on its own topic and streams (docs/design.md, "Wire
// compatibility"). Adding a field is not a new version.
const Version = 1

// Bounds on a decoded batch. A batch beyond any of them is refused whole.
const (
	MaxBatchBytes = 1 << 20 // encoded size; gossipsub's default message cap
	MaxEntries    = 4096    // window plus lease entries
	MaxKeyLen     = 256     // bytes of a key
	MaxRuleLen    = 128     // bytes of a rule name
	MaxPeerLen    = 128     // bytes of a peer ID
	MaxSlots      = 256     // extra slots named by one batch
	MaxNacks      = 1024
	MaxEvicted    = 1024
	MaxEchoes     = 16   // clock echoes of one batch (a node sends a few)
	MaxRepairs    = 1024 // repaired batches named by one batch
	MaxMembers    = 1024 // member table entries of one full-state batch
	MaxAddrs      = 16   // addresses of one member table entry
	MaxAddrLen    = 256  // bytes of one address
	// MaxEchoHeldMs bounds an echo's Held: a node echoes a peer's clock
	// within a few heartbeats or not at all.
	MaxEchoHeldMs = 60_000
	// MaxWindowMs is the longest window: a year of milliseconds.
	MaxWindowMs = 366 * 24 * 3600 * 1000
	// MaxValue bounds every counter value, so sums and differences stay
	// exact in int64 and float64 arithmetic.
	MaxValue   = 1 << 53
	maxNesting = 6
)

// Flags of a Batch.
const (
	// FlagFull marks an anti-entropy batch: every live value of the
	// sender's own slot and its member table (Batch.Members), not just
	// changes; with FlagRelay, every live slot the sender holds.
	FlagFull uint64 = 1 << iota
	// FlagLeaving announces a graceful leave: the sender stops counting
	// as a member at once.
	FlagLeaving
	// FlagLast marks the last batch of a multi-batch full state.
	FlagLast
	// FlagEcho announces that the sender understands Batch.Echoes. A peer
	// echoes clocks only once every live member has announced it, since a
	// decoder that predates Echoes refuses a batch carrying them (unknown
	// field) while it ignores an unknown flag.
	FlagEcho
	// FlagWant, on a full state, asks the receiver for a relay: the
	// sender is joining, restarting or fenced and needs the receiver's
	// whole view, not only its own slot.
	FlagWant
	// FlagRelay marks a full state that relays every live slot its
	// sender holds — other members', dead and left members', earlier
	// incarnations' (Batch.Slots) — the answer to FlagWant.
	FlagRelay
	// FlagRepairs announces that the sender understands Batch.Repairs. A
	// member tags the entries it publishes again for a nack only once
	// every live member has announced it (a decoder that predates Repairs
	// refuses a batch carrying them); until then it publishes them
	// untagged, for every receiver to merge.
	FlagRepairs
	// FlagSkipsUnknown announces a decoder that skips fields it does not
	// know (DecodeBatch since issue 25) instead of refusing the batch.
	// Decoders before it refuse any field added after them, so a sender
	// adds a new field only once every receiver has announced this flag,
	// or the field's own (docs/design.md, "Wire compatibility").
	FlagSkipsUnknown
)

// ErrMalformed wraps every decoding and validation failure.
var ErrMalformed = errors.New("crdt: malformed batch")

// Batch is the unit that travels between peers: a header that describes the
// sender, its clock and what it has merged from the others, and the absolute
// values of slots that changed. Applying a batch twice, late or out of order
// changes nothing.
type Batch struct {
	Version uint64 `cbor:"0,keyasint"`
	// From is the sender's slot; entries with Slot 0 are From's.
	From Slot `cbor:"1,keyasint"`
	// Seq increases by one with every batch the slot sends.
	Seq uint64 `cbor:"2,keyasint"`
	// Sent is the sender's mesh time in Unix milliseconds when it built
	// the batch; Clock is its raw clock at the same moment (for offset
	// estimation).
	Sent  int64 `cbor:"3,keyasint"`
	Clock int64 `cbor:"4,keyasint"`
	// RulesHash identifies the sender's rule configuration.
	RulesHash uint64 `cbor:"5,keyasint,omitempty"`
	// Ack is the sender's acknowledgement watermark: it has merged every
	// batch sent at or before this mesh time by every member it holds
	// alive, except those listed in Nacks.
	Ack int64 `cbor:"6,keyasint,omitempty"`
	// Nacks lists batches the sender found missing (a gap in a peer's
	// sequence numbers), so their authors re-send what they carried.
	Nacks []Nack `cbor:"7,keyasint,omitempty"`
	Flags uint64 `cbor:"8,keyasint,omitempty"`
	// Slots names further slots that entries refer to as 1, 2, …; only
	// full-state (anti-entropy) batches relaying the state of other slots
	// use it.
	Slots   []Slot        `cbor:"9,keyasint,omitempty"`
	Windows []WindowEntry `cbor:"10,keyasint,omitempty"`
	Leases  []LeaseEntry  `cbor:"11,keyasint,omitempty"`
	// Evicted lists slots the sender has evicted from its membership, so
	// an evicted node that comes back learns it.
	Evicted []Slot `cbor:"12,keyasint,omitempty"`
	// Echoes return a few peers' Clock to them, so each can measure a
	// round trip to the sender (see Echo). Only gossip batches of senders
	// that set FlagEcho carry them.
	Echoes []Echo `cbor:"13,keyasint,omitempty"`
	// Members is the sender's member table (itself excluded), carried by
	// full-state batches only, so a joining or restarted member learns of
	// every member at once, counts them in N and can dial them.
	Members []MemberEntry `cbor:"14,keyasint,omitempty"`
	// Repairs tags the last window entries as published again because a
	// member nacked an earlier batch: in order, Repairs[0].N entries
	// repair batch Repairs[0].Seq, the next Repairs[1].N entries batch
	// Repairs[1].Seq, and so on, after the Fresh() untagged ones. A
	// receiver that merged the repaired batch itself may skip them: they
	// carry what that batch carried, raised to the sender's current value,
	// and every raise since went out in a later batch of its own.
	Repairs []Repair `cbor:"15,keyasint,omitempty"`
}

// Repair names a batch of the sender's (Seq) and how many window entries
// (N) publish its values again. It encodes as a two-element array.
type Repair struct {
	_   struct{} `cbor:",toarray"`
	Seq uint64
	N   uint32
}

// Fresh returns how many window entries, from the first, are not tagged as
// repairs (Batch.Repairs).
func (b *Batch) Fresh() int {
	n := len(b.Windows)
	for _, r := range b.Repairs {
		n -= int(r.N)
	}
	return n
}

// MemberEntry is one member as the sender of a full state knows it. It
// encodes as a four-element array.
type MemberEntry struct {
	_           struct{} `cbor:",toarray"`
	Peer        string
	Incarnation uint64
	// State is the member's state in the sender's view: MemberAlive,
	// MemberSuspect, MemberDead or MemberLeft.
	State uint8
	// Addrs are multiaddrs the member was reached at (filled in by the
	// transport; may be empty).
	Addrs []string
}

// The states of a MemberEntry.
const (
	MemberAlive uint8 = iota
	MemberSuspect
	MemberDead
	MemberLeft
)

// Echo returns one peer's clock reading to it. The peer sent a batch with
// Clock t1 (its raw clock); the echo's sender received it at t2 and sends
// this echo in a batch whose Clock is t3 (t2 and t3 on the echo's sender's
// raw clock); the peer receives that batch at t4 and has the four
// timestamps of an NTP exchange: offset ((t2 − t1) + (t3 − t4)) / 2 and
// round-trip delay (t4 − t1) − (t3 − t2), free of the one-way latency a
// bare Clock carries.
//
// The timestamps travel relative to the carrying batch's Clock, as small
// numbers: t1 = Clock − Ago and t2 = Clock − Held. An Echo encodes as a
// three-element array, typically 10 to 12 bytes.
type Echo struct {
	_ struct{} `cbor:",toarray"`
	// Peer names the echoed peer by PeerTag of its peer ID: a 32-bit tag,
	// not the ID, to keep an echo small. Tags of two members of a
	// thousand-node mesh collide with a probability of about 1e-4; a
	// colliding echo is taken for a round trip by the wrong peer only if
	// its timestamps fit that peer's own clock.
	Peer uint32
	// Ago is the carrying batch's Clock minus the echoed Clock (t3 − t1).
	Ago int64
	// Held is how long the sender held the echo, in ms of its raw clock:
	// the carrying batch's Clock minus its raw clock when the echoed batch
	// arrived (t3 − t2). At most MaxEchoHeldMs.
	Held uint32
}

// PeerTag returns the 32-bit tag (FNV-1a) an Echo names peer by.
func PeerTag(peer string) uint32 {
	h := uint32(2166136261)
	for i := 0; i < len(peer); i++ {
		h ^= uint32(peer[i])
		h *= 16777619
	}
	return h
}

// Nack names one missing batch of one slot.
type Nack struct {
	Slot Slot   `cbor:"0,keyasint"`
	Seq  uint64 `cbor:"1,keyasint"`
}

// WindowEntry is one slot's absolute values in one window.
type WindowEntry struct {
	Slot      uint32 `cbor:"0,keyasint,omitempty"` // 0 = Batch.From, i = Batch.Slots[i-1]
	Rule      string `cbor:"1,keyasint"`
	Key       string `cbor:"2,keyasint"`
	WindowMs  int64  `cbor:"3,keyasint"`
	Window    int64  `cbor:"4,keyasint"`
	Admitted  uint64 `cbor:"5,keyasint,omitempty"`
	Attempted uint64 `cbor:"6,keyasint,omitempty"`
}

// LeaseEntry is one slot's absolute lease counts for one (rule, key).
type LeaseEntry struct {
	Slot     uint32 `cbor:"0,keyasint,omitempty"`
	Rule     string `cbor:"1,keyasint"`
	Key      string `cbor:"2,keyasint"`
	Acquired uint64 `cbor:"3,keyasint,omitempty"`
	Released uint64 `cbor:"4,keyasint,omitempty"`
}

// SlotOf returns the slot an entry's slot index names.
func (b *Batch) SlotOf(i uint32) Slot {
	if i == 0 {
		return b.From
	}
	return b.Slots[i-1]
}

// Has reports whether flag is set.
func (b *Batch) Has(flag uint64) bool { return b.Flags&flag != 0 }

var (
	encMode cbor.EncMode
	decMode cbor.DecMode
)

func init() {
	var err error
	encMode, err = cbor.EncOptions{Sort: cbor.SortNone}.EncMode()
	if err != nil {
		panic(err)
	}
	decMode, err = cbor.DecOptions{
		DupMapKey:        cbor.DupMapKeyEnforcedAPF,
		IndefLength:      cbor.IndefLengthForbidden,
		TagsMd:           cbor.TagsForbidden,
		MaxNestedLevels:  maxNesting,
		MaxArrayElements: MaxEntries,
		MaxMapPairs:      maxMapPairs,
		UTF8:             cbor.UTF8RejectInvalid,
		IntDec:           cbor.IntDecConvertNone,
		// Unknown keys are skipped, not refused (no
		// ExtraDecErrorUnknownField): checkKeys bounds them.
	}.DecMode()
	if err != nil {
		panic(err)
	}
}

// Encode returns the CBOR encoding of b. It validates b first, so what it
// encodes always decodes.
func (b *Batch) Encode() ([]byte, error) {
	if err := b.Validate(); err != nil {
		return nil, err
	}
	data, err := encMode.Marshal(b)
	if err != nil {
		return nil, fmt.Errorf("crdt: encode batch: %w", err)
	}
	if len(data) > MaxBatchBytes {
		return nil, fmt.Errorf("%w: %d bytes, over the %d-byte cap", ErrMalformed, len(data), MaxBatchBytes)
	}
	return data, nil
}

// DecodeBatch decodes and validates one batch. It is strict on what it
// knows and bounded: a known field of the wrong type, a map key that is not
// an unsigned integer, duplicate map keys, indefinite lengths, tags,
// nesting beyond a few levels, more than MaxEntries entries, an oversized
// input or key, or any value that fails Validate return an error wrapping
// ErrMalformed. What a later version added — up to MaxUnknownKeys unknown
// integer keys in each map, up to MaxExtraElements trailing elements in
// each array-encoded entry — is skipped (wire.go). It never panics.
func DecodeBatch(data []byte) (*Batch, error) {
	if len(data) > MaxBatchBytes {
		return nil, fmt.Errorf("%w: %d bytes, over the %d-byte cap", ErrMalformed, len(data), MaxBatchBytes)
	}
	var b Batch
	data, err := prepare(data)
	if _, policy := err.(*policyError); policy {
		return nil, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	if uerr := decMode.Unmarshal(data, &b); uerr != nil {
		return nil, fmt.Errorf("%w: %v", ErrMalformed, uerr)
	}
	if err != nil { // the walk found malformed CBOR the decoder took
		return nil, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	if err := b.Validate(); err != nil {
		return nil, err
	}
	return &b, nil
}

// Validate checks the invariants every batch must hold, naming the field
// that breaks one.
func (b *Batch) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrMalformed}, args...)...)
	}
	if b.Version != Version {
		return bad("version %d, want %d", b.Version, Version)
	}
	if err := checkSlot(b.From); err != nil {
		return bad("from: %v", err)
	}
	if n := len(b.Windows) + len(b.Leases); n > MaxEntries {
		return bad("%d entries, over the cap of %d", n, MaxEntries)
	}
	if len(b.Slots) > MaxSlots {
		return bad("%d slots, over the cap of %d", len(b.Slots), MaxSlots)
	}
	if len(b.Nacks) > MaxNacks {
		return bad("%d nacks, over the cap of %d", len(b.Nacks), MaxNacks)
	}
	if len(b.Evicted) > MaxEvicted {
		return bad("%d evicted slots, over the cap of %d", len(b.Evicted), MaxEvicted)
	}
	if len(b.Echoes) > MaxEchoes {
		return bad("%d echoes, over the cap of %d", len(b.Echoes), MaxEchoes)
	}
	if len(b.Repairs) > MaxRepairs {
		return bad("%d repairs, over the cap of %d", len(b.Repairs), MaxRepairs)
	}
	tagged := 0
	for i, r := range b.Repairs {
		switch {
		case r.Seq == 0 || r.Seq >= b.Seq:
			return bad("repairs[%d]: seq %d, must be within 1 and the batch's seq %d minus 1", i, r.Seq, b.Seq)
		case r.N == 0:
			return bad("repairs[%d]: repairs no entry", i)
		}
		tagged += int(r.N)
		if tagged > len(b.Windows) {
			return bad("repairs[%d]: tags %d entries in all, more than the batch's %d window entries", i, tagged, len(b.Windows))
		}
	}
	if len(b.Repairs) > 0 && b.Has(FlagFull) {
		return bad("repairs: a full-state batch carries no repairs")
	}
	if len(b.Members) > MaxMembers {
		return bad("%d members, over the cap of %d", len(b.Members), MaxMembers)
	}
	for i, m := range b.Members {
		if err := checkSlot(Slot{Peer: m.Peer}); err != nil {
			return bad("members[%d]: %v", i, err)
		}
		if m.State > MemberLeft {
			return bad("members[%d]: state %d, must be 0 to %d", i, m.State, MemberLeft)
		}
		if len(m.Addrs) > MaxAddrs {
			return bad("members[%d]: %d addrs, over the cap of %d", i, len(m.Addrs), MaxAddrs)
		}
		for j, a := range m.Addrs {
			if a == "" || len(a) > MaxAddrLen || !utf8.ValidString(a) {
				return bad("members[%d].addrs[%d]: must be 1 to %d bytes of UTF-8", i, j, MaxAddrLen)
			}
		}
	}
	if len(b.Members) > 0 && !b.Has(FlagFull) {
		return bad("members: only a full-state batch carries a member table")
	}
	for i, e := range b.Echoes {
		switch {
		case e.Held > MaxEchoHeldMs:
			return bad("echoes[%d]: held %d ms, over the maximum %d", i, e.Held, MaxEchoHeldMs)
		case e.Ago > MaxValue || e.Ago < -MaxValue:
			return bad("echoes[%d]: ago %d ms out of range", i, e.Ago)
		}
	}
	for i, s := range b.Slots {
		if err := checkSlot(s); err != nil {
			return bad("slots[%d]: %v", i, err)
		}
	}
	for i, n := range b.Nacks {
		if err := checkSlot(n.Slot); err != nil {
			return bad("nacks[%d]: %v", i, err)
		}
	}
	for i, s := range b.Evicted {
		if err := checkSlot(s); err != nil {
			return bad("evicted[%d]: %v", i, err)
		}
	}
	for i := range b.Windows {
		e := &b.Windows[i]
		if err := checkEntry(e.Slot, e.Rule, e.Key, len(b.Slots)); err != nil {
			return bad("windows[%d]: %v", i, err)
		}
		switch {
		case e.WindowMs <= 0 || e.WindowMs > MaxWindowMs:
			return bad("windows[%d]: window_ms %d, must be within 1 and %d", i, e.WindowMs, int64(MaxWindowMs))
		case e.Attempted > MaxValue:
			return bad("windows[%d]: attempted %d over the maximum %d", i, e.Attempted, uint64(MaxValue))
		case e.Window < 0:
			return bad("windows[%d]: window %d, must not be negative", i, e.Window)
		case e.Window > (1<<62)/e.WindowMs:
			return bad("windows[%d]: window %d out of range", i, e.Window)
		case e.Attempted < e.Admitted:
			return bad("windows[%d]: attempted %d below admitted %d", i, e.Attempted, e.Admitted)
		}
	}
	for i := range b.Leases {
		e := &b.Leases[i]
		if err := checkEntry(e.Slot, e.Rule, e.Key, len(b.Slots)); err != nil {
			return bad("leases[%d]: %v", i, err)
		}
		if e.Acquired > MaxValue {
			return bad("leases[%d]: acquired %d over the maximum %d", i, e.Acquired, uint64(MaxValue))
		}
		if e.Released > e.Acquired {
			return bad("leases[%d]: released %d above acquired %d", i, e.Released, e.Acquired)
		}
	}
	return nil
}

func checkSlot(s Slot) error {
	if s.Peer == "" {
		return errors.New("empty peer")
	}
	if len(s.Peer) > MaxPeerLen {
		return fmt.Errorf("peer of %d bytes, over %d", len(s.Peer), MaxPeerLen)
	}
	if !utf8.ValidString(s.Peer) {
		return errors.New("peer is not UTF-8")
	}
	return nil
}

func checkEntry(slot uint32, rule, key string, slots int) error {
	switch {
	case int(slot) > slots:
		return fmt.Errorf("slot %d names no slot (batch has %d)", slot, slots)
	case rule == "":
		return errors.New("empty rule")
	case len(rule) > MaxRuleLen:
		return fmt.Errorf("rule of %d bytes, over %d", len(rule), MaxRuleLen)
	case key == "":
		return errors.New("empty key")
	case len(key) > MaxKeyLen:
		return fmt.Errorf("key of %d bytes, over %d", len(key), MaxKeyLen)
	case !utf8.ValidString(rule):
		return errors.New("rule is not UTF-8")
	case !utf8.ValidString(key):
		return errors.New("key is not UTF-8")
	}
	return nil
}
