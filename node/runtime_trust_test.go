package node_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ratemesh/ratemesh/crdt"
	"github.com/ratemesh/ratemesh/internal/testutil"
	"github.com/ratemesh/ratemesh/node"
	"github.com/ratemesh/ratemesh/node/memnet"
)

// addrBook is a memnet transport that can tell an address for any peer,
// as mesh's peerstore can for a peer a member table listed with
// addresses: so the runtime saves every member it counts.
type addrBook struct{ *memnet.Transport }

func (addrBook) KnownAddrs(peer string) []string { return []string{"/memnet/" + peer} }

type discard struct{}

func (discard) HandleBatch(node.Inbound) {}
func (discard) PeerConnected(string)     {}

// TestInventedMembersAreNotSaved: a member sends node a full state listing
// 1024 invented members. a saves the members it counts (SavePeers, with
// each flush) — b and the sender, which it heard — and none of the
// invented ones. Before, it saved all of them, and after a restart dialed
// them all.
func TestInventedMembersAreNotSaved(t *testing.T) {
	hub := memnet.NewHub()
	rule := fixedRule("api", 10, time.Hour)
	store := &node.MemoryStore{}
	cfgA := rtConfig(hub, "a", rule)
	cfgA.Transport, cfgA.Store, cfgA.FlushInterval = addrBook{hub.Transport("a")}, store, 50*time.Millisecond
	ns := map[string]*node.Node{"a": rtStart(t, cfgA), "b": rtStart(t, rtConfig(hub, "b", rule))}
	rtMeshed(t, ns)
	evil := hub.Transport("evil")
	if err := evil.Start(context.Background(), discard{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = evil.Close() })
	b := inventedTable(crdt.Slot{Peer: "evil", Incarnation: 1}, 0, 0)
	if err := evil.SendDirect(context.Background(), "a", []*crdt.Batch{b}); err != nil {
		t.Fatal(err)
	}
	var saved []string
	testutil.Eventually(t, 5*time.Second, func() (bool, string) {
		ps, err := store.LoadPeers(context.Background())
		if err != nil {
			return false, err.Error()
		}
		saved = saved[:0]
		for _, p := range ps {
			saved = append(saved, p.Peer)
		}
		return slices.Contains(saved, "evil"), fmt.Sprintf("saved %d peers, the sender not among them yet", len(saved))
	})
	slices.Sort(saved)
	if strings.Join(saved, ",") != "b,evil" {
		t.Errorf("a saved %d peers (%v…); want b and the sender alone", len(saved), saved[:min(len(saved), 4)])
	}
	if n := len(ns["a"].Peers()); n != 3 {
		t.Errorf("a knows %d members; want a, b and the sender", n)
	}
}

// TestStartCountsSavedPeers: a node started with a saved peer that does
// not answer counts it, suspect, from its start (CoreConfig.Known): under
// strict the saved peer holds half of N.
func TestStartCountsSavedPeers(t *testing.T) {
	hub := memnet.NewHub()
	store := &node.MemoryStore{}
	if err := store.SavePeers(context.Background(), []node.KnownPeer{{Peer: "gone", Addrs: []string{"/memnet/gone"}}}); err != nil {
		t.Fatal(err)
	}
	cfg := rtConfig(hub, "a", fixedRule("api", 10, time.Hour))
	cfg.Store = store
	a := rtStart(t, cfg)
	if got := rtState(a, "gone"); got != "suspect" {
		t.Errorf("a sees its saved peer %s; want suspect", got)
	}
}
