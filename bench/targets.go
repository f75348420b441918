package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/proto"

	"github.com/ratemesh/ratemesh/httpapi"
)

// driver holds the load generator's workers for one system: worker i
// talks to node i mod the nodes, over its own keep-alive HTTP/1.1
// connection (httpConn) and its own gRPC connection (grpcConn), each
// dialled at its first request: one request in flight on each, as with
// the grpc.ClientConn a worker had before.
type driver struct {
	c       *cluster
	workers []*worker
}

func newDriver(c *cluster, conc int) *driver {
	d := &driver{c: c}
	for i := range conc {
		nd := c.nodes[i%len(c.nodes)]
		d.workers = append(d.workers, &worker{id: i, rng: rand.New(rand.NewPCG(uint64(i), 0x5eed)), node: nd,
			http: httpConn{addr: nd.http}, grpc: grpcConn{addr: nd.grpc}})
	}
	return d
}

// close closes the workers' connections; call it when no phase runs.
func (d *driver) close() {
	for _, w := range d.workers {
		w.http.close()
		w.grpc.close()
	}
}

// requestTimeout bounds one request's exchange.
const requestTimeout = 30 * time.Second

// do sends req (from httpRequest) on w's connection and leaves a 200's
// body in w.buf; what names the request in errors.
func (d *driver) do(ctx context.Context, w *worker, what string, req []byte) error {
	code, err := w.http.roundTrip(ctx, req, &w.buf, requestTimeout)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	if code != 200 {
		return fmt.Errorf("%s: HTTP %d: %.200s", what, code, strings.TrimSpace(w.buf.String()))
	}
	return nil
}

// keyNames returns n key names, prefix0 … prefix(n−1).
func keyNames(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = prefix + strconv.Itoa(i)
	}
	return out
}

// A limit, for both systems: the rule (ratemesh) or the name with its
// limit and duration (Gubernator's requests carry them).
type limitSpec struct {
	name     string
	limit    int64
	window   time.Duration
	behavior int32 // Gubernator only: BATCHING (0) or GLOBAL (guberGlobal)
}

// guberGlobal is Gubernator's Behavior GLOBAL.
const guberGlobal = 2

// ---- ratemesh ----

// rmAllow asks POST /v1/allow for a random one of keys. With track, an
// admission carries the end of its window (rmWindowEnd).
func (d *driver) rmAllow(l limitSpec, keys []string, track bool) (op, error) {
	reqs := make([][]byte, len(keys))
	for i, k := range keys {
		b, err := json.Marshal(httpapi.AllowRequest{Rule: l.name, Key: k})
		if err != nil {
			return nil, err
		}
		reqs[i] = httpRequest("POST", "/v1/allow", b)
	}
	return func(ctx context.Context, w *worker) (outcome, error) {
		sent := time.Now()
		if err := d.do(ctx, w, "POST /v1/allow", reqs[w.rng.IntN(len(reqs))]); err != nil {
			return outcome{}, err
		}
		recv := time.Now()
		var r httpapi.AllowResponse
		if err := json.Unmarshal(w.buf.Bytes(), &r); err != nil {
			return outcome{}, fmt.Errorf("/v1/allow: %w", err)
		}
		out := outcome{decisions: 1}
		if r.Allowed {
			out.allowed = 1
			if track {
				out.ends = []int64{rmWindowEnd(sent, recv, r.ResetAfterMs, l.window)}
			}
		}
		return out, nil
	}, nil
}

// rmWindowEnd is the end (Unix ms) of the window a ratemesh decision
// counted in, or −1 when it cannot be told. The node decided at some
// moment between sent and recv, and its window ended reset_after_ms after
// that moment; ratemesh's windows end at multiples of the window (in mesh
// time, which on one host is the clock). So the end is the multiple of the
// window in [sent + reset, recv + reset] (a millisecond of slack for the
// rounding of reset_after_ms) — unless a slow answer leaves two.
func rmWindowEnd(sent, recv time.Time, resetMs int64, window time.Duration) int64 {
	w := window.Milliseconds()
	lo, hi := sent.UnixMilli()+resetMs-1, recv.UnixMilli()+resetMs+1
	first := (lo + w - 1) / w * w // the first multiple of w at or after lo
	if first > hi || first+w <= hi {
		return -1
	}
	return first
}

// rmHealthz asks GET /healthz.
func (d *driver) rmHealthz() op {
	req := httpRequest("GET", "/healthz", nil)
	return func(ctx context.Context, w *worker) (outcome, error) {
		return outcome{}, d.do(ctx, w, "GET /healthz", req)
	}
}

