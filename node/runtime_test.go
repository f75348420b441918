package node_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratemesh/ratemesh/internal/testutil"
	"github.com/ratemesh/ratemesh/limiter"
	"github.com/ratemesh/ratemesh/node"
	"github.com/ratemesh/ratemesh/node/memnet"
)

// rtConfig returns a runtime config for peer on hub with rules.
func rtConfig(hub *memnet.Hub, peer string, rules ...limiter.Rule) node.Config {
	cfg := node.DefaultConfig()
	cfg.Peer, cfg.Rules, cfg.Transport = peer, rules, hub.Transport(peer)
	return cfg
}

// rtStart starts a node from cfg and closes it when the test ends.
func rtStart(t testing.TB, cfg node.Config) *node.Node {
	t.Helper()
	n, err := node.Start(context.Background(), cfg)
	if err != nil {
		t.Fatalf("Start(%s): %v", cfg.Peer, err)
	}
	t.Cleanup(func() { _ = n.Close() })
	return n
}

// rtState returns peer's state in n's view, or "absent".
func rtState(n *node.Node, peer string) string {
	for _, p := range n.Peers() {
		if p.Peer == peer {
			return p.State.String()
		}
	}
	return "absent"
}

// rtMeshed waits until every node sees every other one alive.
func rtMeshed(t testing.TB, ns map[string]*node.Node) {
	t.Helper()
	testutil.Eventually(t, 5*time.Second, func() (bool, string) {
		for a, na := range ns {
			for b := range ns {
				if s := rtState(na, b); a != b && s != "alive" {
					return false, fmt.Sprintf("%s sees %s %s", a, b, s)
				}
			}
		}
		return true, ""
	})
}

func fixedRule(name string, limit uint64, window time.Duration) limiter.Rule {
	return limiter.Rule{Name: name, Algorithm: limiter.FixedWindow, Limit: limit, Window: window}
}

func TestStartAloneIsReadyAtOnce(t *testing.T) {
	n := rtStart(t, rtConfig(memnet.NewHub(), "a", fixedRule("api", 10, time.Hour)))
	if !n.Ready() {
		t.Fatal("Ready() = false right after Start without Join")
	}
	d, err := n.Allow(context.Background(), "api", "k")
	if err != nil || !d.Allowed || d.Limit != 10 {
		t.Fatalf("Allow = %+v, %v; want allowed with limit 10", d, err)
	}
	ps := n.Peers()
	if len(ps) != 1 || ps[0].Peer != "a" || !ps[0].Self {
		t.Fatalf("Peers() = %+v, want only self", ps)
	}
}

func TestStartJoinTimesOutWithoutPeers(t *testing.T) {
	cfg := rtConfig(memnet.NewHub(), "a", fixedRule("api", 10, time.Hour))
	cfg.Join, cfg.JoinTimeout = true, 200*time.Millisecond
	start := time.Now()
	n := rtStart(t, cfg)
	if el := time.Since(start); el < cfg.JoinTimeout {
		t.Fatalf("Start returned after %v, before join_timeout %v", el, cfg.JoinTimeout)
	}
	if !n.Ready() {
		t.Fatal("Ready() = false after Start returned")
	}
	if d, err := n.Allow(context.Background(), "api", "k"); err != nil || !d.Allowed {
		t.Fatalf("Allow after the join timed out = %+v, %v; want allowed", d, err)
	}
}

func TestStartJoinsThroughAntiEntropy(t *testing.T) {
	hub := memnet.NewHub()
	rules := []limiter.Rule{fixedRule("api", 10, time.Hour)}
	a := rtStart(t, rtConfig(hub, "a", rules...))
	if _, err := a.Allow(context.Background(), "api", "k", node.Cost(4)); err != nil {
		t.Fatal(err)
	}
	cfg := rtConfig(hub, "b", rules...)
	cfg.Join, cfg.JoinTimeout = true, time.Minute
	start := time.Now()
	b := rtStart(t, cfg)
	if el := time.Since(start); el > cfg.JoinTimeout/2 {
		t.Fatalf("Start took %v: it waited for the join timeout instead of joining", el)
	}
	if s := rtState(b, "a"); s != "alive" {
		t.Errorf("b sees a %s right after joining, want alive", s)
	}
	// The joiner merged a's state before serving.
	rep, err := b.Usage("api", "k")
	if err != nil || rep.Total != 4 {
		t.Fatalf("b.Usage = %+v, %v; want a's 4 credits", rep, err)
	}
}

