package node_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ratemesh/ratemesh/internal/testutil"
	"github.com/ratemesh/ratemesh/limiter"
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
	hub, ns := strictTrio(t, 300*time.Millisecond, 600*time.Millisecond)
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

// TestStaleIsNotReady: under strict, c's batches stop reaching a and b
// while it still hears them (its output queue stalled). Once they have
// not acknowledged it lately, c denies every decision as stale and its
// health says so — /readyz answers 503, so a load balancer stops sending
// it traffic it would deny — and once its batches flow again it is
// ready again.
func TestStaleIsNotReady(t *testing.T) {
	hub, ns := strictTrio(t, 2*time.Second, 4*time.Second)
	if h := ns["c"].Health(); h != node.HealthReady {
		t.Fatalf("c is %v before the cut, want ready", h)
	}
	hub.CutOneWay("c", "a")
	hub.CutOneWay("c", "b")
	testutil.Eventually(t, 5*time.Second, func() (bool, string) {
		h := ns["c"].Health()
		return h == node.HealthStale, fmt.Sprintf("c is %v", h)
	})
	if d, err := ns["c"].Allow(context.Background(), "api", "k"); err != nil || d.Allowed || d.Reason != limiter.ReasonStale {
		t.Fatalf("c while stale: %+v, %v; want denied, stale", d, err)
	}
	for _, p := range []string{"a", "b"} {
		if h := ns[p].Health(); h != node.HealthReady {
			t.Errorf("%s is %v while c is stale, want ready (it hears everyone)", p, h)
		}
	}
	hub.ResumeOneWay("c", "a")
	hub.ResumeOneWay("c", "b")
	testutil.Eventually(t, 5*time.Second, func() (bool, string) {
		h := ns["c"].Health()
		return h == node.HealthReady, fmt.Sprintf("c is %v after its batches flow again", h)
	})
}

// strictTrio starts a, b and c meshed under strict over a hub with 1 ms
// links, one rule "api" of 1000 per second, a 100 ms heartbeat, the
// given suspect_after and dead_after, and a join_timeout of 10 s.
func strictTrio(t *testing.T, suspectAfter, deadAfter time.Duration) (*memnet.Hub, map[string]*node.Node) {
	t.Helper()
	hub := memnet.NewHub()
	hub.SetDelay(time.Millisecond)
	rule := fixedRule("api", 1000, time.Second)
	ns := map[string]*node.Node{}
	for _, p := range []string{"a", "b", "c"} {
		cfg := rtConfig(hub, p, rule)
		cfg.Heartbeat, cfg.SuspectAfter, cfg.DeadAfter = 100*time.Millisecond, suspectAfter, deadAfter
		cfg.Policy, cfg.JoinTimeout = node.Strict, 10*time.Second
		ns[p] = rtStart(t, cfg)
	}
	rtMeshed(t, ns)
	return hub, ns
}
