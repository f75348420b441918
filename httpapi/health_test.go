package httpapi_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/ratemesh/ratemesh/internal/apitest"
	"github.com/ratemesh/ratemesh/internal/testutil"
	"github.com/ratemesh/ratemesh/node"
	"github.com/ratemesh/ratemesh/node/memnet"
)

// probe answers GET path as "STATUS state".
func probe(t *testing.T, url, path string) string {
	t.Helper()
	status, out := do(t, "GET", url+path, "")
	return fmt.Sprintf("%d %v", status, out["state"])
}

// TestProbesWhileJoining: a member waiting for its first anti-entropy
// exchange is live (/livez 200) and not ready (/readyz and /healthz 503).
func TestProbesWhileJoining(t *testing.T) {
	m := apitest.Start(t, nil, "a", testRules(), apitest.Join, func(c *node.Config) {
		c.StartJoining, c.JoinTimeout = true, time.Hour
	})
	for path, want := range map[string]string{"/livez": "200 joining", "/readyz": "503 joining", "/healthz": "503 joining"} {
		if got := probe(t, m.URL(), path); got != want {
			t.Errorf("GET %s while joining: %s, want %s", path, got, want)
		}
	}
}

// TestProbesWhileFenced: under strict, a member cut from the two others
// fences itself: /livez stays 200 (a liveness probe must not restart it
// in the middle of the partition), /readyz and /healthz answer 503; all
// three 200 ready before.
func TestProbesWhileFenced(t *testing.T) {
	hub := memnet.NewHub()
	hub.SetDelay(time.Millisecond)
	fast := func(c *node.Config) {
		c.Heartbeat, c.SuspectAfter, c.DeadAfter = 100*time.Millisecond, 300*time.Millisecond, 600*time.Millisecond
		c.Policy, c.JoinTimeout = node.Strict, 10*time.Second
	}
	ms := map[string]*apitest.Member{}
	for _, p := range []string{"a", "b", "c"} {
		ms[p] = apitest.Start(t, hub, p, testRules(), fast)
	}
	testutil.Eventually(t, 10*time.Second, func() (bool, string) {
		for p, m := range ms {
			alive := 0
			for _, q := range m.Node.Peers() {
				if q.State == node.Alive {
					alive++
				}
			}
			if alive != 3 {
				return false, fmt.Sprintf("%s sees %d alive members, want 3", p, alive)
			}
		}
		return true, ""
	})
	c := ms["c"].URL()
	for _, path := range []string{"/livez", "/readyz", "/healthz"} {
		if got := probe(t, c, path); got != "200 ready" {
			t.Errorf("GET %s before the partition: %s, want 200 ready", path, got)
		}
	}
	hub.Cut("c", "a")
	hub.Cut("c", "b")
	testutil.Eventually(t, 10*time.Second, func() (bool, string) {
		h := ms["c"].Node.Health()
		return h == node.HealthFenced, fmt.Sprintf("c is %v", h)
	})
	for path, want := range map[string]string{"/livez": "200 fenced", "/readyz": "503 fenced", "/healthz": "503 fenced"} {
		if got := probe(t, c, path); got != want {
			t.Errorf("GET %s while fenced: %s, want %s", path, got, want)
		}
	}
}