// rmRLS asks Envoy's ShouldRateLimit for a random one of keys, as the
// value of descriptor entry "key" in domain "bench". The requests are
// encoded once (go-control-plane's types) and sent by grpcConn; the
// answers read by parseRLSResponse.
func (d *driver) rmRLS(keys []string) (op, error) {
	reqs := make([][]byte, len(keys))
	for i, k := range keys {
		b, err := proto.Marshal(&rlspb.RateLimitRequest{Domain: "bench", Descriptors: []*rlcommon.RateLimitDescriptor{
			{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "key", Value: k}}}}})
		if err != nil {
			return nil, err
		}
		reqs[i] = b
	}
	return func(ctx context.Context, w *worker) (outcome, error) {
		if err := w.grpc.call(ctx, rlsShouldRateLimit, reqs[w.rng.IntN(len(reqs))], &w.buf, requestTimeout); err != nil {
			return outcome{}, fmt.Errorf("ShouldRateLimit: %w", err)
		}
		r, err := parseRLSResponse(w.buf.Bytes())
		if err != nil {
			return outcome{}, err
		}
		if r.Statuses != 1 || r.Limited != 1 {
			return outcome{}, errNoLimit
		}
		out := outcome{decisions: 1}
		if r.OK {
			out.allowed = 1
		}
		return out, nil
	}, nil
}

// rmFill touches keys[next…] once each, batch at a time, in
// all-or-nothing requests ({"checks": [...]}) that must be admitted. A
// batch a member denies for its own state, not the keys' (fenced, stale
// or joining: under the strict policy a member of a mesh that cannot tell
// whether it is cut off, as on a starved host), is counted in resent and
// sent again after the retry_after_ms it names.
func (d *driver) rmFill(rule string, keys []string, batch int, next, resent *atomic.Int64) op {
	return func(ctx context.Context, w *worker) (outcome, error) {
		lo := int(next.Add(int64(batch))) - batch
		if lo >= len(keys) {
			return outcome{}, errDone
		}
		hi := min(len(keys), lo+batch)
		w.buf.Reset()
		w.buf.WriteString(`{"checks":[`)
		for i := lo; i < hi; i++ {
			if i > lo {
				w.buf.WriteByte(',')
			}
			fmt.Fprintf(&w.buf, `{"rule":%q,"key":%q}`, rule, keys[i])
		}
		w.buf.WriteString(`]}`)
		req := httpRequest("POST", "/v1/allow", w.buf.Bytes()) // a copy: w.buf takes the answers
		for {
			if err := d.do(ctx, w, "POST /v1/allow", req); err != nil {
				return outcome{}, err
			}
			var r httpapi.MultiAllowResponse
			if err := json.Unmarshal(w.buf.Bytes(), &r); err != nil {
				return outcome{}, fmt.Errorf("/v1/allow: %w", err)
			}
			if r.Allowed && len(r.Results) == hi-lo {
				return outcome{decisions: hi - lo, allowed: hi - lo}, nil
			}
			wait, ok := memberDenial(r)
			if !ok {
				return outcome{}, fmt.Errorf("/v1/allow of %d new keys: allowed %v, %d results (%.200s)", hi-lo, r.Allowed, len(r.Results), w.buf.String())
			}
			resent.Add(1)
			if !sleepCtx(ctx, wait) {
				return outcome{}, ctx.Err()
			}
		}
	}
}

// memberDenial reports whether a denied multi-check was denied for the
// member's own state (fenced, stale or joining) rather than its keys,
// and how long to wait before sending it again: the longest
// retry_after_ms of its results, between 10 ms and a second.
func memberDenial(r httpapi.MultiAllowResponse) (time.Duration, bool) {
	if r.Allowed {
		return 0, false
	}
	var wait time.Duration
	member := false
	for _, res := range r.Results {
		switch res.Reason {
		case "fenced", "stale", "joining":
			member = true
			wait = max(wait, time.Duration(res.RetryAfterMs)*time.Millisecond)
		case "", "admitted":
		default:
			return 0, false
		}
	}
	return min(max(wait, 10*time.Millisecond), time.Second), member
}

// ---- Gubernator ----

// guberReq is one element of Gubernator's JSON GetRateLimits request.
type guberReq struct {
	Name      string `json:"name"`
	UniqueKey string `json:"unique_key"`
	Hits      int64  `json:"hits"`
	Limit     int64  `json:"limit"`
	Duration  int64  `json:"duration"`
	Behavior  int32  `json:"behavior,omitempty"`
}

// guberResp is Gubernator's JSON GetRateLimits answer (protojson: int64
// as strings, enums by name).
type guberResp struct {
	Responses []struct {
		Status    string `json:"status"`
		Limit     int64  `json:"limit,string"`
		Remaining int64  `json:"remaining,string"`
		ResetTime int64  `json:"reset_time,string"`
		Error     string `json:"error"`
	} `json:"responses"`
}

func (l limitSpec) guberReq(key string) guberReq {
	return guberReq{Name: l.name, UniqueKey: key, Hits: 1, Limit: l.limit, Duration: l.window.Milliseconds(), Behavior: l.behavior}
}

