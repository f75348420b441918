package httplimit_test

import (
	"testing"
	"time"

	"github.com/ratemesh/ratemesh/limiter"
	"github.com/ratemesh/ratemesh/node/httplimit"
)

// TestBucketHeaders: on a token bucket (max 3, one credit every 2 s, on a
// stopped clock) r counts the credits down, t is the seconds until the
// bucket is full again — on a denial, the seconds until a retry could pass,
// as Retry-After: one credit, 2 s — and the policy's w is the time to fill
// from empty (6 s).
func TestBucketHeaders(t *testing.T) {
	n := startNode(t, limiter.Rule{Name: "api", Algorithm: limiter.TokenBucket, Limit: 3, Refill: 1, Interval: 2 * time.Second})
	cfg := httplimit.DefaultConfig()
	cfg.Rule = "api"
	h := wrap(t, n, cfg)
	want := []struct {
		code             int
		rateLimit, retry string
	}{
		{200, `"api";r=2;t=2`, ""},
		{200, `"api";r=1;t=4`, ""},
		{200, `"api";r=0;t=6`, ""},
		{429, `"api";r=0;t=2`, "2"},
	}
	for i, w := range want {
		res := do(h, "192.0.2.7:4242")
		if res.Code != w.code {
			t.Errorf("request %d: status %d, want %d", i+1, res.Code, w.code)
		}
		if got := res.Header().Get("RateLimit-Policy"); got != `"api";q=3;w=6` {
			t.Errorf("request %d: RateLimit-Policy %q, want \"api\";q=3;w=6", i+1, got)
		}
		if got := res.Header().Get("RateLimit"); got != w.rateLimit {
			t.Errorf("request %d: RateLimit %q, want %q", i+1, got, w.rateLimit)
		}
		if got := res.Header().Get("Retry-After"); got != w.retry {
			t.Errorf("request %d: Retry-After %q, want %q", i+1, got, w.retry)
		}
	}
}
