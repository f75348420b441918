// Package p2plimit rate-limits the inbound streams of a libp2p protocol
// with a ratemesh node: the libp2p counterpart of package httplimit. It
// wraps a network.StreamHandler so that every stream is decided before the
// handler runs; a denied stream is reset with a documented error code, so
// the remote side can tell a rate limit from a failure.
//
// A p2p service attaches a ratemesh member to its own host and PubSub
// (mesh.Attach), starts a node on it and wraps its handlers:
//
//	m, err := mesh.Attach(h, ps, mcfg)
//	n, err := node.Start(ctx, ncfg) // ncfg.Transport = m; rules include "echo"
//	cfg := p2plimit.DefaultConfig()
//	cfg.Rule = "echo" // keyed by the remote peer ID by default
//	limit, err := p2plimit.New(n, cfg)
//	h.SetStreamHandler("/echo/1.0.0", limit(echo))
//
// Every member of the mesh that wraps its handler with the same rule holds
// one limit per remote peer across all of them.
//
// # Windowed rules
//
// Each stream costs Config.Cost credits (1 by default) of the rule, keyed
// by Config.Key (the remote peer ID by default). A stream the rule admits
// reaches the handler; a denied one is handed to Config.Denied, which by
// default resets it with CodeRateLimited (libp2p's RATE_LIMITED, 0x1003).
// The remote side reads a *network.StreamError with that ErrorCode and
// Remote set from its next Read or Write (see IsRateLimited). A stream only
// this member's share refuses is held for at most the rule's share_wait
// (see node.Node.Allow) before it is decided.
//
// # Concurrency rules
//
// With a concurrency rule a stream holds a lease while it is open: the
// handler runs only if the mesh's live leases of the key are under the
// limit, and receives a stream whose Close, Reset and ResetWithError
// release the lease. The lease is renewed in the background while the
// stream is open (every third of the rule's lease_ttl), and released as
// well when the stream's connection is found closed (checked every
// Config.LeaseCheck), so a client host that dies frees its leases even if
// the handler never returns. If the serving member itself dies, its leases
// expire after lease_ttl, as every lease does. As libp2p requires of every
// handler, the handler must Close or Reset the stream when done: a stream
// left open holds its lease until its connection closes.
package p2plimit

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-yamux/v5"

	"github.com/ratemesh/ratemesh/limiter"
	"github.com/ratemesh/ratemesh/node"
)

// Limiter is what the wrapper needs of a node: a decision per stream (Allow
// for a windowed rule, Acquire for a concurrency rule), and Usage, which
// tells the two apart at New. *node.Node implements it. The methods are
// called concurrently from the host's stream goroutines.
type Limiter interface {
	Allow(ctx context.Context, rule, key string, opts ...node.Option) (node.Decision, error)
	Acquire(ctx context.Context, rule, key string, opts ...node.Option) (*node.LeaseHandle, node.Decision, error)
	Usage(rule, key string) (node.UsageReport, error)
}

var _ Limiter = (*node.Node)(nil)

// KeyFunc returns the rate-limit key of a stream: its remote peer, its
// remote IP, an account the protocol names. An error refuses the stream
// before the limiter is asked (Config.Error answers it).
type KeyFunc func(s network.Stream) (string, error)

// CostFunc returns the credits a stream costs. 0 is a peek: it is decided
// but consumes nothing.
type CostFunc func(s network.Stream) (uint64, error)

// ClassFunc returns the client class of a stream (a class of the rule,
// which scales its limit or makes it unlimited), or "" for none.
type ClassFunc func(s network.Stream) (string, error)

// DeniedFunc answers a denied stream; it must Reset it (or Close it), the
// handler never sees it.
type DeniedFunc func(s network.Stream, d node.Decision)

// ErrorFunc answers a stream the wrapper could not decide; it must Reset
// or Close it. err wraps ErrKey for a KeyFunc, CostFunc or ClassFunc
// failure, a limiter sentinel (limiter.ErrBadKey, limiter.ErrUnknownClass,
// …) for a stream the rule refuses, node.ErrClosed, or the decision's
// context error (Config.Timeout).
type ErrorFunc func(s network.Stream, err error)

