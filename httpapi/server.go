package httpapi

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/ratemesh/ratemesh/apiauth"
	"github.com/ratemesh/ratemesh/internal/deadline"
	"github.com/ratemesh/ratemesh/limiter"
	"github.com/ratemesh/ratemesh/mesh"
	"github.com/ratemesh/ratemesh/node"
)

// MaxBodyBytes caps a request body; a larger one is refused with 400.
const MaxBodyBytes = 64 << 10

// MaxKeyBytes is the longest key accepted.
const MaxKeyBytes = 256

// Transport is what the API reads from the mesh: its counters for the
// metrics and the peers' addresses for /v1/peers. *mesh.Mesh implements
// it.
type Transport interface {
	Stats() mesh.Stats
	Addrs() []string
	PeerAddrs(peerID string) []string
}

var _ Transport = (*mesh.Mesh)(nil)

// Config configures a Server. Node is required; the rest is optional.
type Config struct {
	// Node is the member the API serves.
	Node *node.Node
	// Transport supplies addresses and mesh metrics; nil leaves addrs
	// empty and the mesh metrics out.
	Transport Transport
	// MaxWait caps how long /v1/wait may wait (its max_wait_ms, or the
	// whole wait when absent). Default 30s.
	MaxWait time.Duration
	// Logger receives server-side errors; nil discards them.
	Logger *slog.Logger
	// Tokens authorises requests by their bearer token
	// (Authorization: Bearer TOKEN) and its scope: decisions need
	// decide, the member table, the per-member counts and evict need
	// admin (see Scopes). Nil asks for no token: every endpoint is open
	// (a loopback API, or one behind mutual TLS alone).
	Tokens *apiauth.Tokens
	// MetricsAuth makes /metrics ask for a token (any scope) too; by
	// default it is open, like /healthz.
	MetricsAuth bool
}

// Server is the HTTP API over one node: an http.Handler with its own
// Prometheus registry. It is safe for concurrent use.
type Server struct {
	cfg     Config
	log     *slog.Logger
	reg     *prometheus.Registry
	metrics *metrics
	mux     *http.ServeMux
}

// New returns the API server for cfg.Node.
func New(cfg Config) (*Server, error) {
	if cfg.Node == nil {
		return nil, errors.New("httpapi: Config.Node must be set")
	}
	if cfg.MaxWait == 0 {
		cfg.MaxWait = 30 * time.Second // longer than any sane client timeout; a stuck waiter frees itself
	}
	if cfg.MaxWait < 0 {
		return nil, fmt.Errorf("httpapi: max_wait: must be positive, got %v", cfg.MaxWait)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	s := &Server{cfg: cfg, log: cfg.Logger, reg: prometheus.NewRegistry()}
	s.metrics = newMetrics(s.reg, cfg)
	s.mux = s.routes(promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{ErrorLog: slogAdapter{s.log}}))
	return s, nil
}

// Registry returns the server's Prometheus registry, so a command can
// register more collectors.
func (s *Server) Registry() *prometheus.Registry { return s.reg }

// ObserveReload counts one configuration reload by result: "ok" (every
// rule applied), "partial" (some rules kept their old version) or
// "failed" (nothing applied).
func (s *Server) ObserveReload(result string) { s.metrics.reloads.WithLabelValues(result).Inc() }

type slogAdapter struct{ l *slog.Logger }

func (a slogAdapter) Println(v ...any) { a.l.Error("metrics", "err", fmt.Sprint(v...)) }

