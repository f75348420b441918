package node

import (
	"context"
	"errors"
	"sort"
	"sync"

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

// Store persists what must survive a restart: the incarnation, and the
// merged state of long windows. The real one is pebble (package
// persistence); MemoryStore serves tests.
//
// A Store is used from one goroutine at a time.
type Store interface {
	// LoadIncarnation returns the last incarnation saved, 0 if none.
	LoadIncarnation(ctx context.Context) (uint64, error)
	// SaveIncarnation persists inc durably before it returns: the member
	// serves under inc only afterwards.
	SaveIncarnation(ctx context.Context, inc uint64) error
	// LoadWindows returns every window record saved and not yet
	// collected.
	LoadWindows(ctx context.Context) ([]WindowRecord, error)
	// SaveWindows writes recs in one batch, replacing earlier values of
	// the same (rule, key, window_ms, window, slot) by per-field max,
	// drops every record collected at collectBeforeMs (mesh time: its
	// window and the next one have ended), and syncs.
	SaveWindows(ctx context.Context, recs []WindowRecord, collectBeforeMs int64) error
	// Close releases the store.
	Close() error
}

// ErrStoreClosed is returned by a closed MemoryStore.
var ErrStoreClosed = errors.New("node: store closed")

type recKey struct {
	rule, key        string
	windowMs, window int64
	slot             crdt.Slot
}

// MemoryStore is a Store in memory: it survives a Core, not a process. The
// zero value is ready to use and safe for concurrent use.
type MemoryStore struct {
	mu     sync.Mutex
	inc    uint64
	recs   map[recKey]WindowRecord
	closed bool
}

var _ Store = (*MemoryStore)(nil)

// LoadIncarnation implements Store.
func (s *MemoryStore) LoadIncarnation(context.Context) (uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return 0, ErrStoreClosed
	}
	return s.inc, nil
}

// SaveIncarnation implements Store.
func (s *MemoryStore) SaveIncarnation(_ context.Context, inc uint64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrStoreClosed
	}
	s.inc = max(s.inc, inc)
	return nil
}

// LoadWindows implements Store; records come sorted.
func (s *MemoryStore) LoadWindows(context.Context) ([]WindowRecord, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, ErrStoreClosed
	}
	out := make([]WindowRecord, 0, len(s.recs))
	for _, r := range s.recs {
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
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
	return out, nil
}

// SaveWindows implements Store. Values merge by max, like the counters.
func (s *MemoryStore) SaveWindows(_ context.Context, recs []WindowRecord, collectBeforeMs int64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrStoreClosed
	}
	if s.recs == nil {
		s.recs = make(map[recKey]WindowRecord)
	}
	for _, r := range recs {
		k := recKey{r.Rule, r.Key, r.WindowMs, r.Window, r.Slot}
		old := s.recs[k]
		r.Admitted, r.Attempted = max(r.Admitted, old.Admitted), max(r.Attempted, old.Attempted)
		s.recs[k] = r
	}
	for k, r := range s.recs {
		if (r.Window+2)*r.WindowMs <= collectBeforeMs {
			delete(s.recs, k)
		}
	}
	return nil
}

// Close implements Store.
func (s *MemoryStore) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	return nil
}
