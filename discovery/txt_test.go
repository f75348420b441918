package discovery_test

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/ratemesh/ratemesh/discovery"
	"github.com/ratemesh/ratemesh/internal/testutil"
	"github.com/ratemesh/ratemesh/mesh"
	"github.com/ratemesh/ratemesh/node"
)

// fakeTXT answers LookupTXT from a map, or fails a name in fail.
type fakeTXT struct {
	mu      sync.Mutex
	records map[string][]string
	fail    map[string]error
}

func (f *fakeTXT) LookupTXT(_ context.Context, name string) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.fail[name]; err != nil {
		return nil, err
	}
	return slices.Clone(f.records[name]), nil
}

func peerID(t *testing.T) string {
	t.Helper()
	k, _, err := crypto.GenerateEd25519Key(nil)
	if err != nil {
		t.Fatal(err)
	}
	id, err := peer.IDFromPrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	return id.String()
}

// TestParseTXT: only ratemesh-peer= records count, whatever the case of
// the prefix and the spaces; repeats collapse; bad IDs are reported.
func TestParseTXT(t *testing.T) {
	a, b := peerID(t), peerID(t)
	ids, bad := discovery.ParseTXT([]string{
		"v=spf1 -all",
		"ratemesh-peer=" + b,
		"  RATEMESH-PEER= " + a + " ",
		"ratemesh-peer=" + b,
		"ratemesh-peer=not-an-id",
		"ratemesh-peer",
		"ratemesh-peer=",
	})
	if want := sortedIDs(a, b); !slices.Equal(ids, want) {
		t.Errorf("ids %v, want %v", ids, want)
	}
	if !slices.Equal(bad, []string{"ratemesh-peer=not-an-id", "ratemesh-peer="}) {
		t.Errorf("bad %v", bad)
	}
}

func sortedIDs(s ...string) []string { slices.Sort(s); return s }

// TestTXTRounds: a round hands Set the union of every name's members; a
// failed lookup keeps the last list (Set is not called) and names the
// name; a change applies at the next round; a bad record is skipped, not
// fatal; an unchanged answer does not call Set again.
func TestTXTRounds(t *testing.T) {
	a, b, c := peerID(t), peerID(t), peerID(t)
	res := &fakeTXT{
		records: map[string][]string{
			"ratemesh.svc":   {"ratemesh-peer=" + a, "other=1"},
			"ratemesh-2.svc": {"ratemesh-peer=" + b, "ratemesh-peer=garbage"},
		},
		fail: map[string]error{},
	}
	var sets [][]string
	d, err := discovery.NewTXT(discovery.TXTConfig{
		Names:    []string{"ratemesh.svc", "ratemesh-2.svc"},
		Resolver: res,
		Set:      func(ids []string) error { sets = append(sets, ids); return nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := d.Round(ctx); err != nil {
		t.Fatal(err)
	}
	if len(sets) != 1 || !slices.Equal(sets[0], sortedIDs(a, b)) {
		t.Fatalf("first round set %v, want [%v]", sets, sortedIDs(a, b))
	}
	if err := d.Round(ctx); err != nil || len(sets) != 1 {
		t.Fatalf("an unchanged answer: %v, %d sets", err, len(sets))
	}

	res.mu.Lock()
	res.fail["ratemesh-2.svc"] = errors.New("i/o timeout")
	res.records["ratemesh.svc"] = []string{"ratemesh-peer=" + c}
	res.mu.Unlock()
	err = d.Round(ctx)
	if err == nil || !strings.Contains(err.Error(), "ratemesh-2.svc") {
		t.Fatalf("a failed lookup: %v", err)
	}
	if len(sets) != 1 {
		t.Fatalf("a failed round changed the list: %v", sets)
	}

	res.mu.Lock()
	delete(res.fail, "ratemesh-2.svc")
	res.mu.Unlock()
	if err := d.Round(ctx); err != nil {
		t.Fatal(err)
	}
	if len(sets) != 2 || !slices.Equal(sets[1], sortedIDs(b, c)) {
		t.Fatalf("after recovery set %v, want %v", sets, sortedIDs(b, c))
	}
}

// TestNewTXT refuses a config without names or Set, or with a name that
// is not a DNS name.
func TestNewTXT(t *testing.T) {
	set := func([]string) error { return nil }
	for _, cfg := range []discovery.TXTConfig{
		{Set: set},
		{Names: []string{"a"}},
		{Names: []string{"host:8080"}, Set: set},
		{Names: []string{" "}, Set: set},
	} {
		if _, err := discovery.NewTXT(cfg); err == nil {
			t.Errorf("%+v accepted", cfg)
		}
	}
}

// nopHandler drops what the mesh delivers.
type nopHandler struct{}

func (nopHandler) HandleBatch(node.Inbound) {}
func (nopHandler) PeerConnected(string)     {}

func txtMesh(t *testing.T, external bool) *mesh.Mesh {
	t.Helper()
	key, _, err := crypto.GenerateEd25519Key(nil)
	if err != nil {
		t.Fatal(err)
	}
	mc := mesh.DefaultConfig()
	mc.Namespace, mc.PrivKey, mc.AllowExternal = "txttest", key, external
	mc.Listen = []string{"/ip4/127.0.0.1/tcp/0"}
	mc.DialTimeout = time.Second
	mc.Logger = slog.New(slog.DiscardHandler)
	m, err := mesh.New(mc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	if err := m.Start(context.Background(), nopHandler{}); err != nil {
		t.Fatal(err)
	}
	return m
}

// TestTXTAllowlistMesh: DNS TXT records served by a DNS server on UDP
// decide who may connect to a member whose allowlist comes from them.
// Until the records list a peer, its dials are refused; once listed it
// connects; once unlisted it is disconnected and refused again.
func TestTXTAllowlistMesh(t *testing.T) {
	a, b := txtMesh(t, true), txtMesh(t, false)
	srv := startDNS(t, "members.test")
	srv.setTXT("unrelated")
	d, err := discovery.NewTXT(discovery.TXTConfig{
		Names: []string{"members.test"}, Resolver: srv.resolver(),
		Set: func(ids []string) error { return a.SetAllowedPeers("dns", ids) },
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	addr := a.Addrs()[0]
	if err := d.Round(ctx); err != nil {
		t.Fatal(err)
	}
	refusedOnce := func() {
		t.Helper()
		before := a.Stats().RefusedConns[mesh.ConnNotMember]
		// Dial on every poll: b also redials a by itself once a cut it
		// off (a member it lost), and a Connect that joins such a dial
		// already refused counts nothing new.
		testutil.Eventually(t, 5*time.Second, func() (bool, string) {
			_ = b.Connect(ctx, addr)
			return a.Stats().RefusedConns[mesh.ConnNotMember] > before && !slices.Contains(a.Peers(), b.PeerID()), "an unlisted peer is refused"
		})
	}
	refusedOnce()
	srv.setTXT("ratemesh-peer=" + b.PeerID())
	if err := d.Round(ctx); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 5*time.Second, func() (bool, string) {
		_ = b.Connect(ctx, addr)
		return slices.Contains(a.Peers(), b.PeerID()), "the listed peer connects"
	})
	srv.setTXT("unrelated")
	if err := d.Round(ctx); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 5*time.Second, func() (bool, string) {
		return !slices.Contains(a.Peers(), b.PeerID()), "the unlisted peer is disconnected"
	})
	refusedOnce()
}
