package envoy

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"runtime"
	"strings"
	"sync/atomic"
	"time"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratemesh/ratemesh/apiauth"
	"github.com/ratemesh/ratemesh/internal/deadline"
	"github.com/ratemesh/ratemesh/limiter"
	"github.com/ratemesh/ratemesh/node"
)

// ServiceName is the gRPC service the Server implements, as health checks
// name it.
const ServiceName = "envoy.service.ratelimit.v3.RateLimitService"

// Decider decides requests: *node.Node. Calls may be concurrent.
type Decider interface {
	Allow(ctx context.Context, rule, key string, opts ...node.Option) (node.Decision, error)
	Usage(rule, key string) (node.UsageReport, error)
}

// Config configures a Server.
type Config struct {
	// Node decides every counted descriptor.
	Node Decider
	// Descriptors are the loaded configuration files; nil: every
	// descriptor is OK. Their Rules must be among Node's rules.
	Descriptors *Descriptors
	// Registerer takes the Server's metrics; nil keeps them unregistered.
	Registerer prometheus.Registerer
	// Logger receives errors; nil discards them.
	Logger *slog.Logger
	// Tokens authorises calls by the bearer token in their
	// "authorization" metadata ("Bearer TOKEN"): ShouldRateLimit needs
	// the decide scope (admin implies it); the health service is open.
	// Nil asks for no token.
	Tokens *apiauth.Tokens
	// TLS serves gRPC over TLS with this config (apiauth.Certs'
	// ServerConfig("h2"): with a client CA, clients need a certificate);
	// nil serves plaintext HTTP/2.
	TLS *tls.Config
}

// Server is envoyproxy/ratelimit's gRPC service over a ratemesh node
// (envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit), with the
// standard gRPC health service beside it. It is safe for concurrent use.
//
// Each descriptor of a request that matches an entry with a limit is one
// check of the entry's rule, keyed by the descriptor's values; every such
// descriptor is counted whatever the others decide (as in
// envoyproxy/ratelimit by default), and the overall code is OVER_LIMIT if
// any descriptor is.
type Server struct {
	rlspb.UnimplementedRateLimitServiceServer
	node    Decider
	desc    atomic.Pointer[Descriptors]
	log     *slog.Logger
	health  *health.Server
	grpc    *grpc.Server
	metrics *metrics
}

// New returns a Server; it serves once Serve is called. Health checks
// answer NOT_SERVING until SetServing(true).
func New(cfg Config) (*Server, error) {
	if cfg.Node == nil {
		return nil, errors.New("envoy: Config.Node must be set")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	s := &Server{node: cfg.Node, log: cfg.Logger, health: health.NewServer(), metrics: newMetrics()}
	s.desc.Store(cfg.Descriptors)
	if cfg.Registerer != nil {
		if err := s.metrics.register(cfg.Registerer); err != nil {
			return nil, fmt.Errorf("envoy: metrics: %w", err)
		}
	}
	s.SetServing(false)
	if cfg.Tokens != nil {
		for _, r := range []string{"missing", "invalid", "scope"} {
			s.metrics.refused.WithLabelValues(r)
		}
	}
	opts := []grpc.ServerOption{
		// Calls run on long-lived workers (one a CPU; a call that finds
		// them all busy gets a goroutine of its own, as without them):
		// a goroutine made per call grew its stack on every call, and
		// copying stacks was 12 % of the CPU under a flood of
		// ShouldRateLimit.
		grpc.NumStreamWorkers(uint32(runtime.GOMAXPROCS(0))),
		// ShouldRateLimit's messages are coded by hand (codec.go);
		// every other message by grpc's protobuf codec.
		grpc.ForceServerCodecV2(newCodec()),
		// Fixed flow-control windows, which turn off grpc-go's BDP
		// estimator (see streamWindow).
		grpc.StaticStreamWindowSize(streamWindow),
		grpc.StaticConnWindowSize(connWindow),
	}
	if cfg.Tokens != nil {
		// Without tokens there is no interceptor at all: grpc-go then
		// calls the handler directly, without the closures and the
		// UnaryServerInfo it makes for every call through a chain.
		a := &auth{toks: cfg.Tokens, refused: s.metrics.refused}
		opts = append(opts, grpc.UnaryInterceptor(a.unary), grpc.StreamInterceptor(a.stream))
	}
	if cfg.TLS != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(cfg.TLS)))
	}
	s.grpc = grpc.NewServer(opts...)
	rlspb.RegisterRateLimitServiceServer(s.grpc, s)
	healthpb.RegisterHealthServer(s.grpc, s.health)
	return s, nil
}

