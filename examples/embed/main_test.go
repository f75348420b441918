package main

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/ratemesh/ratemesh/internal/testutil"
	"github.com/ratemesh/ratemesh/limiter"
	"github.com/ratemesh/ratemesh/node"
)

// TestTwoReplicas runs the example as two replicas on loopback: the second
// joins through the first and both decide against the same limits. The
// windows are a day long so that none ends during the test.
func TestTwoReplicas(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rules := []limiter.Rule{
		{Name: "api", Algorithm: limiter.FixedWindow, Limit: 100, Window: 24 * time.Hour},
		{Name: "hourly", Algorithm: limiter.FixedWindow, Limit: 1000, Window: 24 * time.Hour, Overrides: map[string]uint64{"acct:small": 5}},
		{Name: "conns", Algorithm: limiter.Concurrency, Limit: 4, LeaseTTL: time.Minute},
	}
	dir := t.TempDir()
	a, ma, err := StartMember(ctx, Options{DataDir: filepath.Join(dir, "a", "data"), Listen: []string{"/ip4/127.0.0.1/tcp/0"}, Rules: rules})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	ha, err := Handler(a, nil)
	if err != nil {
		t.Fatal(err)
	}
	do := func(h http.Handler, method, path, account, remote string) *httptest.ResponseRecorder {
		t.Helper()
		r := httptest.NewRequest(method, path, nil)
		if account != "" {
			r.Header.Set("X-Account", account)
		}
		r.RemoteAddr = remote
		r.Header.Set("X-Forwarded-For", "198.51.100.9") // believed only from a trusted proxy
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	for i := range 4 {
		if w := do(ha, "GET", "/hello", "", "192.0.2.1:1000"); w.Code != 200 || w.Body.String() != "hello\n" {
			t.Fatalf("hello %d at a: %d %q", i, w.Code, w.Body)
		}
	}
	// The middleware keyed the requests by the connection's address, not
	// by the forwarding header of an untrusted peer.
	if rep, err := a.Usage("api", "192.0.2.1"); err != nil || rep.Total != 4 {
		t.Fatalf("a's usage of 192.0.2.1: %+v, %v; want 4", rep, err)
	}

	b, _, err := StartMember(ctx, Options{DataDir: filepath.Join(dir, "b"), Listen: []string{"/ip4/127.0.0.1/tcp/0"}, Bootstrap: ma.Addrs(), Rules: rules})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	// From a trusted proxy, the rightmost untrusted forwarded address is
	// the key: the same client as at a.
	hb, err := Handler(b, []netip.Prefix{netip.MustParsePrefix("203.0.113.0/24")})
	if err != nil {
		t.Fatal(err)
	}
	if rep, err := b.Usage("api", "192.0.2.1"); err != nil || rep.Total != 4 {
		t.Fatalf("b joined with usage %+v, %v; want the 4 admitted at a", rep, err)
	}
	w := do(hb, "GET", "/hello", "", "203.0.113.5:2000")
	if w.Code != 200 {
		t.Fatalf("hello at b: %d %q", w.Code, w.Body)
	}
	if got := w.Header().Get("RateLimit-Policy"); got != `"api";q=100;w=86400` {
		t.Fatalf("RateLimit-Policy %q", got)
	}
	if rep, err := b.Usage("api", "198.51.100.9"); err != nil || rep.Total != 1 {
		t.Fatalf("b's usage of the forwarded client: %+v, %v; want 1", rep, err)
	}

	// /search costs 5 of the account's api limit.
	if w := do(ha, "GET", "/search", "acct:9", "192.0.2.1:1000"); w.Code != 200 || w.Body.String() != "results (95 left this second)\n" {
		t.Fatalf("search: %d %q", w.Code, w.Body)
	}
	if w := do(ha, "GET", "/search", "", "192.0.2.1:1000"); w.Code != 400 {
		t.Fatalf("search without an account: %d %q; want 400", w.Code, w.Body)
	}

	// /report: 10 of api and 10 of hourly, all or nothing. acct:small's
	// hourly limit is 5, so its report can never pass (no Retry-After) and
	// consumes nothing of api either.
	if w := do(hb, "POST", "/report", "acct:7", "203.0.113.5:2000"); w.Code != 200 || w.Body.String() != "report accepted\n" {
		t.Fatalf("report: %d %q", w.Code, w.Body)
	}
	for _, rule := range []string{"api", "hourly"} {
		if rep, err := b.Usage(rule, "acct:7"); err != nil || rep.Total != 10 {
			t.Fatalf("%s after a report: %+v, %v; want 10", rule, rep, err)
		}
	}
	w = do(hb, "POST", "/report", "acct:small", "203.0.113.5:2000")
	if w.Code != http.StatusTooManyRequests || w.Header().Get("Retry-After") != "" {
		t.Fatalf("report over acct:small's limit: %d %q Retry-After %q; want 429 without Retry-After", w.Code, w.Body, w.Header().Get("Retry-After"))
	}
	if rep, err := b.Usage("api", "acct:small"); err != nil || rep.Total != 0 {
		t.Fatalf("api after a denied report: %+v, %v; want 0", rep, err)
	}
	if w := do(hb, "POST", "/report", "", "203.0.113.5:2000"); w.Code != 400 {
		t.Fatalf("report without an account: %d; want 400", w.Code)
	}

	// /stream holds a lease for the request and releases it after.
	for _, h := range []http.Handler{ha, hb} {
		w := do(h, "GET", "/stream", "acct:7", "192.0.2.1:1000")
		if w.Code != 200 {
			t.Fatalf("stream: %d %q", w.Code, w.Body)
		}
	}
	for name, n := range map[string]*node.Node{"a": a, "b": b} {
		testutil.Eventually(t, 10*time.Second, func() (bool, string) {
			rep, err := n.Usage("conns", "acct:7")
			return err == nil && rep.Total == 0, fmt.Sprintf("%s: live leases %+v, %v; want 0 once released", name, rep, err)
		})
	}
	if w := do(ha, "GET", "/stream", "", "192.0.2.1:1000"); w.Code != 400 {
		t.Fatalf("stream without an account: %d %q; want 400", w.Code, w.Body)
	}
}

func TestStartMemberBadDataDir(t *testing.T) {
	file := filepath.Join(t.TempDir(), "f")
	if err := writeFile(file); err != nil {
		t.Fatal(err)
	}
	_, _, err := StartMember(context.Background(), Options{DataDir: file, Rules: Rules()})
	if err == nil {
		t.Fatal("StartMember on a file: no error")
	}
}

func writeFile(path string) error { return os.WriteFile(path, []byte("x"), 0o600) }
