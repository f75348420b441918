package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/ratemesh/ratemesh/httpapi"
)

const benchUsage = "usage: ratemesh bench --api ADDR... [--rule NAME] [--keys N] [--concurrency N] [--duration D] [--baseline D] [--grpc ADDR... --domain D --descriptor-key K] [--json] [--token T] [--ca FILE] [--tls-cert FILE --tls-key FILE]"

// apiList is a repeatable --api flag; each value may also list several
// addresses separated by commas.
type apiList []string

func (l *apiList) String() string { return strings.Join(*l, ",") }

func (l *apiList) Set(v string) error {
	for _, a := range strings.Split(v, ",") {
		if a = strings.TrimSpace(a); a != "" {
			*l = append(*l, a)
		}
	}
	return nil
}

// benchPhase is one phase's outcome: /healthz (the server's cheapest
// answer, the reference) or /v1/allow.
type benchPhase struct {
	Path      string  `json:"path"`
	Requests  uint64  `json:"requests"`
	Errors    uint64  `json:"errors"`
	Seconds   float64 `json:"seconds"`
	PerSecond float64 `json:"per_second"`
	P50Ms     float64 `json:"p50_ms"`
	P99Ms     float64 `json:"p99_ms"`
	Allowed   uint64  `json:"allowed,omitempty"`
	Denied    uint64  `json:"denied,omitempty"`
	FirstErr  string  `json:"first_error,omitempty"`
}

// benchWindow is one window of the allow phase: the credits admitted over
// all keys, and the busiest key's against its limit.
type benchWindow struct {
	Window      int64  `json:"window"`
	Full        bool   `json:"full"`
	Admitted    uint64 `json:"admitted"`
	Keys        int    `json:"keys"`
	MaxPerKey   uint64 `json:"max_per_key"`
	Limit       uint64 `json:"limit"`
	KeysOverCap int    `json:"keys_over_limit"`
}

// benchReport is what bench prints, as JSON with --json.
type benchReport struct {
	APIs        []string    `json:"apis"`
	Rule        string      `json:"rule"`
	Keys        int         `json:"keys"`
	Concurrency int         `json:"concurrency"`
	WindowMs    int64       `json:"window_ms"`
	Rounds      int         `json:"rounds"`
	Healthz     *benchPhase `json:"healthz,omitempty"`
	Allow       benchPhase  `json:"allow"`
	Ratio       float64     `json:"ratio_allow_to_healthz,omitempty"`
	// GRPC is the ShouldRateLimit phase, with --grpc: the same keys as
	// one descriptor (--descriptor-key, the key's value) of --domain.
	GRPC        *benchPhase   `json:"grpc,omitempty"`
	GRPCRatio   float64       `json:"ratio_grpc_to_allow,omitempty"`
	Windows     []benchWindow `json:"windows"`
	FullWindows int           `json:"full_windows"`
	// Held: no key admitted more than its limit in any full window.
	Held bool `json:"held"`
}

// benchWorker is one client goroutine's state; nothing in it is shared.
type benchWorker struct {
	c     *http.Client
	token string
	base  string
	rng   *rand.Rand
	buf   bytes.Buffer
	lat   []time.Duration
	n     uint64
	errs  uint64
	err   error
	rls   rlspb.RateLimitServiceClient // with --grpc
	// allow and grpc phases
	allowed, denied         uint64
	grpcAllowed, grpcDenied uint64
	counts                  map[keyWindow]uint64
	limits                  map[int]uint64
}

type keyWindow struct {
	key    int
	window int64
}