// The error codes the default answers reset a stream with, from libp2p's
// own table (go-libp2p core/network, the libp2p error-codes
// specification). A stream that fails for any other reason is reset
// without a code (0), as libp2p resets streams.
const (
	// CodeRateLimited resets a denied stream: retry later.
	CodeRateLimited = network.StreamRateLimited // 0x1003
	// CodeBadRequest resets a stream the rule cannot take: its key, cost
	// or class is refused (ErrKey, limiter.ErrBadKey, ErrBadCost,
	// ErrUnknownClass, ErrUnknownType). Retrying does not help.
	CodeBadRequest = network.StreamProtocolViolation // 0x1004
	// CodeUnavailable resets a stream that arrives while the node is
	// closing (node.ErrClosed).
	CodeUnavailable = network.StreamShutdown // 0x1007
)

// Sentinel errors of the package.
var (
	// ErrKey wraps every failure of Config.Key, Config.Cost and
	// Config.Class: the stream does not say who it is or what it costs.
	ErrKey = errors.New("p2plimit: no rate-limit key")
	// ErrInvalidConfig wraps every configuration error of New.
	ErrInvalidConfig = errors.New("p2plimit: invalid config")
)

// Config configures the wrapper. Start from DefaultConfig and set Rule.
type Config struct {
	// Rule is the node's rule that streams are counted against: windowed
	// (each stream costs credits) or concurrency (each open stream holds
	// a lease). Required; New fails if the node does not know it.
	Rule string
	// Key returns each stream's key. Default RemotePeer(): the
	// authenticated remote peer ID, which a client cannot choose.
	Key KeyFunc
	// Cost returns each stream's cost. Nil means 1. A concurrency rule
	// takes no cost: a stream holds one lease.
	Cost CostFunc
	// Class returns each stream's client class. Nil means none.
	Class ClassFunc
	// Denied answers a denied stream. Nil means DefaultDenied: a reset
	// with CodeRateLimited.
	Denied DeniedFunc
	// Error answers a stream that could not be decided. Nil means
	// DefaultError: a reset with CodeOf(err).
	Error ErrorFunc
	// Timeout bounds one decision, a held share denial or a lease
	// forwarded to another member included. Default 5 s.
	Timeout time.Duration
	// LeaseCheck is how often a stream holding a lease checks whether its
	// connection has closed, and at most how long after a third of the
	// lease's TTL it is renewed. Default 1 s; at most a third of the TTL
	// is used.
	LeaseCheck time.Duration
	// Logger receives lease renewals and releases that failed; nil
	// discards them.
	Logger *slog.Logger
}

// DefaultConfig returns a config that keys streams by their authenticated
// remote peer ID and costs each stream 1. Rule is left for the caller.
func DefaultConfig() Config {
	return Config{
		Key: RemotePeer(),
		// A held share denial waits at most limiter.MaxShareWait (1 s);
		// the rest is slack for a forwarded lease on a loaded host.
		Timeout: 5 * time.Second,
		// A dead client's leases go within a second of its connection
		// closing, at the cost of one IsClosed per open stream a second.
		LeaseCheck: time.Second,
	}
}

func (c *Config) validate() error {
	switch {
	case c.Rule == "":
		return fmt.Errorf("%w: Rule: required", ErrInvalidConfig)
	case c.Key == nil:
		return fmt.Errorf("%w: Key: required (use RemotePeer, RemoteIP or a KeyFunc)", ErrInvalidConfig)
	case c.Timeout <= 0:
		return fmt.Errorf("%w: Timeout: %v, must be positive", ErrInvalidConfig, c.Timeout)
	case c.LeaseCheck <= 0:
		return fmt.Errorf("%w: LeaseCheck: %v, must be positive", ErrInvalidConfig, c.LeaseCheck)
	}
	return nil
}

// limits is one configured wrapper; it is safe for concurrent use.
type limits struct {
	n   Limiter
	cfg Config
	log *slog.Logger
	// lease is whether the rule is a concurrency rule, as last seen: a
	// reload may change the rule's algorithm, which the next decision
	// notices (limiter.ErrWrongAlgorithm) and follows.
	lease atomic.Bool
}

