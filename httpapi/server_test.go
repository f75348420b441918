package httpapi_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ratemesh/ratemesh/internal/apitest"
	"github.com/ratemesh/ratemesh/internal/testutil"
	"github.com/ratemesh/ratemesh/limiter"
	"github.com/ratemesh/ratemesh/node/memnet"
)

func testRules() []limiter.Rule {
	return []limiter.Rule{
		{Name: "api", Algorithm: limiter.FixedWindow, Limit: 5, Window: time.Hour,
			Classes: map[string]limiter.Class{"payer": {Multiplier: 2}, "node": {Unlimited: true}},
			Costs:   map[string]limiter.Cost{"query": {Per: 10}, "publish": {Each: 3}}},
		{Name: "big", Algorithm: limiter.FixedWindow, Limit: 1000, Window: time.Hour},
		{Name: "conc", Algorithm: limiter.Concurrency, Limit: 1, LeaseTTL: time.Minute},
	}
}

func do(t *testing.T, method, url, body string) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	var out map[string]any
	if len(data) > 0 && strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		if err := json.Unmarshal(data, &out); err != nil {
			t.Fatalf("%s %s: answer is not JSON: %q", method, url, data)
		}
	}
	return resp.StatusCode, out
}

func TestBadInput(t *testing.T) {
	ts := apitest.Start(t, nil, "a", testRules()).Server
	long := strings.Repeat("k", 257)
	huge := `{"rule":"api","key":"k","pad":"` + strings.Repeat("x", 70<<10) + `"}`
	tests := []struct {
		name, method, path, body string
		status                   int
		want                     string // in the error message
	}{
		{"malformed", "POST", "/v1/allow", `{"rule":`, 400, "body: malformed JSON"},
		{"not an object", "POST", "/v1/allow", `[1,2]`, 400, "body: must be a JSON object"},
		{"empty body", "POST", "/v1/allow", ``, 400, "body: empty"},
		{"trailing data", "POST", "/v1/allow", `{"rule":"api","key":"k"} {}`, 400, "body: data after"},
		{"rule wrong type", "POST", "/v1/allow", `{"rule":5,"key":"k"}`, 400, "rule: must be a string"},
		{"key wrong type", "POST", "/v1/allow", `{"rule":"api","key":["k"]}`, 400, "key: must be a string"},
		{"missing rule", "POST", "/v1/allow", `{"key":"k"}`, 400, "rule: missing"},
		{"missing key", "POST", "/v1/allow", `{"rule":"api"}`, 400, "key: missing"},
		{"empty key", "POST", "/v1/allow", `{"rule":"api","key":""}`, 400, "key: must not be empty"},
		{"null key", "POST", "/v1/allow", `{"rule":"api","key":null}`, 400, "key: missing"},
		{"long key", "POST", "/v1/allow", `{"rule":"api","key":"` + long + `"}`, 400, "key: 257 bytes, at most 256"},
		{"negative cost", "POST", "/v1/allow", `{"rule":"api","key":"k","cost":-1}`, 400, "cost: must not be negative"},
		{"fractional cost", "POST", "/v1/allow", `{"rule":"api","key":"k","cost":1.5}`, 400, "cost: must be a whole number"},
		{"huge cost", "POST", "/v1/allow", `{"rule":"api","key":"k","cost":1e300}`, 400, "cost: 1e300 is over the maximum"},
		{"huge int cost", "POST", "/v1/allow", `{"rule":"api","key":"k","cost":99999999999999999999999}`, 400, "cost: 99999999999999999999999 is over the maximum"},
		{"cost over max", "POST", "/v1/allow", `{"rule":"api","key":"k","cost":1125899906842625}`, 400, "cost: 1125899906842625 is over the maximum"},
		{"string cost", "POST", "/v1/allow", `{"rule":"api","key":"k","cost":"5"}`, 400, "cost: must be a whole number, got a string"},
		{"cost and type", "POST", "/v1/allow", `{"rule":"api","key":"k","cost":1,"type":"query"}`, 400, "type: give either cost or type"},
		{"units without type", "POST", "/v1/allow", `{"rule":"api","key":"k","units":3}`, 400, "units: needs type"},
		{"negative units", "POST", "/v1/allow", `{"rule":"api","key":"k","type":"query","units":-3}`, 400, "units: must not be negative"},
		{"unknown type", "POST", "/v1/allow", `{"rule":"api","key":"k","type":"nope","units":1}`, 400, `type: unknown request type "nope"`},
		{"unknown class", "POST", "/v1/allow", `{"rule":"api","key":"k","class":"vip"}`, 400, `class: unknown class "vip"`},
		{"unknown field", "POST", "/v1/allow", `{"rule":"api","key":"k","colour":"red"}`, 400, "colour: unknown field"},
		{"body too large", "POST", "/v1/allow", huge, 400, "body: over 65536 bytes"},
		{"unknown rule", "POST", "/v1/allow", `{"rule":"nope","key":"k"}`, 404, `rule: unknown rule "nope"`},
		{"concurrency rule on allow", "POST", "/v1/allow", `{"rule":"conc","key":"k"}`, 400, "rule: wrong algorithm"},
		{"wrong method allow", "GET", "/v1/allow", ``, 405, "method GET not allowed"},
		{"checks not array", "POST", "/v1/allow", `{"checks":{}}`, 400, "checks: must be an array"},
		{"checks empty", "POST", "/v1/allow", `{"checks":[]}`, 400, "checks: must not be empty"},
		{"checks with extra", "POST", "/v1/allow", `{"checks":[{"rule":"api","key":"k"}],"rule":"api"}`, 400, "rule: unknown field"},
		{"check bad cost", "POST", "/v1/allow", `{"checks":[{"rule":"api","key":"k"},{"rule":"api","key":"k","cost":-2}]}`, 400, "checks[1].cost: must not be negative"},
		{"check bad class", "POST", "/v1/allow", `{"checks":[{"rule":"api","key":"k"},{"rule":"api","key":"k","class":"vip"}]}`, 400, `checks[1].class: unknown class "vip"`},
		{"check unknown rule", "POST", "/v1/allow", `{"checks":[{"rule":"nope","key":"k"}]}`, 404, `checks[0].rule: unknown rule`},
		{"check not object", "POST", "/v1/allow", `{"checks":[5]}`, 400, "checks[0]: must be an object"},
		{"allow max_wait 0", "POST", "/v1/allow", `{"rule":"api","key":"k","max_wait_ms":0}`, 400, "max_wait_ms: must be at least 1"},
		{"allow max_wait string", "POST", "/v1/allow", `{"rule":"api","key":"k","max_wait_ms":"20"}`, 400, "max_wait_ms: must be a whole number, got a string"},
		{"allow max_wait huge", "POST", "/v1/allow", `{"rule":"api","key":"k","max_wait_ms":100000000}`, 400, "max_wait_ms: 100000000 is over the maximum 30000"},
		{"checks max_wait 0", "POST", "/v1/allow", `{"checks":[{"rule":"api","key":"k"}],"max_wait_ms":0}`, 400, "max_wait_ms: must be at least 1"},
		{"check with max_wait", "POST", "/v1/allow", `{"checks":[{"rule":"api","key":"k","max_wait_ms":5}]}`, 400, "checks[0].max_wait_ms: unknown field"},
		{"acquire max_wait negative", "POST", "/v1/acquire", `{"rule":"conc","key":"k","max_wait_ms":-1}`, 400, "max_wait_ms: must not be negative"},
		{"wait negative max", "POST", "/v1/wait", `{"rule":"api","key":"k","max_wait_ms":-5}`, 400, "max_wait_ms: must not be negative"},
		{"wait huge max", "POST", "/v1/wait", `{"rule":"api","key":"k","max_wait_ms":100000000}`, 400, "max_wait_ms: 100000000 is over the maximum 30000"},
		{"wait checks", "POST", "/v1/wait", `{"checks":[]}`, 400, "checks: /v1/wait takes one check"},
		{"wait method", "PUT", "/v1/wait", `{}`, 405, "not allowed"},
		{"acquire missing key", "POST", "/v1/acquire", `{"rule":"conc"}`, 400, "key: missing"},
		{"acquire cost", "POST", "/v1/acquire", `{"rule":"conc","key":"k","cost":1}`, 400, "cost: unknown field"},
		{"acquire windowed rule", "POST", "/v1/acquire", `{"rule":"api","key":"k"}`, 400, "rule: wrong algorithm"},
		{"acquire unknown class", "POST", "/v1/acquire", `{"rule":"conc","key":"k","class":"x"}`, 400, `class: unknown class "x"`},
		{"acquire unknown rule", "POST", "/v1/acquire", `{"rule":"zzz","key":"k"}`, 404, "rule: unknown rule"},
		{"renew missing id", "POST", "/v1/renew", `{}`, 400, "lease_id: missing"},
		{"renew wrong type", "POST", "/v1/renew", `{"lease_id":7}`, 400, "lease_id: must be a string"},
		{"renew unknown", "POST", "/v1/renew", `{"lease_id":"a~1~1"}`, 404, "lease_id: unknown or expired"},
		{"release other owner", "POST", "/v1/release", `{"lease_id":"QmOther~1~1"}`, 404, "lease_id: owned by peer QmOther"},
		{"release method", "GET", "/v1/release", ``, 405, "not allowed"},
		{"usage missing key", "GET", "/v1/usage?rule=api", ``, 400, "key: missing"},
		{"usage unknown param", "GET", "/v1/usage?rule=api&key=k&x=1", ``, 400, "x: unknown query parameter"},
		{"usage long key", "GET", "/v1/usage?rule=api&key=" + long, ``, 400, "key: 257 bytes"},
		{"usage unknown rule", "GET", "/v1/usage?rule=zz&key=k", ``, 404, "rule: unknown rule"},
		{"usage method", "POST", "/v1/usage?rule=api&key=k", ``, 405, "not allowed"},
		{"peers method", "POST", "/v1/peers", ``, 405, "not allowed"},
		{"evict unknown", "POST", "/v1/peers/QmNobody/evict", ``, 404, `peer_id: unknown peer "QmNobody"`},
		{"evict method", "GET", "/v1/peers/QmNobody/evict", ``, 405, "not allowed"},
		{"healthz method", "POST", "/healthz", ``, 405, "not allowed"},
		{"metrics method", "DELETE", "/metrics", ``, 405, "not allowed"},
		{"unknown path", "GET", "/v2/allow", ``, 404, "no such endpoint"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			status, out := do(t, tc.method, ts.URL+tc.path, tc.body)
			if status != tc.status {
				t.Fatalf("status %d, want %d (%v)", status, tc.status, out)
			}
			msg, _ := out["error"].(string)
			if !strings.Contains(msg, tc.want) {
				t.Fatalf("error %q, want it to contain %q", msg, tc.want)
			}
		})
	}
}