// The Server's HTTP/2 flow-control windows: fixed, which turns off
// grpc-go's BDP estimator. The estimator pings the client whenever a
// DATA frame arrives and no ping of its is outstanding, with a
// connection WINDOW_UPDATE before the PING; a client with one call at a
// time on a connection, which acknowledges at once, got both with every
// answer and sent a PING ack with every request: three frames a call
// for the two sides to code, the answer's write 92 bytes instead of 62
// (TestFramesPerCall). Envoy, with many calls in flight on a connection,
// got one of each a round trip. The windows the estimator would grow
// (to 16 MiB) are of no use to ShouldRateLimit: a request is a few
// hundred bytes in a stream of its own.
//
// A stream's window is HTTP/2's default, 64 KiB − 1 (no setting sent),
// many times the largest request. The connection's is the bytes a
// client may have sent that the server has not read yet, over all its
// streams: grpc-go returns them in a WINDOW_UPDATE once a quarter has
// been read, whether or not a handler has taken its message yet. 1 MiB
// is about 5,000 requests of 200 bytes in flight, or 1 MiB a round
// trip (5 million such requests a second at 1 ms) before Envoy's
// concurrent streams on one connection could wait for a window.
const (
	streamWindow = 65535
	connWindow   = 1 << 20
)

// healthPrefix starts the methods of the health service, which stay
// open: Envoy's health checks and orchestrators' probes carry no token,
// and they learn only SERVING or NOT_SERVING.
const healthPrefix = "/grpc.health.v1.Health/"

// scopeOf is the scope a method needs.
func scopeOf(method string) apiauth.Scope {
	if strings.HasPrefix(method, healthPrefix) {
		return apiauth.None
	}
	return apiauth.Decide
}

// auth authorises calls by token and counts the refusals.
type auth struct {
	toks    *apiauth.Tokens
	refused *prometheus.CounterVec
}

// authorize checks the call's "authorization" metadata against the
// tokens: codes.Unauthenticated without a valid token,
// codes.PermissionDenied when its scope is too low.
func (a *auth) authorize(ctx context.Context, method string) error {
	toks := a.toks
	if toks == nil {
		return nil
	}
	need := scopeOf(method)
	if need == apiauth.None {
		return nil
	}
	var tok string
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		for _, v := range md.Get("authorization") {
			if tok = apiauth.BearerToken(v); tok != "" {
				break
			}
		}
	}
	err := toks.Authorize(tok, need)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, apiauth.ErrForbidden):
		a.refused.WithLabelValues("scope").Inc()
		return status.Error(codes.PermissionDenied, err.Error())
	case tok == "":
		a.refused.WithLabelValues("missing").Inc()
		return status.Error(codes.Unauthenticated, "authorization: a bearer token is required in the authorization metadata (\"Bearer TOKEN\"; Envoy: grpc_service.initial_metadata)")
	}
	a.refused.WithLabelValues("invalid").Inc()
	return status.Error(codes.Unauthenticated, err.Error())
}

func (a *auth) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	if err := a.authorize(ctx, info.FullMethod); err != nil {
		return nil, err
	}
	return h(ctx, req)
}

func (a *auth) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	if err := a.authorize(ss.Context(), info.FullMethod); err != nil {
		return err
	}
	return h(srv, ss)
}

// Serve serves gRPC on ln until Stop; it returns nil after Stop.
func (s *Server) Serve(ln net.Listener) error {
	if err := s.grpc.Serve(ln); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return err
	}
	return nil
}

// Stop says NOT_SERVING, lets the calls under way finish until ctx ends,
// then closes every connection.
func (s *Server) Stop(ctx context.Context) {
	s.health.Shutdown()
	done := make(chan struct{})
	go func() { s.grpc.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		s.grpc.Stop()
		<-done
	}
}

// SetServing sets the health status of the server and of ServiceName:
// SERVING once the node is ready, NOT_SERVING while it joins.
func (s *Server) SetServing(ok bool) {
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if ok {
		st = healthpb.HealthCheckResponse_SERVING
	}
	s.health.SetServingStatus("", st)
	s.health.SetServingStatus(ServiceName, st)
}

// SetDescriptors replaces the descriptors the next requests use (a
// reload); the node must already hold their rules.
func (s *Server) SetDescriptors(d *Descriptors) { s.desc.Store(d) }

// Descriptors returns the descriptors in use.
func (s *Server) Descriptors() *Descriptors { return s.desc.Load() }

// MinHoldTimeout is the least time a ShouldRateLimit call's deadline must
// leave for a share denial to be held (limiter.Rule.ShareWait) while
// acknowledgements return; a call with less is decided at once. Envoy's
// rate limit filter waits 20 ms by default: a hold could take 10 ms of it
// (a hold leaves half the time left for the answer), which is too short
// for most acknowledgements (one to two sync intervals) and, on a host
// whose cores are busy, makes 1–3 % of the answers late (measured:
// TestServeEnvoyDeadline), each of which Envoy then admits. At 50 ms a
// hold may take 25 ms and leaves 25 ms.
const MinHoldTimeout = 50 * time.Millisecond

