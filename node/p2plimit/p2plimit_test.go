package p2plimit_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	"github.com/libp2p/go-yamux/v5"

	"github.com/ratemesh/ratemesh/internal/p2ptest"
	"github.com/ratemesh/ratemesh/internal/testutil"
	"github.com/ratemesh/ratemesh/limiter"
	"github.com/ratemesh/ratemesh/node"
	"github.com/ratemesh/ratemesh/node/memnet"
	"github.com/ratemesh/ratemesh/node/p2plimit"
)

const echoProto = protocol.ID("/test/echo/1.0.0")

// frozenAt returns a clock stopped into past the start of a window of
// length w, so that a test's requests all fall in one window.
func frozenAt(w, into time.Duration) func() time.Time {
	now := time.Now().UnixNano()
	at := time.Unix(0, now-now%w.Nanoseconds()).Add(w + into)
	return func() time.Time { return at }
}

// startNode starts a node alone on a memnet hub; clock nil is the real
// one.
func startNode(t testing.TB, clock func() time.Time, rules ...limiter.Rule) *node.Node {
	t.Helper()
	cfg := node.DefaultConfig()
	cfg.Peer, cfg.Rules, cfg.Transport = "a", rules, memnet.NewHub().Transport("a")
	if clock != nil {
		cfg.Clock = clock
	}
	n, err := node.Start(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Close() })
	return n
}

func fixed(name string, limit uint64) limiter.Rule {
	return limiter.Rule{Name: name, Algorithm: limiter.FixedWindow, Limit: limit, Window: time.Hour}
}

// echo answers one line with "echo: " and the line, and counts its calls.
func echo(calls *atomic.Int64) network.StreamHandler {
	return func(s network.Stream) {
		calls.Add(1)
		line, err := bufio.NewReader(s).ReadString('\n')
		if err != nil {
			_ = s.Reset()
			return
		}
		_, _ = io.WriteString(s, "echo: "+line)
		_ = s.Close()
	}
}