// TestThreeNodesHoldTheLimit runs traffic from goroutines on three nodes
// for several windows and checks every window's admissions against the
// limit, then that the merged usage converges everywhere.
func TestThreeNodesHoldTheLimit(t *testing.T) {
	if testing.Short() {
		t.Skip("runs for seconds")
	}
	const (
		limit    = 1000
		window   = time.Second
		windows  = 4
		workers  = 2 // goroutines per node
		interval = time.Millisecond
	)
	api := limiter.Rule{Name: "api", Algorithm: limiter.SlidingWindow, Limit: limit, Window: window}
	total := fixedRule("total", 1<<40, time.Hour)
	hub := memnet.NewHub()
	hub.SetDelay(time.Millisecond)
	peers := []string{"a", "b", "c"}
	ns := map[string]*node.Node{}
	for _, p := range peers {
		cfg := rtConfig(hub, p, api, total)
		cfg.Clock = time.Now // the decision's window is read on this clock
		ns[p] = rtStart(t, cfg)
	}
	rtMeshed(t, ns)

	// windowOf returns the index of the window a decision counted in: the
	// window that ends ResetAfter after the decision, read on the node's
	// clock just after it (mesh offsets here are milliseconds, far below
	// half a window).
	windowOf := func(d node.Decision, w time.Duration, after time.Time) int64 {
		end := after.Add(d.ResetAfter).UnixMilli()
		return (end+w.Milliseconds()/2)/w.Milliseconds() - 1
	}
	var (
		mu       sync.Mutex
		admitted = map[int64]int{} // api admissions per window
		counted  = map[int64]int{} // total admissions per window
		errs     []error
	)
	start := time.Now()
	stop := start.Add(windows * window)
	var wg sync.WaitGroup
	for _, p := range peers {
		for range workers {
			wg.Add(1)
			go func(n *node.Node) {
				defer wg.Done()
				ctx := context.Background()
				mine, mineTotal := map[int64]int{}, map[int64]int{}
				tick := time.NewTicker(interval)
				defer tick.Stop()
				var err error
				for now := range tick.C {
					if now.After(stop) {
						break
					}
					var d node.Decision
					if d, err = n.Allow(ctx, "api", "k"); err != nil {
						break
					}
					if !d.Allowed {
						continue
					}
					mine[windowOf(d, window, time.Now())]++
					if d, err = n.Allow(ctx, "total", "k"); err != nil {
						break
					}
					if !d.Allowed {
						err = fmt.Errorf("total denied: %+v", d)
						break
					}
					mineTotal[windowOf(d, time.Hour, time.Now())]++
				}
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					errs = append(errs, err)
				}
				for w, c := range mine {
					admitted[w] += c
				}
				for w, c := range mineTotal {
					counted[w] += c
				}
			}(ns[p])
		}
	}
	wg.Wait()
	end := time.Now()
	if len(errs) > 0 {
		t.Fatalf("traffic: %v", errs)
	}

	ws := make([]int64, 0, len(admitted))
	for w := range admitted {
		ws = append(ws, w)
	}
	slices.Sort(ws)
	wms := window.Milliseconds()
	checked := 0
	for _, w := range ws {
		got := admitted[w]
		full := w*wms >= start.UnixMilli() && (w+1)*wms <= end.UnixMilli()
		t.Logf("window %d: admitted %d of %d (fully inside the traffic: %t)", w, got, limit, full)
		if float64(got) > 1.02*limit {
			t.Errorf("window %d: admitted %d, over 1.02 × the limit %d", w, got, limit)
		}
		// The first full window follows the warm-up; check the ones after.
		if full && w*wms >= start.UnixMilli()+wms {
			checked++
			if float64(got) < 0.9*limit {
				t.Errorf("window %d: admitted %d, under 0.9 × the limit %d", w, got, limit)
			}
		}
	}
	if checked < windows-3 {
		t.Errorf("only %d middle windows checked, want at least %d", checked, windows-3)
	}

	// Every node converges on the same merged usage, which is what the
	// test counted.
	testutil.Eventually(t, 5*time.Second, func() (bool, string) {
		var first node.UsageReport
		for i, p := range peers {
			rep, err := ns[p].Usage("total", "k")
			if err != nil {
				return false, err.Error()
			}
			if want := uint64(counted[rep.Window]); rep.Total != want {
				return false, fmt.Sprintf("%s: total %d in window %d, want %d", p, rep.Total, rep.Window, want)
			}
			if i == 0 {
				first = rep
			} else if !slices.Equal(rep.Slots, first.Slots) {
				return false, fmt.Sprintf("%s slots %+v, %s slots %+v", p, rep.Slots, peers[0], first.Slots)
			}
		}
		return len(first.Slots) == len(peers), fmt.Sprintf("slots %+v, want one per node", first.Slots)
	})
}

