package mesh_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/ratemesh/ratemesh/internal/testutil"
	"github.com/ratemesh/ratemesh/limiter"
	"github.com/ratemesh/ratemesh/node"
)

// TestNodeCloseLeaves: a member that closes gracefully is seen as "left"
// by the others at once — not "suspect" and later "dead" — even though it
// closes its host right after publishing the leave (the direct copy of the
// announcement is read before Close goes on). Repeated five times, since
// the gossip copy alone was lost in most runs.
func TestNodeCloseLeaves(t *testing.T) {
	rules := []limiter.Rule{fixedRule("api", 100, time.Second)}
	for round := range 5 {
		ms := startMembers(t, 3, spec{rules: rules, core: func(c *node.CoreConfig) {
			c.SuspectAfter = 10 * time.Second // silence alone cannot explain a state change
			c.DeadAfter = 20 * time.Second
		}})
		gone := ms[2].m.PeerID()
		if err := ms[2].n.Close(); err != nil {
			t.Fatalf("round %d: close: %v", round, err)
		}
		testutil.Eventually(t, 3*time.Second, func() (bool, string) {
			for i, x := range ms[:2] {
				if s := stateOf(x.n, gone); s != "left" {
					return false, fmt.Sprintf("round %d: member %d sees the closed member %s", round, i, s)
				}
			}
			return true, ""
		})
	}
}