// ShouldRateLimit implements rlspb.RateLimitServiceServer.
//
// The call's deadline (its grpc-timeout; Envoy's rate limit filter sends
// its timeout, 20 ms by default) bounds every hold for a share: a call
// with less than MinHoldTimeout left is not held, and a longer one at
// most half the time left (see node.Node.Allow), so that the answer
// leaves in time. Once the deadline has passed, or the caller has
// cancelled, what is left is still decided at once, without holding, and
// answered: never DEADLINE_EXCEEDED from here. A call that the server
// only began to handle after its deadline is decided and counted too
// (envoy.md: the caller has given up, and with failure_mode_deny false
// its request went through).
//
// Each answer is timed against the call's deadline
// (ratemesh_deadline_answers_total{api="grpc"}): from when the handler
// begins, the request decoded (and authorised, with tokens), to when it
// returns the answer to be encoded and sent.
func (s *Server) ShouldRateLimit(ctx context.Context, req *rlspb.RateLimitRequest) (*rlspb.RateLimitResponse, error) {
	arrived := time.Now()
	resp, err := s.shouldRateLimit(ctx, req)
	if err == nil {
		dl, ok := ctx.Deadline()
		s.metrics.deadlines.Observe(dl, ok, arrived, time.Now())
	}
	return resp, err
}

func (s *Server) shouldRateLimit(ctx context.Context, req *rlspb.RateLimitRequest) (*rlspb.RateLimitResponse, error) {
	if req.GetDomain() == "" {
		return nil, status.Error(codes.InvalidArgument, "rate limit domain must not be empty")
	}
	descs := req.GetDescriptors()
	if len(descs) == 0 {
		return nil, status.Error(codes.InvalidArgument, "rate limit descriptor list must not be empty")
	}
	d := s.desc.Load()
	matches := make([]Match, len(descs))
	found := make([]bool, len(descs))
	var replacing map[string]bool
	for i, desc := range descs {
		if desc.GetLimit() != nil {
			return nil, status.Errorf(codes.Unimplemented, "descriptors[%d].limit: a limit override in the request is not supported by ratemesh; configure the limit in the descriptor files", i)
		}
		if desc.GetIsNegativeHits() {
			return nil, status.Errorf(codes.Unimplemented, "descriptors[%d].is_negative_hits: ratemesh counters only grow; negative hits are not supported", i)
		}
		matches[i], found[i] = d.Lookup(req.GetDomain(), desc.GetEntries())
		if found[i] {
			for _, r := range matches[i].Entry.Limit.Replaces {
				if replacing == nil {
					replacing = make(map[string]bool)
				}
				replacing[r] = true
			}
		}
	}
	resp := &rlspb.RateLimitResponse{OverallCode: rlspb.RateLimitResponse_OK, Statuses: make([]*rlspb.RateLimitResponse_DescriptorStatus, len(descs))}
	if dl, ok := ctx.Deadline(); ok {
		if time.Until(dl) < MinHoldTimeout {
			dl = time.Now() // the node does not hold past it: decide at once
		}
		ctx = deadline.Bound(ctx, dl)
	}
	for i, desc := range descs {
		m := matches[i]
		var st *rlspb.RateLimitResponse_DescriptorStatus
		switch {
		case !found[i]:
			st = &rlspb.RateLimitResponse_DescriptorStatus{Code: rlspb.RateLimitResponse_OK}
		case m.Entry.Limit.Unlimited:
			st = &rlspb.RateLimitResponse_DescriptorStatus{Code: rlspb.RateLimitResponse_OK, LimitRemaining: math.MaxUint32}
		case m.Entry.Limit.Name != "" && replacing[m.Entry.Limit.Name]:
			st = &rlspb.RateLimitResponse_DescriptorStatus{Code: rlspb.RateLimitResponse_OK}
		default:
			var err error
			if st, err = s.decide(ctx, m, hitsAddend(req, desc.GetHitsAddend())); err != nil {
				return nil, err
			}
		}
		resp.Statuses[i] = st
		if st.Code == rlspb.RateLimitResponse_OVER_LIMIT {
			resp.OverallCode = rlspb.RateLimitResponse_OVER_LIMIT
		}
	}
	s.metrics.requests.WithLabelValues(codeName(resp.OverallCode)).Inc()
	return resp, nil
}

// hitsAddend is the cost of one descriptor: its own hits_addend when set
// (0 checks without counting), else the request's, 0 meaning 1.
func hitsAddend(req *rlspb.RateLimitRequest, own *wrapperspb.UInt64Value) uint64 {
	if own != nil {
		return own.GetValue()
	}
	return uint64(max(req.GetHitsAddend(), 1))
}

