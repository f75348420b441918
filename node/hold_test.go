package node_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ratemesh/ratemesh/internal/testutil"
	"github.com/ratemesh/ratemesh/limiter"
	"github.com/ratemesh/ratemesh/node"
	"github.com/ratemesh/ratemesh/node/memnet"
)

// holdCluster starts members "a", "b", "c" on one memnet hub with rules,
// and waits until they see each other alive.
func holdCluster(t *testing.T, rules ...limiter.Rule) (*memnet.Hub, map[string]*node.Node) {
	t.Helper()
	hub := memnet.NewHub()
	hub.SetDelay(time.Millisecond)
	ns := map[string]*node.Node{}
	for _, p := range []string{"a", "b", "c"} {
		ns[p] = rtStart(t, rtConfig(hub, p, rules...))
	}
	rtMeshed(t, ns)
	return hub, ns
}

// spend admits n requests of (rule, key) at nd, failing on any denial.
func spend(t *testing.T, nd *node.Node, rule, key string, n int) {
	t.Helper()
	for i := range n {
		d, err := nd.Allow(context.Background(), rule, key)
		if err != nil || !d.Allowed {
			t.Fatalf("request %d of %d: %+v, %v", i+1, n, d, err)
		}
	}
}

// TestHoldAdmitsWhenAcknowledged: with a limit of 30 over 3 members, a
// member admits 10 requests within its share; the 11th fits under the
// limit but not the share, so Allow holds it until the acknowledgements
// return and admits it, well within share_wait. With share_wait 0 the same
// request is refused at once, saying why, with nothing remaining and the
// acknowledgement delay as its retry hint.
func TestHoldAdmitsWhenAcknowledged(t *testing.T) {
	held := fixedRule("held", 30, time.Hour)
	held.ShareWait = limiter.MaxShareWait // a loaded host's acknowledgements may take a while
	now := fixedRule("now", 30, time.Hour)
	now.ShareWait = limiter.NoShareWait
	_, ns := holdCluster(t, held, now)
	a, ctx := ns["a"], context.Background()

	spend(t, a, "now", "k", 10)
	d, err := a.Allow(ctx, "now", "k")
	if err != nil || d.Allowed || d.Reason != limiter.ReasonShare || d.Remaining != 0 || d.RetryAfter != 40*time.Millisecond {
		t.Fatalf("share_wait 0: %+v, %v; want denied at once for its share, remaining 0, retry after 40ms", d, err)
	}

	spend(t, a, "held", "k", 10)
	start := time.Now()
	d, err = a.Allow(ctx, "held", "k")
	took := time.Since(start)
	if err != nil || !d.Allowed || d.Reason != limiter.ReasonAdmitted {
		t.Fatalf("held request: %+v, %v after %v; want admitted once acknowledged", d, err, took)
	}
	if took >= held.ShareWait {
		t.Errorf("held for %v, share_wait %v", took, held.ShareWait)
	}
	st := a.HoldStats()
	if st.Held != 1 || st.HeldAdmitted != 1 {
		t.Errorf("HoldStats = %+v, want 1 held, 1 admitted", st)
	}
	// Its attempt counted once: 11 attempted, 11 admitted.
	rep, err := a.Usage("held", "k")
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Slots) != 1 || rep.Slots[0].Admitted != 11 || rep.Slots[0].Attempted != 11 {
		t.Errorf("a's slot = %+v, want 11 admitted of 11 attempted", rep.Slots)
	}
}

// TestHoldNotWhenLimitReached: a request the limit itself refuses is
// answered at once (no holding when the global room is gone).
func TestHoldNotWhenLimitReached(t *testing.T) {
	_, ns := holdCluster(t, fixedRule("api", 3, time.Hour))
	ctx := context.Background()
	got := 0
	for i := 0; got < 3 && i < 100; i++ {
		for _, p := range []string{"a", "b", "c"} {
			if d, err := ns[p].Allow(ctx, "api", "k"); err == nil && d.Allowed {
				got++
			}
		}
	}
	testutil.Eventually(t, 5*time.Second, func() (bool, string) {
		rep, _ := ns["a"].Usage("api", "k")
		return rep.Total == 3, fmt.Sprintf("a sees %d of 3", rep.Total)
	})
	d, err := ns["a"].Allow(ctx, "api", "k")
	if err != nil || d.Allowed || d.Reason != limiter.ReasonLimit {
		t.Fatalf("over the limit: %+v, %v; want denied by the limit", d, err)
	}
	if st := ns["a"].HoldStats(); st.Held != 0 {
		t.Errorf("HoldStats = %+v: a request was held", st)
	}
	if d.Remaining != 0 || d.RetryAfter <= 0 {
		t.Errorf("over the limit: remaining %d, retry after %v; want 0 and the window's end", d.Remaining, d.RetryAfter)
	}
}

