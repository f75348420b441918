package mesh

import (
	"fmt"

	"github.com/ratemesh/ratemesh/crdt"
)

// Reason says why a received batch was refused.
type Reason int

// Reasons a received batch is refused. The validator answers Reject (the
// sender is penalised and the message not forwarded) for every one.
const (
	// ReasonOversize: the encoded batch exceeds MaxMessageBytes.
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
		return "author"
	case ReasonForeignSlot:
		return "foreign_slot"
	case ReasonImplausible:
		return "implausible"
	}
	return fmt.Sprintf("reason(%d)", int(r))
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