func TestAllowAndFriends(t *testing.T) {
	m := apitest.Start(t, nil, "a", testRules())
	n, ts := m.Node, m.Server
	for i := range 5 {
		status, out := do(t, "POST", ts.URL+"/v1/allow", `{"rule":"api","key":"k"}`)
		if status != 200 || out["allowed"] != true || out["limit"].(float64) != 5 || out["remaining"].(float64) != float64(4-i) || out["reason"] != "admitted" {
			t.Fatalf("allow %d: %d %v", i, status, out)
		}
	}
	status, out := do(t, "POST", ts.URL+"/v1/allow", `{"rule":"api","key":"k"}`)
	if status != 200 || out["allowed"] != false || out["retry_after_ms"].(float64) <= 0 || out["reset_after_ms"].(float64) <= 0 ||
		out["reason"] != "limit" || out["remaining"].(float64) != 0 {
		t.Fatalf("sixth: %d %v", status, out)
	}
	// A cost over the limit can never be admitted: -1; smaller requests
	// still can, so remaining stays.
	status, out = do(t, "POST", ts.URL+"/v1/allow", `{"rule":"api","key":"other","cost":6}`)
	if status != 200 || out["allowed"] != false || out["retry_after_ms"].(float64) != -1 || out["reason"] != "cost" || out["remaining"].(float64) != 5 {
		t.Fatalf("cost over limit: %d %v", status, out)
	}
	status, out = do(t, "POST", ts.URL+"/v1/allow", `{"rule":"api","key":"u","class":"node"}`)
	if status != 200 || out["allowed"] != true || out["reason"] != "unlimited" {
		t.Fatalf("unlimited class: %d %v", status, out)
	}
	// type + units: 2 units of publish cost 6 > 5 → never; 1 unit of query costs 1.
	status, out = do(t, "POST", ts.URL+"/v1/allow", `{"rule":"api","key":"t","type":"query","units":7}`)
	if status != 200 || out["allowed"] != true || out["remaining"].(float64) != 4 {
		t.Fatalf("type query: %d %v", status, out)
	}
	// A class doubles the limit.
	status, out = do(t, "POST", ts.URL+"/v1/allow", `{"rule":"api","key":"c","class":"payer","cost":0}`)
	if status != 200 || out["limit"].(float64) != 10 {
		t.Fatalf("class: %d %v", status, out)
	}
	// All or nothing: the second check fails, the first consumes nothing.
	status, out = do(t, "POST", ts.URL+"/v1/allow", `{"checks":[{"rule":"big","key":"m"},{"rule":"api","key":"k"}]}`)
	if status != 200 || out["allowed"] != false || len(out["results"].([]any)) != 2 ||
		out["results"].([]any)[0].(map[string]any)["reason"] != "admitted" || out["results"].([]any)[1].(map[string]any)["reason"] != "limit" {
		t.Fatalf("checks: %d %v", status, out)
	}
	if rep, err := n.Usage("big", "m"); err != nil || rep.Total != 0 {
		t.Fatalf("big consumed %d after a failed all-or-nothing (%v)", rep.Total, err)
	}
	status, out = do(t, "POST", ts.URL+"/v1/allow", `{"checks":[{"rule":"big","key":"m","cost":3},{"rule":"api","key":"fresh"}]}`)
	if status != 200 || out["allowed"] != true {
		t.Fatalf("checks pass: %d %v", status, out)
	}
	status, out = do(t, "GET", ts.URL+"/v1/usage?rule=big&key=m", "")
	if status != 200 || out["total"].(float64) != 3 || out["window_ms"].(float64) != 3600000 || len(out["slots"].([]any)) != 1 {
		t.Fatalf("usage: %d %v", status, out)
	}
	// A named window: the current one, the one before (empty here), no other.
	cur := int64(out["window"].(float64))
	status, out = do(t, "GET", ts.URL+fmt.Sprintf("/v1/usage?rule=big&key=m&window=%d", cur), "")
	if status != 200 || out["total"].(float64) != 3 || int64(out["window"].(float64)) != cur {
		t.Fatalf("usage of the current window by index: %d %v", status, out)
	}
	status, out = do(t, "GET", ts.URL+fmt.Sprintf("/v1/usage?rule=big&key=m&window=%d", cur-1), "")
	if status != 200 || out["total"].(float64) != 0 || int64(out["window"].(float64)) != cur-1 || len(out["slots"].([]any)) != 0 {
		t.Fatalf("usage of the window before: %d %v", status, out)
	}
	for q, want := range map[string]string{
		fmt.Sprintf("rule=big&key=m&window=%d", cur-2): "window: " + fmt.Sprint(cur-2) + " is neither the current window",
		"rule=big&key=m&window=x":                      `window: "x" is not a window index`,
		"rule=conc&key=m&window=1":                     `window: rule "conc" has no windows`,
	} {
		status, out = do(t, "GET", ts.URL+"/v1/usage?"+q, "")
		if msg, _ := out["error"].(string); status != 400 || !strings.Contains(msg, want) {
			t.Errorf("usage?%s: %d %v, want 400 %q", q, status, out, want)
		}
	}
	// wait: exhausted for an hour, max_wait 10 ms: denied at once.
	start := time.Now()
	status, out = do(t, "POST", ts.URL+"/v1/wait", `{"rule":"api","key":"k","max_wait_ms":10}`)
	if status != 200 || out["allowed"] != false || time.Since(start) > 5*time.Second {
		t.Fatalf("wait: %d %v after %v", status, out, time.Since(start))
	}
	status, out = do(t, "POST", ts.URL+"/v1/wait", `{"rule":"big","key":"w"}`)
	if status != 200 || out["allowed"] != true {
		t.Fatalf("wait admitted: %d %v", status, out)
	}
	// Leases.
	status, out = do(t, "POST", ts.URL+"/v1/acquire", `{"rule":"conc","key":"k"}`)
	id, _ := out["lease_id"].(string)
	if status != 200 || out["allowed"] != true || id == "" || out["ttl_ms"].(float64) < 59000 {
		t.Fatalf("acquire: %d %v", status, out)
	}
	status, out = do(t, "POST", ts.URL+"/v1/acquire", `{"rule":"conc","key":"k"}`)
	if status != 200 || out["allowed"] != false || out["lease_id"] != "" || out["reason"] != "limit" ||
		out["remaining"].(float64) != 0 || out["retry_after_ms"].(float64) != 60000 {
		t.Fatalf("second acquire at limit 1: %d %v; want denied by the limit, retry after the lease TTL", status, out)
	}
	status, out = do(t, "POST", ts.URL+"/v1/renew", `{"lease_id":"`+id+`"}`)
	if status != 200 || out["ttl_ms"].(float64) != 60000 {
		t.Fatalf("renew: %d %v", status, out)
	}
	status, out = do(t, "POST", ts.URL+"/v1/release", `{"lease_id":"`+id+`"}`)
	if status != 200 || len(out) != 0 {
		t.Fatalf("release: %d %v", status, out)
	}
	status, _ = do(t, "POST", ts.URL+"/v1/release", `{"lease_id":"`+id+`"}`)
	if status != 404 {
		t.Fatalf("second release: %d, want 404", status)
	}
	for _, bad := range []string{"garbage", "a~0~1", "a~1", "a~1~x!"} {
		status, out = do(t, "POST", ts.URL+"/v1/renew", `{"lease_id":"`+bad+`"}`)
		if status != 400 || !strings.HasPrefix(out["error"].(string), "lease_id: malformed lease ID") {
			t.Errorf("renew %q: %d %v, want 400 naming lease_id", bad, status, out)
		}
	}
	status, out = do(t, "GET", ts.URL+"/healthz", "")
	if status != 200 || out["state"] != "ready" {
		t.Fatalf("healthz: %d %v", status, out)
	}
	status, out = do(t, "GET", ts.URL+"/v1/peers", "")
	peers, _ := out["peers"].([]any)
	if status != 200 || len(peers) != 1 || peers[0].(map[string]any)["self"] != true || peers[0].(map[string]any)["state"] != "alive" {
		t.Fatalf("peers: %d %v", status, out)
	}
}

