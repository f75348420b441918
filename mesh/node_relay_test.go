package mesh_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ratemesh/ratemesh/crdt"
	"github.com/ratemesh/ratemesh/internal/testutil"
	"github.com/ratemesh/ratemesh/limiter"
)

// TestNodesRelayCannotLowerLeases is issue 24's first finding on real
// hosts: member 0 holds 9 of 10 leases, and a peer that speaks the
// protocol (a real libp2p transport of its own) sends members 1 and 2 a
// full state relaying member 0's lease counts as acquired = released =
// 2⁴⁰ — within the plausibility bound, since the difference is 0. Before
// the fix every receiver then read member 0's live leases as 0, and the
// two granted 6 more: 16 live leases under a limit of 10. Now the relayed
// released count is not taken: both still count member 0's 9, and
// together they grant at most the one lease left.
func TestNodesRelayCannotLowerLeases(t *testing.T) {
	const limit = 10
	rules := []limiter.Rule{{Name: "cc", Algorithm: limiter.Concurrency, Limit: limit, LeaseTTL: time.Minute}}
	clock := testutil.AlignedClock(time.Hour, time.Minute)
	ms := startMembers(t, 3, spec{rules: rules, clock: clock})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// Member 0 takes 9 leases; a share denial (its earlier ones not yet
	// acknowledged, on a slow machine) is retried.
	retry := time.NewTicker(10 * time.Millisecond)
	defer retry.Stop()
	for held, deadline := 0, time.Now().Add(10*time.Second); held < limit-1; <-retry.C {
		l, d, err := ms[0].n.Acquire(ctx, "cc", "k")
		switch {
		case err != nil:
			t.Fatal(err)
		case l != nil:
			held++
		case d.Reason != limiter.ReasonShare || time.Now().After(deadline):
			t.Fatalf("lease %d at member 0: %+v", held, d)
		}
	}
	counts := func(i int) uint64 {
		rep, err := ms[i].n.Usage("cc", "k")
		if err != nil {
			t.Fatal(err)
		}
		return rep.Total
	}
	testutil.Eventually(t, 10*time.Second, func() (bool, string) {
		return counts(1) == limit-1 && counts(2) == limit-1, fmt.Sprintf("members 1 and 2 count %d and %d leases, want %d", counts(1), counts(2), limit-1)
	})

	attacker := newTransport(t, spec{rules: rules})
	if err := attacker.Start(ctx, nopHandler{}); err != nil {
		t.Fatal(err)
	}
	self := crdt.Slot{Peer: attacker.PeerID(), Incarnation: uint64(clock().UnixMilli())}
	victim := crdt.Slot{Peer: ms[0].m.PeerID(), Incarnation: ms[0].n.Incarnation()}
	const big = 1 << 40
	now := clock().UnixMilli()
	for _, i := range []int{1, 2} {
		if err := attacker.Connect(ctx, tcpAddrOf(t, ms[i].m)); err != nil {
			t.Fatal(err)
		}
		relay := &crdt.Batch{
			Version: crdt.Version, From: self, Sent: now, Clock: now,
			Flags: crdt.FlagFull | crdt.FlagRelay | crdt.FlagLast, Slots: []crdt.Slot{victim},
			Leases: []crdt.LeaseEntry{{Slot: 1, Rule: "cc", Key: "k", Acquired: big, Released: big}},
		}
		if err := attacker.SendDirect(ctx, ms[i].m.PeerID(), []*crdt.Batch{relay}); err != nil {
			t.Fatalf("the relay to member %d: %v", i, err)
		}
	}
	testutil.Eventually(t, 10*time.Second, func() (bool, string) {
		a, b := ms[1].n.Stats().RelayLowering, ms[2].n.Stats().RelayLowering
		return a >= 1 && b >= 1, fmt.Sprintf("members 1 and 2 refused %d and %d lowering relays, want 1 each", a, b)
	})
	for _, i := range []int{1, 2} {
		if got := counts(i); got < limit-1 {
			t.Errorf("member %d counts %d live leases after the relay, want at least member 0's %d", i, got, limit-1)
		}
	}
	// Both try for a while, as clients would; the mesh grants at most the
	// one lease left.
	granted := 0
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for end := time.Now().Add(1500 * time.Millisecond); time.Now().Before(end); <-tick.C {
		for _, i := range []int{1, 2} {
			if l, _, err := ms[i].n.Acquire(ctx, "cc", "k"); err == nil && l != nil {
				granted++
			}
		}
	}
	if live := limit - 1 + granted; live > limit {
		t.Errorf("members 1 and 2 granted %d leases beside member 0's %d: %d live under a limit of %d", granted, limit-1, live, limit)
	}
}