// routes returns the API's routes: each endpoint under its method (a GET
// route answers HEAD too), every other method on its path 405 with Allow,
// any other path 404, all as JSON.
func (s *Server) routes(metricsH http.Handler) *http.ServeMux {
	mux := http.NewServeMux()
	handlers := map[string]http.HandlerFunc{
		"/v1/allow": s.allow, "/v1/wait": s.wait, "/v1/acquire": s.acquire,
		"/v1/renew": s.renew, "/v1/release": s.release, "/v1/usage": s.usage,
		"/v1/peers": s.peers, "/v1/peers/{peer_id}/evict": s.evict,
		"/metrics": metricsH.ServeHTTP, "/healthz": s.health,
		"/livez": s.live, "/readyz": s.health,
	}
	for _, rt := range Scopes(s.cfg.MetricsAuth) {
		mux.HandleFunc(rt.Method+" "+rt.Path, s.authorize(rt, handlers[rt.Path]))
		mux.HandleFunc(rt.Path, methodNotAllowed(rt.Method))
	}
	mux.HandleFunc("/", notFound)
	return mux
}

// Route is one endpoint and the scope a token needs to call it.
type Route struct {
	Method, Path string
	// Scope is apiauth.None for an open endpoint.
	Scope apiauth.Scope
}

// Scopes returns every endpoint with the scope it needs when tokens are
// configured (Config.Tokens): decisions and leases need decide; the
// member table (/v1/peers), the per-member counts (/v1/usage: each
// member's slot) and evict need admin; /healthz, /livez and /readyz are
// open (load balancers and orchestrators probe them without credentials,
// and they tell only ready, joining or fenced), and so is /metrics unless
// metricsAuth, when any valid token reads it.
func Scopes(metricsAuth bool) []Route {
	metrics := apiauth.None
	if metricsAuth {
		metrics = apiauth.Decide
	}
	return []Route{
		{http.MethodPost, "/v1/allow", apiauth.Decide},
		{http.MethodPost, "/v1/wait", apiauth.Decide},
		{http.MethodPost, "/v1/acquire", apiauth.Decide},
		{http.MethodPost, "/v1/renew", apiauth.Decide},
		{http.MethodPost, "/v1/release", apiauth.Decide},
		{http.MethodGet, "/v1/usage", apiauth.Admin},
		{http.MethodGet, "/v1/peers", apiauth.Admin},
		{http.MethodPost, "/v1/peers/{peer_id}/evict", apiauth.Admin},
		{http.MethodGet, "/metrics", metrics},
		{http.MethodGet, "/healthz", apiauth.None},
		{http.MethodGet, "/livez", apiauth.None},
		{http.MethodGet, "/readyz", apiauth.None},
	}
}

// authorize wraps h: with tokens configured, a request without a valid
// token answers 401 with WWW-Authenticate: Bearer (RFC 6750), one whose
// token lacks rt's scope 403, both with the API's JSON error. Without
// tokens (Config.Tokens nil, which Tokens.Authorize lets everything
// through) h is served as it is.
func (s *Server) authorize(rt Route, h http.HandlerFunc) http.HandlerFunc {
	if rt.Scope == apiauth.None || s.cfg.Tokens == nil {
		return h
	}
	return func(w http.ResponseWriter, r *http.Request) {
		err := s.cfg.Tokens.Authorize(apiauth.BearerToken(r.Header.Get("Authorization")), rt.Scope)
		if err == nil {
			h(w, r)
			return
		}
		var ae *apiauth.AuthError
		if !errors.As(err, &ae) {
			writeError(w, http.StatusInternalServerError, "authorization: "+err.Error())
			return
		}
		challenge := `Bearer realm="ratemesh"`
		status, reason := http.StatusUnauthorized, "missing"
		switch {
		case ae.Missing:
		case errors.Is(err, apiauth.ErrForbidden):
			challenge += fmt.Sprintf(`, error="insufficient_scope", scope="%s"`, rt.Scope)
			status, reason = http.StatusForbidden, "scope"
		default:
			challenge += `, error="invalid_token"`
			reason = "invalid"
		}
		s.metrics.refused.WithLabelValues(reason).Inc()
		w.Header().Set("WWW-Authenticate", challenge)
		msg := ae.Error()
		if status == http.StatusForbidden {
			msg = fmt.Sprintf("authorization: %s %s needs the %s scope; the token has %s", rt.Method, rt.Path, ae.Need, ae.Have)
		}
		writeError(w, status, msg)
	}
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !clean(r.URL.Path) {
		// ServeMux would redirect to the cleaned path; no endpoint lives
		// at a path that needs cleaning.
		notFound(w, r)
		return
	}
	s.mux.ServeHTTP(w, r)
}

