package node

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"sort"
	"sync"

	"github.com/ratemesh/ratemesh/crdt"
)

// ErrStoreClosed is returned by a closed MemoryStore.
var ErrStoreClosed = errors.New("node: store closed")

type recKey struct {
	rule, key        string
	windowMs, window int64
	slot             crdt.Slot
}

// MemoryStore is a Store in memory: it survives a Node, not a process. The
// zero value is ready to use and safe for concurrent use.
type MemoryStore struct {
	mu       sync.Mutex
	identity []byte
	inc      uint64
	recs     map[recKey]WindowRecord
	// collectAt is the least CollectAt of recs (0: none held, or not
	// known): a flush before it has nothing to collect and walks nothing.
	collectAt int64
	leases    map[string]Lease
	peers     []KnownPeer
	flushes   int
	closed    bool
}

// LoadPeers implements Store.
func (s *MemoryStore) LoadPeers(context.Context) ([]KnownPeer, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, ErrStoreClosed
	}
	return cloneKnown(s.peers), nil
}

// SavePeers implements Store.
func (s *MemoryStore) SavePeers(_ context.Context, peers []KnownPeer) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrStoreClosed
	}
	s.peers = cloneKnown(peers)
	return nil
}

func cloneKnown(ps []KnownPeer) []KnownPeer {
	out := make([]KnownPeer, len(ps))
	for i, p := range ps {
		out[i] = KnownPeer{Peer: p.Peer, Addrs: slices.Clone(p.Addrs)}
	}
	return out
}

var _ Store = (*MemoryStore)(nil)

// LoadIdentity implements Store.
func (s *MemoryStore) LoadIdentity(context.Context) ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, ErrStoreClosed
	}
	return bytes.Clone(s.identity), nil
}

// SaveIdentity implements Store.
func (s *MemoryStore) SaveIdentity(_ context.Context, key []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrStoreClosed
	}
	s.identity = bytes.Clone(key)
	return nil
}

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
	SortWindowRecords(out)
	return out, nil
}

// LoadLeases implements Store; leases come sorted by ID.
func (s *MemoryStore) LoadLeases(context.Context) ([]Lease, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, ErrStoreClosed
	}
	out := make([]Lease, 0, len(s.leases))
	for _, l := range s.leases {
		out = append(out, l)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// Flush implements Store. Values merge by max, like the counters.
func (s *MemoryStore) Flush(_ context.Context, f Flush) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrStoreClosed
	}
	if s.recs == nil {
		s.recs = make(map[recKey]WindowRecord)
		s.leases = make(map[string]Lease)
	}
	for _, r := range f.Windows {
		k := recKey{r.Rule, r.Key, r.WindowMs, r.Window, r.Slot}
		old := s.recs[k]
		r.Admitted, r.Attempted = max(r.Admitted, old.Admitted), max(r.Attempted, old.Attempted)
		s.recs[k] = r
		if at := r.CollectAt(); s.collectAt == 0 || at < s.collectAt {
			s.collectAt = at
		}
	}
	if s.collectAt != 0 && s.collectAt <= f.CollectBeforeMs {
		// Walk only when something is due: an idle node holding a
		// million persisted keys flushes every FlushInterval.
		s.collectAt = 0
		for k, r := range s.recs {
			if at := r.CollectAt(); at <= f.CollectBeforeMs {
				delete(s.recs, k)
			} else if s.collectAt == 0 || at < s.collectAt {
				s.collectAt = at
			}
		}
	}
	for _, id := range f.Released {
		delete(s.leases, id)
	}
	for _, l := range f.Leases {
		s.leases[l.ID] = l
	}
	s.flushes++
	return nil
}

// Flushes returns how many flushes the store has taken.
func (s *MemoryStore) Flushes() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.flushes
}

// Close implements Store.
func (s *MemoryStore) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	return nil
}
