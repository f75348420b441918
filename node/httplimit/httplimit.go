// Package httplimit is net/http middleware that rate-limits requests with a
// ratemesh node: it asks the node about every request, sets the RateLimit
// and RateLimit-Policy headers of draft-ietf-httpapi-ratelimit-headers-10 on
// every response, and answers a denied request with 429 Too Many Requests
// and Retry-After.
//
// A service embeds a node and wraps its handler:
//
//	n, err := node.Start(ctx, nodeCfg) // rules include "api"
//	cfg := httplimit.DefaultConfig()
//	cfg.Rule = "api"
//	cfg.Key = httplimit.ClientIP(trustedProxies) // or Header("X-API-Key"), or your own
//	mw, err := httplimit.New(n, cfg)
//	http.ListenAndServe(addr, mw(mux))
//
// An allowed request reaches the wrapped handler with
//
//	RateLimit-Policy: "api";q=100;w=1
//	RateLimit: "api";r=37;t=1
//
// already set; a denied one gets the same headers saying what a retry can
// expect (r=0, and t the seconds until it could pass), Retry-After in whole
// seconds (rounded up, at least 1) and Config.Denied's answer, 429 by
// default. A request only the node's share refuses is held by the node for
// at most the rule's share_wait (see node.Node.Allow) before it is decided,
// bounded by the request's context.
package httplimit

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/ratemesh/ratemesh/limiter"
	"github.com/ratemesh/ratemesh/node"
)

// Limiter is what the middleware needs of a node: a decision per request,
// and the rule's window, which it reads from Usage at New and at most once a
// second afterwards. *node.Node
// implements it. Both methods are called concurrently from the server's
// goroutines.
type Limiter interface {
	Allow(ctx context.Context, rule, key string, opts ...node.Option) (node.Decision, error)
	Usage(rule, key string) (node.UsageReport, error)
}

var _ Limiter = (*node.Node)(nil)

// KeyFunc returns the rate-limit key of a request: the client IP, an API key,
// an account. An error refuses the request before the limiter is asked
// (Config.Error answers it, 400 by default).
type KeyFunc func(r *http.Request) (string, error)

// CostFunc returns the credits a request costs. 0 is a peek: it is decided
// but consumes nothing.
type CostFunc func(r *http.Request) (uint64, error)

// ClassFunc returns the client class of a request (a class of the rule, which
// scales its limit or makes it unlimited), or "" for none.
type ClassFunc func(r *http.Request) (string, error)

// DeniedFunc answers a denied request. The RateLimit, RateLimit-Policy and
// Retry-After headers are already set on w; it writes the status and body.
type DeniedFunc func(w http.ResponseWriter, r *http.Request, d node.Decision)

// ErrorFunc answers a request the middleware could not decide: err wraps
// ErrKey for a KeyFunc, CostFunc or ClassFunc failure, a limiter sentinel
// (limiter.ErrBadKey, limiter.ErrUnknownClass, …) for a request the rule
// refuses, or node.ErrClosed.
type ErrorFunc func(w http.ResponseWriter, r *http.Request, err error)

// Sentinel errors of the package.
var (
	// ErrKey wraps every failure of Config.Key, Config.Cost and
	// Config.Class: the request does not say who it is or what it costs.
	ErrKey = errors.New("httplimit: no rate-limit key")
	// ErrInvalidConfig wraps every configuration error of New.
	ErrInvalidConfig = errors.New("httplimit: invalid config")
)

// Config configures the middleware. Start from DefaultConfig and set Rule.
type Config struct {
	// Rule is the node's rule that requests are counted against.
	// Required; New fails if the node does not know it.
	Rule string
	// Policy names the quota policy in the headers. Empty means Rule.
	Policy string
	// Key returns each request's key. Default ClientIP(nil): the peer
	// address of the connection, never a forwarding header.
	Key KeyFunc
	// Cost returns each request's cost. Nil means 1.
	Cost CostFunc
	// Class returns each request's client class. Nil means none.
	Class ClassFunc
	// Denied answers a denied request. Nil means DefaultDenied: 429 with a
	// short text body.
	Denied DeniedFunc
	// Error answers a request that could not be decided. Nil means
	// DefaultError: 400 for a key, cost, class or other client error,
	// 503 for a closed node, 500 otherwise.
	Error ErrorFunc
}

// DefaultConfig returns a config that keys requests by the connection's peer
// address (safe: a client cannot choose its key by sending a header) and
// costs each request 1. Rule is left for the caller.
func DefaultConfig() Config {
	return Config{Key: ClientIP(nil)}
}

