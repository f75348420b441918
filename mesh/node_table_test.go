package mesh_test

import (
	"context"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/ratemesh/ratemesh/crdt"
	"github.com/ratemesh/ratemesh/internal/p2ptest"
	"github.com/ratemesh/ratemesh/internal/testutil"
	"github.com/ratemesh/ratemesh/limiter"
	"github.com/ratemesh/ratemesh/mesh"
	"github.com/ratemesh/ratemesh/node"
)

// inventedPeers returns n peer IDs nobody runs.
func inventedPeers(t *testing.T, n int) []string {
	t.Helper()
	out := make([]string, n)
	for i := range out {
		_, pub, err := crypto.GenerateEd25519Key(nil)
		if err != nil {
			t.Fatal(err)
		}
		id, err := peer.IDFromPublicKey(pub)
		if err != nil {
			t.Fatal(err)
		}
		out[i] = id.String()
	}
	return out
}

// TestNodesMemberTableFlood is issue 24's second finding on real hosts: a
// peer that speaks the protocol sends member 0 ten full states, each
// listing 1024 invented members alive (at 821b92d the receiver then
// counted 10,241 suspect members, fenced itself for good and saved the
// invented peers, so a restart dialled them all). A member table is a
// suggestion now: member 0 counts only the members that signed something
// (the three and the sender), stays ready for the suspect_after and more
// that the invented ones would have needed to turn suspect, saves no
// invented peer, and dials only within its budget.
func TestNodesMemberTableFlood(t *testing.T) {
	rules := []limiter.Rule{fixedRule("api", 100, time.Second)}
	store := &node.MemoryStore{}
	ms := []member{startMember(t, spec{rules: rules, store: store})}
	for range 2 {
		ms = append(ms, startMember(t, spec{rules: rules, bootstrap: []*mesh.Mesh{ms[0].m}}))
	}
	waitAlive(t, ms, 10*time.Second)

	attacker := newTransport(t, spec{rules: rules})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := attacker.Start(ctx, nopHandler{}); err != nil {
		t.Fatal(err)
	}
	if err := attacker.Connect(ctx, tcpAddrOf(t, ms[0].m)); err != nil {
		t.Fatal(err)
	}
	self := crdt.Slot{Peer: attacker.PeerID(), Incarnation: uint64(time.Now().UnixMilli())}
	invented := inventedPeers(t, 10*crdt.MaxMembers)
	start := time.Now()
	for k := range 10 {
		now := time.Now().UnixMilli()
		b := &crdt.Batch{Version: crdt.Version, From: self, Seq: uint64(k + 1), Sent: now, Clock: now, Flags: crdt.FlagFull | crdt.FlagLast}
		for _, p := range invented[k*crdt.MaxMembers : (k+1)*crdt.MaxMembers] {
			b.Members = append(b.Members, crdt.MemberEntry{Peer: p, Incarnation: 1, State: crdt.MemberAlive,
				Addrs: []string{"/ip4/127.0.0.1/tcp/9/p2p/" + p}})
		}
		// Written on the sync stream by hand: a Mesh's own SendDirect
		// would fill in the addresses its peerstore knows (none).
		if err := p2ptest.SendRawSync(ctx, attacker.Host(), ms[0].m.Host().ID(), ms[0].m.SyncProtocol(), b); err != nil {
			t.Fatalf("full state %d: %v", k, err)
		}
	}
	t.Logf("sent 10 full states of %d invented members in %v", crdt.MaxMembers, time.Since(start).Round(time.Millisecond))
	// Past suspect_after (2 s) and a heartbeat: invented members counted
	// alive would be suspect by now, and member 0 fenced.
	members := func() (n int, states map[string]int) {
		states = map[string]int{}
		for _, p := range ms[0].n.Peers() {
			states[p.State.String()]++
			if p.State == node.Alive || p.State == node.Suspect {
				n++
			}
		}
		return n, states
	}
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); <-tick.C {
		if h := ms[0].n.Health(); h != node.HealthReady {
			n, st := members()
			t.Fatalf("member 0 is %v after the flood, with %d live members %v", h, n, st)
		}
	}
	if n, st := members(); n != 4 {
		t.Errorf("member 0 counts %d live members %v, want the 3 members and the sender", n, st)
	}
	// Its transport dialled at most 256 of each table's 1024 (and at most
	// 16 at a time); the rest count as table_budget.
	if over := ms[0].m.Stats().RefusedMessages[mesh.ReasonTableBudget]; over < 10*(crdt.MaxMembers-256) {
		t.Errorf("%d table entries refused over the dial budget, want at least %d", over, 10*(crdt.MaxMembers-256))
	}
	// The runtime saves its known peers with each flush (1 s): none of the
	// invented ones.
	testutil.Eventually(t, 5*time.Second, func() (bool, string) {
		saved, err := store.LoadPeers(ctx)
		if err != nil {
			return false, err.Error()
		}
		return len(saved) > 0, "member 0 has saved no peers yet"
	})
	saved, _ := store.LoadPeers(ctx)
	known := map[string]bool{attacker.PeerID(): true}
	for _, x := range ms {
		known[x.m.PeerID()] = true
	}
	for _, kp := range saved {
		if !known[kp.Peer] {
			t.Fatalf("member 0 saved an invented peer %s (of %d saved)", kp.Peer, len(saved))
		}
	}
}