// serve wraps h with cfg over n on srv's echo protocol.
func serve(t testing.TB, srv host.Host, n p2plimit.Limiter, cfg p2plimit.Config, h network.StreamHandler) {
	t.Helper()
	limit, err := p2plimit.New(n, cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv.SetStreamHandler(echoProto, limit(h))
}

// call sends one line on a new echo stream from c to srv and returns the
// answer or the error the stream ended with.
func call(c, srv host.Host, msg string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := c.NewStream(ctx, srv.ID(), echoProto)
	if err != nil {
		return "", err
	}
	_ = s.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(s, msg+"\n"); err != nil {
		_ = s.Reset()
		return "", err
	}
	_ = s.CloseWrite()
	b, err := io.ReadAll(s)
	if err != nil {
		_ = s.Reset()
		return "", err
	}
	_ = s.Close()
	return string(b), nil
}

// code returns the error code of a remote reset, or fails.
func code(t testing.TB, err error) network.StreamErrorCode {
	t.Helper()
	var se *network.StreamError
	if !errors.As(err, &se) || !se.Remote {
		t.Fatalf("error %v is not a remote stream reset", err)
	}
	return se.ErrorCode
}

// TestDeniedStreamsResetWithCode: a limit of 3 per window keyed by the
// remote peer. Three streams of a client reach the handler and are
// echoed; the next two are reset before the handler runs with
// CodeRateLimited, which the client reads as a *network.StreamError
// (IsRateLimited). Another client has its own three.
func TestDeniedStreamsResetWithCode(t *testing.T) {
	t.Parallel()
	n := startNode(t, frozenAt(time.Hour, time.Minute), fixed("echo", 3))
	srv, c1, c2 := p2ptest.Host(t), p2ptest.Host(t), p2ptest.Host(t)
	p2ptest.Connect(t, c1, srv)
	p2ptest.Connect(t, c2, srv)
	cfg := p2plimit.DefaultConfig()
	cfg.Rule = "echo"
	var calls atomic.Int64
	serve(t, srv, n, cfg, echo(&calls))

	for i := range 5 {
		got, err := call(c1, srv, fmt.Sprint("hi ", i))
		if i < 3 {
			if err != nil || got != fmt.Sprintf("echo: hi %d\n", i) {
				t.Fatalf("stream %d: %q, %v; want its echo", i, got, err)
			}
			continue
		}
		if got := code(t, err); got != 0x1003 {
			t.Fatalf("stream %d: reset with code %#x, want CodeRateLimited 0x1003", i, got)
		}
		if !p2plimit.IsRateLimited(err) {
			t.Fatalf("stream %d: IsRateLimited(%v) = false", i, err)
		}
	}
	if got := calls.Load(); got != 3 {
		t.Fatalf("the handler ran %d times, want 3: a denied stream reached it", got)
	}
	for i := range 3 {
		if _, err := call(c2, srv, "other"); err != nil {
			t.Fatalf("the other client's stream %d: %v", i, err)
		}
	}
	if _, err := call(c2, srv, "other"); !p2plimit.IsRateLimited(err) {
		t.Fatalf("the other client's fourth stream: %v, want a rate-limit reset", err)
	}
	rep, err := n.Usage("echo", c1.ID().String())
	if err != nil || rep.Total != 3 {
		t.Fatalf("usage of the first client's peer ID: %+v, %v; want 3", rep, err)
	}
}

// TestKeysAndClasses: RemoteIP gives two clients on 127.0.0.1 one key; a
// peer set given an unlimited class passes beyond the limit while the
// others are held to it; a cost function charges per stream.
func TestKeysAndClasses(t *testing.T) {
	t.Parallel()
	rule := fixed("echo", 4)
	rule.Classes = map[string]limiter.Class{"own": {Unlimited: true}}
	n := startNode(t, frozenAt(time.Hour, time.Minute), rule)
	srv, c1, c2, own := p2ptest.Host(t), p2ptest.Host(t), p2ptest.Host(t), p2ptest.Host(t)
	for _, c := range []host.Host{c1, c2, own} {
		p2ptest.Connect(t, c, srv)
	}
	var calls atomic.Int64
	byIP := p2plimit.DefaultConfig()
	byIP.Rule, byIP.Key = "echo", p2plimit.RemoteIP()
	limit, err := p2plimit.New(n, byIP)
	if err != nil {
		t.Fatal(err)
	}
	srv.SetStreamHandler(echoProto, limit(echo(&calls)))
	admitted := 0
	for i := range 6 {
		c := []host.Host{c1, c2}[i%2]
		if _, err := call(c, srv, "x"); err == nil {
			admitted++
		} else if !p2plimit.IsRateLimited(err) {
			t.Fatalf("stream %d: %v", i, err)
		}
	}
	if admitted != 4 {
		t.Fatalf("two peers on one IP were admitted %d streams, want 4 in all", admitted)
	}
	if rep, _ := n.Usage("echo", "127.0.0.1"); rep.Total != 4 {
		t.Fatalf("usage of key 127.0.0.1: %d, want 4", rep.Total)
	}

	n2 := startNode(t, frozenAt(time.Hour, time.Minute), rule)
	classes, err := p2plimit.PeerClasses(map[string][]peer.ID{"own": {own.ID()}})
	if err != nil {
		t.Fatal(err)
	}
	cfg := p2plimit.DefaultConfig()
	cfg.Rule, cfg.Class = "echo", classes
	cfg.Cost = func(network.Stream) (uint64, error) { return 2, nil }
	serve(t, srv, n2, cfg, echo(&calls))
	for i := range 10 {
		if _, err := call(own, srv, "mine"); err != nil {
			t.Fatalf("the service's own peer, stream %d: %v", i, err)
		}
	}
	for i := range 3 {
		_, err := call(c1, srv, "x")
		if i < 2 && err != nil {
			t.Fatalf("stream %d of cost 2 under a limit of 4: %v", i, err)
		}
		if i == 2 && !p2plimit.IsRateLimited(err) {
			t.Fatalf("a third stream of cost 2 under a limit of 4: %v, want a rate-limit reset", err)
		}
	}
	if _, err := p2plimit.PeerClasses(map[string][]peer.ID{"a": {own.ID()}, "b": {own.ID()}}); !errors.Is(err, p2plimit.ErrInvalidConfig) {
		t.Fatalf("a peer in two classes: %v", err)
	}
}

// TestErrors: a stream the wrapper cannot decide is reset before the
// handler with the code CodeOf gives: CodeBadRequest for a key function's
// failure or an unknown class, CodeUnavailable once the node is closed.
// New names the config field that is wrong.
func TestErrors(t *testing.T) {
	t.Parallel()
	n := startNode(t, frozenAt(time.Hour, time.Minute), fixed("echo", 100),
		limiter.Rule{Name: "conc", Algorithm: limiter.Concurrency, Limit: 1})
	srv, c := p2ptest.Host(t), p2ptest.Host(t)
	p2ptest.Connect(t, c, srv)
	var calls atomic.Int64
	for _, tc := range []struct {
		name string
		edit func(*p2plimit.Config)
		want network.StreamErrorCode
	}{
		{"key", func(cfg *p2plimit.Config) {
			cfg.Key = func(network.Stream) (string, error) { return "", errors.New("who?") }
		}, p2plimit.CodeBadRequest},
		{"class", func(cfg *p2plimit.Config) {
			cfg.Class = func(network.Stream) (string, error) { return "gold", nil }
		}, p2plimit.CodeBadRequest},
	} {
		cfg := p2plimit.DefaultConfig()
		cfg.Rule = "echo"
		tc.edit(&cfg)
		serve(t, srv, n, cfg, echo(&calls))
		_, err := call(c, srv, "x")
		if got := code(t, err); got != tc.want {
			t.Errorf("%s: reset with %#x, want %#x", tc.name, got, tc.want)
		}
	}
	if calls.Load() != 0 {
		t.Fatalf("the handler ran %d times", calls.Load())
	}

	for _, tc := range []struct {
		name, want string
		edit       func(*p2plimit.Config)
	}{
		{"no rule", "Rule: required", func(cfg *p2plimit.Config) { cfg.Rule = "" }},
		{"unknown rule", `Rule "nope"`, func(cfg *p2plimit.Config) { cfg.Rule = "nope" }},
		{"no key", "Key: required", func(cfg *p2plimit.Config) { cfg.Key = nil }},
		{"cost of a lease", "Cost: rule \"conc\" is a concurrency rule", func(cfg *p2plimit.Config) {
			cfg.Rule = "conc"
			cfg.Cost = func(network.Stream) (uint64, error) { return 1, nil }
		}},
		{"timeout", "Timeout", func(cfg *p2plimit.Config) { cfg.Timeout = 0 }},
	} {
		cfg := p2plimit.DefaultConfig()
		cfg.Rule = "echo"
		tc.edit(&cfg)
		if _, err := p2plimit.New(n, cfg); !errors.Is(err, p2plimit.ErrInvalidConfig) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: New = %v, want ErrInvalidConfig naming %q", tc.name, err, tc.want)
		}
	}

	cfg := p2plimit.DefaultConfig()
	cfg.Rule = "echo"
	serve(t, srv, n, cfg, echo(&calls))
	if _, err := call(c, srv, "x"); err != nil {
		t.Fatalf("before Close: %v", err)
	}
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	_, err := call(c, srv, "x")
	if got := code(t, err); got != p2plimit.CodeUnavailable {
		t.Fatalf("after the node's Close: reset with %#x, want CodeUnavailable %#x", got, p2plimit.CodeUnavailable)
	}
}