// clean reports whether p is an absolute path with no empty, . or ..
// element (a trailing slash aside): one that ServeMux does not redirect.
func clean(p string) bool {
	if p == "" || p[0] != '/' {
		return false
	}
	if p == "/" {
		return true
	}
	for rest := strings.TrimSuffix(p[1:], "/"); ; {
		e, after, more := strings.Cut(rest, "/")
		if e == "" || e == "." || e == ".." {
			return false
		}
		if !more {
			return true
		}
		rest = after
	}
}

func notFound(w http.ResponseWriter, r *http.Request) {
	writeError(w, http.StatusNotFound, "no such endpoint: "+r.URL.Path)
}

// methodNotAllowed answers 405 naming want, the endpoint's method (GET
// admits HEAD too).
func methodNotAllowed(want string) http.HandlerFunc {
	allow := want
	if want == http.MethodGet {
		allow = "GET, HEAD"
	}
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Allow", allow)
		writeError(w, http.StatusMethodNotAllowed, fmt.Sprintf("method %s not allowed; use %s", r.Method, want))
	}
}

func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, ErrorResponse{Error: msg})
}

// badRequest is a client's mistake found here: 400 with a message naming
// the field.
type badRequest struct{ msg string }

func (e *badRequest) Error() string { return e.msg }

func bad(format string, args ...any) error {
	return &badRequest{msg: fmt.Sprintf(format, args...)}
}

// fail writes err: a badRequest as itself; a node or limiter error by its
// type, naming the request's field (and the check of an all-or-nothing
// request), with the status its sentinel calls for; anything else as 500
// (a fault of ours, logged).
func (s *Server) fail(w http.ResponseWriter, err error) {
	var br *badRequest
	var notOwner *node.NotOwnerError
	switch {
	case errors.As(err, &br):
		writeError(w, http.StatusBadRequest, br.msg)
		return
	case errors.As(err, &notOwner):
		writeJSON(w, http.StatusNotFound, ErrorResponse{Error: fmt.Sprintf("lease_id: owned by peer %s; renew or release it there", notOwner.Owner), Owner: notOwner.Owner})
		return
	}
	field, msg, ok := requestError(err)
	var ce *node.CheckError
	if ok && errors.As(err, &ce) {
		check := fmt.Sprintf("checks[%d]", ce.Index)
		if field == "" {
			field = check
		} else {
			field = check + "." + field
		}
	}
	if field != "" {
		msg = field + ": " + msg
	}
	oe := &node.OwnerError{}
	errors.As(err, &oe)
	switch {
	case !ok && errors.Is(err, node.ErrClosed):
		writeError(w, http.StatusServiceUnavailable, "the node is shutting down")
	case !ok && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)):
		writeError(w, http.StatusServiceUnavailable, "request cancelled: "+err.Error())
	case !ok:
		s.log.Error("api", "err", err)
		writeError(w, http.StatusInternalServerError, "internal error")
	case errors.Is(err, node.ErrOwnerUnreachable):
		writeJSON(w, http.StatusServiceUnavailable, ErrorResponse{Error: msg + "; retry", Owner: oe.Owner})
	case errors.Is(err, node.ErrUnknownLease):
		writeJSON(w, http.StatusNotFound, ErrorResponse{Error: msg, Owner: oe.Owner})
	case errors.Is(err, node.ErrUnknownRule), errors.Is(err, node.ErrUnknownPeer):
		writeError(w, http.StatusNotFound, msg)
	default:
		writeError(w, http.StatusBadRequest, msg)
	}
}