// decide counts one descriptor of cost hits under m's entry.
func (s *Server) decide(ctx context.Context, m Match, hits uint64) (*rlspb.RateLimitResponse_DescriptorStatus, error) {
	e, l := m.Entry, m.Entry.Limit
	cur := &rlspb.RateLimitResponse_RateLimit{Name: l.Name, RequestsPerUnit: l.RequestsPerUnit, Unit: l.Unit}
	if l.UnitMultiplier > 0 {
		cur.UnitMultiplier = wrapperspb.UInt32(l.UnitMultiplier)
	}
	st := &rlspb.RateLimitResponse_DescriptorStatus{Code: rlspb.RateLimitResponse_OK, CurrentLimit: cur}
	over := func() {
		if e.ShadowMode {
			s.metrics.hits.WithLabelValues(m.StatKey, "shadow_mode").Add(float64(hits))
			return
		}
		st.Code = rlspb.RateLimitResponse_OVER_LIMIT
		s.metrics.hits.WithLabelValues(m.StatKey, "over_limit").Add(float64(hits))
	}
	if e.Rule == "" {
		// 0 requests per unit: every counted hit is over the limit.
		st.DurationUntilReset = untilReset(l.Window(), time.Now())
		if hits > 0 {
			over()
		}
		return st, nil
	}
	d, err := s.node.Allow(ctx, e.Rule, m.Key, node.Cost(hits))
	if err != nil {
		if ctx.Err() != nil {
			return nil, status.FromContextError(ctx.Err()).Err()
		}
		s.log.Error("decide", "rule", e.Rule, "key", m.Key, "err", err)
		if errors.Is(err, node.ErrClosed) {
			return nil, status.Error(codes.Unavailable, "the node is shutting down")
		}
		return nil, status.Errorf(codes.Internal, "rule %s: %v", e.Rule, err)
	}
	st.DurationUntilReset = durationpb.New(((d.ResetAfter + time.Second - 1) / time.Second) * time.Second)
	st.LimitRemaining = uint32(min(d.Remaining, math.MaxUint32))
	switch {
	case hits == 0:
		// A check that counts nothing: over the limit only once the
		// merged count is past it, as Redis's INCRBY 0 would say.
		if d.Remaining == 0 {
			if u, err := s.node.Usage(e.Rule, m.Key); err == nil && u.Total > uint64(l.RequestsPerUnit) {
				over()
			}
		}
	case d.Shadow:
		over()
	case d.Allowed:
		s.metrics.hits.WithLabelValues(m.StatKey, "within_limit").Add(float64(hits))
	default:
		st.LimitRemaining = 0
		over()
		if d.Reason == limiter.ReasonLimit || d.Reason == limiter.ReasonCost {
			// The limit is reached as this member sees it: count the hits
			// anyway, as Redis's INCRBY does, so that a hits_addend over
			// the limit keeps the window closed, as it does there.
			if _, err := s.node.Allow(ctx, e.Rule, m.Key, node.Cost(hits), node.Class(OverLimitClass)); err != nil {
				s.log.Warn("count a denied request", "rule", e.Rule, "err", err)
			}
		}
	}
	return st, nil
}

// untilReset is the time from now to the end of now's epoch-aligned
// window of length w, in whole seconds rounded up.
func untilReset(w time.Duration, now time.Time) *durationpb.Duration {
	ms := w.Milliseconds()
	left := time.Duration(ms-now.UnixMilli()%ms) * time.Millisecond
	return durationpb.New(((left + time.Second - 1) / time.Second) * time.Second)
}

func codeName(c rlspb.RateLimitResponse_Code) string {
	if c == rlspb.RateLimitResponse_OVER_LIMIT {
		return "over_limit"
	}
	return "ok"
}

// metrics are the Server's Prometheus metrics.
type metrics struct {
	requests  *prometheus.CounterVec
	hits      *prometheus.CounterVec
	refused   *prometheus.CounterVec
	deadlines *deadline.Metrics
}

func newMetrics() *metrics {
	return &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratemesh_envoy_requests_total",
			Help: "ShouldRateLimit calls answered, by overall code (ok, over_limit).",
		}, []string{"code"}),
		hits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratemesh_envoy_hits_total",
			Help: "Hits of counted descriptors, by envoyproxy/ratelimit's statistics key and result (within_limit, over_limit, shadow_mode: over the limit but answered OK).",
		}, []string{"key", "result"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratemesh_envoy_refused_total",
			Help: "gRPC calls refused by authorization, by reason: missing (no bearer token), invalid (a token the node does not hold), scope (too low a scope).",
		}, []string{"reason"}),
		deadlines: deadline.NewMetrics("grpc"),
	}
}

func (m *metrics) register(r prometheus.Registerer) error {
	for _, c := range []prometheus.Collector{m.requests, m.hits, m.refused, m.deadlines} {
		if err := r.Register(c); err != nil {
			return err
		}
	}
	return nil
}