// holder is a concurrency handler: it answers "ok" at once, then reads
// until the client closes (and closes) or the stream breaks (and resets).
// With stuck set it never ends the stream, as a buggy handler might.
type holder struct {
	calls atomic.Int64
	stuck chan struct{}
}

func (h *holder) handle(s network.Stream) {
	h.calls.Add(1)
	if _, err := io.WriteString(s, "ok\n"); err != nil {
		_ = s.Reset()
		return
	}
	if h.stuck != nil {
		<-h.stuck
		return
	}
	if _, err := io.Copy(io.Discard, s); err != nil {
		_ = s.Reset()
		return
	}
	_ = s.Close()
}

// open opens a held stream from c to srv: admitted (the handler said ok)
// or the error it was reset with.
func open(c, srv host.Host) (network.Stream, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := c.NewStream(ctx, srv.ID(), echoProto)
	if err != nil {
		return nil, err
	}
	// Write first: a lazily negotiated stream reaches the server on its
	// first write.
	if _, err := s.Write([]byte("x")); err != nil {
		_ = s.Reset()
		return nil, err
	}
	_ = s.SetReadDeadline(time.Now().Add(5 * time.Second))
	line, err := bufio.NewReader(s).ReadString('\n')
	if err != nil {
		_ = s.Reset()
		return nil, err
	}
	if line != "ok\n" {
		_ = s.Reset()
		return nil, fmt.Errorf("answer %q", line)
	}
	_ = s.SetReadDeadline(time.Time{})
	return s, nil
}

