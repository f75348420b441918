package node_test

import (
	"context"
	"testing"
	"time"

	"github.com/ratemesh/ratemesh/internal/testutil"
	"github.com/ratemesh/ratemesh/limiter"
	"github.com/ratemesh/ratemesh/node"
	"github.com/ratemesh/ratemesh/node/memnet"
)

func pacedRule(name string, limit uint64, window time.Duration) limiter.Rule {
	r := fixedRule(name, limit, window)
	r.Pace = true
	return r
}

// TestWaitPaced waits on a paced key in real time: limit 10 per 2 s, so
// the burst allowance is 1 credit and the pace one more every 200 ms. Each
// Wait after the burst sleeps until the paced time: every admission it
// returns lies within the cap at its own instant (read from the decision:
// the window position from ResetAfter, the window's usage from
// Remaining), so the fourth credit of a window cannot come before 600 ms
// into it. An unpaced rule beside it admits all four at once.
func TestWaitPaced(t *testing.T) {
	const (
		window = 2 * time.Second
		limit  = 10
	)
	cfg := rtConfig(memnet.NewHub(), "a", pacedRule("paced", limit, window), fixedRule("plain", limit, window))
	cfg.Clock = testutil.AlignedClock(window, 0)
	n := rtStart(t, cfg)
	ctx := context.Background()

	// withinPace checks one admission against the cap of its instant:
	// min(10, 10·into/2000 + 1) = min(10, into/200ms + 1).
	withinPace := func(what string, d node.Decision) (used, into int64) {
		t.Helper()
		into = (window - d.ResetAfter).Milliseconds()
		used = int64(d.Limit - d.Remaining)
		if cap := min(limit, into/200+1); used > cap {
			t.Errorf("%s: admitted the %dth credit %d ms into the window, over the paced cap %d", what, used, into, cap)
		}
		return used, into
	}

	d, err := n.Allow(ctx, "paced", "k")
	if err != nil || !d.Allowed {
		t.Fatalf("first Allow = %+v, %v; want the burst allowance admitted", d, err)
	}
	withinPace("Allow", d)
	for i := 2; i <= 4; i++ {
		start := time.Now()
		d, err := n.Wait(ctx, "paced", "k", node.MaxWait(5*time.Second))
		if err != nil || !d.Allowed {
			t.Fatalf("Wait %d = %+v, %v; want admitted at the paced time", i, d, err)
		}
		used, into := withinPace("Wait", d)
		t.Logf("Wait %d: credit %d admitted %d ms into the window after %v", i, used, into, time.Since(start).Round(time.Millisecond))
	}

	// Unpaced, the same four credits go at once, whatever the instant.
	for i := 1; i <= 4; i++ {
		if d, err := n.Allow(ctx, "plain", "k"); err != nil || !d.Allowed {
			t.Fatalf("unpaced Allow %d = %+v, %v; want admitted", i, d, err)
		}
	}
}

// TestWaitPacedReturnsAtOnce: limit 10 per 50 s paces one credit every
// 5 s. Once the burst allowance is spent, the paced time is seconds away:
// Wait must return the denial at once, with no error, when it is past
// MaxWait or past ctx's deadline, and its RetryAfter is the paced time.
func TestWaitPacedReturnsAtOnce(t *testing.T) {
	const window = 50 * time.Second
	cfg := rtConfig(memnet.NewHub(), "a", pacedRule("paced", 10, window))
	cfg.Clock = testutil.AlignedClock(window, 0)
	n := rtStart(t, cfg)
	ctx := context.Background()
	if d, err := n.Allow(ctx, "paced", "k"); err != nil || !d.Allowed {
		t.Fatalf("first Allow = %+v, %v; want the burst allowance admitted", d, err)
	}
	d, err := n.Allow(ctx, "paced", "k")
	if err != nil || d.Allowed || d.Reason != limiter.ReasonLimit {
		t.Fatalf("second Allow = %+v, %v; want denied by the pace", d, err)
	}
	// The second credit is due 5 s into the window.
	if into := window - d.ResetAfter; d.RetryAfter != 5*time.Second-into {
		t.Fatalf("RetryAfter = %v at %v into the window, want %v", d.RetryAfter, into, 5*time.Second-into)
	}

	for _, tc := range []struct {
		name string
		ctx  func() (context.Context, context.CancelFunc)
		opts []node.Option
	}{
		{"max wait", func() (context.Context, context.CancelFunc) { return ctx, func() {} }, []node.Option{node.MaxWait(time.Second)}},
		{"deadline", func() (context.Context, context.CancelFunc) { return context.WithTimeout(ctx, time.Second) }, nil},
	} {
		wctx, cancel := tc.ctx()
		start := time.Now()
		d, err := n.Wait(wctx, "paced", "k", tc.opts...)
		el := time.Since(start)
		cancel()
		if err != nil || d.Allowed {
			t.Errorf("%s: Wait = %+v, %v; want the denial and no error", tc.name, d, err)
		}
		if d.RetryAfter <= time.Second {
			t.Errorf("%s: RetryAfter = %v; want the paced time, seconds away", tc.name, d.RetryAfter)
		}
		// Sleeping to the paced time would take about 5 s.
		if el > 2*time.Second {
			t.Errorf("%s: Wait took %v; it should have returned at once (retry after %v)", tc.name, el, d.RetryAfter)
		}
	}
}
