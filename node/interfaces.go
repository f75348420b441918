package node

import (
	"context"
	"sort"
	"time"

	"github.com/ratemesh/ratemesh/crdt"
)

// Inbound is one batch a Transport received.
type Inbound struct {
	// Batch has been decoded with crdt.DecodeBatch and validated. Its
	// From is authenticated: the signature-verified author of a gossip
	// message, or the stream's authenticated peer for a direct one.
	Batch *crdt.Batch
	// Direct reports an anti-entropy batch sent to this member alone,
	// rather than a gossip message.
	Direct bool
	// At is when the batch arrived, on the node's clock. The runtime's
	// handler stamps it when the transport leaves it zero, before the
	// batch queues for the run loop: mesh time's samples then measure
	// the path, not the queue (Core.StepReceived).
	At time.Time
}

// Handler receives what a Transport hears.
//
// Calls may come from several goroutines at once and must not block for
// long: the runtime only queues them. The handler owns the batch after the
// call; the transport must not touch it again.
type Handler interface {
	// HandleBatch delivers one received batch.
	HandleBatch(in Inbound)
	// PeerConnected reports a new or re-established connection to peer;
	// the runtime answers with its full state through SendDirect
	// (anti-entropy on connect).
	PeerConnected(peer string)
}

// Transport carries batches between members. The real one is libp2p
// gossipsub (package mesh); tests and the simulator use in-memory ones.
type Transport interface {
	// Start begins delivering to h and returns once the transport can
	// publish.
	Start(ctx context.Context, h Handler) error
	// Publish broadcasts b to every member. The runtime calls it from one
	// goroutine at a time; it must not block past ctx and must not retain
	// b after it returns.
	Publish(ctx context.Context, b *crdt.Batch) error
	// SendDirect sends batches to one peer only, in order (anti-entropy
	// answers).
	SendDirect(ctx context.Context, peer string, bs []*crdt.Batch) error
	// Close stops delivering and leaves the network.
	Close() error
}

// WindowRecord is one slot's values in one window, as persisted.
type WindowRecord struct {
	Rule      string
	Key       string
	WindowMs  int64
	Window    int64
	Slot      crdt.Slot
	Admitted  uint64
	Attempted uint64
}

// CollectAt returns the mesh time in milliseconds from which the record's
// window is collected: its window and the next one have ended.
func (r WindowRecord) CollectAt() int64 { return (r.Window + 2) * r.WindowMs }

// Flush is what one flush persists, written as one batch and synced.
type Flush struct {
	// Windows are the window records that changed since the last flush.
	// Each replaces the saved record of the same (rule, key, window_ms,
	// window, slot) by per-field max, so a counter on disk never goes
	// backwards.
	Windows []WindowRecord
	// Leases are the leases this member owns that were acquired or
	// renewed since the last flush; each replaces the saved lease of the
	// same ID.
	Leases []Lease
	// Released are the IDs of saved leases released or expired since.
	Released []string
	// CollectBeforeMs is mesh time: every saved record with CollectAt at
	// or before it is dropped (garbage collection on disk).
	CollectBeforeMs int64
}

// Empty reports whether f writes and drops nothing but may still collect.
func (f *Flush) Empty() bool {
	return len(f.Windows) == 0 && len(f.Leases) == 0 && len(f.Released) == 0
}

// Store persists what must survive a restart: the member's identity (its
// libp2p private key, marshalled), its incarnation, the merged state of
// its long windows and the leases it owns. The real one is pebble
// (package persistence); MemoryStore serves tests.
//
// The node runtime calls a Store from one goroutine at a time; the
// implementations in this module are nonetheless safe for concurrent use.
// Errors wrap the cause and, for a disk, name the path.
type Store interface {
	// LoadIdentity returns the identity saved, or nil and no error if
	// none has been.
	LoadIdentity(ctx context.Context) ([]byte, error)
	// SaveIdentity persists key durably before it returns.
	SaveIdentity(ctx context.Context, key []byte) error
	// LoadIncarnation returns the last incarnation saved, 0 if none.
	LoadIncarnation(ctx context.Context) (uint64, error)
	// SaveIncarnation persists inc durably before it returns: the member
	// serves under inc only afterwards. A smaller inc than the one saved
	// never replaces it.
	SaveIncarnation(ctx context.Context, inc uint64) error
	// LoadWindows returns every window record saved and not yet
	// collected, sorted by (rule, key, window_ms, window, slot).
	LoadWindows(ctx context.Context) ([]WindowRecord, error)
	// LoadLeases returns every lease saved, sorted by ID; expired ones
	// included (the caller knows the time).
	LoadLeases(ctx context.Context) ([]Lease, error)
	// Flush writes f in one batch and syncs it before it returns.
	Flush(ctx context.Context, f Flush) error
	// LoadPeers returns the members saved by SavePeers, nil if none.
	LoadPeers(ctx context.Context) ([]KnownPeer, error)
	// SavePeers replaces the saved members with peers: a node restarted
	// with no bootstrap address dials them.
	SavePeers(ctx context.Context, peers []KnownPeer) error
	// Close releases the store; later calls fail.
	Close() error
}

// KnownPeer is a member and the full multiaddrs (ending in /p2p/<peer
// ID>) it was reached at, as persisted for a restart.
type KnownPeer struct {
	Peer  string   `json:"peer"`
	Addrs []string `json:"addrs"`
}

// AddrBook is what a Transport may offer for persisting the members'
// addresses: the full multiaddrs it knows for a peer. The runtime saves
// the live members' addresses to the Store with each flush when its
// Transport implements it.
type AddrBook interface {
	KnownAddrs(peer string) []string
}

// SortWindowRecords sorts recs by (rule, key, window_ms, window, slot): the
// order Store.LoadWindows returns.
func SortWindowRecords(recs []WindowRecord) {
	sort.Slice(recs, func(i, j int) bool {
		a, b := recs[i], recs[j]
		switch {
		case a.Rule != b.Rule:
			return a.Rule < b.Rule
		case a.Key != b.Key:
			return a.Key < b.Key
		case a.WindowMs != b.WindowMs:
			return a.WindowMs < b.WindowMs
		case a.Window != b.Window:
			return a.Window < b.Window
		case a.Slot.Peer != b.Slot.Peer:
			return a.Slot.Peer < b.Slot.Peer
		}
		return a.Slot.Incarnation < b.Slot.Incarnation
	})
}