func runBench(args []string, stdout, stderr io.Writer) int {
	fset := flag.NewFlagSet("bench", flag.ContinueOnError)
	setUsage(fset, stderr)
	var apis apiList
	fset.Var(&apis, "api", "a node's API, HOST:PORT or a URL; repeat (or separate with commas) to spread the load over nodes")
	rule := fset.String("rule", "default", "the rule to ask about")
	keys := fset.Int("keys", 10000, "distinct keys, chosen uniformly at random")
	conc := fset.Int("concurrency", 32, "requests in flight (one keep-alive connection each)")
	duration := fset.Duration("duration", 10*time.Second, "how long the /v1/allow phase runs")
	baseline := fset.Duration("baseline", -1, "how long the /healthz reference phase runs first (default: --duration; 0 skips it)")
	rounds := fset.Int("rounds", 5, "alternate the /healthz and /v1/allow phases this many times, in equal slices, so that other load on the machine weighs on both alike (fewer when a slice would hold less than two windows)")
	prefix := fset.String("key-prefix", "bench:", "prefix of the generated keys")
	var grpcs apiList
	fset.Var(&grpcs, "grpc", "a node's gRPC address (node.grpc), HOST:PORT: add a ShouldRateLimit phase to each round, with the same keys as descriptor values; repeat to spread the load")
	domain := fset.String("domain", "bench", "with --grpc: the descriptors' domain")
	descKey := fset.String("descriptor-key", "key", "with --grpc: the descriptor entry's key (its value is the bench key)")
	asJSON := fset.Bool("json", false, "print only the JSON report on stdout")
	auth := addClientAuth(fset)
	if err := fset.Parse(args); err != nil {
		return flagExit(err)
	}
	bad := func(msg string) int {
		fmt.Fprintf(stderr, "ratemesh bench: %s\n%s\n", msg, benchUsage)
		return 2
	}
	switch {
	case fset.NArg() > 0:
		return bad(fmt.Sprintf("unexpected argument %q", fset.Arg(0)))
	case len(apis) == 0:
		return bad("--api: required (HOST:PORT or a URL)")
	case *rule == "":
		return bad("--rule: must not be empty")
	case *keys < 1 || *keys > 10_000_000:
		return bad(fmt.Sprintf("--keys %d: must be between 1 and 10000000", *keys))
	case *conc < 1 || *conc > 10_000:
		return bad(fmt.Sprintf("--concurrency %d: must be between 1 and 10000", *conc))
	case *duration <= 0:
		return bad(fmt.Sprintf("--duration %v: must be positive", *duration))
	case *rounds < 1 || *rounds > 1000:
		return bad(fmt.Sprintf("--rounds %d: must be between 1 and 1000", *rounds))
	case len(*prefix)+len(fmt.Sprint(*keys)) > 256:
		return bad("--key-prefix: too long for a 256-byte key")
	}
	if *baseline < 0 {
		*baseline = *duration
	}
	var bases []string
	var client *apiClient
	for _, a := range apis {
		c, err := auth.client(a, *conc, 30*time.Second)
		if err != nil {
			return bad(err.Error())
		}
		bases, client = append(bases, c.base), c
	}
	grpcCreds := insecure.NewCredentials()
	if auth.tls() {
		tc, err := auth.tlsConfig()
		if err != nil {
			return bad(err.Error())
		}
		grpcCreds = credentials.NewTLS(tc)
	}
	rep, err := bench(context.Background(), benchConfig{
		client: client.http, token: client.token, grpcCreds: grpcCreds,
		grpcs: grpcs, domain: *domain, descKey: *descKey,
		bases: bases, rule: *rule, keys: *keys, conc: *conc,
		duration: *duration, baseline: *baseline, rounds: *rounds, prefix: *prefix, progress: stderr,
	})
	if err != nil {
		fmt.Fprintf(stderr, "ratemesh bench: %v\n", err)
		return 1
	}
	if *asJSON {
		err = writeJSON(stdout, rep)
	} else {
		rep.writeText(stdout)
	}
	if err != nil {
		fmt.Fprintf(stderr, "ratemesh bench: %v\n", err)
		return 1
	}
	if rep.Allow.Requests == 0 {
		return 1
	}
	return 0
}

type benchConfig struct {
	// client and token ask the HTTP API (nil: a plain client, no token);
	// grpcCreds the gRPC addresses (nil: plaintext).
	client             *http.Client
	token              string
	grpcCreds          credentials.TransportCredentials
	grpcs              []string
	domain, descKey    string
	bases              []string
	rule               string
	keys, conc, rounds int
	duration, baseline time.Duration
	prefix             string
	progress           io.Writer
}