// New returns a wrapper that decides every inbound stream of the handlers
// it wraps with n under cfg. The error names the config field, or wraps
// node.ErrUnknownRule.
func New(n Limiter, cfg Config) (func(network.StreamHandler) network.StreamHandler, error) {
	if n == nil {
		return nil, fmt.Errorf("%w: limiter: nil", ErrInvalidConfig)
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	rep, err := n.Usage(cfg.Rule, "")
	if err != nil {
		return nil, fmt.Errorf("%w: Rule %q: %w", ErrInvalidConfig, cfg.Rule, err)
	}
	concurrency := rep.WindowMs <= 0
	if concurrency && cfg.Cost != nil {
		return nil, fmt.Errorf("%w: Cost: rule %q is a concurrency rule, where a stream holds one lease; leave Cost nil", ErrInvalidConfig, cfg.Rule)
	}
	if cfg.Denied == nil {
		cfg.Denied = DefaultDenied
	}
	if cfg.Error == nil {
		cfg.Error = DefaultError
	}
	l := &limits{n: n, cfg: cfg, log: cfg.Logger}
	if l.log == nil {
		l.log = slog.New(slog.DiscardHandler)
	}
	l.lease.Store(concurrency)
	return func(next network.StreamHandler) network.StreamHandler {
		return func(s network.Stream) { l.serve(s, next) }
	}, nil
}

func (l *limits) serve(s network.Stream, next network.StreamHandler) {
	key, opts, err := l.request(s)
	if err != nil {
		l.cfg.Error(s, err)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), l.cfg.Timeout)
	defer cancel()
	var (
		d     node.Decision
		lease *node.LeaseHandle
	)
	for try := 0; ; try++ {
		if l.lease.Load() {
			lease, d, err = l.n.Acquire(ctx, l.cfg.Rule, key, opts[1:]...) // a lease takes no cost
		} else {
			d, err = l.n.Allow(ctx, l.cfg.Rule, key, opts[:]...)
		}
		if try == 0 && errors.Is(err, limiter.ErrWrongAlgorithm) {
			l.lease.Store(!l.lease.Load()) // the rule was reloaded as the other kind
			continue
		}
		break
	}
	if err != nil {
		l.cfg.Error(s, err)
		return
	}
	if !d.Allowed {
		l.cfg.Denied(s, d)
		return
	}
	if lease == nil {
		next(s)
		return
	}
	ls := &leasedStream{Stream: s, done: make(chan struct{})}
	go l.hold(ls, lease)
	next(ls)
}

// request returns a stream's key and options: opts[0] its cost, opts[1]
// its class, each the zero Option when not configured.
func (l *limits) request(s network.Stream) (key string, opts [2]node.Option, err error) {
	key, err = l.cfg.Key(s)
	if err != nil {
		return "", opts, wrapKey("key", err)
	}
	if l.cfg.Cost != nil {
		c, err := l.cfg.Cost(s)
		if err != nil {
			return "", opts, wrapKey("cost", err)
		}
		opts[0] = node.Cost(c)
	}
	if l.cfg.Class != nil {
		c, err := l.cfg.Class(s)
		if err != nil {
			return "", opts, wrapKey("class", err)
		}
		if c != "" {
			opts[1] = node.Class(c)
		}
	}
	return key, opts, nil
}

func wrapKey(what string, err error) error {
	if errors.Is(err, ErrKey) {
		return err
	}
	return fmt.Errorf("%w: %s: %w", ErrKey, what, err)
}

