package httplimit_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/ratemesh/ratemesh/limiter"
	"github.com/ratemesh/ratemesh/node"
	"github.com/ratemesh/ratemesh/node/httplimit"
	"github.com/ratemesh/ratemesh/node/memnet"
)

// frozenAt returns a clock stopped into past the start of a window of
// length w: header values that depend on the time are then exact.
func frozenAt(w, into time.Duration) func() time.Time {
	now := time.Now().UnixNano()
	t := time.Unix(0, now-now%w.Nanoseconds()).Add(w + into) // windows align to the Unix epoch
	return func() time.Time { return t }
}

// startNode starts a real node alone on a memnet hub with rules, its clock
// stopped 2.1 s into a 10 s window, closed when the test ends.
func startNode(t *testing.T, rules ...limiter.Rule) *node.Node {
	t.Helper()
	cfg := node.DefaultConfig()
	cfg.Peer, cfg.Rules, cfg.Transport = "a", rules, memnet.NewHub().Transport("a")
	cfg.Clock = frozenAt(10*time.Second, 2100*time.Millisecond)
	n, err := node.Start(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Close() })
	return n
}

func fixed(name string, limit uint64, w time.Duration) limiter.Rule {
	return limiter.Rule{Name: name, Algorithm: limiter.FixedWindow, Limit: limit, Window: w}
}

var ok = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	_, _ = io.WriteString(w, "hello")
})