func bench(ctx context.Context, cfg benchConfig) (*benchReport, error) {
	client := cfg.client
	if client == nil {
		client = newHTTPClient(cfg.conc, 30*time.Second)
	}
	if cfg.grpcCreds == nil {
		cfg.grpcCreds = insecure.NewCredentials()
	}
	defer client.CloseIdleConnections()
	rep := &benchReport{APIs: cfg.bases, Rule: cfg.rule, Keys: cfg.keys, Concurrency: cfg.conc, Held: true}

	// The rule's window, which also proves the rule exists on every node.
	for _, b := range cfg.bases {
		c := &apiClient{base: b, http: client, token: cfg.token}
		var u httpapi.UsageResponse
		q := "/v1/usage?rule=" + url.QueryEscape(cfg.rule) + "&key=" + url.QueryEscape(cfg.prefix+"0")
		if err := c.call(ctx, "GET", q, nil, &u); err != nil {
			return nil, fmt.Errorf("%s: rule %q: %w", b, cfg.rule, err)
		}
		if u.WindowMs <= 0 {
			return nil, fmt.Errorf("%s: rule %q is a concurrency rule; bench asks /v1/allow", b, cfg.rule)
		}
		if rep.WindowMs != 0 && rep.WindowMs != u.WindowMs {
			return nil, fmt.Errorf("rule %q: window %d ms at %s, %d ms at %s", cfg.rule, rep.WindowMs, cfg.bases[0], u.WindowMs, b)
		}
		rep.WindowMs = u.WindowMs
	}
	bodies := make([][]byte, cfg.keys)
	for i := range bodies {
		b, err := json.Marshal(httpapi.AllowRequest{Rule: cfg.rule, Key: fmt.Sprintf("%s%d", cfg.prefix, i)})
		if err != nil {
			return nil, err
		}
		bodies[i] = b
	}
	workers := make([]*benchWorker, cfg.conc)
	for i := range workers {
		workers[i] = &benchWorker{c: client, token: cfg.token, base: cfg.bases[i%len(cfg.bases)], rng: rand.New(rand.NewPCG(uint64(i), 0x5eed))}
	}
	var grpcAllowed, grpcDenied uint64
	if len(cfg.grpcs) > 0 {
		// One connection per worker, as the HTTP phases have.
		for i, w := range workers {
			conn, err := grpc.NewClient(cfg.grpcs[i%len(cfg.grpcs)], grpc.WithTransportCredentials(cfg.grpcCreds))
			if err != nil {
				return nil, fmt.Errorf("--grpc %s: %w", cfg.grpcs[i%len(cfg.grpcs)], err)
			}
			defer conn.Close()
			w.rls = rlspb.NewRateLimitServiceClient(conn)
		}
	}
	grpcReqs := make([]*rlspb.RateLimitRequest, 0)
	if len(cfg.grpcs) > 0 {
		grpcReqs = make([]*rlspb.RateLimitRequest, cfg.keys)
		for i := range grpcReqs {
			grpcReqs[i] = &rlspb.RateLimitRequest{Domain: cfg.domain, Descriptors: []*rlcommon.RateLimitDescriptor{
				{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: cfg.descKey, Value: fmt.Sprintf("%s%d", cfg.prefix, i)}}}}}
		}
	}
	gctx := ctx
	if cfg.token != "" {
		gctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+cfg.token)
	}
	grpcOp := func(w *benchWorker) error {
		r, err := w.rls.ShouldRateLimit(gctx, grpcReqs[w.rng.IntN(cfg.keys)])
		if err != nil {
			return err
		}
		if len(r.GetStatuses()) != 1 || r.GetStatuses()[0].GetCurrentLimit() == nil {
			return fmt.Errorf("ShouldRateLimit: domain %q, descriptor key %q: no limit applies (is the node serving that descriptor file?)", cfg.domain, cfg.descKey)
		}
		if r.GetOverallCode() == rlspb.RateLimitResponse_OK {
			w.grpcAllowed++
		} else {
			w.grpcDenied++
		}
		return nil
	}

	healthz := func(w *benchWorker) error {
		req, err := http.NewRequestWithContext(ctx, "GET", w.base+"/healthz", nil)
		if err != nil {
			return err
		}
		return w.do(req, nil)
	}
	allowOp := func(w *benchWorker) error {
		k := w.rng.IntN(cfg.keys)
		req, err := http.NewRequestWithContext(ctx, "POST", w.base+"/v1/allow", bytes.NewReader(bodies[k]))
		if err != nil {
			return err
		}
		req.Header.Set("Content-Type", "application/json")
		var r httpapi.AllowResponse
		sent := time.Now()
		if err := w.do(req, &r); err != nil {
			return err
		}
		if r.Allowed {
			w.allowed++
			// The window the node decided in ends ResetAfter from now.
			end := int64(math.Round(float64(sent.UnixMilli()+r.ResetAfterMs) / float64(rep.WindowMs)))
			w.counts[keyWindow{k, end - 1}]++
		} else {
			w.denied++
		}
		w.limits[k] = r.Limit
		return nil
	}
	for _, w := range workers {
		w.counts, w.limits = map[keyWindow]uint64{}, map[int]uint64{}
	}

	// Warm up: open every connection and let the server's code settle.
	fmt.Fprintf(cfg.progress, "bench: warming up %d connections …\n", cfg.conc)
	runBenchPhase(workers, 500*time.Millisecond, healthz, &phaseAcc{})

	// Alternate the phases in slices; each allow slice holds at least two
	// windows so that at least one full window is judged.
	window := time.Duration(rep.WindowMs) * time.Millisecond
	rounds := max(1, min(cfg.rounds, int(cfg.duration/(2*window))))
	rep.Rounds = rounds
	var hz, al, gr phaseAcc
	var spans [][2]time.Time
	for r := range rounds {
		if cfg.baseline > 0 {
			fmt.Fprintf(cfg.progress, "bench: round %d/%d: GET /healthz for %v …\n", r+1, rounds, cfg.baseline/time.Duration(rounds))
			runBenchPhase(workers, cfg.baseline/time.Duration(rounds), healthz, &hz)
		}
		d := cfg.duration / time.Duration(rounds)
		fmt.Fprintf(cfg.progress, "bench: round %d/%d: POST /v1/allow, rule %q, %d keys, for %v …\n", r+1, rounds, cfg.rule, cfg.keys, d)
		start := time.Now()
		runBenchPhase(workers, d, allowOp, &al)
		spans = append(spans, [2]time.Time{start, start.Add(d)})
		if len(cfg.grpcs) > 0 {
			fmt.Fprintf(cfg.progress, "bench: round %d/%d: gRPC ShouldRateLimit, domain %q, for %v …\n", r+1, rounds, cfg.domain, d)
			runBenchPhase(workers, d, grpcOp, &gr)
		}
	}
	if len(cfg.grpcs) > 0 {
		p := gr.result("ShouldRateLimit")
		for _, w := range workers {
			grpcAllowed += w.grpcAllowed
			grpcDenied += w.grpcDenied
		}
		p.Allowed, p.Denied = grpcAllowed, grpcDenied
		rep.GRPC = &p
		if p.Requests == 0 {
			return nil, fmt.Errorf("gRPC: no request succeeded: %s", p.FirstErr)
		}
	}
	if cfg.baseline > 0 {
		p := hz.result("/healthz")
		rep.Healthz = &p
		if p.Requests == 0 {
			return nil, fmt.Errorf("/healthz: no request succeeded: %s", p.FirstErr)
		}
	}
	rep.Allow = al.result("/v1/allow")
	for _, w := range workers {
		rep.Allow.Allowed += w.allowed
		rep.Allow.Denied += w.denied
	}
	if rep.Healthz != nil && rep.Healthz.PerSecond > 0 {
		rep.Ratio = rep.Allow.PerSecond / rep.Healthz.PerSecond
	}
	if rep.GRPC != nil && rep.Allow.PerSecond > 0 {
		rep.GRPCRatio = rep.GRPC.PerSecond / rep.Allow.PerSecond
	}
	rep.Windows = benchWindows(workers, rep.WindowMs, spans)
	for _, bw := range rep.Windows {
		if bw.Full {
			rep.FullWindows++
			if bw.KeysOverCap > 0 {
				rep.Held = false
			}
		}
	}
	return rep, nil
}