// hold keeps s's lease while s is open: it renews the lease every third of
// its TTL and releases it when the handler closes or resets s, or when s's
// connection is found closed (the client is gone). A lease that cannot be
// renewed before it expires is lost: the stream goes on, uncounted, and
// the loss is logged.
func (l *limits) hold(s *leasedStream, h *node.LeaseHandle) {
	ttl := time.Until(h.Expires())
	check := min(l.cfg.LeaseCheck, max(ttl/3, time.Millisecond))
	tick := time.NewTicker(check)
	defer tick.Stop()
	renewAt := time.Now().Add(ttl / 3)
	for {
		select {
		case <-s.done:
			l.release(h)
			return
		case <-tick.C:
		}
		if s.Conn().IsClosed() {
			l.release(h)
			return
		}
		if time.Now().Before(renewAt) {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), l.cfg.Timeout)
		ttl, err := h.Renew(ctx)
		cancel()
		switch {
		case err == nil:
			renewAt = time.Now().Add(ttl / 3)
		case errors.Is(err, node.ErrUnknownLease), errors.Is(err, node.ErrClosed), !time.Now().Before(h.Expires()):
			l.log.Warn("a stream's lease is lost; the stream goes on uncounted", "rule", h.Rule, "key", h.Key, "lease", h.ID, "err", err)
			return
		default:
			l.log.Debug("lease renewal failed; retrying", "rule", h.Rule, "key", h.Key, "lease", h.ID, "err", err)
		}
	}
}

func (l *limits) release(h *node.LeaseHandle) {
	ctx, cancel := context.WithTimeout(context.Background(), l.cfg.Timeout)
	defer cancel()
	if err := h.Release(ctx); err != nil && !errors.Is(err, node.ErrClosed) {
		l.log.Warn("release a stream's lease", "rule", h.Rule, "key", h.Key, "lease", h.ID, "err", err)
	}
}

// leasedStream is the stream a handler of a concurrency rule receives:
// Close, Reset and ResetWithError end the lease.
type leasedStream struct {
	network.Stream
	once sync.Once
	done chan struct{} // closed when the handler ends the stream
}

func (s *leasedStream) end() { s.once.Do(func() { close(s.done) }) }

// Close closes the stream and releases its lease.
func (s *leasedStream) Close() error {
	err := s.Stream.Close()
	s.end()
	return err
}

// Reset resets the stream and releases its lease.
func (s *leasedStream) Reset() error {
	err := s.Stream.Reset()
	s.end()
	return err
}

// ResetWithError resets the stream with code and releases its lease.
func (s *leasedStream) ResetWithError(code network.StreamErrorCode) error {
	err := s.Stream.ResetWithError(code)
	s.end()
	return err
}

// DefaultDenied resets a denied stream with CodeRateLimited.
func DefaultDenied(s network.Stream, _ node.Decision) {
	_ = s.ResetWithError(CodeRateLimited)
}

// DefaultError resets a stream that could not be decided with CodeOf(err).
func DefaultError(s network.Stream, err error) {
	_ = s.ResetWithError(CodeOf(err))
}

// CodeOf returns the error code DefaultError resets a stream with for err:
// CodeBadRequest for a stream the rule cannot take (ErrKey, a bad key,
// cost, type or class), CodeUnavailable for a closed node, and 0 (a plain
// reset) otherwise.
func CodeOf(err error) network.StreamErrorCode {
	switch {
	case errors.Is(err, ErrKey), errors.Is(err, limiter.ErrBadKey), errors.Is(err, limiter.ErrBadCost),
		errors.Is(err, limiter.ErrUnknownClass), errors.Is(err, limiter.ErrUnknownType), errors.Is(err, node.ErrBadOption):
		return CodeBadRequest
	case errors.Is(err, node.ErrClosed):
		return CodeUnavailable
	default:
		return network.StreamNoError
	}
}

// IsRateLimited reports whether err, from a Read, Write or CloseWrite on a
// stream this side opened, says the remote side reset it with
// CodeRateLimited: the stream was denied, and a later one may pass. It
// knows libp2p's *network.StreamError and the *yamux.StreamError that
// go-libp2p v0.51's yamux streams return unconverted from CloseWrite.
func IsRateLimited(err error) bool {
	var se *network.StreamError
	if errors.As(err, &se) {
		return se.Remote && se.ErrorCode == CodeRateLimited
	}
	var ye *yamux.StreamError
	return errors.As(err, &ye) && ye.Remote && network.StreamErrorCode(ye.ErrorCode) == CodeRateLimited
}