func TestAllowAllIsAllOrNothing(t *testing.T) {
	cfg := rtConfig(memnet.NewHub(), "a", fixedRule("wide", 5, 10*time.Second), fixedRule("narrow", 2, 10*time.Second))
	cfg.Clock = testutil.AlignedClock(10*time.Second, 10*time.Millisecond)
	n := rtStart(t, cfg)
	ctx := context.Background()
	for i := range 2 {
		ok, ds, err := n.AllowAll(ctx, node.NewCheck("wide", "k"), node.NewCheck("narrow", "k"))
		if err != nil || !ok || len(ds) != 2 || !ds[0].Allowed || !ds[1].Allowed {
			t.Fatalf("AllowAll #%d = %t, %+v, %v; want both allowed", i, ok, ds, err)
		}
	}
	ok, ds, err := n.AllowAll(ctx, node.NewCheck("wide", "k"), node.NewCheck("narrow", "k"))
	if err != nil || ok {
		t.Fatalf("AllowAll #3 = %t, %v; want denied", ok, err)
	}
	if ds[0].Allowed || ds[1].Allowed || ds[1].Reason != limiter.ReasonLimit {
		t.Errorf("decisions %+v: want both denied, narrow for its limit", ds)
	}
	for rule, want := range map[string]uint64{"wide": 2, "narrow": 2} {
		rep, err := n.Usage(rule, "k")
		if err != nil || rep.Total != want {
			t.Errorf("Usage(%s) = %+v, %v; want total %d: a failed AllowAll consumes nothing", rule, rep, err, want)
		}
	}
	// wide alone still has room.
	if d, err := n.Allow(ctx, "wide", "k", node.Cost(3)); err != nil || !d.Allowed {
		t.Errorf("Allow(wide, cost 3) = %+v, %v; want allowed", d, err)
	}

	if _, _, err := n.AllowAll(ctx, node.NewCheck("wide", "k"), node.NewCheck("nope", "k")); !errors.Is(err, node.ErrUnknownRule) || !strings.Contains(err.Error(), "checks[1]") {
		t.Errorf("AllowAll with an unknown rule: err = %v, want ErrUnknownRule naming checks[1]", err)
	}
	if _, _, err := n.AllowAll(ctx, node.NewCheck("wide", "k", node.MaxWait(time.Second))); !errors.Is(err, node.ErrBadOption) {
		t.Errorf("AllowAll with MaxWait: err = %v, want ErrBadOption", err)
	}
	if _, err := n.Allow(ctx, "wide", "k", node.MaxWait(time.Second)); !errors.Is(err, node.ErrBadOption) {
		t.Errorf("Allow with MaxWait: err = %v, want ErrBadOption", err)
	}
	if _, err := n.Allow(ctx, "nope", "k"); !errors.Is(err, node.ErrUnknownRule) {
		t.Errorf("Allow(nope): err = %v, want ErrUnknownRule", err)
	}
	if _, err := n.Allow(ctx, "wide", ""); !errors.Is(err, limiter.ErrBadKey) {
		t.Errorf("Allow with an empty key: err = %v, want limiter.ErrBadKey", err)
	}
}