func (c *Config) validate() error {
	if c.Rule == "" {
		return fmt.Errorf("%w: Rule: required", ErrInvalidConfig)
	}
	if c.Key == nil {
		return fmt.Errorf("%w: Key: required (use ClientIP, Header or a KeyFunc)", ErrInvalidConfig)
	}
	if strings.IndexFunc(c.Policy, notPrintableASCII) >= 0 {
		return fmt.Errorf("%w: Policy %q: only printable ASCII fits a header string", ErrInvalidConfig, c.Policy)
	}
	return nil
}

func notPrintableASCII(r rune) bool { return r < 0x20 || r > 0x7e }

// limiterMiddleware holds one configured middleware; it is safe for
// concurrent use.
type limiterMiddleware struct {
	n    Limiter
	cfg  Config
	name string // the policy name as a structured-field string

	// wparam is the RateLimit-Policy's ";w=N" for the rule's window, read
	// from the limiter at most every windowRefresh (a reload may change
	// the window); refreshAt is when to read it next, in Unix ns.
	wparam    atomic.Pointer[string]
	refreshAt atomic.Int64
}

// windowRefresh is how often the middleware re-reads the rule's window, so
// that a reload that changes it shows in the headers within a second.
const windowRefresh = time.Second

// windowParamNow returns ";w=N" for the rule's current window, re-reading it
// from the limiter when windowRefresh has passed; one request at a time does
// the re-read and the others use the value before it.
func (m *limiterMiddleware) windowParamNow() string {
	now := time.Now().UnixNano()
	if at := m.refreshAt.Load(); now >= at && m.refreshAt.CompareAndSwap(at, now+int64(windowRefresh)) {
		if rep, err := m.n.Usage(m.cfg.Rule, ""); err == nil && rep.WindowMs > 0 {
			p := windowParam(quota(rep))
			m.wparam.Store(&p)
		}
	}
	return *m.wparam.Load()
}

// New returns middleware that decides every request with n under cfg.
// It reads the rule's window from n at once and again at most every second
// (a reload may change it). The error names the config field, or wraps node.ErrUnknownRule;
// a concurrency rule is refused (it holds leases, not per-request credits).
func New(n Limiter, cfg Config) (func(http.Handler) http.Handler, error) {
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
	if rep.WindowMs <= 0 {
		return nil, fmt.Errorf("%w: Rule %q: a concurrency rule holds leases; the middleware needs a windowed rule", ErrInvalidConfig, cfg.Rule)
	}
	if cfg.Policy == "" {
		cfg.Policy = cfg.Rule
		if strings.IndexFunc(cfg.Policy, notPrintableASCII) >= 0 {
			return nil, fmt.Errorf("%w: Rule %q: set Policy, only printable ASCII fits a header string", ErrInvalidConfig, cfg.Rule)
		}
	}
	if cfg.Denied == nil {
		cfg.Denied = DefaultDenied
	}
	if cfg.Error == nil {
		cfg.Error = DefaultError
	}
	m := &limiterMiddleware{n: n, cfg: cfg, name: sfString(cfg.Policy)}
	p := windowParam(quota(rep))
	m.wparam.Store(&p)
	m.refreshAt.Store(time.Now().UnixNano() + int64(windowRefresh))
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			m.serve(w, r, next)
		})
	}, nil
}

func (m *limiterMiddleware) serve(w http.ResponseWriter, r *http.Request, next http.Handler) {
	key, err := m.cfg.Key(r)
	if err != nil {
		m.cfg.Error(w, r, wrapKey("key", err))
		return
	}
	var opts [2]node.Option
	if m.cfg.Cost != nil {
		c, err := m.cfg.Cost(r)
		if err != nil {
			m.cfg.Error(w, r, wrapKey("cost", err))
			return
		}
		opts[0] = node.Cost(c)
	}
	if m.cfg.Class != nil {
		c, err := m.cfg.Class(r)
		if err != nil {
			m.cfg.Error(w, r, wrapKey("class", err))
			return
		}
		if c != "" {
			opts[1] = node.Class(c)
		}
	}
	d, err := m.n.Allow(r.Context(), m.cfg.Rule, key, opts[:]...)
	if err != nil {
		m.cfg.Error(w, r, err)
		return
	}
	h := w.Header()
	h.Add("RateLimit-Policy", m.name+";q="+strconv.FormatUint(d.Limit, 10)+m.windowParamNow())
	h.Add("RateLimit", rateLimitValue(m.name, d))
	if d.Allowed {
		next.ServeHTTP(w, r)
		return
	}
	if s, ok := RetryAfterSeconds(d.RetryAfter); ok {
		h.Set("Retry-After", strconv.FormatInt(s, 10))
	}
	m.cfg.Denied(w, r, d)
}