// TestHoldBoundedByShareWaitAndContext: with the links cut, no
// acknowledgement returns, so a held request is answered with its denial
// once share_wait has passed — or sooner, at the caller's deadline, or
// with the context's error when the caller gives up.
func TestHoldBoundedByShareWaitAndContext(t *testing.T) {
	r := fixedRule("api", 30, time.Hour)
	r.ShareWait = 60 * time.Millisecond
	hub, ns := holdCluster(t, r)
	a := ns["a"]
	hub.Cut("a", "b")
	hub.Cut("a", "c")
	spend(t, a, "api", "k", 10)

	cases := []struct {
		name     string
		ctx      func() (context.Context, context.CancelFunc)
		min, max time.Duration
		err      error
	}{
		{"share_wait", func() (context.Context, context.CancelFunc) { return context.WithCancel(context.Background()) },
			60 * time.Millisecond, 160 * time.Millisecond, nil},
		{"deadline", func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(context.Background(), 30*time.Millisecond)
		}, 15 * time.Millisecond, 15 * time.Millisecond, nil}, // half the deadline is the answer's margin
		{"cancelled", func() (context.Context, context.CancelFunc) {
			ctx, cancel := context.WithCancel(context.Background())
			time.AfterFunc(10*time.Millisecond, cancel)
			return ctx, cancel
		}, 10 * time.Millisecond, 50 * time.Millisecond, context.Canceled},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := c.ctx()
			defer cancel()
			start := time.Now()
			d, err := a.Allow(ctx, "api", "k")
			took := time.Since(start)
			if d.Allowed || d.Reason != limiter.ReasonShare || !errors.Is(err, c.err) && err != c.err {
				t.Fatalf("%+v, %v; want the share denial and error %v", d, err, c.err)
			}
			if took < c.min || took > c.max+250*time.Millisecond {
				t.Errorf("answered after %v, want within [%v, %v]", took, c.min, c.max)
			}
		})
	}
}

// TestHoldAllowAll: an all-or-nothing request whose one check is refused
// by its share is held as a whole and admitted as a whole; one refused
// by its limit is answered at once and consumes nothing.
func TestHoldAllowAll(t *testing.T) {
	sec := fixedRule("sec", 30, time.Hour)
	sec.ShareWait = limiter.MaxShareWait
	_, ns := holdCluster(t, sec, fixedRule("min", 1000, time.Hour), fixedRule("tiny", 3, time.Hour))
	a, ctx := ns["a"], context.Background()
	spend(t, a, "sec", "k", 10)
	start := time.Now()
	ok, ds, err := a.AllowAll(ctx, node.NewCheck("sec", "k"), node.NewCheck("min", "k"))
	if err != nil || !ok || !ds[0].Allowed || !ds[1].Allowed {
		t.Fatalf("held AllowAll: %v %+v %v after %v; want both admitted", ok, ds, err, time.Since(start))
	}
	for _, rule := range []string{"sec", "min"} {
		rep, _ := a.Usage(rule, "k")
		want := map[string]uint64{"sec": 11, "min": 1}[rule]
		if len(rep.Slots) != 1 || rep.Slots[0].Admitted != want || rep.Slots[0].Attempted != want {
			t.Errorf("%s: a's slot %+v, want %d admitted of %d attempted (one attempt however long held)", rule, rep.Slots, want, want)
		}
	}
	for _, p := range []string{"a", "b", "c"} {
		spend(t, ns[p], "tiny", "k", 1)
	}
	testutil.Eventually(t, 5*time.Second, func() (bool, string) {
		rep, _ := a.Usage("tiny", "k")
		return rep.Total == 3, fmt.Sprintf("a sees %d of 3", rep.Total)
	})
	held := a.HoldStats().Held
	ok, ds, err = a.AllowAll(ctx, node.NewCheck("min", "k"), node.NewCheck("tiny", "k"))
	if err != nil || ok || ds[1].Reason != limiter.ReasonLimit {
		t.Fatalf("AllowAll over a limit: %v %+v %v; want refused by the limit", ok, ds, err)
	}
	if st := a.HoldStats(); st.Held != held {
		t.Errorf("HoldStats = %+v: the AllowAll refused by a limit was held", st)
	}
	if rep, _ := a.Usage("min", "k"); rep.Total != 1 {
		t.Errorf("the refused AllowAll consumed: min holds %d, want 1", rep.Total)
	}
}

