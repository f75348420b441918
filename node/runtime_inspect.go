package node

import (
	"time"
)

// Usage reports what this member knows of (rule, key) now: the merged
// usage of the current window, per slot, or the live leases.
func (n *Node) Usage(rule, key string) (UsageReport, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return UsageReport{}, ErrClosed
	}
	return n.core.Usage(n.readClock(), rule, key)
}

// UsageOfWindow reports what this member holds of (rule, key) in the
// rule's window of index window (Core.UsageOfWindow).
func (n *Node) UsageOfWindow(rule, key string, window int64) (UsageReport, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return UsageReport{}, ErrClosed
	}
	return n.core.UsageOfWindow(n.readClock(), rule, key, window)
}

// Peers returns every member this member knows, itself included, sorted
// by peer ID; nil after Close.
func (n *Node) Peers() []PeerInfo {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return nil
	}
	return n.core.Peers(n.readClock())
}

// Evict removes a silent member at once (see Core.Evict): what `ratemesh
// peers evict` asks for, under the strict policy, of a member known to be
// gone for good.
func (n *Node) Evict(peer string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return ErrClosed
	}
	return n.core.Evict(n.readClock(), peer)
}

// Stats returns a copy of the core's counters.
func (n *Node) Stats() Stats {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.core.Stats()
}

// Offset returns the member's estimated clock offset to the mesh.
func (n *Node) Offset() time.Duration {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.core.Offset()
}

// Incarnation returns the member's current incarnation: the one Start
// took, or a newer one after an eviction.
func (n *Node) Incarnation() uint64 {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.core.Self().Incarnation
}