// benchWindows sums the workers' admissions per window: over all keys, and
// the busiest key against its limit. Only windows wholly inside one of the
// allow phase's spans are full.
func benchWindows(workers []*benchWorker, winMs int64, spans [][2]time.Time) []benchWindow {
	type acc struct {
		bw   benchWindow
		keys map[int]uint64
	}
	byWin := map[int64]*acc{}
	limits := map[int]uint64{}
	for _, w := range workers {
		for k, l := range w.limits {
			limits[k] = max(limits[k], l)
		}
		for kw, n := range w.counts {
			a := byWin[kw.window]
			if a == nil {
				a = &acc{bw: benchWindow{Window: kw.window}, keys: map[int]uint64{}}
				byWin[kw.window] = a
			}
			a.keys[kw.key] += n
			a.bw.Admitted += n
		}
	}
	full := func(idx int64) bool {
		for _, sp := range spans {
			if idx >= sp[0].UnixMilli()/winMs+1 && idx <= sp[1].UnixMilli()/winMs-1 {
				return true
			}
		}
		return false
	}
	out := make([]benchWindow, 0, len(byWin))
	for idx, a := range byWin {
		a.bw.Full = full(idx)
		a.bw.Keys = len(a.keys)
		for k, n := range a.keys {
			if n > a.bw.MaxPerKey {
				a.bw.MaxPerKey, a.bw.Limit = n, limits[k]
			}
			if n > limits[k] {
				a.bw.KeysOverCap++
			}
		}
		out = append(out, a.bw)
	}
	slices.SortFunc(out, func(a, b benchWindow) int { return int(a.Window - b.Window) })
	return out
}