func wrapKey(what string, err error) error {
	if errors.Is(err, ErrKey) {
		return err
	}
	return fmt.Errorf("%w: %s: %w", ErrKey, what, err)
}

// PolicyValue returns the RateLimit-Policy header value of a policy with
// quota limit per window: `"api";q=100;w=1`, w in whole seconds rounded up.
// A window of 0 (a concurrency rule) leaves w out. policy must be printable
// ASCII.
func PolicyValue(policy string, limit uint64, window time.Duration) string {
	return sfString(policy) + ";q=" + strconv.FormatUint(limit, 10) + windowParam(window)
}

// quota returns the period of rep's rule's limit: its window, or a token
// bucket's time to fill.
func quota(rep node.UsageReport) time.Duration {
	if rep.QuotaMs > 0 {
		return time.Duration(rep.QuotaMs) * time.Millisecond
	}
	return time.Duration(rep.WindowMs) * time.Millisecond
}

func windowParam(window time.Duration) string {
	if window <= 0 {
		return ""
	}
	return ";w=" + strconv.FormatInt(ceilSeconds(window), 10)
}

// RateLimitValue returns the RateLimit header value of decision d under
// policy: `"api";r=37;t=1`, r the remaining credits (what a retry can
// expect: 0 after a denial) and t the seconds, rounded up, until a retry
// can expect it: the window's reset when allowed, the denial's retry hint
// (at least 1, as Retry-After) when denied — a denial for the node's share
// says t=1, not the window's end — and the reset again for a request that
// can never pass (node.Never). policy must be printable ASCII.
func RateLimitValue(policy string, d node.Decision) string {
	return rateLimitValue(sfString(policy), d)
}

// rateLimitValue is RateLimitValue with the policy name already quoted.
func rateLimitValue(name string, d node.Decision) string {
	t := ceilSeconds(max(d.ResetAfter, 0))
	if s, ok := RetryAfterSeconds(d.RetryAfter); ok && !d.Allowed {
		t = s
	}
	return name + ";r=" + strconv.FormatUint(d.Remaining, 10) + ";t=" + strconv.FormatInt(t, 10)
}

// RetryAfterSeconds returns the Retry-After of a denial whose retry hint is
// d: whole seconds rounded up and at least 1, since HTTP cannot say less and
// a client that retries early is denied again. ok is false for node.Never
// (the cost exceeds the limit: no retry can succeed, so no Retry-After).
func RetryAfterSeconds(d time.Duration) (secs int64, ok bool) {
	if d < 0 {
		return 0, false
	}
	return max(ceilSeconds(d), 1), true
}

// ceilSeconds rounds d up to whole seconds.
func ceilSeconds(d time.Duration) int64 {
	s := int64(d / time.Second)
	if d%time.Second > 0 {
		s++
	}
	return s
}

// sfString serialises s as an RFC 8941 string: quoted, with backslash and
// quote escaped. s holds printable ASCII only (validate checks).
func sfString(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		if s[i] == '"' || s[i] == '\\' {
			b.WriteByte('\\')
		}
		b.WriteByte(s[i])
	}
	b.WriteByte('"')
	return b.String()
}

// DefaultDenied answers 429 Too Many Requests with a one-line text body.
func DefaultDenied(w http.ResponseWriter, _ *http.Request, d node.Decision) {
	msg := "rate limit exceeded\n"
	if d.RetryAfter < 0 {
		msg = "request cost exceeds the rate limit\n"
	}
	http.Error(w, msg, http.StatusTooManyRequests)
}

// DefaultError answers 400 Bad Request for a request the middleware or the
// rule cannot take (ErrKey, a bad key, cost, type or class), 503 Service
// Unavailable for a closed node, and 500 otherwise, with the error as text.
func DefaultError(w http.ResponseWriter, _ *http.Request, err error) {
	http.Error(w, err.Error(), StatusOf(err))
}

// StatusOf returns the HTTP status DefaultError answers for err.
func StatusOf(err error) int {
	switch {
	case errors.Is(err, ErrKey), errors.Is(err, limiter.ErrBadKey), errors.Is(err, limiter.ErrBadCost),
		errors.Is(err, limiter.ErrUnknownClass), errors.Is(err, limiter.ErrUnknownType):
		return http.StatusBadRequest
	case errors.Is(err, node.ErrClosed):
		return http.StatusServiceUnavailable
	default:
		return http.StatusInternalServerError
	}
}