// requestError returns the request's field a node or limiter error names
// and what it says, with the owner of a lease another member owns; ok is
// false for an error about no field of the request.
func requestError(err error) (field, msg string, ok bool) {
	var ne *node.RequestError
	var le *limiter.RequestError
	switch {
	case errors.As(err, &ne):
		field, msg = ne.Field, ne.Msg
	case errors.As(err, &le):
		field, msg = le.Field, le.Msg
	case errors.Is(err, node.ErrUnknownLease): // the sentinel itself
		field, msg = "lease_id", "unknown or expired lease"
	default:
		return "", "", false
	}
	var oe *node.OwnerError
	if errors.As(err, &oe) {
		msg += fmt.Sprintf(" (owner %s)", oe.Owner)
	}
	return field, msg, true
}

// check is one decoded /v1/allow check.
type check struct {
	rule, key string
	opts      [3]node.Option // cost, type and class at most
	nOpts     int
}

func (c *check) add(o node.Option) {
	c.opts[c.nOpts] = o
	c.nOpts++
}

// options returns the check's options.
func (c *check) options() []node.Option { return c.opts[:c.nOpts] }

// readCheck reads one check's fields from f (rule, key, cost, type, units,
// class) and leaves other fields for the caller.
func readCheck(f *fieldReader) check {
	var c check
	c.rule = f.str(fRule, true)
	c.key = f.str(fKey, true)
	if len(c.key) > MaxKeyBytes {
		f.fail(fKey, "%d bytes, at most %d", len(c.key), MaxKeyBytes)
	}
	cost, hasCost := f.uint(fCost, limiter.MaxCost)
	typ := f.str(fType, false)
	units, hasUnits := f.uint(fUnits, limiter.MaxCost)
	class := f.str(fClass, false)
	if f.err != nil {
		return c
	}
	switch {
	case hasCost && typ != "":
		f.fail(fType, "give either cost or type with units, not both")
	case hasUnits && typ == "":
		f.fail(fUnits, "needs type")
	case f.given(fType) && typ == "":
		f.fail(fType, "must not be empty")
	}
	if hasCost {
		c.add(node.Cost(cost))
	}
	if typ != "" {
		if !hasUnits {
			units = 1
		}
		c.add(node.Type(typ, units))
	}
	if class != "" {
		c.add(node.Class(class))
	}
	return c
}

// MaxWaitHeader is the request header that gives the caller's deadline
// in milliseconds, a whole number from 1, on /v1/allow, /v1/acquire and
// /v1/wait: the node answers within it. A hold for the share leaves half
// the time left (at least 5 ms) for the answer, and once the time is up
// the request is decided at once and answered, never failed for it. On
// /v1/allow and /v1/acquire the body's max_wait_ms says the same; on
// /v1/wait the header bounds the whole wait, less a margin for the answer
// (waitMargin), beside max_wait_ms. Envoy's router's
// X-Envoy-Expected-Rq-Timeout-Ms is read the same way; the least of them
// all is the deadline.
const MaxWaitHeader = "X-Ratemesh-Max-Wait-Ms"

// envoyTimeoutHeader is the time Envoy's router waits for the answer of
// an upstream request, which it tells the upstream in this header.
const envoyTimeoutHeader = "X-Envoy-Expected-Rq-Timeout-Ms"

// maxHeaderWait bounds MaxWaitHeader: longer than any answer takes.
const maxHeaderWait = time.Hour

