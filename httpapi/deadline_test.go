package httpapi_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/ratemesh/ratemesh/httpapi"
	"github.com/ratemesh/ratemesh/internal/apitest"
	"github.com/ratemesh/ratemesh/internal/testutil"
	"github.com/ratemesh/ratemesh/limiter"
	"github.com/ratemesh/ratemesh/node"
	"github.com/ratemesh/ratemesh/node/memnet"
)

// post sends body to url with headers and returns the status, the
// decoded answer and how long it took.
func post(t *testing.T, url, body string, headers map[string]string) (int, map[string]any, time.Duration) {
	t.Helper()
	req, err := http.NewRequest("POST", url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range headers {
		req.Header.Add(k, v)
	}
	start := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, out, time.Since(start)
}

// TestCallerDeadlineBoundsHold: a share denial that would be held for its
// rule's share_wait (1 s: the other member's acknowledgements never come)
// is answered within the caller's deadline instead, given as max_wait_ms,
// X-Ratemesh-Max-Wait-Ms or Envoy's X-Envoy-Expected-Rq-Timeout-Ms, on
// /v1/allow (both forms) and /v1/wait; the answers are counted against
// their deadlines; a malformed header is refused by name.
func TestCallerDeadlineBoundsHold(t *testing.T) {
	hub := memnet.NewHub()
	rules := []limiter.Rule{{Name: "held", Algorithm: limiter.FixedWindow, Limit: 10, Window: time.Hour, ShareWait: time.Second}}
	a := apitest.Start(t, hub, "a", rules, patient)
	apitest.Start(t, hub, "b", rules, patient)
	testutil.Eventually(t, 10*time.Second, func() (bool, string) {
		for _, p := range a.Node.Peers() {
			if p.Peer == "b" && p.State.String() == "alive" {
				return true, ""
			}
		}
		return false, "a sees b alive"
	})
	hub.Cut("a", "b") // b stays alive (patient), and acknowledges nothing
	url := a.URL()
	for i := range 5 { // a's share of 10 over 2 members
		if status, out, _ := post(t, url+"/v1/allow", `{"rule":"held","key":"k"}`, nil); status != 200 || out["allowed"] != true {
			t.Fatalf("admission %d: %d %v", i, status, out)
		}
	}
	for _, c := range []struct {
		name, path, body string
		headers          map[string]string
	}{
		{"max_wait_ms", "/v1/allow", `{"rule":"held","key":"k","max_wait_ms":40}`, nil},
		{"header", "/v1/allow", `{"rule":"held","key":"k"}`, map[string]string{httpapi.MaxWaitHeader: "40"}},
		{"header at once", "/v1/allow", `{"rule":"held","key":"k"}`, map[string]string{httpapi.MaxWaitHeader: "1"}},
		{"the least wins", "/v1/allow", `{"rule":"held","key":"k","max_wait_ms":30000}`, map[string]string{httpapi.MaxWaitHeader: "40"}},
		{"envoy's header", "/v1/allow", `{"rule":"held","key":"k"}`, map[string]string{"X-Envoy-Expected-Rq-Timeout-Ms": "40"}},
		{"checks form", "/v1/allow", `{"checks":[{"rule":"held","key":"k"}],"max_wait_ms":40}`, nil},
	} {
		status, out, took := post(t, url+c.path, c.body, c.headers)
		if res, ok := out["results"].([]any); ok {
			out = res[0].(map[string]any)
		}
		if status != 200 || out["allowed"] != false || out["reason"] != "share" {
			t.Errorf("%s: %d %v, want a share denial", c.name, status, out)
		}
		// Held for its share_wait, it would take a second.
		if took > 900*time.Millisecond {
			t.Errorf("%s: answered after %v, not within its deadline", c.name, took)
		}
		t.Logf("%s: answered in %v", c.name, took.Round(100*time.Microsecond))
	}
	m := metricsText(t, a.Server)
	inTime, late := metricValue(m, `ratemesh_deadline_answers_total{api="http",outcome="in_time"}`), metricValue(m, `ratemesh_deadline_answers_total{api="http",outcome="late"}`)
	if inTime+late != 6 || metricValue(m, `ratemesh_deadline_answers_total{api="http",outcome="no_deadline"}`) != 5 {
		t.Errorf("deadline answers: %v in time, %v late, want 6 in all and 5 without a deadline:\n%s", inTime, late, grep(m, "ratemesh_deadline_answers_total"))
	}

	for _, c := range []struct{ value, want string }{
		{"soon", `X-Ratemesh-Max-Wait-Ms: must be a whole number of milliseconds from 1, got "soon"`},
		{"0", `X-Ratemesh-Max-Wait-Ms: must be a whole number of milliseconds from 1, got "0"`},
		{"-5", `X-Ratemesh-Max-Wait-Ms: must be a whole number of milliseconds from 1, got "-5"`},
	} {
		for _, path := range []string{"/v1/allow", "/v1/wait"} {
			status, out, _ := post(t, url+path, `{"rule":"held","key":"k"}`, map[string]string{httpapi.MaxWaitHeader: c.value})
			if status != 400 || out["error"] != c.want {
				t.Errorf("%s with %s %q: %d %v", path, httpapi.MaxWaitHeader, c.value, status, out)
			}
		}
	}
	req, _ := http.NewRequest("POST", url+"/v1/allow", strings.NewReader(`{"rule":"held","key":"k"}`))
	req.Header.Add(httpapi.MaxWaitHeader, "5")
	req.Header.Add(httpapi.MaxWaitHeader, "9")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 400 {
		t.Errorf("the header twice: %d, want 400", resp.StatusCode)
	}
}

// TestCallerDeadlineBoundsWait: /v1/wait, whose max_wait_ms would let it
// wait 10 s for the bucket's next credit, answers the denial at once when
// X-Ratemesh-Max-Wait-Ms says the caller gives up sooner.
func TestCallerDeadlineBoundsWait(t *testing.T) {
	a := apitest.Start(t, nil, "a", []limiter.Rule{{Name: "tb", Algorithm: limiter.TokenBucket, Limit: 1, Refill: 1, Interval: 10 * time.Second}})
	if status, out, _ := post(t, a.URL()+"/v1/allow", `{"rule":"tb","key":"k"}`, nil); status != 200 || out["allowed"] != true {
		t.Fatalf("the bucket's credit: %d %v", status, out)
	}
	status, out, took := post(t, a.URL()+"/v1/wait", `{"rule":"tb","key":"k","max_wait_ms":30000}`, map[string]string{httpapi.MaxWaitHeader: "200"})
	if status != 200 || out["allowed"] != false || took > 5*time.Second {
		t.Errorf("wait with a 200 ms deadline: %d %v after %v, want a denial well before the next credit (10 s)", status, out, took)
	}
	if m := metricsText(t, a.Server); metricValue(m, `ratemesh_deadline_answers_total{api="http",outcome="in_time"}`)+metricValue(m, `ratemesh_deadline_answers_total{api="http",outcome="late"}`) != 1 {
		t.Errorf("the wait is not counted against its deadline:\n%s", grep(m, "ratemesh_deadline_answers_total"))
	}
}

func metricValue(text, sample string) float64 {
	for _, l := range strings.Split(text, "\n") {
		if v, ok := strings.CutPrefix(l, sample+" "); ok {
			var f float64
			fmt.Sscan(v, &f)
			return f
		}
	}
	return -1
}

func grep(text, sub string) string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// patient keeps a silent member alive for the test's whole length, however
// slowly a busy host runs it: b must hold its share while cut off.
func patient(c *node.Config) {
	c.SuspectAfter, c.DeadAfter, c.EvictAfter = time.Minute, 2*time.Minute, 3*time.Minute
}
