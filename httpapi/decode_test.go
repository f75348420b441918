package httpapi_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"

	"github.com/ratemesh/ratemesh/internal/apitest"
)

// decodeCase is one request and the answer the API gave it when the
// request still went through map[string]any (recorded at 69e81b5): the
// status, and the error's exact text, or for a 200 the decision without
// its times.
type decodeCase struct {
	method, path, body string
	header             map[string]string
	status             int
	want               string
}

func decodeCases() []decodeCase {
	checks := func(n int) string {
		s := make([]string, n)
		for i := range s {
			s[i] = fmt.Sprintf(`{"rule":"big","key":"c%d"}`, i)
		}
		return `{"checks":[` + strings.Join(s, ",") + `]}`
	}
	pad := strings.Repeat(" ", 70<<10)
	long := strings.Repeat("k", 257)
	return []decodeCase{
		// The body as a whole.
		{method: "POST", path: "/v1/allow", body: ``},
		{method: "POST", path: "/v1/allow", body: `   `},
		{method: "POST", path: "/v1/allow", body: `{"rule":`},
		{method: "POST", path: "/v1/allow", body: `{"rule":"api",}`},
		{method: "POST", path: "/v1/allow", body: `{"rule" "api"}`},
		{method: "POST", path: "/v1/allow", body: `{'rule':'api'}`},
		{method: "POST", path: "/v1/allow", body: `{"rule":"api","key":"k"`},
		{method: "POST", path: "/v1/allow", body: `{"rule":"a\x01pi","key":"k"}`},
		{method: "POST", path: "/v1/allow", body: `{"rule":"a\qpi","key":"k"}`},
		{method: "POST", path: "/v1/allow", body: `{"rule":tru,"key":"k"}`},
		{method: "POST", path: "/v1/allow", body: `{"cost":01}`},
		{method: "POST", path: "/v1/allow", body: `{"cost":1.}`},
		{method: "POST", path: "/v1/allow", body: `{"cost":-}`},
		{method: "POST", path: "/v1/allow", body: `[1,2]`},
		{method: "POST", path: "/v1/allow", body: `"x"`},
		{method: "POST", path: "/v1/allow", body: `5`},
		{method: "POST", path: "/v1/allow", body: `true`},
		{method: "POST", path: "/v1/allow", body: `null`},
		{method: "POST", path: "/v1/allow", body: `{"rule":"api","key":"k"} {}`},
		{method: "POST", path: "/v1/allow", body: `{"rule":"api","key":"k"} x`},
		{method: "POST", path: "/v1/allow", body: `{"rule":"api","key":"k"}]`},
		{method: "POST", path: "/v1/allow", body: `[] {}`},
		{method: "POST", path: "/v1/allow", body: `{"rule":"api","key":"k","pad":"` + strings.Repeat("x", 70<<10) + `"}`},
		{method: "POST", path: "/v1/allow", body: `{"rule":"api","key":"k"}` + pad},
		{method: "POST", path: "/v1/allow", body: `{"rule":"api","key":"k"}` + pad + `x`},
		{method: "POST", path: "/v1/allow", body: `{"rule":x` + strings.Repeat("y", 70<<10)},
		{method: "POST", path: "/v1/allow", body: `{"rule":"api","key":"k"` + pad + `}`},
		{method: "POST", path: "/v1/allow", body: `{"pad":"` + strings.Repeat("x", 65500) + `"}`},
		{method: "POST", path: "/v1/allow", body: `{"rule":"api","key":"k"}` + "\n"},
		// Fields of the single form.
		{method: "POST", path: "/v1/allow", body: `{}`},
		{method: "POST", path: "/v1/allow", body: `{"rule":5,"key":"k"}`},
		{method: "POST", path: "/v1/allow", body: `{"rule":true,"key":"k"}`},
		{method: "POST", path: "/v1/allow", body: `{"rule":{},"key":"k"}`},
		{method: "POST", path: "/v1/allow", body: `{"rule":"api","key":["k"]}`},
		{method: "POST", path: "/v1/allow", body: `{"key":"k"}`},
		{method: "POST", path: "/v1/allow", body: `{"rule":"api"}`},
		{method: "POST", path: "/v1/allow", body: `{"rule":"","key":"k"}`},
		{method: "POST", path: "/v1/allow", body: `{"rule":"api","key":""}`},
		{method: "POST", path: "/v1/allow", body: `{"rule":"api","key":null}`},
		{method: "POST", path: "/v1/allow", body: `{"rule":"api","key":"` + long + `"}`},
		{method: "POST", path: "/v1/allow", body: `{"rule":"api","key":"` + long + `","cost":-1}`},
		{method: "POST", path: "/v1/allow", body: `{"rule":"api","key":"k","cost":-1}`},
		{method: "POST", path: "/v1/allow", body: `{"rule":"api","key":"k","cost":-0}`},
		{method: "POST", path: "/v1/allow", body: `{"rule":"api","key":"k","cost":-0.0}`},
		{method: "POST", path: "/v1/allow", body: `{"rule":"api","key":"k","cost":-1e-400}`},
		{method: "POST", path: "/v1/allow", body: `{"rule":"api","key":"k","cost":-1.5}`},
		{method: "POST", path: "/v1/allow", body: `{"rule":"api","key":"k","cost":1.5}`},
		{method: "POST", path: "/v1/allow", body: `{"rule":"api","key":"k","cost":1e-3}`},
		{method: "POST", path: "/v1/allow", body: `{"rule":"big","key":"e1","cost":2.0}`},
		{method: "POST", path: "/v1/allow", body: `{"rule":"big","key":"e2","cost":1E1}`},
		{method: "POST", path: "/v1/allow", body: `{"rule":"big","key":"e3","cost":0}`},
		{method: "POST", path: "/v1/allow", body: `{"rule":"api","key":"k","cost":1e300}`},
		{method: "POST", path: "/v1/allow", body: `{"rule":"api","key":"k","cost":1e999}`},
		{method: "POST", path: "/v1/allow", body: `{"rule":"api","key":"k","cost":99999999999999999999999}`},
		{method: "POST", path: "/v1/allow", body: `{"rule":"api","key":"k","cost":18446744073709551615}`},
		{method: "POST", path: "/v1/allow", body: `{"rule":"api","key":"k","cost":1125899906842625}`},
		{method: "POST", path: "/v1/allow", body: `{"rule":"api","key":"k","cost":1125899906842624}`},
		{method: "POST", path: "/v1/allow", body: `{"rule":"api","key":"k","cost":"5"}`},
		{method: "POST", path: "/v1/allow", body: `{"rule":"api","key":"k","cost":true}`},
		{method: "POST", path: "/v1/allow", body: `{"rule":"api","key":"k","cost":[1]}`},
		{method: "POST", path: "/v1/allow", body: `{"rule":"big","key":"n1","cost":null}`},
		{method: "POST", path: "/v1/allow", body: `{"rule":"api","key":"k","cost":1,"type":"query"}`},
		{method: "POST", path: "/v1/allow", body: `{"rule":"api","key":"k","units":3}`},
		{method: "POST", path: "/v1/allow", body: `{"rule":"api","key":"k","type":"query","units":-3}`},
		{method: "POST", path: "/v1/allow", body: `{"rule":"api","key":"k","type":"query","units":1.5}`},
		{method: "POST", path: "/v1/allow", body: `{"rule":"api","key":"k","type":"nope","units":1}`},
		{method: "POST", path: "/v1/allow", body: `{"rule":"api","key":"k","type":""}`},
		{method: "POST", path: "/v1/allow", body: `{"rule":"api","key":"k","type":null}`},
		{method: "POST", path: "/v1/allow", body: `{"rule":"api","key":"k","type":null,"cost":1}`},
		{method: "POST", path: "/v1/allow", body: `{"rule":"api","key":"k","type":null,"units":1}`},
		{method: "POST", path: "/v1/allow", body: `{"rule":"api","key":"k","type":5}`},
		{method: "POST", path: "/v1/allow", body: `{"rule":"api","key":"t1","type":"query"}`},
		{method: "POST", path: "/v1/allow", body: `{"rule":"api","key":"t2","type":"publish","units":1}`},
		{method: "POST", path: "/v1/allow", body: `{"rule":"api","key":"k","class":"vip"}`},
		{method: "POST", path: "/v1/allow", body: `{"rule":"api","key":"k","class":7}`},
		{method: "POST", path: "/v1/allow", body: `{"rule":"api","key":"c1","class":"payer"}`},
		{method: "POST", path: "/v1/allow", body: `{"rule":"api","key":"c2","class":""}`},
		{method: "POST", path: "/v1/allow", body: `{"rule":"api","key":"k","colour":"red"}`},
		{method: "POST", path: "/v1/allow", body: `{"rule":"api","key":"k","colour":null}`},
		{method: "POST", path: "/v1/allow", body: `{"rule":"api","key":"k","zeta":1,"alpha":2}`},
		{method: "POST", path: "/v1/allow", body: `{"rule":"api","key":"k","RULE":"api"}`},
		{method: "POST", path: "/v1/allow", body: `{"Rule":"api","key":"k"}`},
		{method: "POST", path: "/v1/allow", body: `{"rule":"api","key":"k","lease_id":"x"}`},
		{method: "POST", path: "/v1/allow", body: `{"rule":5,"key":"k","colour":"red"}`},
		{method: "POST", path: "/v1/allow", body: `{"\u0072ule":"api","key":"u1"}`},
		{method: "POST", path: "/v1/allow", body: `{"rule":"api","key":"caf\u00e9"}`},
		{method: "POST", path: "/v1/allow", body: "{\"rule\":\"api\",\"key\":\"k\xff\"}"},
		{method: "POST", path: "/v1/allow", body: "{\"rule\":\"api\",\"key\":\"k\",\"\xff\":1}"},
		{method: "POST", path: "/v1/allow", body: `{"rule":"nope","key":"d1","rule":"api"}`},
		{method: "POST", path: "/v1/allow", body: `{"rule":"api","key":"d2","rule":"nope"}`},
		{method: "POST", path: "/v1/allow", body: `{"rule":"nope","key":"k"}`},
		{method: "POST", path: "/v1/allow", body: `{"rule":"conc","key":"k"}`},
		{method: "POST", path: "/v1/allow", body: "\t{ \"rule\" : \"api\" ,\n \"key\" : \"w1\" }\r\n"},
		{method: "POST", path: "/v1/allow", body: `{"rule":"api","key":"v1","cost":1}`},
		{method: "POST", path: "/v1/allow", body: `{"rule":"api","key":"v2","cost":6}`},
		{method: "POST", path: "/v1/allow", body: `{"rule":"api","key":"v3","cost":1,"class":"node"}`},
		// max_wait_ms and the deadline headers.
		{method: "POST", path: "/v1/allow", body: `{"rule":"api","key":"k","max_wait_ms":0}`},
		{method: "POST", path: "/v1/allow", body: `{"rule":"api","key":"k","max_wait_ms":"20"}`},
		{method: "POST", path: "/v1/allow", body: `{"rule":"api","key":"k","max_wait_ms":-1}`},
		{method: "POST", path: "/v1/allow", body: `{"rule":"api","key":"k","max_wait_ms":1.5}`},
		{method: "POST", path: "/v1/allow", body: `{"rule":"api","key":"k","max_wait_ms":100000000}`},
		{method: "POST", path: "/v1/allow", body: `{"rule":"api","key":"k","max_wait_ms":30001}`},
		{method: "POST", path: "/v1/allow", body: `{"rule":"api","key":"m1","max_wait_ms":30000}`},
		{method: "POST", path: "/v1/allow", body: `{"rule":"api","key":"m2","max_wait_ms":null}`},
		{method: "POST", path: "/v1/allow", body: `{"rule":5,"key":"k","max_wait_ms":0}`},
		{method: "POST", path: "/v1/allow", body: `{"rule":"api","key":"k","max_wait_ms":0,"colour":1}`},
		{method: "POST", path: "/v1/allow", body: `{"rule":"api","key":"k","units":1,"max_wait_ms":0}`},
		{method: "POST", path: "/v1/allow", body: `{"rule":"api","key":"h1"}`, header: map[string]string{"X-Ratemesh-Max-Wait-Ms": "0"}},
		{method: "POST", path: "/v1/allow", body: `{"rule":"api","key":"h2"}`, header: map[string]string{"X-Ratemesh-Max-Wait-Ms": "abc"}},
		{method: "POST", path: "/v1/allow", body: `{"rule":"api","key":"h3"}`, header: map[string]string{"X-Ratemesh-Max-Wait-Ms": " 20 "}},
		{method: "POST", path: "/v1/allow", body: `{"rule":"api","key":"h4"}`, header: map[string]string{"X-Envoy-Expected-Rq-Timeout-Ms": "junk"}},
		{method: "POST", path: "/v1/allow", body: `{"rule":"api","key":"h5"}`, header: map[string]string{"X-Envoy-Expected-Rq-Timeout-Ms": "20"}},
		{method: "POST", path: "/v1/allow", body: `{"rule":5,"key":"h6"}`, header: map[string]string{"X-Ratemesh-Max-Wait-Ms": "0"}},
		{method: "POST", path: "/v1/allow", body: `{"checks":[{"rule":"api","key":"h7"}]}`, header: map[string]string{"X-Ratemesh-Max-Wait-Ms": "-4"}},
		// The checks form.
		{method: "POST", path: "/v1/allow", body: `{"checks":{}}`},
		{method: "POST", path: "/v1/allow", body: `{"checks":null}`},
		{method: "POST", path: "/v1/allow", body: `{"checks":"x"}`},
		{method: "POST", path: "/v1/allow", body: `{"checks":[]}`},
		{method: "POST", path: "/v1/allow", body: checks(65)},
		{method: "POST", path: "/v1/allow", body: checks(64)},
		{method: "POST", path: "/v1/allow", body: `{"checks":[{"rule":"api","key":"k"}],"rule":"api"}`},
		{method: "POST", path: "/v1/allow", body: `{"checks":[{"rule":"api","key":"k"}],"colour":null}`},
		{method: "POST", path: "/v1/allow", body: `{"checks":5,"colour":1}`},
		{method: "POST", path: "/v1/allow", body: `{"checks":[5],"max_wait_ms":-1}`},
		{method: "POST", path: "/v1/allow", body: `{"checks":[{"rule":"api","key":"k"},{"rule":"api","key":"k","cost":-2}]}`},
		{method: "POST", path: "/v1/allow", body: `{"checks":[{"rule":"api","key":"k"},{"rule":"api","key":"k","class":"vip"}]}`},
		{method: "POST", path: "/v1/allow", body: `{"checks":[{"rule":"nope","key":"k"}]}`},
		{method: "POST", path: "/v1/allow", body: `{"checks":[5]}`},
		{method: "POST", path: "/v1/allow", body: `{"checks":[null]}`},
		{method: "POST", path: "/v1/allow", body: `{"checks":[[]]}`},
		{method: "POST", path: "/v1/allow", body: `{"checks":[{"rule":"api","key":"k","colour":1},5]}`},
		{method: "POST", path: "/v1/allow", body: `{"checks":[{"rule":"api","key":"k"},{"rule":"api","key":"k","zeta":1,"beta":2}]}`},
		{method: "POST", path: "/v1/allow", body: `{"checks":[{"rule":"api","key":"k","checks":[]}]}`},
		{method: "POST", path: "/v1/allow", body: `{"checks":[{"key":"k"}]}`},
		{method: "POST", path: "/v1/allow", body: `{"checks":[{"rule":"api","key":"k","units":2}]}`},
		{method: "POST", path: "/v1/allow", body: `{"checks":[{"rule":"api","key":"k","type":null}]}`},
		{method: "POST", path: "/v1/allow", body: `{"checks":[{"rule":"api","key":"k"}],"max_wait_ms":0}`},
		{method: "POST", path: "/v1/allow", body: `{"checks":[{"rule":"api","key":"k"}],"max_wait_ms":"1"}`},
		{method: "POST", path: "/v1/allow", body: `{"checks":[{"rule":"api","key":"k","max_wait_ms":5}]}`},
		{method: "POST", path: "/v1/allow", body: `{"checks":[{"rule":"api","key":"x1"},{"rule":"big","key":"x1","cost":3}],"max_wait_ms":50}`},
		{method: "POST", path: "/v1/allow", body: `{"checks":[{"rule":"api","key":"x2","cost":9},{"rule":"big","key":"x2"}]}`},
		{method: "POST", path: "/v1/allow", body: `{"max_wait_ms":null,"checks":[{"rule":"api","key":"x3","type":"publish"}]}`},
		{method: "POST", path: "/v1/allow", body: `{"checks":[{"rule":"api","key":"x4"}],"checks":5}`},
		{method: "POST", path: "/v1/allow", body: `{"checks":5,"checks":[{"rule":"api","key":"x5"}]}`},
		// /v1/wait.
		{method: "POST", path: "/v1/wait", body: `{"checks":[]}`},
		{method: "POST", path: "/v1/wait", body: `{"checks":null}`},
		{method: "POST", path: "/v1/wait", body: `{"rule":"api","key":"k","max_wait_ms":-5}`},
		{method: "POST", path: "/v1/wait", body: `{"rule":"api","key":"k","max_wait_ms":100000000}`},
		{method: "POST", path: "/v1/wait", body: `{"rule":"api","key":"k","colour":1}`},
		{method: "POST", path: "/v1/wait", body: `{"rule":"api","key":"k","units":1}`},
		{method: "POST", path: "/v1/wait", body: `[]`},
		{method: "POST", path: "/v1/wait", body: `{"rule":"api","key":"wt1","max_wait_ms":0}`},
		{method: "POST", path: "/v1/wait", body: `{"rule":"api","key":"wt2","cost":2}`},
		{method: "POST", path: "/v1/wait", body: `{"rule":"api","key":"wt3"}`, header: map[string]string{"X-Ratemesh-Max-Wait-Ms": "0"}},
		// /v1/acquire.
		{method: "POST", path: "/v1/acquire", body: `{"rule":"conc"}`},
		{method: "POST", path: "/v1/acquire", body: `{"rule":"conc","key":"k","cost":1}`},
		{method: "POST", path: "/v1/acquire", body: `{"rule":"conc","key":"k","checks":[]}`},
		{method: "POST", path: "/v1/acquire", body: `{"rule":"conc","key":"k","max_wait_ms":-1}`},
		{method: "POST", path: "/v1/acquire", body: `{"rule":"conc","key":"k","max_wait_ms":0}`},
		{method: "POST", path: "/v1/acquire", body: `{"rule":"conc","key":"k","class":5}`},
		{method: "POST", path: "/v1/acquire", body: `{"rule":"conc","key":"` + long + `"}`},
		{method: "POST", path: "/v1/acquire", body: `{"rule":"api","key":"k"}`},
		{method: "POST", path: "/v1/acquire", body: `{"rule":"conc","key":"k","class":"x"}`},
		{method: "POST", path: "/v1/acquire", body: `{"rule":"zzz","key":"k"}`},
		{method: "POST", path: "/v1/acquire", body: `{"rule":"conc","key":"k","type":"q"}`},
		{method: "POST", path: "/v1/acquire", body: `{"rule":"conc","key":"k"} 1`},
		// /v1/renew and /v1/release.
		{method: "POST", path: "/v1/renew", body: `{}`},
		{method: "POST", path: "/v1/renew", body: `{"lease_id":7}`},
		{method: "POST", path: "/v1/renew", body: `{"lease_id":""}`},
		{method: "POST", path: "/v1/renew", body: `{"lease_id":null}`},
		{method: "POST", path: "/v1/renew", body: `{"lease_id":"a~1~1"}`},
		{method: "POST", path: "/v1/renew", body: `{"lease_id":"a~1~1","rule":"x"}`},
		{method: "POST", path: "/v1/renew", body: `[]`},
		{method: "POST", path: "/v1/release", body: `{"lease_id":"QmOther~1~1"}`},
		{method: "POST", path: "/v1/release", body: `{"lease_id":"a~1~1","key":5}`},
		{method: "POST", path: "/v1/release", body: `{"lease_id":`},
	}
}

