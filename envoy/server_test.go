package envoy_test

import (
	"context"
	"math"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratemesh/ratemesh/envoy"
	"github.com/ratemesh/ratemesh/node"
	"github.com/ratemesh/ratemesh/node/memnet"
)

// t0 is the frozen clock of the test nodes: 20.25 s into a minute, so a
// test never straddles a window (and durations until reset are fixed).
var t0 = time.Unix(1_700_000_000, 250_000_000)

// fixture is a node serving the gRPC API over real TCP, and a client of it
// built from go-control-plane's generated code.
type fixture struct {
	srv    *envoy.Server
	node   *node.Node
	rls    rlspb.RateLimitServiceClient
	health healthpb.HealthClient
	reg    *prometheus.Registry
}

func load(t *testing.T, files ...string) *envoy.Descriptors {
	t.Helper()
	var fs []envoy.File
	for _, f := range files {
		fs = append(fs, readFile(t, filepath.Join("testdata", f)))
	}
	d, err := envoy.Parse(fs...)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func start(t testing.TB, desc *envoy.Descriptors) *fixture {
	t.Helper()
	hub := memnet.NewHub()
	cfg := node.DefaultConfig()
	cfg.Peer, cfg.Transport = "p1", hub.Transport("p1")
	cfg.Rules = desc.Rules()
	cfg.Clock = func() time.Time { return t0 }
	if len(cfg.Rules) == 0 {
		cfg.Rules = nil
	}
	n, err := node.Start(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Close() })
	reg := prometheus.NewRegistry()
	srv, err := envoy.New(envoy.Config{Node: n, Descriptors: desc, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(serveLoopback(t, srv), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return &fixture{srv: srv, node: n, rls: rlspb.NewRateLimitServiceClient(conn), health: healthpb.NewHealthClient(conn), reg: reg}
}

// req builds a request like envoyproxy/ratelimit's test helper
// common.NewRateLimitRequest: one descriptor per list of key/value pairs.
func req(domain string, descs [][][2]string, hits uint32) *rlspb.RateLimitRequest {
	r := &rlspb.RateLimitRequest{Domain: domain, HitsAddend: hits}
	for _, d := range descs {
		rd := &rlcommon.RateLimitDescriptor{}
		for _, kv := range d {
			rd.Entries = append(rd.Entries, &rlcommon.RateLimitDescriptor_Entry{Key: kv[0], Value: kv[1]})
		}
		r.Descriptors = append(r.Descriptors, rd)
	}
	return r
}

func (f *fixture) call(t *testing.T, r *rlspb.RateLimitRequest) *rlspb.RateLimitResponse {
	t.Helper()
	resp, err := f.rls.ShouldRateLimit(context.Background(), r)
	if err != nil {
		t.Fatalf("ShouldRateLimit(%v): %v", r, err)
	}
	return resp
}

type unit = rlspb.RateLimitResponse_RateLimit_Unit

const (
	ok   = rlspb.RateLimitResponse_OK
	over = rlspb.RateLimitResponse_OVER_LIMIT
	sec  = rlspb.RateLimitResponse_RateLimit_SECOND
	min_ = rlspb.RateLimitResponse_RateLimit_MINUTE
	hour = rlspb.RateLimitResponse_RateLimit_HOUR
)

// until is envoyproxy/ratelimit's duration_until_reset at t0:
// unit − now mod unit, in whole seconds.
func until(u unit) *durationpb.Duration {
	div := map[unit]int64{sec: 1, min_: 60, hour: 3600}[u]
	return &durationpb.Duration{Seconds: div - t0.Unix()%div}
}

// status_ is envoyproxy/ratelimit's descriptor status of a limited
// descriptor, as its integration test writes it (newDescriptorStatus).
func status_(code rlspb.RateLimitResponse_Code, rpu uint32, u unit, remaining uint32) *rlspb.RateLimitResponse_DescriptorStatus {
	return &rlspb.RateLimitResponse_DescriptorStatus{
		Code:               code,
		CurrentLimit:       &rlspb.RateLimitResponse_RateLimit{RequestsPerUnit: rpu, Unit: u},
		LimitRemaining:     remaining,
		DurationUntilReset: until(u),
	}
}

func response(code rlspb.RateLimitResponse_Code, sts ...*rlspb.RateLimitResponse_DescriptorStatus) *rlspb.RateLimitResponse {
	return &rlspb.RateLimitResponse{OverallCode: code, Statuses: sts}
}

func expect(t *testing.T, what string, got, want *rlspb.RateLimitResponse) {
	t.Helper()
	if !proto.Equal(got, want) {
		t.Fatalf("%s:\n got %v\nwant %v", what, got, want)
	}
}

// TestIntegrationConfig replays envoyproxy/ratelimit's integration test
// (test/integration/integration_test.go, testBasicBaseConfig) over its own
// runtime files: unknown domains, limit_remaining after a first hit, a
// per-minute limit run over, and two descriptors in one request where the
// second runs over while the first keeps counting.
func TestIntegrationConfig(t *testing.T) {
	f := start(t, load(t, "integration/basic.yaml", "integration/another.yaml"))

	expect(t, "unknown domain", f.call(t, req("foo", [][][2]string{{{"hello", "world"}}}, 1)),
		response(ok, &rlspb.RateLimitResponse_DescriptorStatus{Code: ok}))
	expect(t, "first hit", f.call(t, req("basic", [][][2]string{{{"key1", "foo"}}}, 1)),
		response(ok, status_(ok, 50, sec, 49)))

	for i := range 25 {
		code, remaining := ok, uint32(20-(i+1))
		if i >= 20 {
			code, remaining = over, 0
		}
		expect(t, "key2 hit "+itoa(i), f.call(t, req("another", [][][2]string{{{"key2", "12345"}}}, 1)),
			response(code, status_(code, 20, min_, remaining)))
	}

	for i := range 15 {
		code, rem1, rem2 := ok, uint32(20-(i+1)), uint32(10-(i+1))
		if i >= 10 {
			code, rem2 = over, 0
		}
		expect(t, "key2+key3 hit "+itoa(i),
			f.call(t, req("another", [][][2]string{{{"key2", "67890"}}, {{"key3", "67890"}}}, 1)),
			response(code, status_(ok, 20, min_, rem1), status_(code, 10, hour, rem2)))
	}

	// Each value of a key without a value has its own counter.
	expect(t, "another value", f.call(t, req("another", [][][2]string{{{"key2", "other"}}}, 1)),
		response(ok, status_(ok, 20, min_, 19)))
}

// TestBasicConfig covers envoyproxy/ratelimit's test/config/basic_config.yaml
// through the service: a key default and a value override per second,
// whitelisted values, unlimited keys, unknown descriptors, depth rules.
func TestBasicConfig(t *testing.T) {
	f := start(t, load(t, "basic_config.yaml"))
	d := "test-domain"

	// Key default (5/s) and value override (10/s) at the second level.
	for i := range 7 {
		code, rem := ok, uint32(5-(i+1))
		if i >= 5 {
			code, rem = over, 0
		}
		expect(t, "subkey1 default", f.call(t, req(d, [][][2]string{{{"key1", "value1"}, {"subkey1", "something"}}}, 1)),
			response(code, status_(code, 5, sec, rem)))
	}
	for i := range 12 {
		code, rem := ok, uint32(10-(i+1))
		if i >= 10 {
			code, rem = over, 0
		}
		expect(t, "subkey1 override", f.call(t, req(d, [][][2]string{{{"key1", "value1"}, {"subkey1", "subvalue1"}}}, 1)),
			response(code, status_(code, 10, sec, rem)))
	}
	// Another value of the default has its own counter.
	expect(t, "subkey1 other value", f.call(t, req(d, [][][2]string{{{"key1", "value1"}, {"subkey1", "other"}}}, 1)),
		response(ok, status_(ok, 5, sec, 4)))

	plainOK := response(ok, &rlspb.RateLimitResponse_DescriptorStatus{Code: ok})
	for _, c := range []struct {
		what  string
		descs [][][2]string
	}{
		{"whitelisted value", [][][2]string{{{"key2", "value3"}}}},
		{"unknown key", [][][2]string{{{"nokey", "x"}}}},
		{"key1 with another value: no default", [][][2]string{{{"key1", "something"}}}},
		{"key1 value1 has no limit of its own", [][][2]string{{{"key1", "value1"}}}},
		{"deeper than the config", [][][2]string{{{"key2", "value2"}, {"subkey", "subvalue"}}}},
		{"key5 subkey5 with an unknown value", [][][2]string{{{"key5", "value5"}, {"subkey5", "subvalue"}}}},
	} {
		for range 3 {
			expect(t, c.what, f.call(t, req(d, c.descs, 1)), plainOK)
		}
	}
	// Unlimited: OK with limit_remaining MaxUint32, however often.
	for range 5 {
		expect(t, "unlimited", f.call(t, req(d, [][][2]string{{{"key6", "x"}}}, 1000)),
			response(ok, &rlspb.RateLimitResponse_DescriptorStatus{Code: ok, LimitRemaining: math.MaxUint32}))
	}
	// A value override at the first level (30/min) beside the key's 20/min.
	expect(t, "key2 value2", f.call(t, req(d, [][][2]string{{{"key2", "value2"}}}, 1)), response(ok, status_(ok, 30, min_, 29)))
	expect(t, "key2 other", f.call(t, req(d, [][][2]string{{{"key2", "else"}}}, 1)), response(ok, status_(ok, 20, min_, 19)))
	// detailed_metric: counted per value in the metrics too.
	expect(t, "key7", f.call(t, req(d, [][][2]string{{{"key7", "unspecified_value"}}}, 1)), response(ok, status_(ok, 70, min_, 69)))
	if v := (hitsMetric(t, f, "test-domain.key7_unspecified_value", "within_limit")); v != 1 {
		t.Errorf("detailed metric test-domain.key7_unspecified_value within_limit = %v, want 1", v)
	}
	if v := (hitsMetric(t, f, "test-domain.key2", "within_limit")); v != 1 {
		t.Errorf("metric test-domain.key2 within_limit = %v, want 1", v)
	}
	problems, err := testutil.GatherAndLint(f.reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("promlint: %s: %s", p.Metric, p.Text)
	}
}

func hitsMetric(t *testing.T, f *fixture, key, result string) float64 {
	t.Helper()
	mfs, err := f.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "ratemesh_envoy_hits_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["key"] == key && labels["result"] == result {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// TestHitsAddend: a hits_addend over the limit is OVER_LIMIT with nothing
// remaining, and, as Redis's INCRBY counts it, the window stays closed;
// per-descriptor hits_addend overrides the request's, and 0 checks only.
func TestHitsAddend(t *testing.T) {
	f := start(t, load(t, "integration/basic.yaml"))
	expect(t, "51 of 50", f.call(t, req("basic", [][][2]string{{{"key1", "a"}}}, 51)), response(over, status_(over, 50, sec, 0)))
	expect(t, "then 1", f.call(t, req("basic", [][][2]string{{{"key1", "a"}}}, 1)), response(over, status_(over, 50, sec, 0)))

	expect(t, "20 of 50", f.call(t, req("basic", [][][2]string{{{"key1", "b"}}}, 20)), response(ok, status_(ok, 50, sec, 30)))
	expect(t, "0 means 1", f.call(t, req("basic", [][][2]string{{{"key1", "b"}}}, 0)), response(ok, status_(ok, 50, sec, 29)))

	r := req("basic", [][][2]string{{{"key1", "b"}}, {{"key1", "c"}}}, 5)
	r.Descriptors[0].HitsAddend = wrapperspb.UInt64(0) // check only
	r.Descriptors[1].HitsAddend = wrapperspb.UInt64(50)
	expect(t, "per-descriptor hits", f.call(t, r), response(ok, status_(ok, 50, sec, 29), status_(ok, 50, sec, 0)))
	r = req("basic", [][][2]string{{{"key1", "c"}}}, 0)
	r.Descriptors[0].HitsAddend = wrapperspb.UInt64(0)
	expect(t, "a check at the limit is OK", f.call(t, r), response(ok, status_(ok, 50, sec, 0)))
	expect(t, "one more on c", f.call(t, req("basic", [][][2]string{{{"key1", "c"}}}, 1)), response(over, status_(over, 50, sec, 0)))
	expect(t, "a check past the limit is over", f.call(t, r), response(over, status_(over, 50, sec, 0)))
}

// TestShadowReplacesWildcard covers shadow_mode (counted, reported, never
// denied, with a metric), replaces and wildcard values.
func TestShadowReplacesWildcard(t *testing.T) {
	_, err := envoy.Parse(readFile(t, "testdata/shadowmode_config.yaml"), readFile(t, "testdata/wildcard.yaml"), envoy.File{Name: "example7.yaml", Data: []byte(`
domain: example7
descriptors:
  - key: key_1
    value: value_1
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          name: specific_limit
          requests_per_unit: 5
          unit: second
  - key: key_2
    value: value_2
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          replaces:
            - name: specific_limit
          requests_per_unit: 10
          unit: second
  - key: files
    value: files/*
    share_threshold: true
    rate_limit:
      unit: minute
      requests_per_unit: 3
`)})
	if err == nil || !strings.Contains(err.Error(), "duplicate domain 'test-domain'") {
		t.Fatalf("shadowmode_config and wildcard share a domain; got %v", err)
	}
	wild := readFile(t, "testdata/wildcard.yaml")
	wild.Data = []byte(strings.Replace(string(wild.Data), "domain: test-domain", "domain: wild-domain", 1))
	desc, err := envoy.Parse(readFile(t, "testdata/shadowmode_config.yaml"), wild, envoy.File{Name: "example7.yaml", Data: []byte(`
domain: example7
descriptors:
  - key: key_1
    value: value_1
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          name: specific_limit
          requests_per_unit: 5
          unit: second
  - key: key_2
    value: value_2
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          replaces:
            - name: specific_limit
          requests_per_unit: 10
          unit: second
  - key: files
    value: files/*
    share_threshold: true
    rate_limit:
      unit: minute
      requests_per_unit: 3
`)})
	if err != nil {
		t.Fatal(err)
	}
	f := start(t, desc)

	// shadow_mode: 20/min on key2, never denied; the would-be denials
	// are counted in the shadow_mode metric.
	for i := range 23 {
		rem := uint32(max(0, 20-(i+1)))
		expect(t, "shadow", f.call(t, req("test-domain", [][][2]string{{{"key2", "x"}}}, 1)), response(ok, status_(ok, 20, min_, rem)))
	}
	if v := (hitsMetric(t, f, "test-domain.key2", "shadow_mode")); v != 3 {
		t.Errorf("shadow_mode metric = %v, want 3", v)
	}

	// replaces: with both descriptors, only the replacing 10/s applies and
	// the 5/s limit is not counted.
	both := [][][2]string{{{"key_1", "value_1"}, {"user", "bkthomps"}}, {{"key_2", "value_2"}, {"user", "bkthomps"}}}
	for i := range 7 {
		st := status_(ok, 10, sec, uint32(10-(i+1)))
		st.CurrentLimit.Name = ""
		expect(t, "replaced", f.call(t, req("example7", both, 1)), response(ok, &rlspb.RateLimitResponse_DescriptorStatus{Code: ok}, st))
	}
	alone := status_(ok, 5, sec, 4)
	alone.CurrentLimit.Name = "specific_limit"
	expect(t, "specific_limit untouched", f.call(t, req("example7", [][][2]string{both[0]}, 1)), response(ok, alone))

	// Wildcards: each value under foo* has its own counter; bar*b is a
	// literal value; share_threshold makes every files/* value share one.
	for _, v := range []string{"foo1", "foo2"} {
		expect(t, "wild "+v, f.call(t, req("wild-domain", [][][2]string{{{"wild", v}}}, 1)), response(ok, status_(ok, 20, min_, 19)))
	}
	expect(t, "no wild match", f.call(t, req("wild-domain", [][][2]string{{{"wild", "bar"}}}, 1)), response(ok, &rlspb.RateLimitResponse_DescriptorStatus{Code: ok}))
	expect(t, "mid wildcard is literal", f.call(t, req("wild-domain", [][][2]string{{{"midWild", "barab"}}}, 1)), response(ok, &rlspb.RateLimitResponse_DescriptorStatus{Code: ok}))
	for i, v := range []string{"files/a", "files/b", "files/c", "files/d"} {
		code, rem := ok, uint32(3-(i+1))
		if i >= 3 {
			code, rem = over, 0
		}
		expect(t, "shared "+v, f.call(t, req("example7", [][][2]string{{{"files", v}}}, 1)), response(code, status_(code, 3, min_, rem)))
	}
}

// TestRequestErrors: the refusals envoyproxy/ratelimit answers with an
// error, and what ratemesh cannot do.
func TestRequestErrors(t *testing.T) {
	f := start(t, load(t, "integration/basic.yaml"))
	for _, c := range []struct {
		r    *rlspb.RateLimitRequest
		code codes.Code
		msg  string
	}{
		{req("", [][][2]string{{{"a", "b"}}}, 1), codes.InvalidArgument, "rate limit domain must not be empty"},
		{req("basic", nil, 1), codes.InvalidArgument, "rate limit descriptor list must not be empty"},
		{func() *rlspb.RateLimitRequest {
			r := req("basic", [][][2]string{{{"key1", "a"}}}, 1)
			r.Descriptors[0].Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 3}
			return r
		}(), codes.Unimplemented, "descriptors[0].limit"},
	} {
		_, err := f.rls.ShouldRateLimit(context.Background(), c.r)
		if st, _ := status.FromError(err); st.Code() != c.code || !strings.Contains(st.Message(), c.msg) {
			t.Errorf("%v: got %v, want %v %q", c.r, err, c.code, c.msg)
		}
	}
}

func TestHealth(t *testing.T) {
	f := start(t, load(t, "integration/basic.yaml"))
	check := func(svc string) healthpb.HealthCheckResponse_ServingStatus {
		t.Helper()
		r, err := f.health.Check(context.Background(), &healthpb.HealthCheckRequest{Service: svc})
		if err != nil {
			t.Fatal(err)
		}
		return r.GetStatus()
	}
	for _, svc := range []string{"", envoy.ServiceName} {
		if got := check(svc); got != healthpb.HealthCheckResponse_NOT_SERVING {
			t.Errorf("%q before SetServing: %v", svc, got)
		}
	}
	f.srv.SetServing(true)
	for _, svc := range []string{"", envoy.ServiceName} {
		if got := check(svc); got != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("%q after SetServing: %v", svc, got)
		}
	}
}

func itoa(i int) string { return strconv.Itoa(i) }

func readFile(t *testing.T, path string) envoy.File {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return envoy.File{Name: filepath.Base(path), Data: data}
}

// serveLoopback serves srv on an ephemeral 127.0.0.1 port until the test
// ends and returns the address.
func serveLoopback(t testing.TB, srv *envoy.Server) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		srv.Stop(ctx)
	})
	return ln.Addr().String()
}