func TestLeaseOwnedElsewhereAndEvict(t *testing.T) {
	hub := memnet.NewHub()
	tsA := apitest.Start(t, hub, "a", testRules()).Server
	// Acquire while a is alone: with b in the mesh, a limit of 1 over two
	// members is a lottery.
	status, out := do(t, "POST", tsA.URL+"/v1/acquire", `{"rule":"conc","key":"k"}`)
	if status != 200 || out["allowed"] != true {
		t.Fatalf("acquire: %d %v", status, out)
	}
	tsB := apitest.Start(t, hub, "b", testRules()).Server
	id := out["lease_id"].(string)
	for _, path := range []string{"/v1/renew", "/v1/release"} {
		status, out = do(t, "POST", tsB.URL+path, `{"lease_id":"`+id+`"}`)
		if status != 404 || out["owner"] != "a" || !strings.Contains(out["error"].(string), "owned by peer a") {
			t.Fatalf("%s on b: %d %v", path, status, out)
		}
	}
	// b learns of a, then evicts it.
	testutil.Eventually(t, 10*time.Second, func() (bool, string) {
		_, out := do(t, "GET", tsB.URL+"/v1/peers", "")
		return len(out["peers"].([]any)) == 2, fmt.Sprintf("b has not seen a: %v", out)
	})
	status, out = do(t, "POST", tsB.URL+"/v1/peers/a/evict", "")
	if status != 200 || len(out) != 0 {
		t.Fatalf("evict: %d %v", status, out)
	}
}