// decided is a 200 answer without its times, which depend on the clock.
func decided(body []byte) string {
	var out map[string]any
	if err := json.Unmarshal(body, &out); err != nil {
		return "not JSON: " + string(body)
	}
	strip := func(m map[string]any) {
		delete(m, "reset_after_ms")
		delete(m, "ttl_ms")
		delete(m, "lease_id")
		if ra, ok := m["retry_after_ms"].(float64); ok && ra > 0 {
			m["retry_after_ms"] = "positive"
		}
	}
	strip(out)
	if rs, ok := out["results"].([]any); ok {
		for _, r := range rs {
			strip(r.(map[string]any))
		}
	}
	b, _ := json.Marshal(out)
	return string(b)
}

// TestDecodeContract holds the decoder to the answers the API gave
// before it decoded into a typed request: status and exact error text
// for malformed requests, the decision for valid ones. The cases run in
// order against one node; valid ones use keys of their own.
// RATEMESH_RECORD=1 prints the table's answers instead.
func TestDecodeContract(t *testing.T) {
	api := apitest.Start(t, nil, "a", testRules()).API
	record := os.Getenv("RATEMESH_RECORD") == "1"
	cases := decodeCases()
	var want []decodeAnswer
	if !record {
		want = decodeAnswers()
		if len(want) != len(cases) {
			t.Fatalf("%d cases, %d answers", len(cases), len(want))
		}
	}
	for i, tc := range cases {
		req := httptest.NewRequest(tc.method, tc.path, strings.NewReader(tc.body))
		for k, v := range tc.header {
			req.Header.Set(k, v)
		}
		rec := httptest.NewRecorder()
		api.ServeHTTP(rec, req)
		got := decodeAnswer{status: rec.Code}
		if rec.Code == http.StatusOK {
			got.body = decided(rec.Body.Bytes())
		} else {
			var e struct{ Error string }
			if err := json.Unmarshal(rec.Body.Bytes(), &e); err != nil {
				t.Fatalf("case %d: answer is not JSON: %q", i, rec.Body.Bytes())
			}
			got.body = e.Error
		}
		if record {
			fmt.Printf("\t\t{%d, %q},\n", got.status, got.body)
			continue
		}
		if got != want[i] {
			body := tc.body
			if len(body) > 120 {
				body = body[:120] + "…"
			}
			t.Errorf("case %d %s %s %q:\n got %d %q\nwant %d %q", i, tc.method, tc.path, body, got.status, got.body, want[i].status, want[i].body)
		}
	}
}

type decodeAnswer struct {
	status int
	body   string
}