func leases(t testing.TB, n *node.Node, key string) uint64 {
	t.Helper()
	rep, err := n.Usage("conc", key)
	if err != nil {
		t.Fatal(err)
	}
	return rep.Total
}

// startConcurrency serves a concurrency rule of limit 2 (lease TTL ttl)
// with h on srv, checking connections every 20 ms.
func startConcurrency(t *testing.T, ttl time.Duration, h *holder) (*node.Node, host.Host) {
	t.Helper()
	n := startNode(t, nil, limiter.Rule{Name: "conc", Algorithm: limiter.Concurrency, Limit: 2, LeaseTTL: ttl})
	srv := p2ptest.Host(t)
	cfg := p2plimit.DefaultConfig()
	cfg.Rule = "conc"
	cfg.LeaseCheck = 20 * time.Millisecond
	serve(t, srv, n, cfg, h.handle)
	return n, srv
}

// TestLeaseReleasedOnCloseAndReset: under a concurrency limit of 2 a
// client holds two streams and a third is refused with CodeRateLimited.
// The client closing one frees its lease (the handler sees EOF and
// closes), and so does resetting one (the handler's read fails and it
// resets): each time a new stream is admitted.
func TestLeaseReleasedOnCloseAndReset(t *testing.T) {
	t.Parallel()
	h := &holder{}
	n, srv := startConcurrency(t, time.Minute, h)
	c := p2ptest.Host(t)
	p2ptest.Connect(t, c, srv)
	key := c.ID().String()

	a, err := open(c, srv)
	if err != nil {
		t.Fatal(err)
	}
	b, err := open(c, srv)
	if err != nil {
		t.Fatal(err)
	}
	if got := leases(t, n, key); got != 2 {
		t.Fatalf("two open streams hold %d leases", got)
	}
	if _, err := open(c, srv); !p2plimit.IsRateLimited(err) {
		t.Fatalf("a third concurrent stream: %v, want a rate-limit reset", err)
	}

	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 5*time.Second, func() (bool, string) {
		got := leases(t, n, key)
		return got == 1, fmt.Sprintf("%d leases after closing one of two streams", got)
	})
	a2, err := open(c, srv)
	if err != nil {
		t.Fatalf("after a close: %v", err)
	}

	if err := b.Reset(); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 5*time.Second, func() (bool, string) {
		got := leases(t, n, key)
		return got == 1, fmt.Sprintf("%d leases after resetting one of two streams", got)
	})
	if _, err := open(c, srv); err != nil {
		t.Fatalf("after a reset: %v", err)
	}
	_ = a2.Close()
	if got := h.calls.Load(); got != 4 {
		t.Fatalf("the handler ran %d times, want 4 (the refused stream must not reach it)", got)
	}
}