// callerDeadline returns the caller's deadline, from arrived: the least of
// body (milliseconds, when hasBody), MaxWaitHeader and Envoy's router's
// timeout header. A malformed MaxWaitHeader is a bad request naming it; a
// malformed Envoy header is ignored (Envoy wrote it, not the caller).
func callerDeadline(r *http.Request, arrived time.Time, body uint64, hasBody bool) (dl time.Time, ok bool, err error) {
	wait, ok := time.Duration(body)*time.Millisecond, hasBody
	// Both names are canonical (TestHeaderNamesCanonical), as net/http
	// stores a request's: read the map without canonicalising them again.
	if vs := r.Header[MaxWaitHeader]; len(vs) > 0 {
		ms, perr := strconv.ParseUint(strings.TrimSpace(vs[0]), 10, 64)
		switch {
		case len(vs) > 1:
			return dl, false, bad("%s: given %d times", MaxWaitHeader, len(vs))
		case perr != nil || ms == 0:
			return dl, false, bad("%s: must be a whole number of milliseconds from 1, got %q", MaxWaitHeader, vs[0])
		}
		w := time.Duration(min(ms, uint64(maxHeaderWait/time.Millisecond))) * time.Millisecond
		if !ok || w < wait {
			wait, ok = w, true
		}
	}
	// Most requests come without it, and parsing "" would allocate its error.
	if vs := r.Header[envoyTimeoutHeader]; len(vs) > 0 && vs[0] != "" {
		v := vs[0]
		if ms, perr := strconv.ParseUint(strings.TrimSpace(v), 10, 64); perr == nil && ms > 0 {
			w := time.Duration(min(ms, uint64(maxHeaderWait/time.Millisecond))) * time.Millisecond
			if !ok || w < wait {
				wait, ok = w, true
			}
		}
	}
	if !ok {
		return dl, false, nil
	}
	return arrived.Add(wait), true, nil
}

// maxWaitField reads the body's max_wait_ms of /v1/allow and /v1/acquire:
// the caller's deadline, from 1 to MaxWait.
func (s *Server) maxWaitField(f *fieldReader) (uint64, bool) {
	ms, ok := f.uint(fMaxWait, uint64(s.cfg.MaxWait/time.Millisecond))
	if ok && ms == 0 && f.err == nil {
		f.fail(fMaxWait, "must be at least 1: the milliseconds the caller waits for the answer (1 decides at once, without holding)")
	}
	return ms, ok
}

// decideContext is the context a decision of r runs under: r's, or with a
// deadline, one that carries it and is never cancelled (deadline.Bound),
// so that the time running out never fails the request.
func decideContext(r *http.Request, dl time.Time, ok bool) context.Context {
	if !ok {
		return r.Context()
	}
	return deadline.Bound(r.Context(), dl)
}

// answered counts an answer by the caller's deadline (deadline.Metrics);
// the moment it went out matters only when there is one.
func (s *Server) answered(dl time.Time, hasDL bool, arrived time.Time) {
	var now time.Time
	if hasDL {
		now = time.Now()
	}
	s.metrics.deadlines.Observe(dl, hasDL, arrived, now)
}

func msCeil(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}

func toResponse(d node.Decision) AllowResponse {
	ra := msCeil(d.RetryAfter)
	if d.RetryAfter == node.Never {
		ra = -1
	}
	return AllowResponse{Allowed: d.Allowed, Limit: d.Limit, Remaining: d.Remaining, ResetAfterMs: msCeil(d.ResetAfter), RetryAfterMs: ra, Reason: d.Reason.String()}
}

func (s *Server) allow(w http.ResponseWriter, r *http.Request) {
	arrived := time.Now()
	b, err := readBody(w, r)
	if err != nil {
		s.fail(w, err)
		return
	}
	defer b.release()
	if b.top.fields[fChecks].given {
		s.allowAll(w, r, arrived, b)
		return
	}
	f := newFields(&b.top, -1)
	c := readCheck(f)
	maxMs, hasMax := s.maxWaitField(f)
	if err := f.done(singleFields); err != nil {
		s.fail(w, err)
		return
	}
	dl, hasDL, err := callerDeadline(r, arrived, maxMs, hasMax)
	if err != nil {
		s.fail(w, err)
		return
	}
	start := time.Now()
	d, err := s.cfg.Node.Allow(decideContext(r, dl, hasDL), c.rule, c.key, c.options()...)
	s.metrics.allowLatency.Observe(time.Since(start).Seconds())
	if err != nil {
		s.fail(w, err)
		return
	}
	s.metrics.decided(c.rule, d)
	writeAllow(w, toResponse(d))
	s.answered(dl, hasDL, arrived)
}

// MaxChecks caps the checks of one all-or-nothing request.
const MaxChecks = 64