func TestWait(t *testing.T) {
	const window = time.Second
	cfg := rtConfig(memnet.NewHub(), "a", fixedRule("api", 2, window))
	cfg.Clock = testutil.AlignedClock(window, 20*time.Millisecond)
	n := rtStart(t, cfg)
	ctx := context.Background()
	for range 2 {
		if d, err := n.Wait(ctx, "api", "k"); err != nil || !d.Allowed {
			t.Fatalf("Wait with room = %+v, %v; want allowed", d, err)
		}
	}
	// The window is spent for the next ~950 ms; none of these may wait
	// for it.
	quick := window / 2
	atOnce := []struct {
		name string
		ctx  func() (context.Context, context.CancelFunc)
		opts []node.Option
	}{
		{"max wait", func() (context.Context, context.CancelFunc) { return ctx, func() {} }, []node.Option{node.MaxWait(50 * time.Millisecond)}},
		{"deadline", func() (context.Context, context.CancelFunc) { return context.WithTimeout(ctx, 50*time.Millisecond) }, nil},
		{"never", func() (context.Context, context.CancelFunc) { return ctx, func() {} }, []node.Option{node.Cost(3)}},
	}
	for _, tc := range atOnce {
		wctx, cancel := tc.ctx()
		start := time.Now()
		d, err := n.Wait(wctx, "api", "k", tc.opts...)
		el := time.Since(start)
		cancel()
		if err != nil || d.Allowed {
			t.Errorf("%s: Wait = %+v, %v; want a denial and no error", tc.name, d, err)
		}
		if el > quick {
			t.Errorf("%s: Wait took %v; it should have returned at once (retry after %v)", tc.name, el, d.RetryAfter)
		}
		if tc.name == "never" && d.RetryAfter != node.Never {
			t.Errorf("never: RetryAfter = %v, want Never", d.RetryAfter)
		}
	}

	// Cancelled while it sleeps: the last denial and ctx's error.
	cctx, cancel := context.WithCancel(ctx)
	stopAfter := time.AfterFunc(50*time.Millisecond, cancel)
	defer stopAfter.Stop()
	if d, err := n.Wait(cctx, "api", "k"); !errors.Is(err, context.Canceled) || d.Allowed {
		t.Errorf("cancelled Wait = %+v, %v; want a denial with context.Canceled", d, err)
	}

	// With time enough it waits for the next window and is admitted there.
	d, err := n.Allow(ctx, "api", "k")
	if err != nil || d.Allowed || d.RetryAfter <= 0 {
		t.Fatalf("Allow in a spent window = %+v, %v; want a denial with a retry time", d, err)
	}
	start := time.Now()
	retry := d.RetryAfter
	d, err = n.Wait(ctx, "api", "k", node.MaxWait(5*time.Second))
	el := time.Since(start)
	if err != nil || !d.Allowed {
		t.Fatalf("Wait(max 5s) = %+v, %v; want allowed once the window rolled", d, err)
	}
	// retry was read on the node's coarse clock, which may lag a little.
	if el < retry-100*time.Millisecond {
		t.Errorf("Wait returned after %v, before the window rolled (retry after %v)", el, retry)
	}
	if d.ResetAfter < window/2 {
		t.Errorf("admitted with %v left in the window; want early in the next window", d.ResetAfter)
	}
}

