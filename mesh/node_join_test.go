package mesh_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/ratemesh/ratemesh/internal/testutil"
	"github.com/ratemesh/ratemesh/limiter"
	"github.com/ratemesh/ratemesh/mesh"
)

// TestNodesJoinThroughOneSeed: three members spend 830 of a 1000-per-hour
// limit and fall quiet; a fourth starts bootstrapped to member 0 alone. On
// real libp2p hosts, the seed's full state relays every member's slots and
// its member table with their addresses: the joiner is ready holding all
// three slots (830), counts four members, and dials members 1 and 2 by
// itself. Hammered at once, it admits no more than what is left.
func TestNodesJoinThroughOneSeed(t *testing.T) {
	clock := testutil.AlignedClock(time.Hour, time.Minute)
	rules := []limiter.Rule{fixedRule("api", 1000, time.Hour)}
	ms := startMembers(t, 3, spec{rules: rules, clock: clock})
	spent := 0
	for spent < 830 {
		d, err := ms[spent%3].n.Allow(context.Background(), "api", "k")
		if err != nil || !d.Allowed {
			t.Fatalf("spending: %+v %v", d, err)
		}
		spent++
	}
	testutil.Eventually(t, 5*time.Second, func() (bool, string) {
		if d := usageDiff(ms, "api", "k"); d != "" {
			return false, d
		}
		return totalOf(t, ms[0], "k") == 830, "the three do not hold 830 yet"
	})
	j := startMember(t, spec{rules: rules, clock: clock, bootstrap: []*mesh.Mesh{ms[0].m}})
	// node.Start returned: the joiner is ready.
	rep, err := j.n.Usage("api", "k")
	if err != nil {
		t.Fatal(err)
	}
	if rep.Total != 830 || len(rep.Slots) != 3 {
		t.Errorf("ready joiner holds %d in %d slots, want 830 in the three members' slots", rep.Total, len(rep.Slots))
	}
	testutil.Eventually(t, 5*time.Second, func() (bool, string) {
		peers := j.m.Peers()
		for _, x := range ms {
			if !slices.Contains(peers, x.m.PeerID()) {
				return false, fmt.Sprintf("the joiner is connected to %v, not to %s", peers, x.m.PeerID())
			}
		}
		return true, ""
	})
	admitted := 0
	for range 400 {
		d, err := j.n.Allow(context.Background(), "api", "k")
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed {
			admitted++
		}
	}
	if admitted > 170 {
		t.Errorf("the joiner admitted %d with 170 left", admitted)
	}
	t.Logf("the joiner admitted %d of the 170 left at once", admitted)
}