// wrap returns the middleware for cfg over n around ok.
func wrap(t *testing.T, n httplimit.Limiter, cfg httplimit.Config) http.Handler {
	t.Helper()
	mw, err := httplimit.New(n, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return mw(ok)
}

func do(h http.Handler, remote string, hdr ...string) *httptest.ResponseRecorder {
	r := httptest.NewRequest("GET", "/x", nil)
	r.RemoteAddr = remote
	for i := 0; i+1 < len(hdr); i += 2 {
		r.Header.Add(hdr[i], hdr[i+1])
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// TestHeadersOnEveryResponse sends five requests against a limit of 3 in a
// 10 s window 2.1 s in: the first three pass with r counting down, the last
// two get 429 with Retry-After 8 (7.9 s rounded up), and all carry both
// headers.
func TestHeadersOnEveryResponse(t *testing.T) {
	n := startNode(t, fixed("api", 3, 10*time.Second))
	cfg := httplimit.DefaultConfig()
	cfg.Rule = "api"
	h := wrap(t, n, cfg)
	want := []struct {
		code             int
		rateLimit, retry string
	}{
		{200, `"api";r=2;t=8`, ""},
		{200, `"api";r=1;t=8`, ""},
		{200, `"api";r=0;t=8`, ""},
		{429, `"api";r=0;t=8`, "8"},
		{429, `"api";r=0;t=8`, "8"},
	}
	for i, w := range want {
		res := do(h, "192.0.2.7:4242")
		if res.Code != w.code {
			t.Errorf("request %d: status %d, want %d", i+1, res.Code, w.code)
		}
		if got := res.Header().Values("RateLimit-Policy"); len(got) != 1 || got[0] != `"api";q=3;w=10` {
			t.Errorf("request %d: RateLimit-Policy %q, want [\"api\";q=3;w=10]", i+1, got)
		}
		if got := res.Header().Values("RateLimit"); len(got) != 1 || got[0] != w.rateLimit {
			t.Errorf("request %d: RateLimit %q, want %q", i+1, got, w.rateLimit)
		}
		if got := res.Header().Get("Retry-After"); got != w.retry {
			t.Errorf("request %d: Retry-After %q, want %q", i+1, got, w.retry)
		}
		if body := res.Body.String(); (w.code == 200) != (body == "hello") {
			t.Errorf("request %d: body %q (status %d)", i+1, body, res.Code)
		}
	}
	// Another client has its own key.
	if res := do(h, "192.0.2.8:1"); res.Code != 200 || res.Header().Get("RateLimit") != `"api";r=2;t=8` {
		t.Errorf("other client: %d %q", res.Code, res.Header().Get("RateLimit"))
	}
}

func TestRetryAfterRounding(t *testing.T) {
	for _, c := range []struct {
		in   time.Duration
		want int64
		ok   bool
	}{
		{0, 1, true},
		{time.Nanosecond, 1, true},
		{time.Millisecond, 1, true},
		{999 * time.Millisecond, 1, true},
		{1000 * time.Millisecond, 1, true},
		{1001 * time.Millisecond, 2, true},
		{2 * time.Second, 2, true},
		{2*time.Second + time.Nanosecond, 3, true},
		{90 * time.Second, 90, true},
		{node.Never, 0, false},
	} {
		got, ok := httplimit.RetryAfterSeconds(c.in)
		if got != c.want || ok != c.ok {
			t.Errorf("RetryAfterSeconds(%v) = %d, %t; want %d, %t", c.in, got, ok, c.want, c.ok)
		}
	}
}

func TestHeaderValues(t *testing.T) {
	for _, c := range []struct {
		policy string
		limit  uint64
		window time.Duration
		want   string
	}{
		{"default", 100, time.Second, `"default";q=100;w=1`},
		{"api", 5000, time.Hour, `"api";q=5000;w=3600`},
		{"fast", 10, 100 * time.Millisecond, `"fast";q=10;w=1`},
		{"odd", 10, 1500 * time.Millisecond, `"odd";q=10;w=2`},
		{`q"uo\te`, 1, time.Minute, `"q\"uo\\te";q=1;w=60`},
		{"leases", 4, 0, `"leases";q=4`},
	} {
		if got := httplimit.PolicyValue(c.policy, c.limit, c.window); got != c.want {
			t.Errorf("PolicyValue(%q, %d, %v) = %s, want %s", c.policy, c.limit, c.window, got, c.want)
		}
	}
	for _, c := range []struct {
		d    node.Decision
		want string
	}{
		{node.Decision{Allowed: true, Remaining: 37, ResetAfter: 1 * time.Second}, `"default";r=37;t=1`},
		{node.Decision{Remaining: 0, ResetAfter: 1 * time.Millisecond, RetryAfter: time.Millisecond}, `"default";r=0;t=1`},
		{node.Decision{Allowed: true, Remaining: 5, ResetAfter: 1001 * time.Millisecond}, `"default";r=5;t=2`},
		{node.Decision{Allowed: true, Remaining: 5, ResetAfter: 0}, `"default";r=5;t=0`},
		// Denied for the share: a retry can expect nothing now, and may pass in 40 ms, not at the window's end.
		{node.Decision{Remaining: 0, ResetAfter: 8 * time.Second, RetryAfter: 40 * time.Millisecond, Reason: limiter.ReasonShare}, `"default";r=0;t=1`},
		{node.Decision{Remaining: 0, ResetAfter: 8 * time.Second, RetryAfter: 2500 * time.Millisecond}, `"default";r=0;t=3`},
		// Never admissible: the reset, and the remaining smaller requests can have.
		{node.Decision{Remaining: 3, ResetAfter: 8 * time.Second, RetryAfter: node.Never, Reason: limiter.ReasonCost}, `"default";r=3;t=8`},
	} {
		if got := httplimit.RateLimitValue("default", c.d); got != c.want {
			t.Errorf("RateLimitValue(%+v) = %s, want %s", c.d, got, c.want)
		}
	}
}

func TestClientIP(t *testing.T) {
	proxies := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("2001:db8::/32")}
	for _, c := range []struct {
		name    string
		trusted []netip.Prefix
		remote  string
		xff     []string
		want    string // "" means an error wrapping ErrKey
	}{
		{"peer only", nil, "192.0.2.1:5555", nil, "192.0.2.1"},
		{"no trust ignores XFF", nil, "192.0.2.1:5555", []string{"203.0.113.9"}, "192.0.2.1"},
		{"untrusted peer ignores XFF", proxies, "192.0.2.1:5555", []string{"203.0.113.9"}, "192.0.2.1"},
		{"trusted proxy", proxies, "10.0.0.1:80", []string{"203.0.113.9"}, "203.0.113.9"},
		{"forged left part ignored", proxies, "10.0.0.1:80", []string{"6.6.6.6, 203.0.113.9, 10.1.2.3"}, "203.0.113.9"},
		{"garbage left of client ignored", proxies, "10.0.0.1:80", []string{"not-an-ip, 203.0.113.9"}, "203.0.113.9"},
		{"several header lines", proxies, "10.0.0.1:80", []string{"6.6.6.6", "203.0.113.9, 10.0.0.3"}, "203.0.113.9"},
		{"all trusted takes leftmost", proxies, "10.0.0.1:80", []string{"10.0.0.5, 10.0.0.4"}, "10.0.0.5"},
		{"trusted without XFF", proxies, "10.0.0.1:80", nil, "10.0.0.1"},
		{"entry with port", proxies, "10.0.0.1:80", []string{"203.0.113.9:1234"}, "203.0.113.9"},
		{"ipv6 entry with port", proxies, "10.0.0.1:80", []string{"[2001:db9::7]:1234"}, "2001:db9::7"},
		{"ipv6 proxy", proxies, "[2001:db8::1]:443", []string{"198.51.100.4"}, "198.51.100.4"},
		{"mapped ipv4 peer", nil, "[::ffff:192.0.2.1]:80", nil, "192.0.2.1"},
		{"malformed on the path", proxies, "10.0.0.1:80", []string{"203.0.113.9, bogus"}, ""},
		{"empty entry on the path", proxies, "10.0.0.1:80", []string{"203.0.113.9, "}, ""},
		{"bad remote", nil, "nowhere", nil, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := httptest.NewRequest("GET", "/", nil)
			r.RemoteAddr = c.remote
			for _, v := range c.xff {
				r.Header.Add("X-Forwarded-For", v)
			}
			got, err := httplimit.ClientIP(c.trusted)(r)
			if c.want == "" {
				if !errors.Is(err, httplimit.ErrKey) {
					t.Fatalf("= %q, %v; want an error wrapping ErrKey", got, err)
				}
				return
			}
			if err != nil || got != c.want {
				t.Fatalf("= %q, %v; want %q", got, err, c.want)
			}
		})
	}
}

func TestHeaderKeyAndErrors(t *testing.T) {
	n := startNode(t, fixed("api", 2, 10*time.Second))
	cfg := httplimit.DefaultConfig()
	cfg.Rule = "api"
	cfg.Key = httplimit.Header("X-Api-Key")
	h := wrap(t, n, cfg)

	res := do(h, "192.0.2.1:1")
	if res.Code != http.StatusBadRequest || !strings.Contains(res.Body.String(), "X-Api-Key") {
		t.Errorf("no key: %d %q, want 400 naming the header", res.Code, res.Body.String())
	}
	if res.Header().Get("RateLimit") != "" {
		t.Errorf("no key: RateLimit %q set without a decision", res.Header().Get("RateLimit"))
	}
	// The key is the header, whatever the address.
	for i, remote := range []string{"192.0.2.1:1", "192.0.2.2:1", "192.0.2.3:1"} {
		want := 200
		if i == 2 {
			want = 429
		}
		if res := do(h, remote, "X-Api-Key", " k1 "); res.Code != want {
			t.Errorf("request %d with key k1: %d, want %d", i+1, res.Code, want)
		}
	}
	// A key the limiter refuses (over 256 bytes) is the client's fault.
	if res := do(h, "192.0.2.1:1", "X-Api-Key", strings.Repeat("k", 300)); res.Code != 400 {
		t.Errorf("long key: %d, want 400", res.Code)
	}

	// A custom error handler decides the status.
	cfg.Error = func(w http.ResponseWriter, r *http.Request, err error) {
		if errors.Is(err, httplimit.ErrKey) {
			http.Error(w, "who are you", http.StatusUnauthorized)
			return
		}
		httplimit.DefaultError(w, r, err)
	}
	if res := do(wrap(t, n, cfg), "192.0.2.1:1"); res.Code != http.StatusUnauthorized {
		t.Errorf("custom error handler: %d, want 401", res.Code)
	}
}

func TestCostClassAndCustomDenied(t *testing.T) {
	rule := fixed("api", 5, 10*time.Second)
	rule.Classes = map[string]limiter.Class{"payer": {Multiplier: 2}}
	n := startNode(t, rule)
	cfg := httplimit.DefaultConfig()
	cfg.Rule, cfg.Policy = "api", "public"
	cfg.Cost = func(r *http.Request) (uint64, error) {
		if r.URL.Query().Get("bulk") != "" {
			return 3, nil
		}
		if r.URL.Query().Get("bad") != "" {
			return 0, errors.New("unpriceable")
		}
		return 1, nil
	}
	cfg.Class = func(r *http.Request) (string, error) { return r.Header.Get("X-Class"), nil }
	var denied node.Decision
	cfg.Denied = func(w http.ResponseWriter, r *http.Request, d node.Decision) {
		denied = d
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = io.WriteString(w, "slow down")
	}
	h := wrap(t, n, cfg)
	get := func(path, remote string, hdr ...string) *httptest.ResponseRecorder {
		r := httptest.NewRequest("GET", path, nil)
		r.RemoteAddr = remote
		for i := 0; i+1 < len(hdr); i += 2 {
			r.Header.Set(hdr[i], hdr[i+1])
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	if res := get("/?bulk=1", "192.0.2.1:1"); res.Code != 200 || res.Header().Get("RateLimit") != `"public";r=2;t=8` {
		t.Errorf("bulk: %d %q, want 200 with r=2", res.Code, res.Header().Get("RateLimit"))
	}
	res := get("/?bulk=1", "192.0.2.1:1")
	if res.Code != http.StatusServiceUnavailable || res.Body.String() != "slow down" {
		t.Errorf("bulk over the limit: %d %q, want the custom denial", res.Code, res.Body.String())
	}
	if res.Header().Get("Retry-After") != "8" || res.Header().Get("RateLimit-Policy") != `"public";q=5;w=10` {
		t.Errorf("custom denial headers: %v", res.Header())
	}
	if denied.Allowed || denied.Limit != 5 {
		t.Errorf("denied handler got %+v", denied)
	}
	if res := get("/?bad=1", "192.0.2.1:1"); res.Code != 400 || !strings.Contains(res.Body.String(), "unpriceable") {
		t.Errorf("cost error: %d %q, want 400", res.Code, res.Body.String())
	}
	// The payer class doubles the limit: 10, of which 3 are used.
	if res := get("/?bulk=1", "192.0.2.1:1", "X-Class", "payer"); res.Code != 200 ||
		res.Header().Get("RateLimit-Policy") != `"public";q=10;w=10` || res.Header().Get("RateLimit") != `"public";r=4;t=8` {
		t.Errorf("payer: %d %v", res.Code, res.Header())
	}
	if res := get("/", "192.0.2.1:1", "X-Class", "nobody"); res.Code != 400 {
		t.Errorf("unknown class: %d, want 400", res.Code)
	}
}

func TestCostOverLimitHasNoRetryAfter(t *testing.T) {
	n := startNode(t, fixed("api", 3, 10*time.Second))
	cfg := httplimit.DefaultConfig()
	cfg.Rule = "api"
	cfg.Cost = func(*http.Request) (uint64, error) { return 4, nil }
	res := do(wrap(t, n, cfg), "192.0.2.1:1")
	if res.Code != 429 || res.Header().Get("Retry-After") != "" || res.Header().Get("RateLimit") != `"api";r=3;t=8` {
		t.Errorf("cost over limit: %d %v, want 429 without Retry-After", res.Code, res.Header())
	}
}

func TestSlidingWindowSecond(t *testing.T) {
	n := startNode(t, limiter.Rule{Name: "default", Algorithm: limiter.SlidingWindow, Limit: 100, Window: time.Second})
	cfg := httplimit.DefaultConfig()
	cfg.Rule = "default"
	res := do(wrap(t, n, cfg), "192.0.2.1:1")
	if res.Code != 200 || res.Header().Get("RateLimit-Policy") != `"default";q=100;w=1` ||
		res.Header().Get("RateLimit") != `"default";r=99;t=1` {
		t.Errorf("sliding: %d %v", res.Code, res.Header())
	}
}

func TestNewRefusesBadConfig(t *testing.T) {
	n := startNode(t, fixed("api", 3, time.Second),
		limiter.Rule{Name: "conns", Algorithm: limiter.Concurrency, Limit: 2})
	for _, c := range []struct {
		name string
		cfg  httplimit.Config
		want string
		is   error
	}{
		{"no rule", httplimit.Config{Key: httplimit.ClientIP(nil)}, "Rule", httplimit.ErrInvalidConfig},
		{"no key", httplimit.Config{Rule: "api"}, "Key", httplimit.ErrInvalidConfig},
		{"unknown rule", httplimit.Config{Rule: "nope", Key: httplimit.ClientIP(nil)}, `"nope"`, node.ErrUnknownRule},
		{"concurrency rule", httplimit.Config{Rule: "conns", Key: httplimit.ClientIP(nil)}, "concurrency", httplimit.ErrInvalidConfig},
		{"bad policy", httplimit.Config{Rule: "api", Policy: "é", Key: httplimit.ClientIP(nil)}, "Policy", httplimit.ErrInvalidConfig},
	} {
		_, err := httplimit.New(n, c.cfg)
		if !errors.Is(err, c.is) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: New = %v; want %v naming %s", c.name, err, c.is, c.want)
		}
	}
	if _, err := httplimit.New(nil, httplimit.Config{Rule: "api", Key: httplimit.ClientIP(nil)}); !errors.Is(err, httplimit.ErrInvalidConfig) {
		t.Errorf("nil limiter: %v", err)
	}
}

func TestClosedNodeIs503(t *testing.T) {
	n := startNode(t, fixed("api", 3, time.Second))
	cfg := httplimit.DefaultConfig()
	cfg.Rule = "api"
	h := wrap(t, n, cfg)
	_ = n.Close()
	if res := do(h, "192.0.2.1:1"); res.Code != http.StatusServiceUnavailable {
		t.Errorf("closed node: %d, want 503", res.Code)
	}
}

// TestReloadedWindowShows: after a reload changes the rule's window, the
// policy header follows within about a second.
func TestReloadedWindowShows(t *testing.T) {
	n := startNode(t, fixed("api", 3, 10*time.Second))
	cfg := httplimit.DefaultConfig()
	cfg.Rule = "api"
	h := wrap(t, n, cfg)
	if got := do(h, "192.0.2.1:1").Header().Get("RateLimit-Policy"); got != `"api";q=3;w=10` {
		t.Fatalf("before reload: %s", got)
	}
	if err := n.Reload([]limiter.Rule{fixed("api", 7, 20*time.Second)}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		got := do(h, "192.0.2.1:1").Header().Get("RateLimit-Policy")
		if got == `"api";q=7;w=20` {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after reload: RateLimit-Policy %s, want \"api\";q=7;w=20", got)
		}
		<-tick.C
	}
}

// TestShareDenialHeldNot429: three members share a limit of 30 per hour;
// after member a admitted its share of 10 through the middleware, the
// 11th request fits under the limit, and the node holds it until a's
// admissions are acknowledged: 200, not 429. With share_wait 0 the same
// request is 429 with r=0 and t=1 (a retry may pass within a second), not
// the window's end.
func TestShareDenialHeldNot429(t *testing.T) {
	now := fixed("now", 30, time.Hour)
	now.ShareWait = limiter.NoShareWait
	rules := []limiter.Rule{fixed("api", 30, time.Hour), now}
	hub := memnet.NewHub()
	var ns []*node.Node
	for _, p := range []string{"a", "b", "c"} {
		cfg := node.DefaultConfig()
		cfg.Peer, cfg.Rules, cfg.Transport = p, rules, hub.Transport(p)
		n, err := node.Start(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = n.Close() })
		ns = append(ns, n)
	}
	deadline := time.Now().Add(5 * time.Second)
	for len(ns[0].Peers()) != 3 || ns[0].Peers()[1].State != node.Alive || ns[0].Peers()[2].State != node.Alive {
		if time.Now().After(deadline) {
			t.Fatalf("members: %+v", ns[0].Peers())
		}
		time.Sleep(5 * time.Millisecond) // polling the member table with a deadline
	}
	for _, rule := range []string{"api", "now"} {
		cfg := httplimit.DefaultConfig()
		cfg.Rule = rule
		h := wrap(t, ns[0], cfg)
		for i := range 10 {
			if res := do(h, "192.0.2.9:1"); res.Code != 200 {
				t.Fatalf("%s: request %d: %d", rule, i+1, res.Code)
			}
		}
		res := do(h, "192.0.2.9:1")
		switch rule {
		case "api":
			if res.Code != 200 {
				t.Errorf("api: the 11th request got %d %q, want 200 after a hold", res.Code, res.Header().Get("RateLimit"))
			}
		case "now":
			if res.Code != 429 || res.Header().Get("RateLimit") != `"now";r=0;t=1` || res.Header().Get("Retry-After") != "1" {
				t.Errorf("now: the 11th request got %d, RateLimit %q, Retry-After %q; want 429, r=0;t=1, 1",
					res.Code, res.Header().Get("RateLimit"), res.Header().Get("Retry-After"))
			}
		}
	}
}
