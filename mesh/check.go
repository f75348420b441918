package mesh

import (
	"fmt"

	"github.com/ratemesh/ratemesh/crdt"
)

// Reason says why a received message was refused: a gossip message, a
// batch on the sync stream, a request on the forward stream. Every refusal
// is counted by its Reason (Stats.RefusedMessages; the metric
// ratemesh_messages_refused_total{reason}) and logged at most once per
// reason every refusalLogEvery, with the count of those not logged.
type Reason int

// Reasons a received message is refused. The validator answers Reject
// (the sender is penalised and the message not forwarded) for every one.
const (
	// ReasonOversize: the encoded batch exceeds MaxMessageBytes, or a
	// gossipsub RPC exceeds the router's message cap (MaxMessageBytes +
	// 64 KiB; gossipsub resets the stream, see sizeHost), or a sync
	// stream carries more than MaxSyncBatches batches.
	ReasonOversize Reason = iota
	// ReasonMalformed: the strict decoder refused it.
	ReasonMalformed
	// ReasonAuthor: its From is not the authenticated author (the
	// message's signer, or the sync stream's remote peer).
	ReasonAuthor
	// ReasonForeignSlot: an entry names a slot other than From, or a
	// batch carries a member table, outside a full state on the
	// anti-entropy stream: gossip carries only its author's own values.
	ReasonForeignSlot
	// ReasonImplausible: a value exceeds any possible admission
	// (Config.Plausible).
	ReasonImplausible
	// ReasonNotMember: the message's signed author, or the stream's
	// remote peer, is not on the allowlist (Config.AllowPeers and its
	// companions).
	ReasonNotMember
	// ReasonBadSignature: a gossip message without a signature, or whose
	// signature gossipsub could not verify (pubsub's own refusal, seen by
	// the tracer of a Mesh built by New), or one claiming to be from this
	// member though another peer sent it.
	ReasonBadSignature
	// ReasonTableBudget: a member table entry this member did not dial
	// because the suggested dials are at their budget (learnAddrs): a
	// table is its sender's word, and an invented peer costs a dial. The
	// node core may report its own with AddRefused.
	ReasonTableBudget
	// NumReasons is the number of reasons, for arrays indexed by Reason.
	NumReasons
)

// String returns the reason's metric label.
func (r Reason) String() string {
	switch r {
	case ReasonOversize:
		return "oversize"
	case ReasonMalformed:
		return "malformed"
	case ReasonAuthor:
		return "forged_author"
	case ReasonForeignSlot:
		return "foreign_slot"
	case ReasonImplausible:
		return "implausible"
	case ReasonNotMember:
		return "not_member"
	case ReasonBadSignature:
		return "bad_signature"
	case ReasonTableBudget:
		return "table_budget"
	}
	return fmt.Sprintf("reason(%d)", int(r))
}

// ParseReason returns the Reason whose label (Reason.String) is s.
func ParseReason(s string) (Reason, bool) {
	for r := range NumReasons {
		if r.String() == s {
			return r, true
		}
	}
	return 0, false
}

// ConnReason says why the connection gater refused a connection.
type ConnReason int

// Reasons a connection is refused (Stats.RefusedConns; the metric
// ratemesh_connections_refused_total{reason}).
const (
	// ConnBlocked: the peer is blocked (Mesh.Block).
	ConnBlocked ConnReason = iota
	// ConnNotMember: the peer is not on the allowlist.
	ConnNotMember
	// NumConnReasons is the number of connection reasons.
	NumConnReasons
)

// String returns the reason's metric label.
func (r ConnReason) String() string {
	switch r {
	case ConnBlocked:
		return "blocked"
	case ConnNotMember:
		return "not_member"
	}
	return fmt.Sprintf("conn_reason(%d)", int(r))
}

// relaysNonMember returns the first peer other than b's author that a
// full state relays — in its Slots or its member table — and allowed
// refuses. It is pure.
func relaysNonMember(b *crdt.Batch, allowed func(peerID string) bool) (string, bool) {
	for i := range b.Slots {
		if p := b.Slots[i].Peer; !allowed(p) {
			return p, true
		}
	}
	for i := range b.Members {
		if p := b.Members[i].Peer; !allowed(p) {
			return p, true
		}
	}
	return "", false
}

// checkBatch decides whether b, authenticated as sent by author (a peer ID
// in text form), may be merged: From must be the author and no value may
// exceed plausible. Unless relay is set, every entry must be From's own
// (slot index 0) and b may carry no member table; relay is set for a full
// state on the anti-entropy stream, which relays the sender's view of
// other slots as a trusted member's word (see the trust model in
// docs/design.md: merge is per-slot max, so a relayed value can only make
// counts higher, and plausible bounds how much higher). It is pure; the
// verdict is ok or the reason with a description.
func checkBatch(b *crdt.Batch, author string, plausible func(string) (uint64, bool), relay bool) (Reason, error) {
	if b.From.Peer != author {
		return ReasonAuthor, fmt.Errorf("from %q is not the authenticated author %s", b.From.Peer, author)
	}
	if !relay && len(b.Members) > 0 {
		return ReasonForeignSlot, fmt.Errorf("a member table outside a full state on the sync stream")
	}
	for i := range b.Windows {
		e := &b.Windows[i]
		if e.Slot != 0 && !relay {
			return ReasonForeignSlot, fmt.Errorf("windows[%d] names slot %d, not the author's", i, e.Slot)
		}
		if plausible == nil {
			continue
		}
		if max, ok := plausible(e.Rule); ok && e.Admitted > max {
			return ReasonImplausible, fmt.Errorf("windows[%d]: rule %q admitted %d, above any possible %d", i, e.Rule, e.Admitted, max)
		}
	}
	for i := range b.Leases {
		e := &b.Leases[i]
		if e.Slot != 0 && !relay {
			return ReasonForeignSlot, fmt.Errorf("leases[%d] names slot %d, not the author's", i, e.Slot)
		}
		if plausible == nil {
			continue
		}
		// Validate guarantees Released <= Acquired.
		if max, ok := plausible(e.Rule); ok && e.Acquired-e.Released > max {
			return ReasonImplausible, fmt.Errorf("leases[%d]: rule %q holds %d live leases, above any possible %d", i, e.Rule, e.Acquired-e.Released, max)
		}
	}
	return 0, nil
}