func (s *Server) allowAll(w http.ResponseWriter, r *http.Request, arrived time.Time, b *body) {
	if name, ok := b.top.firstUnknown(multiFields); ok {
		s.fail(w, bad("%s: unknown field (a request is either one check or {\"checks\": [...]}, with max_wait_ms beside either)", name))
		return
	}
	top := newFields(&b.top, -1)
	maxMs, hasMax := s.maxWaitField(top)
	if top.err != nil {
		s.fail(w, top.err)
		return
	}
	switch raw := b.top.fields[fChecks]; {
	case raw.kind != kindArray:
		s.fail(w, bad("checks: must be an array of checks, got %s", raw.kind))
		return
	case b.nCheck == 0:
		s.fail(w, bad("checks: must not be empty"))
		return
	case b.nCheck > MaxChecks:
		s.fail(w, bad("checks: %d checks, at most %d", b.nCheck, MaxChecks))
		return
	}
	checks := make([]node.Check, len(b.checks))
	rules := make([]string, len(b.checks))
	for i := range b.checks {
		e := &b.checks[i]
		if e.kind != kindObject {
			s.fail(w, bad("checks[%d]: must be an object, got %s", i, e.kind))
			return
		}
		f := newFields(&e.obj, i)
		c := readCheck(f)
		if err := f.done(checkFields); err != nil {
			s.fail(w, err)
			return
		}
		checks[i], rules[i] = node.NewCheck(c.rule, c.key, c.options()...), c.rule
	}
	dl, hasDL, err := callerDeadline(r, arrived, maxMs, hasMax)
	if err != nil {
		s.fail(w, err)
		return
	}
	start := time.Now()
	allowed, ds, err := s.cfg.Node.AllowAll(decideContext(r, dl, hasDL), checks...)
	s.metrics.allowLatency.Observe(time.Since(start).Seconds())
	if err != nil {
		s.fail(w, err)
		return
	}
	resp := MultiAllowResponse{Allowed: allowed, Results: make([]AllowResponse, len(ds))}
	for i, d := range ds {
		s.metrics.decided(rules[i], d)
		resp.Results[i] = toResponse(d)
	}
	writeAllowAll(w, resp)
	s.answered(dl, hasDL, arrived)
}

// waitMargin is the time /v1/wait leaves for its answer before the
// caller's deadline (MaxWaitHeader) of a request whose wait could last
// budget: half of it, at least 5 ms and at most 100 ms.
func waitMargin(budget time.Duration) time.Duration {
	return min(max(budget/2, 5*time.Millisecond), 100*time.Millisecond)
}

func (s *Server) wait(w http.ResponseWriter, r *http.Request) {
	arrived := time.Now()
	b, err := readBody(w, r)
	if err != nil {
		s.fail(w, err)
		return
	}
	defer b.release()
	if b.top.fields[fChecks].given {
		s.fail(w, bad("checks: /v1/wait takes one check; use /v1/allow for several"))
		return
	}
	f := newFields(&b.top, -1)
	c := readCheck(f)
	maxMs, hasMax := f.uint(fMaxWait, uint64(s.cfg.MaxWait/time.Millisecond))
	if err := f.done(singleFields); err != nil {
		s.fail(w, err)
		return
	}
	maxWait := s.cfg.MaxWait
	if hasMax {
		maxWait = time.Duration(maxMs) * time.Millisecond
	}
	// max_wait_ms is no deadline here: only the headers are.
	dl, hasDL, err := callerDeadline(r, arrived, 0, false)
	if err != nil {
		s.fail(w, err)
		return
	}
	var ctx context.Context
	if hasDL {
		// Waits until the deadline less the answer's margin, and then
		// answers the denial: never cancelled (deadline.Bound).
		ctx = deadline.Bound(r.Context(), dl.Add(-waitMargin(dl.Sub(arrived))))
	} else {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(r.Context(), maxWait+time.Second)
		defer cancel()
	}
	d, err := s.cfg.Node.Wait(ctx, c.rule, c.key, append(c.options(), node.MaxWait(maxWait))...)
	if err != nil && !(d.Limit > 0 && (errors.Is(err, context.DeadlineExceeded))) {
		s.fail(w, err)
		return
	}
	s.metrics.decided(c.rule, d)
	writeJSON(w, http.StatusOK, toResponse(d))
	s.answered(dl, hasDL, arrived)
}

