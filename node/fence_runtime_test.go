package node_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/ratemesh/ratemesh/internal/testutil"
	"github.com/ratemesh/ratemesh/node"
	"github.com/ratemesh/ratemesh/node/memnet"
)

// TestFenceLiftsOverAConnectionThatStayedUp: under strict, c is cut from
// a and b and fences itself; the links come back as connections that
// stayed up through the partition do (a short partition, a paused
// process), with no reconnect and so no full state sent by itself. c
// serves again once the members it hears again have sent their full
// states — which they now send when they hear a member again — not only
// after join_timeout, its fallback (10 s here).
func TestFenceLiftsOverAConnectionThatStayedUp(t *testing.T) {
	hub := memnet.NewHub()
	hub.SetDelay(time.Millisecond)
	rule := fixedRule("api", 1000, time.Second)
	ns := map[string]*node.Node{}
	for _, p := range []string{"a", "b", "c"} {
		cfg := rtConfig(hub, p, rule)
		cfg.Heartbeat, cfg.SuspectAfter, cfg.DeadAfter = 100*time.Millisecond, 300*time.Millisecond, 600*time.Millisecond
		cfg.Policy, cfg.JoinTimeout = node.Strict, 10*time.Second
		ns[p] = rtStart(t, cfg)
	}
	rtMeshed(t, ns)
	hub.Cut("c", "a")
	hub.Cut("c", "b")
	testutil.Eventually(t, 5*time.Second, func() (bool, string) {
		h := ns["c"].Health()
		return h == node.HealthFenced, fmt.Sprintf("c is %v", h)
	})
	hub.Resume("c", "a")
	hub.Resume("c", "b")
	healed := time.Now()
	testutil.Eventually(t, 5*time.Second, func() (bool, string) {
		h := ns["c"].Health()
		return h == node.HealthReady, fmt.Sprintf("c is %v %v after the links came back", h, time.Since(healed).Round(time.Millisecond))
	})
	t.Logf("c serves again %v after the links came back", time.Since(healed).Round(time.Millisecond))
}
