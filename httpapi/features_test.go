package httpapi_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/ratemesh/ratemesh/httpapi"
	"github.com/ratemesh/ratemesh/limiter"
	"github.com/ratemesh/ratemesh/node"
	"github.com/ratemesh/ratemesh/node/memnet"
)

func startWith(t *testing.T, hub *memnet.Hub, peer string, rules []limiter.Rule) (*node.Node, *httptest.Server) {
	t.Helper()
	cfg := node.DefaultConfig()
	cfg.Peer, cfg.Rules, cfg.Transport, cfg.Seed = peer, rules, hub.Transport(peer), 11
	n, err := node.Start(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Close() })
	s, err := httpapi.New(httpapi.Config{Node: n})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(s)
	t.Cleanup(ts.Close)
	return n, ts
}

func metricsText(t *testing.T, ts *httptest.Server) string {
	t.Helper()
	resp, err := http.Get(ts.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// TestKeyFloodOverridesShadow: a flood of distinct keys stays within
// max_keys, denied new keys are counted, overrides and shadow apply.
func TestKeyFloodOverridesShadow(t *testing.T) {
	_, ts := startWith(t, memnet.NewHub(), "a", []limiter.Rule{
		{Name: "ip", Algorithm: limiter.FixedWindow, Limit: 10, Window: time.Hour, MaxKeys: 50, Overrides: map[string]uint64{"vip": 3}},
		{Name: "sh", Algorithm: limiter.FixedWindow, Limit: 2, Window: time.Hour, Shadow: true},
	})
	denied := 0
	for i := range 300 {
		status, out := do(t, "POST", ts.URL+"/v1/allow", fmt.Sprintf(`{"rule":"ip","key":"10.0.%d.%d"}`, i/256, i%256))
		if status != 200 {
			t.Fatalf("flood %d: %d %v", i, status, out)
		}
		if out["allowed"] == false {
			denied++
		}
	}
	if denied != 250 {
		t.Fatalf("%d of 300 distinct keys denied at max_keys 50, want 250", denied)
	}
	m := metricsText(t, ts)
	for _, want := range []string{`ratemesh_keys{rule="ip"} 50`, `ratemesh_keys_denied_total 250`, `ratemesh_decisions_total{result="key_cap",rule="ip"} 250`} {
		if !strings.Contains(m, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	// An override replaces the limit (the vip key is new: at the cap it
	// is denied, but its limit is reported).
	_, out := do(t, "POST", ts.URL+"/v1/allow", `{"rule":"ip","key":"vip","cost":0}`)
	if out["limit"].(float64) != 3 {
		t.Fatalf("override: %v", out)
	}
	// Shadow: decided and counted, never denied.
	for i := range 4 {
		_, out := do(t, "POST", ts.URL+"/v1/allow", `{"rule":"sh","key":"k"}`)
		if out["allowed"] != true {
			t.Fatalf("shadow request %d denied: %v", i, out)
		}
	}
	if m := metricsText(t, ts); !strings.Contains(m, `ratemesh_decisions_total{result="shadowed",rule="sh"} 2`) {
		t.Errorf("metrics lack 2 shadowed decisions:\n%s", m)
	}
}

// TestRulesMismatchShows: a member with other rules shows in /v1/peers
// and the metrics.
func TestRulesMismatchShows(t *testing.T) {
	hub := memnet.NewHub()
	_, tsA := startWith(t, hub, "a", []limiter.Rule{{Name: "x", Algorithm: limiter.FixedWindow, Limit: 10, Window: time.Second}})
	_, tsB := startWith(t, hub, "b", []limiter.Rule{{Name: "x", Algorithm: limiter.FixedWindow, Limit: 20, Window: time.Second}})
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, out := do(t, "GET", tsA.URL+"/v1/peers", "")
		var other map[string]any
		for _, p := range out["peers"].([]any) {
			if pm := p.(map[string]any); pm["peer_id"] == "b" {
				other = pm
			}
		}
		if other != nil && other["rules_hash"] != "0000000000000000" {
			if other["rules_match"] != false {
				t.Fatalf("b's rules differ, /v1/peers says %v", other)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a never heard b: %v", out)
		}
		time.Sleep(10 * time.Millisecond)
	}
	for _, ts := range []*httptest.Server{tsA, tsB} {
		if m := metricsText(t, ts); !strings.Contains(m, "ratemesh_members_rules_mismatch 1") {
			t.Errorf("metrics lack the mismatch")
		}
	}
}