// do sends req and, for a 200, decodes the answer into out (unless nil).
// The body is always read to the end so the connection is reused.
func (w *benchWorker) do(req *http.Request, out any) error {
	if w.token != "" {
		req.Header.Set("Authorization", "Bearer "+w.token)
	}
	resp, err := w.c.Do(req)
	if err != nil {
		return err
	}
	w.buf.Reset()
	_, err = w.buf.ReadFrom(resp.Body)
	resp.Body.Close()
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s %s: HTTP %d: %s", req.Method, req.URL.Path, resp.StatusCode, strings.TrimSpace(w.buf.String()))
	}
	if out != nil {
		return json.Unmarshal(w.buf.Bytes(), out)
	}
	return nil
}

// phaseAcc gathers one phase's calls over its rounds.
type phaseAcc struct {
	lat      []time.Duration
	n, errs  uint64
	firstErr string
	elapsed  time.Duration
}

// runBenchPhase runs op on every worker in a loop for d and adds the calls
// to acc.
func runBenchPhase(workers []*benchWorker, d time.Duration, op func(*benchWorker) error, acc *phaseAcc) {
	for _, w := range workers {
		w.lat, w.n, w.errs, w.err = w.lat[:0], 0, 0, nil
	}
	start := time.Now()
	deadline := start.Add(d)
	var wg sync.WaitGroup
	for _, w := range workers {
		wg.Go(func() {
			for {
				t0 := time.Now()
				if !t0.Before(deadline) {
					return
				}
				if err := op(w); err != nil {
					w.errs++
					if w.err == nil {
						w.err = err
					}
					continue
				}
				w.lat = append(w.lat, time.Since(t0))
				w.n++
			}
		})
	}
	wg.Wait()
	acc.elapsed += time.Since(start)
	for _, w := range workers {
		acc.n += w.n
		acc.errs += w.errs
		if w.err != nil && acc.firstErr == "" {
			acc.firstErr = w.err.Error()
		}
		acc.lat = append(acc.lat, w.lat...)
	}
}

