package mesh

import (
	"context"
	"crypto/rand"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/ratemesh/ratemesh/crdt"
	"github.com/ratemesh/ratemesh/node"
)

// recorder is a node.Handler that remembers everything it is given.
type recorder struct {
	mu        sync.Mutex
	batches   []node.Inbound
	connected []string
}

func (r *recorder) HandleBatch(in node.Inbound) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.batches = append(r.batches, in)
}

func (r *recorder) PeerConnected(p string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.connected = append(r.connected, p)
}

// has reports whether a batch from peer carrying key has arrived.
func (r *recorder) has(from, key string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, in := range r.batches {
		if in.Batch.From.Peer != from {
			continue
		}
		for _, e := range in.Batch.Windows {
			if e.Key == key {
				return true
			}
		}
	}
	return false
}

// find returns the first batch carrying key, whoever sent it.
func (r *recorder) find(key string) (node.Inbound, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, in := range r.batches {
		for _, e := range in.Batch.Windows {
			if e.Key == key {
				return in, true
			}
		}
	}
	return node.Inbound{}, false
}

func (r *recorder) connections() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.connected...)
}

func (r *recorder) connectedCount(p string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, c := range r.connected {
		if c == p {
			n++
		}
	}
	return n
}

func newKey(t testing.TB) crypto.PrivKey {
	t.Helper()
	k, _, err := crypto.GenerateEd25519Key(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// testConfig listens on loopback only, TCP and QUIC, with short timeouts.
func testConfig(t testing.TB) Config {
	cfg := DefaultConfig()
	cfg.Namespace = "test"
	cfg.PrivKey = newKey(t)
	cfg.Listen = []string{"/ip4/127.0.0.1/tcp/0", "/ip4/127.0.0.1/udp/0/quic-v1"}
	cfg.Logger = slog.New(slog.DiscardHandler)
	if os.Getenv("MESH_TEST_LOG") != "" {
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	cfg.DialTimeout = 2 * time.Second
	cfg.SyncTimeout = 5 * time.Second
	cfg.RedialMin = 20 * time.Millisecond
	cfg.RedialMax = 300 * time.Millisecond
	return cfg
}

// newMesh builds a mesh for cfg, closed when the test ends.
func newMesh(t testing.TB, cfg Config) *Mesh {
	t.Helper()
	m, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := m.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return m
}

// startMesh builds and starts a mesh with a fresh recorder.
func startMesh(t testing.TB, cfg Config) (*Mesh, *recorder) {
	t.Helper()
	m := newMesh(t, cfg)
	r := &recorder{}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := m.Start(ctx, r); err != nil {
		t.Fatal(err)
	}
	return m, r
}

// tcpAddr returns m's TCP address with /p2p/.
func tcpAddr(t testing.TB, m *Mesh) string {
	t.Helper()
	for _, a := range m.Addrs() {
		if !strings.Contains(a, "/quic") && strings.Contains(a, "/tcp/") {
			return a
		}
	}
	t.Fatalf("no TCP address in %v", m.Addrs())
	return ""
}

func connected(a, b *Mesh) bool {
	return a.Host().Network().Connectedness(b.Host().ID()) == network.Connected
}

func pid(t testing.TB, m *Mesh) peer.ID {
	t.Helper()
	return m.Host().ID()
}

// batch returns a valid batch from peer carrying one window entry for key.
func batch(from string, seq uint64, key string, admitted uint64) *crdt.Batch {
	return &crdt.Batch{
		Version: crdt.Version,
		From:    crdt.Slot{Peer: from, Incarnation: 1},
		Seq:     seq,
		Sent:    1_700_000_000_000,
		Clock:   1_700_000_000_000,
		Windows: []crdt.WindowEntry{{Rule: "api", Key: key, WindowMs: 1000, Window: 1_700_000_000, Admitted: admitted, Attempted: admitted}},
	}
}