func TestAcquireRenewRelease(t *testing.T) {
	hub := memnet.NewHub()
	conns := limiter.Rule{Name: "conns", Algorithm: limiter.Concurrency, Limit: 4, LeaseTTL: time.Second}
	ns := map[string]*node.Node{"a": rtStart(t, rtConfig(hub, "a", conns, fixedRule("api", 5, time.Hour)))}
	ns["b"] = rtStart(t, rtConfig(hub, "b", conns, fixedRule("api", 5, time.Hour)))
	rtMeshed(t, ns)
	a, b := ns["a"], ns["b"]
	ctx := context.Background()

	before := time.Now()
	l, d, err := a.Acquire(ctx, "conns", "k")
	if err != nil || !d.Allowed || l == nil {
		t.Fatalf("Acquire = %v, %+v, %v; want a lease", l, d, err)
	}
	if !strings.HasPrefix(l.ID, "a~") || l.Rule != "conns" || l.Key != "k" {
		t.Errorf("lease %+v: want an ID owned by a, rule conns, key k", l)
	}
	// The node decides on its coarse clock, which may lag a little.
	if exp := l.Expires(); exp.Before(before.Add(time.Second-100*time.Millisecond)) || exp.After(time.Now().Add(time.Second)) {
		t.Errorf("Expires() = %v, want about a second from now", exp)
	}
	usage := func(n *node.Node, want uint64) func() (bool, string) {
		return func() (bool, string) {
			rep, err := n.Usage("conns", "k")
			return err == nil && rep.Total == want, fmt.Sprintf("Usage = %+v, %v; want %d live", rep, err, want)
		}
	}
	testutil.Eventually(t, 5*time.Second, usage(b, 1))

	if ttl, err := l.Renew(ctx); err != nil || ttl != time.Second {
		t.Errorf("Renew = %v, %v; want the 1s lease TTL", ttl, err)
	}
	var no *node.NotOwnerError
	if err := b.Release(ctx, l.ID); !errors.As(err, &no) || no.Owner != "a" {
		t.Errorf("b.Release(a's lease) = %v, want a *NotOwnerError naming a", err)
	}
	if _, err := b.Renew(ctx, l.ID); !errors.As(err, &no) || no.Owner != "a" {
		t.Errorf("b.Renew(a's lease) = %v, want a *NotOwnerError naming a", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatalf("Release = %v", err)
	}
	if err := l.Release(ctx); !errors.Is(err, node.ErrUnknownLease) {
		t.Errorf("second Release = %v, want ErrUnknownLease", err)
	}
	if _, err := l.Renew(ctx); !errors.Is(err, node.ErrUnknownLease) {
		t.Errorf("Renew after Release = %v, want ErrUnknownLease", err)
	}
	testutil.Eventually(t, 5*time.Second, usage(b, 0))

	if _, _, err := a.Acquire(ctx, "api", "k"); !errors.Is(err, limiter.ErrWrongAlgorithm) {
		t.Errorf("Acquire on a window rule: err = %v, want ErrWrongAlgorithm", err)
	}
	if _, _, err := a.Acquire(ctx, "conns", "k", node.Cost(2)); !errors.Is(err, node.ErrBadOption) {
		t.Errorf("Acquire with a cost: err = %v, want ErrBadOption", err)
	}
	if _, err := a.Allow(ctx, "conns", "k"); !errors.Is(err, limiter.ErrWrongAlgorithm) {
		t.Errorf("Allow on a concurrency rule: err = %v, want ErrWrongAlgorithm", err)
	}
}

func TestAcquireDeniesAtTheLimit(t *testing.T) {
	conns := limiter.Rule{Name: "conns", Algorithm: limiter.Concurrency, Limit: 1, LeaseTTL: time.Minute}
	n := rtStart(t, rtConfig(memnet.NewHub(), "a", conns))
	ctx := context.Background()
	l, d, err := n.Acquire(ctx, "conns", "k")
	if err != nil || l == nil || !d.Allowed {
		t.Fatalf("first Acquire = %v, %+v, %v; want a lease", l, d, err)
	}
	l2, d, err := n.Acquire(ctx, "conns", "k")
	if err != nil || l2 != nil || d.Allowed {
		t.Fatalf("second Acquire = %v, %+v, %v; want a denial without error", l2, d, err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if l3, d, err := n.Acquire(ctx, "conns", "k"); err != nil || l3 == nil || !d.Allowed {
		t.Fatalf("Acquire after Release = %v, %+v, %v; want a lease", l3, d, err)
	}
}

func TestCloseIsAGracefulLeave(t *testing.T) {
	hub := memnet.NewHub()
	rule := fixedRule("api", 10, time.Hour)
	ns := map[string]*node.Node{}
	for _, p := range []string{"a", "b", "c"} {
		ns[p] = rtStart(t, rtConfig(hub, p, rule))
	}
	rtMeshed(t, ns)
	a := ns["a"]
	if err := a.Close(); err != nil {
		t.Fatalf("Close = %v", err)
	}
	// Left comes only from the leave announcement: silence would make a
	// suspect after suspect_after (2 s), never left.
	testutil.Eventually(t, time.Second, func() (bool, string) {
		for _, p := range []string{"b", "c"} {
			if s := rtState(ns[p], "a"); s != "left" {
				return false, fmt.Sprintf("%s sees a %s", p, s)
			}
		}
		return true, ""
	})
	if err := a.Close(); err != nil {
		t.Errorf("second Close = %v, want nil", err)
	}
	ctx := context.Background()
	if _, err := a.Allow(ctx, "api", "k"); !errors.Is(err, node.ErrClosed) {
		t.Errorf("Allow after Close: err = %v, want ErrClosed", err)
	}
	if _, err := a.Wait(ctx, "api", "k"); !errors.Is(err, node.ErrClosed) {
		t.Errorf("Wait after Close: err = %v, want ErrClosed", err)
	}
	if _, _, err := a.Acquire(ctx, "api", "k"); !errors.Is(err, node.ErrClosed) {
		t.Errorf("Acquire after Close: err = %v, want ErrClosed", err)
	}
	if _, err := a.Usage("api", "k"); !errors.Is(err, node.ErrClosed) {
		t.Errorf("Usage after Close: err = %v, want ErrClosed", err)
	}
	if got := hub.Peers(); !slices.Equal(got, []string{"b", "c"}) {
		t.Errorf("hub peers after Close = %v, want [b c]", got)
	}
}

// keepOpen is a store that survives its node's Close, like a disk.
type keepOpen struct{ *node.MemoryStore }

func (keepOpen) Close() error { return nil }

func TestIncarnationGrowsAcrossStarts(t *testing.T) {
	store := keepOpen{&node.MemoryStore{}}
	hub := memnet.NewHub()
	var last uint64
	for i, clock := range []func() time.Time{time.Now, time.Now, func() time.Time { return time.Now().Add(-time.Hour) }} {
		cfg := rtConfig(hub, "a", fixedRule("api", 10, time.Hour))
		cfg.Store, cfg.Clock = store, clock
		n := rtStart(t, cfg)
		inc := n.Incarnation()
		if inc <= last {
			t.Errorf("start %d: incarnation %d, not above the previous %d", i, inc, last)
		}
		if saved, err := store.LoadIncarnation(context.Background()); err != nil || saved != inc {
			t.Errorf("start %d: store holds %d, %v; want %d saved before serving", i, saved, err, inc)
		}
		last = inc
		if err := n.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

func TestStartRefusesBadConfig(t *testing.T) {
	hub := memnet.NewHub()
	tests := []struct {
		name  string
		mut   func(*node.Config)
		field string
		is    error
	}{
		{"no transport", func(c *node.Config) { c.Transport = nil }, "transport", node.ErrInvalidConfig},
		{"incarnation", func(c *node.Config) { c.Incarnation = 7 }, "incarnation", node.ErrInvalidConfig},
		{"leave timeout", func(c *node.Config) { c.LeaveTimeout = 0 }, "leave_timeout", node.ErrInvalidConfig},
		{"sync interval", func(c *node.Config) { c.SyncInterval = 0 }, "sync_interval", node.ErrInvalidConfig},
		{"no peer", func(c *node.Config) { c.Peer = "" }, "peer", node.ErrInvalidConfig},
		{"bad rule", func(c *node.Config) { c.Rules[0].Limit = 0 }, "limit", limiter.ErrInvalidRule},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			store := &node.MemoryStore{}
			cfg := rtConfig(hub, "x", fixedRule("api", 10, time.Hour))
			cfg.Store = store
			tc.mut(&cfg)
			n, err := node.Start(context.Background(), cfg)
			if err == nil {
				n.Close()
				t.Fatal("Start succeeded")
			}
			if !errors.Is(err, tc.is) || !strings.Contains(err.Error(), tc.field) {
				t.Errorf("err = %v, want %v naming %q", err, tc.is, tc.field)
			}
			if inc, _ := store.LoadIncarnation(context.Background()); inc != 0 {
				t.Errorf("a refused config saved incarnation %d", inc)
			}
		})
	}
	if got := hub.Peers(); len(got) != 0 {
		t.Errorf("refused starts left %v attached to the hub", got)
	}
}

// TestPartitionHeals cuts two nodes apart, lets each decide on its own,
// and checks that after the heal both converge on the same usage.
func TestPartitionHeals(t *testing.T) {
	hub := memnet.NewHub()
	rule := fixedRule("api", 1000, time.Hour)
	ns := map[string]*node.Node{}
	for _, p := range []string{"a", "b"} {
		ns[p] = rtStart(t, rtConfig(hub, p, rule))
	}
	rtMeshed(t, ns)
	hub.Cut("a", "b")
	ctx := context.Background()
	want := map[string]int{}
	for _, p := range []string{"a", "b"} {
		for range 5 {
			d, err := ns[p].Allow(ctx, "api", "k")
			if err != nil {
				t.Fatal(err)
			}
			if d.Allowed {
				want[p]++
			}
		}
	}
	hub.Heal("a", "b")
	testutil.Eventually(t, 5*time.Second, func() (bool, string) {
		var why []string
		for _, p := range []string{"a", "b"} {
			rep, err := ns[p].Usage("api", "k")
			if err != nil {
				return false, err.Error()
			}
			if rep.Total != uint64(want["a"]+want["b"]) {
				why = append(why, fmt.Sprintf("%s: total %d, want %d", p, rep.Total, want["a"]+want["b"]))
			}
		}
		return len(why) == 0, strings.Join(why, "; ")
	})
}

// TestDecisionsShareClockReadingsAtHighRates checks the decision clock:
// at high rates consecutive decisions share readings of Clock, and time as
// the node decides never goes backwards.
func TestDecisionsShareClockReadingsAtHighRates(t *testing.T) {
	var reads atomic.Int64
	cfg := rtConfig(memnet.NewHub(), "a", fixedRule("api", limiter.MaxLimit, time.Hour))
	cfg.Clock = func() time.Time { reads.Add(1); return time.Now() }
	n := rtStart(t, cfg)
	ctx := context.Background()
	var last time.Time
	const hour = time.Hour
	testutil.Eventually(t, 10*time.Second, func() (bool, string) {
		r0 := reads.Load()
		const burst = 20_000
		for range burst {
			d, err := n.Allow(ctx, "api", "k")
			after := time.Now()
			if err != nil || !d.Allowed {
				t.Fatalf("Allow = %+v, %v", d, err)
			}
			// ResetAfter counts from the decision's time to the end of
			// its hour window, so the decision's time is that end less
			// ResetAfter, the end being the one hour boundary within an
			// hour after it: no later than now, whatever a busy machine
			// made the test wait. Decided one after another, those
			// times never go back (to the millisecond ResetAfter keeps).
			end := after.Add(d.ResetAfter).Truncate(hour)
			at := end.Add(-d.ResetAfter)
			if at.Before(last.Add(-time.Millisecond)) || at.After(after.Add(time.Millisecond)) {
				t.Fatalf("decision time %v after %v (answered at %v)", at, last, after)
			}
			last = at
		}
		got := reads.Load() - r0
		return got < burst/8, fmt.Sprintf("%d clock reads for %d decisions", got, burst)
	})
}

func TestStartGivesUpWithItsContext(t *testing.T) {
	hub := memnet.NewHub()
	store := &node.MemoryStore{}
	cfg := rtConfig(hub, "a", fixedRule("api", 10, time.Hour))
	cfg.Join, cfg.JoinTimeout, cfg.Store = true, time.Minute, store
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	n, err := node.Start(ctx, cfg)
	if !errors.Is(err, context.DeadlineExceeded) || n != nil {
		t.Fatalf("Start = %v, %v; want nil and the context's error", n, err)
	}
	if got := hub.Peers(); len(got) != 0 {
		t.Errorf("a start given up left %v attached to the hub", got)
	}
	if inc, err := store.LoadIncarnation(context.Background()); err != nil || inc == 0 {
		t.Errorf("store after a start given up: %d, %v; want it open, holding the incarnation", inc, err)
	}
}

// TestEvictedMemberTakesNewIncarnation evicts a live member by hand: it
// learns so from the evicting member's batches, takes a new incarnation,
// and its runtime persists it.
func TestEvictedMemberTakesNewIncarnation(t *testing.T) {
	hub := memnet.NewHub()
	rule := fixedRule("api", 10, time.Hour)
	store := &node.MemoryStore{}
	cfgB := rtConfig(hub, "b", rule)
	cfgB.Store = store
	ns := map[string]*node.Node{"a": rtStart(t, rtConfig(hub, "a", rule)), "b": rtStart(t, cfgB)}
	rtMeshed(t, ns)
	a, b := ns["a"], ns["b"]
	before := b.Incarnation()
	if err := a.Evict("nobody"); !errors.Is(err, node.ErrUnknownPeer) {
		t.Errorf("Evict(nobody) = %v, want ErrUnknownPeer", err)
	}
	if err := a.Evict("b"); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 5*time.Second, func() (bool, string) {
		inc := b.Incarnation()
		saved, err := store.LoadIncarnation(context.Background())
		return inc > before && saved == inc, fmt.Sprintf("b's incarnation %d (was %d), saved %d, %v", inc, before, saved, err)
	})
	// a takes b's new incarnation as a member again.
	testutil.Eventually(t, 5*time.Second, func() (bool, string) {
		for _, p := range a.Peers() {
			if p.Peer == "b" {
				return p.State == node.Alive && p.Incarnation == b.Incarnation(), fmt.Sprintf("a sees b %+v", p)
			}
		}
		return false, "a does not know b"
	})
}

// lockedBuffer is an io.Writer safe for the logger's concurrent use.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func TestMembershipChangesAreLogged(t *testing.T) {
	hub := memnet.NewHub()
	rule := fixedRule("api", 10, time.Hour)
	var buf lockedBuffer
	cfgA := rtConfig(hub, "a", rule)
	cfgA.Logger = slog.New(slog.NewTextHandler(&buf, nil))
	a := rtStart(t, cfgA)
	b := rtStart(t, rtConfig(hub, "b", rule))
	rtMeshed(t, map[string]*node.Node{"a": a, "b": b})
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 5*time.Second, func() (bool, string) {
		log := buf.String()
		ok := strings.Contains(log, "msg=member peer=a member=b") && strings.Contains(log, "state=alive new=true") &&
			strings.Contains(log, "from=alive state=left")
		return ok, "log lacks b's arrival and leave:\n" + log
	})
}