func (s *Server) acquire(w http.ResponseWriter, r *http.Request) {
	arrived := time.Now()
	b, err := readBody(w, r)
	if err != nil {
		s.fail(w, err)
		return
	}
	f := newFields(&b.top, -1)
	rule := f.str(fRule, true)
	key := f.str(fKey, true)
	if len(key) > MaxKeyBytes {
		f.fail(fKey, "%d bytes, at most %d", len(key), MaxKeyBytes)
	}
	class := f.str(fClass, false)
	maxMs, hasMax := s.maxWaitField(f)
	err = f.done(acquireFields)
	b.release()
	if err != nil {
		s.fail(w, err)
		return
	}
	dl, hasDL, err := callerDeadline(r, arrived, maxMs, hasMax)
	if err != nil {
		s.fail(w, err)
		return
	}
	var opts []node.Option
	if class != "" {
		opts = append(opts, node.Class(class))
	}
	start := time.Now()
	lease, d, err := s.cfg.Node.Acquire(decideContext(r, dl, hasDL), rule, key, opts...)
	s.metrics.acquireLatency.Observe(time.Since(start).Seconds())
	if err != nil {
		s.fail(w, err)
		return
	}
	s.metrics.decided(rule, d)
	resp := AcquireResponse{Allowed: d.Allowed, Limit: d.Limit, Remaining: d.Remaining, Reason: d.Reason.String()}
	if !d.Allowed {
		resp.RetryAfterMs = toResponse(d).RetryAfterMs
	}
	if lease != nil {
		resp.LeaseID = lease.ID
		resp.TTLMs = msCeil(time.Until(lease.Expires()))
	}
	writeJSON(w, http.StatusOK, resp)
	s.answered(dl, hasDL, arrived)
}

func (s *Server) leaseID(w http.ResponseWriter, r *http.Request) (string, bool) {
	b, err := readBody(w, r)
	if err != nil {
		s.fail(w, err)
		return "", false
	}
	defer b.release()
	f := newFields(&b.top, -1)
	id := f.str(fLeaseID, true)
	if err := f.done(leaseFields); err != nil {
		s.fail(w, err)
		return "", false
	}
	return id, true
}

func (s *Server) renew(w http.ResponseWriter, r *http.Request) {
	id, ok := s.leaseID(w, r)
	if !ok {
		return
	}
	ttl, err := s.cfg.Node.Renew(r.Context(), id)
	if err != nil {
		s.fail(w, err)
		return
	}
	writeJSON(w, http.StatusOK, RenewResponse{TTLMs: msCeil(ttl)})
}

func (s *Server) release(w http.ResponseWriter, r *http.Request) {
	id, ok := s.leaseID(w, r)
	if !ok {
		return
	}
	if err := s.cfg.Node.Release(r.Context(), id); err != nil {
		s.fail(w, err)
		return
	}
	writeJSON(w, http.StatusOK, struct{}{})
}

