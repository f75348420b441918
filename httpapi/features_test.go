package httpapi_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/ratemesh/ratemesh/internal/apitest"
	"github.com/ratemesh/ratemesh/internal/testutil"
	"github.com/ratemesh/ratemesh/limiter"
	"github.com/ratemesh/ratemesh/node/memnet"
)

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
	ts := apitest.Start(t, nil, "a", []limiter.Rule{
		{Name: "ip", Algorithm: limiter.FixedWindow, Limit: 10, Window: time.Hour, MaxKeys: 50, Overrides: map[string]uint64{"vip": 3}},
		{Name: "sh", Algorithm: limiter.FixedWindow, Limit: 2, Window: time.Hour, Shadow: true},
	}).Server
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
	tsA := apitest.Start(t, hub, "a", []limiter.Rule{{Name: "x", Algorithm: limiter.FixedWindow, Limit: 10, Window: time.Second}}).Server
	tsB := apitest.Start(t, hub, "b", []limiter.Rule{{Name: "x", Algorithm: limiter.FixedWindow, Limit: 20, Window: time.Second}}).Server
	var other map[string]any
	testutil.Eventually(t, 10*time.Second, func() (bool, string) {
		_, out := do(t, "GET", tsA.URL+"/v1/peers", "")
		other = nil
		for _, p := range out["peers"].([]any) {
			if pm := p.(map[string]any); pm["peer_id"] == "b" {
				other = pm
			}
		}
		return other != nil && other["rules_hash"] != "0000000000000000", fmt.Sprintf("a has not heard b's rules: %v", out)
	})
	if other["rules_match"] != false {
		t.Fatalf("b's rules differ, /v1/peers says %v", other)
	}
	for _, ts := range []*httptest.Server{tsA, tsB} {
		if m := metricsText(t, ts); !strings.Contains(m, "ratemesh_members_rules_mismatch 1") {
			t.Errorf("metrics lack the mismatch")
		}
	}
}
