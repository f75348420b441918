package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"

	"github.com/ratemesh/ratemesh/httpapi"
)

// driver holds the load generator's workers for one system: worker i
// talks to node i mod the nodes, over its own keep-alive HTTP connection
// (one shared pool sized to the workers) and, when asked for, its own
// gRPC connection.
type driver struct {
	c       *cluster
	http    *http.Client
	workers []*worker
	conns   []*grpc.ClientConn
}

func newDriver(c *cluster, conc int, withGRPC bool) (*driver, error) {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConns = conc * 2
	tr.MaxIdleConnsPerHost = conc
	tr.Proxy = nil // loopback: a proxy from the environment would only get in the way
	tr.DisableCompression = true
	d := &driver{c: c, http: &http.Client{Transport: tr, Timeout: 30 * time.Second}}
	for i := range conc {
		nd := c.nodes[i%len(c.nodes)]
		w := &worker{id: i, rng: rand.New(rand.NewPCG(uint64(i), 0x5eed)), node: nd}
		if withGRPC {
			conn, err := grpc.NewClient(nd.grpc, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				d.close()
				return nil, fmt.Errorf("%s: gRPC client of %s: %w", c.system, nd.grpc, err)
			}
			d.conns = append(d.conns, conn)
			w.rpc = conn
		}
		d.workers = append(d.workers, w)
	}
	return d, nil
}

func (d *driver) close() {
	for _, c := range d.conns {
		_ = c.Close()
	}
	d.http.CloseIdleConnections()
}

// do sends a request and leaves the 200's body in w.buf.
func (d *driver) do(ctx context.Context, w *worker, method, path string, body []byte) error {
	var rd *bytes.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	var req *http.Request
	var err error
	if rd != nil {
		req, err = http.NewRequestWithContext(ctx, method, "http://"+w.node.http+path, rd)
		req.Header.Set("Content-Type", "application/json")
	} else {
		req, err = http.NewRequestWithContext(ctx, method, "http://"+w.node.http+path, nil)
	}
	if err != nil {
		return err
	}
	resp, err := d.http.Do(req)
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
		return fmt.Errorf("%s %s: HTTP %d: %.200s", method, path, resp.StatusCode, strings.TrimSpace(w.buf.String()))
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
	bodies := make([][]byte, len(keys))
	for i, k := range keys {
		b, err := json.Marshal(httpapi.AllowRequest{Rule: l.name, Key: k})
		if err != nil {
			return nil, err
		}
		bodies[i] = b
	}
	return func(ctx context.Context, w *worker) (outcome, error) {
		sent := time.Now()
		if err := d.do(ctx, w, http.MethodPost, "/v1/allow", bodies[w.rng.IntN(len(bodies))]); err != nil {
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
	return func(ctx context.Context, w *worker) (outcome, error) {
		return outcome{}, d.do(ctx, w, http.MethodGet, "/healthz", nil)
	}
}

// rmRLS asks Envoy's ShouldRateLimit for a random one of keys, as the
// value of descriptor entry "key" in domain "bench". The requests are
// encoded once (go-control-plane's types); the answers read by
// parseRLSResponse.
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
		var resp []byte
		if err := w.rpc.Invoke(ctx, rlsShouldRateLimit, &reqs[w.rng.IntN(len(reqs))], &resp, grpc.ForceCodec(rawCodec{})); err != nil {
			return outcome{}, err
		}
		r, err := parseRLSResponse(resp)
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
// all-or-nothing requests ({"checks": [...]}) that must be admitted.
func (d *driver) rmFill(rule string, keys []string, batch int, next *atomic.Int64) op {
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
		body := bytes.Clone(w.buf.Bytes())
		if err := d.do(ctx, w, http.MethodPost, "/v1/allow", body); err != nil {
			return outcome{}, err
		}
		var r httpapi.MultiAllowResponse
		if err := json.Unmarshal(w.buf.Bytes(), &r); err != nil {
			return outcome{}, fmt.Errorf("/v1/allow: %w", err)
		}
		if !r.Allowed || len(r.Results) != hi-lo {
			return outcome{}, fmt.Errorf("/v1/allow of %d new keys: allowed %v, %d results (%.200s)", hi-lo, r.Allowed, len(r.Results), w.buf.String())
		}
		return outcome{decisions: hi - lo, allowed: hi - lo}, nil
	}
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
	bodies := make([][]byte, len(keys))
	for i, k := range keys {
		b, err := json.Marshal(map[string][]guberReq{"requests": {l.guberReq(k)}})
		if err != nil {
			return nil, err
		}
		bodies[i] = b
	}
	return func(ctx context.Context, w *worker) (outcome, error) {
		if err := d.do(ctx, w, http.MethodPost, "/v1/GetRateLimits", bodies[w.rng.IntN(len(bodies))]); err != nil {
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
	return func(ctx context.Context, w *worker) (outcome, error) {
		return outcome{}, d.do(ctx, w, http.MethodGet, "/v1/HealthCheck", nil)
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
		var resp []byte
		if err := w.rpc.Invoke(ctx, guberGetRateLimits, &reqs[w.rng.IntN(len(reqs))], &resp, grpc.ForceCodec(rawCodec{})); err != nil {
			return outcome{}, err
		}
		rs, err := parseGuberResponse(resp)
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
		if err := d.do(ctx, w, http.MethodPost, "/v1/GetRateLimits", body); err != nil {
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