// result returns the phase's throughput and latency percentiles.
func (a *phaseAcc) result(path string) benchPhase {
	p := benchPhase{Path: path, Requests: a.n, Errors: a.errs, FirstErr: a.firstErr, Seconds: a.elapsed.Seconds()}
	if a.elapsed > 0 {
		p.PerSecond = float64(a.n) / a.elapsed.Seconds()
	}
	if len(a.lat) > 0 {
		slices.Sort(a.lat)
		p.P50Ms = ms(a.lat[len(a.lat)*50/100])
		p.P99Ms = ms(a.lat[min(len(a.lat)-1, len(a.lat)*99/100)])
	}
	return p
}

func ms(d time.Duration) float64 { return math.Round(float64(d.Microseconds())) / 1000 }

func (r *benchReport) writeText(w io.Writer) {
	fmt.Fprintf(w, "bench: %d node(s), rule %q (window %v), %d keys, concurrency %d, %d round(s)\n",
		len(r.APIs), r.Rule, time.Duration(r.WindowMs)*time.Millisecond, r.Keys, r.Concurrency, r.Rounds)
	fmt.Fprintf(w, "%-16s %10s %12s %9s %9s %8s\n", "phase", "requests", "per second", "p50 ms", "p99 ms", "errors")
	row := func(p benchPhase) {
		fmt.Fprintf(w, "%-16s %10d %12.0f %9.3f %9.3f %8d\n", strings.TrimPrefix(p.Path, "/v1"), p.Requests, p.PerSecond, p.P50Ms, p.P99Ms, p.Errors)
	}
	if r.Healthz != nil {
		row(*r.Healthz)
	}
	row(r.Allow)
	if r.GRPC != nil {
		row(*r.GRPC)
	}
	if r.Allow.FirstErr != "" {
		fmt.Fprintf(w, "first error: %s\n", r.Allow.FirstErr)
	}
	if r.GRPC != nil {
		if r.GRPC.FirstErr != "" {
			fmt.Fprintf(w, "first gRPC error: %s\n", r.GRPC.FirstErr)
		}
		fmt.Fprintf(w, "decisions/s over gRPC ÷ over HTTP (/v1/allow): %.2f; gRPC: %d OK, %d OVER_LIMIT\n", r.GRPCRatio, r.GRPC.Allowed, r.GRPC.Denied)
	}
	if r.Healthz != nil {
		fmt.Fprintf(w, "decisions/s of /v1/allow ÷ requests/s of /healthz: %.2f\n", r.Ratio)
	}
	fmt.Fprintf(w, "decisions: %d allowed, %d denied\n", r.Allow.Allowed, r.Allow.Denied)
	fmt.Fprintf(w, "admitted per window (full windows only are judged):\n")
	fmt.Fprintf(w, "  %-14s %10s %8s %12s %8s %10s\n", "window", "admitted", "keys", "busiest key", "limit", "over limit")
	for _, bw := range r.Windows {
		mark := ""
		if !bw.Full {
			mark = "  (partial)"
		}
		fmt.Fprintf(w, "  %-14d %10d %8d %12d %8d %10d%s\n", bw.Window, bw.Admitted, bw.Keys, bw.MaxPerKey, bw.Limit, bw.KeysOverCap, mark)
	}
	switch {
	case r.FullWindows == 0:
		fmt.Fprintln(w, "no full window to judge the limit by: run longer")
	case r.Held:
		fmt.Fprintf(w, "limit held: no key admitted more than its limit in %d full window(s)\n", r.FullWindows)
	default:
		fmt.Fprintln(w, "limit NOT held: some key admitted more than its limit in a full window")
	}
}
