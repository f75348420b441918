package httpapi

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
)

// TestAppendAllow: the hand-written answers are byte for byte what
// encoding/json writes for the same values.
func TestAppendAllow(t *testing.T) {
	rs := []AllowResponse{
		{},
		{Allowed: true, Limit: 5, Remaining: 4, ResetAfterMs: 3_599_999, Reason: "admitted"},
		{Limit: 1 << 50, Remaining: 1<<64 - 1, ResetAfterMs: -1 << 63, RetryAfterMs: -1, Reason: "key_cap"},
		{Reason: "un\"usual <é>\n"},
		{Reason: "\u2028"},
	}
	for _, r := range rs {
		want, _ := json.Marshal(r)
		if got := appendAllow(nil, r); string(got) != string(want) {
			t.Errorf("appendAllow(%+v) = %s, want %s", r, got, want)
		}
	}
	for _, m := range []MultiAllowResponse{{}, {Allowed: true, Results: []AllowResponse{}}, {Results: rs}} {
		want, _ := json.Marshal(m)
		if got := appendAllowAll(nil, m); string(got) != string(want) {
			t.Errorf("appendAllowAll(%+v) = %s, want %s", m, got, want)
		}
	}
}

// TestClean: the paths ServeMux would redirect are refused, the others
// kept.
func TestClean(t *testing.T) {
	for p, want := range map[string]bool{
		"": false, "v1": false, "/": true, "/v1/allow": true, "/v1/allow/": true,
		"//": false, "/v1//allow": false, "/v1/./allow": false, "/v1/../allow": false,
		"/v1/allow//": false, "/.": false, "/..": false, "/./": false, "/a.b/..c": true,
	} {
		if got := clean(p); got != want {
			t.Errorf("clean(%q) = %v, want %v", p, got, want)
		}
	}
}

// TestHeaderNamesCanonical: the header names the handlers read or set
// through the header map directly are in net/http's canonical form, the
// one it stores a request's in.
func TestHeaderNamesCanonical(t *testing.T) {
	for _, name := range []string{MaxWaitHeader, envoyTimeoutHeader, "Content-Type"} {
		if c := http.CanonicalHeaderKey(name); c != name {
			t.Errorf("%s: canonical %s", name, c)
		}
	}
}

// TestAnswerHeader: an answer carries Content-Type application/json, and
// a header added to it later leaves the shared value alone.
func TestAnswerHeader(t *testing.T) {
	w := httptest.NewRecorder()
	writeAllow(w, AllowResponse{Allowed: true, Reason: "admitted"})
	w.Header().Add("Content-Type", "text/plain")
	if got := w.Header()["Content-Type"]; len(got) != 2 || got[0] != "application/json" || len(jsonType) != 1 || jsonType[0] != "application/json" {
		t.Errorf("Content-Type %q, shared %q", got, jsonType)
	}
	w = httptest.NewRecorder()
	writeJSON(w, http.StatusTeapot, HealthResponse{State: "ready"})
	if w.Code != http.StatusTeapot || w.Header().Get("Content-Type") != "application/json" || w.Body.String() != "{\"state\":\"ready\"}\n" {
		t.Errorf("%d %v %q", w.Code, w.Header(), w.Body)
	}
}