func (s *Server) usage(w http.ResponseWriter, r *http.Request) {
	q, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		s.fail(w, bad("query: malformed: %v", err))
		return
	}
	for k, vs := range q {
		if k != "rule" && k != "key" && k != "window" {
			s.fail(w, bad("%s: unknown query parameter", k))
			return
		}
		if len(vs) > 1 {
			s.fail(w, bad("%s: given %d times", k, len(vs)))
			return
		}
	}
	rule, key := q.Get("rule"), q.Get("key")
	switch {
	case rule == "":
		s.fail(w, bad("rule: missing"))
		return
	case key == "":
		s.fail(w, bad("key: missing"))
		return
	case len(key) > MaxKeyBytes:
		s.fail(w, bad("key: %d bytes, at most %d", len(key), MaxKeyBytes))
		return
	}
	rep, err := s.cfg.Node.Usage(rule, key)
	if err != nil {
		s.fail(w, err)
		return
	}
	if q.Has("window") {
		// A window the node still holds: the current one or the one
		// before, whose counts are final once it has ended.
		win, err := strconv.ParseInt(q.Get("window"), 10, 64)
		switch {
		case err != nil:
			s.fail(w, bad("window: %q is not a window index", q.Get("window")))
			return
		case rep.WindowMs == 0:
			s.fail(w, bad("window: rule %q has no windows", rule))
			return
		case win != rep.Window && win != rep.Window-1:
			s.fail(w, bad("window: %d is neither the current window %d nor the one before", win, rep.Window))
			return
		}
		if rep, err = s.cfg.Node.UsageOfWindow(rule, key, win); err != nil {
			s.fail(w, err)
			return
		}
	}
	resp := UsageResponse{Rule: rep.Rule, Key: rep.Key, Window: rep.Window, WindowMs: rep.WindowMs, Total: rep.Total, Slots: make([]SlotJSON, 0, len(rep.Slots))}
	for _, sl := range rep.Slots {
		resp.Slots = append(resp.Slots, SlotJSON{PeerID: sl.Peer, Incarnation: sl.Incarnation, Admitted: sl.Admitted, Attempted: sl.Attempted})
	}
	writeJSON(w, http.StatusOK, resp)
}

// peersJSON converts the node's member table for /v1/peers, with
// addresses from t (nil: none).
func peersJSON(ps []node.PeerInfo, t Transport) PeersResponse {
	resp := PeersResponse{Peers: make([]PeerJSON, 0, len(ps))}
	for _, p := range ps {
		pj := PeerJSON{
			PeerID: p.Peer, Incarnation: p.Incarnation, State: p.State.String(),
			LastSeenMs: p.LastSeen.Milliseconds(), RulesHash: fmt.Sprintf("%016x", p.RulesHash),
			RulesMatch: p.RulesMatch, Self: p.Self, Addrs: []string{},
		}
		if t != nil {
			if p.Self {
				pj.Addrs = append(pj.Addrs, t.Addrs()...)
			} else {
				pj.Addrs = append(pj.Addrs, t.PeerAddrs(p.Peer)...)
			}
		}
		resp.Peers = append(resp.Peers, pj)
	}
	return resp
}

func (s *Server) peers(w http.ResponseWriter, r *http.Request) {
	if len(r.URL.RawQuery) > 0 {
		s.fail(w, bad("query: /v1/peers takes no parameters"))
		return
	}
	ps := s.cfg.Node.Peers()
	if ps == nil {
		s.fail(w, node.ErrClosed)
		return
	}
	var t Transport
	if s.cfg.Transport != nil {
		t = s.cfg.Transport
	}
	writeJSON(w, http.StatusOK, peersJSON(ps, t))
}

func (s *Server) evict(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("peer_id")
	if err := s.cfg.Node.Evict(id); err != nil {
		s.fail(w, err)
		return
	}
	s.log.Warn("member evicted by request", "member", id, "remote", r.RemoteAddr)
	writeJSON(w, http.StatusOK, struct{}{})
}

// health answers /healthz and /readyz: 200 ready, 503 joining, fenced or
// stale (the member denies every decision), so a load balancer or a
// Kubernetes readiness probe sends it no traffic.
func (s *Server) health(w http.ResponseWriter, _ *http.Request) {
	h := s.cfg.Node.Health()
	status := http.StatusServiceUnavailable
	if h == node.HealthReady {
		status = http.StatusOK
	}
	writeJSON(w, status, HealthResponse{State: h.String()})
}

// live answers /livez: 200 whenever the process serves its API, with the
// member's state, joining and fenced included. A fenced or joining member
// is healthy and waiting for its peers; restarting it (a liveness probe
// on /healthz would) only makes it join again, in the middle of a
// partition.
func (s *Server) live(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, HealthResponse{State: s.cfg.Node.Health().String()})
}