// TestHoldAcquire: a lease refused by the member's share is held until
// its earlier leases are acknowledged, then granted.
func TestHoldAcquire(t *testing.T) {
	_, ns := holdCluster(t, limiter.Rule{Name: "conns", Algorithm: limiter.Concurrency, Limit: 6, ShareWait: limiter.MaxShareWait})
	a, ctx := ns["a"], context.Background()
	for i := range 2 {
		if l, d, err := a.Acquire(ctx, "conns", "k"); err != nil || l == nil {
			t.Fatalf("lease %d: %+v, %v", i+1, d, err)
		}
	}
	start := time.Now()
	l, d, err := a.Acquire(ctx, "conns", "k")
	if err != nil || l == nil || !d.Allowed {
		t.Fatalf("third lease: %+v, %v after %v; want it held and granted", d, err, time.Since(start))
	}
	if took := time.Since(start); took >= limiter.MaxShareWait {
		t.Errorf("held for %v, share_wait %v", took, limiter.MaxShareWait)
	}
}

// fwdNet is an in-process Forwarder over memnet: a member's Forward calls
// the addressed member's handler directly, as package mesh's stream does,
// with the caller as the authenticated sender.
type fwdNet struct {
	mu    sync.Mutex
	hs    map[string]node.ForwardHandler
	down  map[string]bool // Forward to these fails
	calls map[node.ForwardOp]int
}

type fwdTransport struct {
	*memnet.Transport
	net *fwdNet
}

func (t *fwdTransport) Start(ctx context.Context, h node.Handler) error {
	t.net.mu.Lock()
	t.net.hs[t.Peer()] = h.(node.ForwardHandler)
	t.net.mu.Unlock()
	return t.Transport.Start(ctx, h)
}

// CheckPeer accepts the IDs the tests use: "peer-" and a name.
func (t *fwdTransport) CheckPeer(id string) error {
	if !strings.HasPrefix(id, "peer-") {
		return fmt.Errorf("%w: %q", node.ErrBadPeer, id)
	}
	return nil
}

func (t *fwdTransport) Forward(ctx context.Context, peer string, req *node.ForwardRequest) (*node.ForwardResponse, error) {
	t.net.mu.Lock()
	h, down := t.net.hs[peer], t.net.down[peer]
	t.net.calls[req.Op]++
	t.net.mu.Unlock()
	if h == nil || down {
		return nil, fmt.Errorf("fwdnet: %s unreachable", peer)
	}
	cp := *req
	return h.HandleForward(ctx, t.Peer(), &cp), nil
}

func (f *fwdNet) count(op node.ForwardOp) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[op]
}

// fwdCluster starts members peer-a, peer-b, peer-c on fwdNet.
func fwdCluster(t *testing.T, rules ...limiter.Rule) (*fwdNet, []*node.Node) {
	t.Helper()
	hub := memnet.NewHub()
	hub.SetDelay(time.Millisecond)
	fn := &fwdNet{hs: map[string]node.ForwardHandler{}, down: map[string]bool{}, calls: map[node.ForwardOp]int{}}
	ns := map[string]*node.Node{}
	var list []*node.Node
	for _, p := range []string{"peer-a", "peer-b", "peer-c"} {
		cfg := rtConfig(hub, p, rules...)
		cfg.Transport = &fwdTransport{Transport: hub.Transport(p), net: fn}
		ns[p] = rtStart(t, cfg)
		list = append(list, ns[p])
	}
	rtMeshed(t, ns)
	return fn, list
}