func TestMetricsLint(t *testing.T) {
	m := apitest.Start(t, nil, "a", testRules())
	s, ts := m.API, m.Server
	do(t, "POST", ts.URL+"/v1/allow", `{"rule":"api","key":"k"}`)
	s.ObserveReload("ok")
	problems, err := promtest.GatherAndLint(s.Registry())
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("promlint: %s: %s", p.Metric, p.Text)
	}
	resp, err := http.Get(ts.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		`ratemesh_decisions_total{result="admitted",rule="api"} 1`,
		`ratemesh_decision_duration_seconds_count{endpoint="allow"} 1`,
		`ratemesh_members{state="alive"} 1`,
		`ratemesh_keys{rule="api"} 1`,
		`ratemesh_windows{rule="api"} 1`,
		`ratemesh_config_reloads_total{result="ok"} 1`,
		`ratemesh_ready 1`,
		`ratemesh_keys_denied_total 0`,
		`ratemesh_persistence_errors_total 0`,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("metrics lack %q", want)
		}
	}
}

// TestRoutes: every endpoint under its method (GET admits HEAD), any
// other method 405 with Allow, any other path (one ServeMux would
// redirect included) 404, all answered in JSON.
func TestRoutes(t *testing.T) {
	ts := apitest.Start(t, nil, "a", testRules()).Server
	tests := []struct {
		method, path string
		status       int
		allow, body  string // body: exact, "" for HEAD
	}{
		{"GET", "/v1/allow", 405, "POST", `{"error":"method GET not allowed; use POST"}`},
		{"HEAD", "/v1/allow", 405, "POST", ``},
		{"OPTIONS", "/v1/wait", 405, "POST", `{"error":"method OPTIONS not allowed; use POST"}`},
		{"GET", "/v1/acquire", 405, "POST", `{"error":"method GET not allowed; use POST"}`},
		{"PUT", "/v1/renew", 405, "POST", `{"error":"method PUT not allowed; use POST"}`},
		{"GET", "/v1/release", 405, "POST", `{"error":"method GET not allowed; use POST"}`},
		{"POST", "/v1/usage?rule=api&key=k", 405, "GET, HEAD", `{"error":"method POST not allowed; use GET"}`},
		{"POST", "/v1/peers", 405, "GET, HEAD", `{"error":"method POST not allowed; use GET"}`},
		{"GET", "/v1/peers/QmNobody/evict", 405, "POST", `{"error":"method GET not allowed; use POST"}`},
		{"DELETE", "/metrics", 405, "GET, HEAD", `{"error":"method DELETE not allowed; use GET"}`},
		{"POST", "/healthz", 405, "GET, HEAD", `{"error":"method POST not allowed; use GET"}`},
		{"GET", "/healthz", 200, "", `{"state":"ready"}`},
		{"HEAD", "/healthz", 200, "", ``},
		{"HEAD", "/v1/usage?rule=zz&key=k", 404, "", ``},
		{"POST", "/v1/peers/QmNobody/evict", 404, "", `{"error":"peer_id: unknown peer \"QmNobody\""}`},
		{"GET", "/v2/allow", 404, "", `{"error":"no such endpoint: /v2/allow"}`},
		{"GET", "/", 404, "", `{"error":"no such endpoint: /"}`},
		{"POST", "/v1/allow/", 404, "", `{"error":"no such endpoint: /v1/allow/"}`},
		{"GET", "/v1/ALLOW", 404, "", `{"error":"no such endpoint: /v1/ALLOW"}`},
		{"GET", "/v1//usage", 404, "", `{"error":"no such endpoint: /v1//usage"}`},
		{"GET", "/v1/./usage?rule=api&key=k", 404, "", `{"error":"no such endpoint: /v1/./usage"}`},
		{"POST", "/v1/peers//evict", 404, "", `{"error":"no such endpoint: /v1/peers//evict"}`},
		{"POST", "/v1/peers/QmNobody/evict/x", 404, "", `{"error":"no such endpoint: /v1/peers/QmNobody/evict/x"}`},
		{"POST", "/v1/peers/QmNobody", 404, "", `{"error":"no such endpoint: /v1/peers/QmNobody"}`},
		{"GET", "/v1/peers/", 404, "", `{"error":"no such endpoint: /v1/peers/"}`},
	}
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	for _, tc := range tests {
		req, err := http.NewRequest(tc.method, ts.URL+tc.path, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.status || resp.Header.Get("Allow") != tc.allow || strings.TrimSpace(string(body)) != tc.body ||
			resp.Header.Get("Content-Type") != "application/json" {
			t.Errorf("%s %s: %d Allow %q %s %q, want %d Allow %q application/json %q", tc.method, tc.path,
				resp.StatusCode, resp.Header.Get("Allow"), resp.Header.Get("Content-Type"), body, tc.status, tc.allow, tc.body)
		}
	}
}