// TestLeaseFreedWhenClientDies: a client holds two streams on a handler
// that never ends them (as if stuck), then its host dies. The leases go
// within a few connection checks, though the handler never returned.
func TestLeaseFreedWhenClientDies(t *testing.T) {
	t.Parallel()
	h := &holder{stuck: make(chan struct{})}
	defer close(h.stuck)
	n, srv := startConcurrency(t, time.Minute, h)
	c := p2ptest.Host(t)
	p2ptest.Connect(t, c, srv)
	key := c.ID().String()
	for range 2 {
		if _, err := open(c, srv); err != nil {
			t.Fatal(err)
		}
	}
	if got := leases(t, n, key); got != 2 {
		t.Fatalf("%d leases held, want 2", got)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 5*time.Second, func() (bool, string) {
		got := leases(t, n, key)
		return got == 0, fmt.Sprintf("%d leases after the client's host died", got)
	})
}

// TestLeaseRenewedWhileOpen: with a lease TTL of 300 ms, a stream held
// open for a second keeps its lease (renewed every 100 ms) and a third
// concurrent stream is still refused; closing it frees the lease.
func TestLeaseRenewedWhileOpen(t *testing.T) {
	t.Parallel()
	h := &holder{}
	n, srv := startConcurrency(t, 300*time.Millisecond, h)
	c := p2ptest.Host(t)
	p2ptest.Connect(t, c, srv)
	key := c.ID().String()
	var held []network.Stream
	for range 2 {
		s, err := open(c, srv)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, s)
	}
	deadline := time.Now().Add(time.Second)
	for time.Now().Before(deadline) {
		if got := leases(t, n, key); got != 2 {
			t.Fatalf("%d leases while two streams are open, want 2: a lease expired unrenewed", got)
		}
		time.Sleep(20 * time.Millisecond) // sampling interval over a fixed span, not a wait for a condition
	}
	if _, err := open(c, srv); !p2plimit.IsRateLimited(err) {
		t.Fatalf("a third stream after 1 s: %v, want a rate-limit reset", err)
	}
	for _, s := range held {
		_ = s.Close()
	}
	testutil.Eventually(t, 5*time.Second, func() (bool, string) {
		got := leases(t, n, key)
		return got == 0, fmt.Sprintf("%d leases after closing both", got)
	})
}

// TestIsRateLimited: the remote's RATE_LIMITED reset is recognised as
// libp2p reports it and as yamux reports it from CloseWrite; a local
// reset, another code or another error is not.
func TestIsRateLimited(t *testing.T) {
	for _, c := range []struct {
		err  error
		want bool
	}{
		{&network.StreamError{ErrorCode: 0x1003, Remote: true}, true},
		{fmt.Errorf("read: %w", &network.StreamError{ErrorCode: 0x1003, Remote: true}), true},
		{&yamux.StreamError{ErrorCode: 0x1003, Remote: true}, true},
		{&network.StreamError{ErrorCode: 0x1003, Remote: false}, false},
		{&network.StreamError{ErrorCode: 0x1004, Remote: true}, false},
		{&yamux.StreamError{ErrorCode: 0, Remote: true}, false},
		{network.ErrReset, false},
		{io.EOF, false},
		{nil, false},
	} {
		if got := p2plimit.IsRateLimited(c.err); got != c.want {
			t.Errorf("IsRateLimited(%v) = %t, want %t", c.err, got, c.want)
		}
	}
}