// gbHTTP asks POST /v1/GetRateLimits (the JSON gateway) for a random one
// of keys. With track, an admission's window end is its reset_time.
func (d *driver) gbHTTP(l limitSpec, keys []string, track bool) (op, error) {
	reqs := make([][]byte, len(keys))
	for i, k := range keys {
		b, err := json.Marshal(map[string][]guberReq{"requests": {l.guberReq(k)}})
		if err != nil {
			return nil, err
		}
		reqs[i] = httpRequest("POST", "/v1/GetRateLimits", b)
	}
	return func(ctx context.Context, w *worker) (outcome, error) {
		if err := d.do(ctx, w, "POST /v1/GetRateLimits", reqs[w.rng.IntN(len(reqs))]); err != nil {
			return outcome{}, err
		}
		var r guberResp
		if err := json.Unmarshal(w.buf.Bytes(), &r); err != nil {
			return outcome{}, fmt.Errorf("/v1/GetRateLimits: %w", err)
		}
		if len(r.Responses) != 1 {
			return outcome{}, fmt.Errorf("/v1/GetRateLimits: %d responses to one request", len(r.Responses))
		}
		x := r.Responses[0]
		if x.Error != "" {
			return outcome{}, fmt.Errorf("/v1/GetRateLimits: %s", x.Error)
		}
		out := outcome{decisions: 1}
		if x.Status == "UNDER_LIMIT" {
			out.allowed = 1
			if track {
				out.ends = []int64{x.ResetTime}
			}
		}
		return out, nil
	}, nil
}

// gbHealth asks GET /v1/HealthCheck.
func (d *driver) gbHealth() op {
	req := httpRequest("GET", "/v1/HealthCheck", nil)
	return func(ctx context.Context, w *worker) (outcome, error) {
		return outcome{}, d.do(ctx, w, "GET /v1/HealthCheck", req)
	}
}

// gbGRPC asks V1.GetRateLimits over gRPC for a random one of keys; the
// requests are encoded once (guberRequest), the answers read by
// parseGuberResponse.
func (d *driver) gbGRPC(l limitSpec, keys []string) op {
	reqs := make([][]byte, len(keys))
	for i, k := range keys {
		reqs[i] = guberRequest(l, k)
	}
	return func(ctx context.Context, w *worker) (outcome, error) {
		if err := w.grpc.call(ctx, guberGetRateLimits, reqs[w.rng.IntN(len(reqs))], &w.buf, requestTimeout); err != nil {
			return outcome{}, fmt.Errorf("GetRateLimits: %w", err)
		}
		rs, err := parseGuberResponse(w.buf.Bytes())
		if err != nil {
			return outcome{}, err
		}
		if len(rs) != 1 {
			return outcome{}, fmt.Errorf("GetRateLimits: %d responses to one request", len(rs))
		}
		if rs[0].Error != "" {
			return outcome{}, fmt.Errorf("GetRateLimits: %s", rs[0].Error)
		}
		out := outcome{decisions: 1}
		if !rs[0].OverLimit {
			out.allowed = 1
		}
		return out, nil
	}
}

// gbFill touches keys[next…] once each, batch at a time, in one
// GetRateLimits request each; every one must be under the limit.
func (d *driver) gbFill(l limitSpec, keys []string, batch int, next *atomic.Int64) op {
	return func(ctx context.Context, w *worker) (outcome, error) {
		lo := int(next.Add(int64(batch))) - batch
		if lo >= len(keys) {
			return outcome{}, errDone
		}
		hi := min(len(keys), lo+batch)
		reqs := make([]guberReq, 0, hi-lo)
		for i := lo; i < hi; i++ {
			reqs = append(reqs, l.guberReq(keys[i]))
		}
		body, err := json.Marshal(map[string][]guberReq{"requests": reqs})
		if err != nil {
			return outcome{}, err
		}
		if err := d.do(ctx, w, "POST /v1/GetRateLimits", httpRequest("POST", "/v1/GetRateLimits", body)); err != nil {
			return outcome{}, err
		}
		var r guberResp
		if err := json.Unmarshal(w.buf.Bytes(), &r); err != nil {
			return outcome{}, fmt.Errorf("/v1/GetRateLimits: %w", err)
		}
		if len(r.Responses) != hi-lo {
			return outcome{}, fmt.Errorf("/v1/GetRateLimits: %d responses to %d requests", len(r.Responses), hi-lo)
		}
		for _, x := range r.Responses {
			if x.Error != "" || x.Status != "UNDER_LIMIT" {
				return outcome{}, fmt.Errorf("/v1/GetRateLimits of a new key: %s %s", x.Status, x.Error)
			}
		}
		return outcome{decisions: hi - lo, allowed: hi - lo}, nil
	}
}