// TestLeaseAtAnyMember: a lease acquired at one member is renewed at
// another and released at a third, each forwarded to the owner, and is
// then free everywhere; a malformed ID is ErrBadLease, a lease of a member
// that is not live ErrUnknownLease, and of a live owner that does not
// answer ErrOwnerUnreachable.
func TestLeaseAtAnyMember(t *testing.T) {
	fn, ns := fwdCluster(t, limiter.Rule{Name: "conns", Algorithm: limiter.Concurrency, Limit: 30, LeaseTTL: time.Minute})
	ctx := context.Background()
	l, d, err := ns[0].Acquire(ctx, "conns", "k")
	if err != nil || l == nil {
		t.Fatalf("Acquire: %+v, %v", d, err)
	}
	if ttl, err := ns[1].Renew(ctx, l.ID); err != nil || ttl != time.Minute {
		t.Fatalf("Renew at another member: %v, %v; want the owner's TTL", ttl, err)
	}
	fn.mu.Lock()
	fn.down["peer-a"] = true
	fn.mu.Unlock()
	if err := ns[2].Release(ctx, l.ID); !errors.Is(err, node.ErrOwnerUnreachable) {
		t.Fatalf("Release while the owner does not answer: %v, want ErrOwnerUnreachable", err)
	}
	fn.mu.Lock()
	fn.down["peer-a"] = false
	fn.mu.Unlock()
	if err := ns[2].Release(ctx, l.ID); err != nil {
		t.Fatalf("Release at a third member: %v", err)
	}
	testutil.Eventually(t, 5*time.Second, func() (bool, string) {
		for i, n := range ns {
			if rep, _ := n.Usage("conns", "k"); rep.Total != 0 {
				return false, fmt.Sprintf("member %d still counts %d leases", i, rep.Total)
			}
		}
		return true, ""
	})
	if _, err := ns[1].Renew(ctx, l.ID); !errors.Is(err, node.ErrUnknownLease) {
		t.Errorf("Renew after the release: %v, want ErrUnknownLease", err)
	}
	if fn.count(node.ForwardRenew) < 2 || fn.count(node.ForwardRelease) != 2 {
		t.Errorf("forwards: %d renewals, %d releases; want them sent to the owner", fn.count(node.ForwardRenew), fn.count(node.ForwardRelease))
	}
	for _, id := range []string{"garbage~x~y", "garbage", "peer-a~0~1", "peer-a~x", "~1~1", "peer-a~1~-1"} {
		if _, err := ns[1].Renew(ctx, id); !errors.Is(err, node.ErrBadLease) {
			t.Errorf("Renew(%q) = %v, want ErrBadLease", id, err)
		}
	}
	if err := ns[1].Release(ctx, "peer-zz~1~1"); !errors.Is(err, node.ErrUnknownLease) {
		t.Errorf("Release of a lease whose owner is no member: %v, want ErrUnknownLease", err)
	}
}

// TestIdleKeyFirstRequest: under a limit of 2 across 3 members each
// member's share of a request is 2/3, so an idle key's first request
// goes to the lottery, whose stratified draws refuse it at one member in
// three. The refusing member hands it to a member whose draw admits it:
// the first request of every idle key is admitted, wherever it arrives,
// for windowed rules and leases alike, and the limit still holds.
func TestIdleKeyFirstRequest(t *testing.T) {
	fn, ns := fwdCluster(t,
		limiter.Rule{Name: "conns", Algorithm: limiter.Concurrency, Limit: 2, LeaseTTL: time.Minute},
		fixedRule("api", 2, time.Hour))
	ctx := context.Background()
	const keys = 30
	for k := range keys {
		key := fmt.Sprintf("k%d", k)
		n := ns[k%3]
		if d, err := n.Allow(ctx, "api", key); err != nil || !d.Allowed {
			t.Errorf("first allow of %s at member %d: %+v, %v", key, k%3, d, err)
		}
		l, d, err := n.Acquire(ctx, "conns", key)
		if err != nil || l == nil {
			t.Errorf("first acquire of %s at member %d: %+v, %v", key, k%3, d, err)
		}
	}
	// Without forwarding (plain memnet) the losers are only held, and a
	// window's draw does not change while they wait: about a third of
	// the first requests are refused.
	_, plain := holdCluster(t, limiter.Rule{Name: "conns", Algorithm: limiter.Concurrency, Limit: 2, LeaseTTL: time.Minute},
		fixedRule("api", 2, time.Hour))
	refusedAllow, refusedLease := 0, 0
	for k := range keys {
		key := fmt.Sprintf("k%d", k)
		n := plain[[]string{"a", "b", "c"}[k%3]]
		if d, err := n.Allow(ctx, "api", key); err == nil && !d.Allowed {
			refusedAllow++
		}
		if l, _, err := n.Acquire(ctx, "conns", key); err == nil && l == nil {
			refusedLease++
		}
	}
	t.Logf("without forwarding: %d of %d first allows and %d of %d first acquires refused", refusedAllow, keys, refusedLease, keys)
	if refusedAllow == 0 {
		t.Errorf("without forwarding no first allow was refused: the test's premise failed")
	}
	allows, acquires := fn.count(node.ForwardAllow), fn.count(node.ForwardAcquire)
	t.Logf("%d of %d first allows and %d of %d first acquires went to another member", allows, keys, acquires, keys)
	if allows == 0 || acquires == 0 || allows > keys*2/3 || acquires > keys*2/3 {
		t.Errorf("forwarded %d allows and %d acquires of %d; want about a third each", allows, acquires, keys)
	}
	// The limit holds: two per key at most, however the requests come.
	for k := range 3 {
		key := fmt.Sprintf("k%d", k)
		admitted := 1
		for range 5 {
			for _, n := range ns {
				if d, _ := n.Allow(ctx, "api", key); d.Allowed {
					admitted++
				}
			}
		}
		if admitted > 2 {
			t.Errorf("%s: %d admitted under a limit of 2", key, admitted)
		}
	}
}
