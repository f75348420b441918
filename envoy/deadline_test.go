package envoy_test

import (
	"context"
	"testing"
	"time"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/ratemesh/ratemesh/envoy"
	"github.com/ratemesh/ratemesh/internal/apitest"
	"github.com/ratemesh/ratemesh/internal/testutil"
	"github.com/ratemesh/ratemesh/node"
	"github.com/ratemesh/ratemesh/node/memnet"
)

// TestDeadlineBoundsHold: a descriptor whose share denial would be held
// for its share_wait (1 s: the other member acknowledges nothing) is
// answered OVER_LIMIT within the call's grpc-timeout instead, held at most
// half of it; a call with less than MinHoldTimeout left, or none, is
// decided at once without holding, never failed; answers are counted by
// outcome.
func TestDeadlineBoundsHold(t *testing.T) {
	desc, err := envoy.Parse(envoy.File{Name: "d.yaml", Data: []byte("domain: edge\ndescriptors:\n  - key: ip\n    rate_limit: {unit: hour, requests_per_unit: 10}\n")})
	if err != nil {
		t.Fatal(err)
	}
	desc, err = desc.WithShareWait(time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	hub := memnet.NewHub()
	a := apitest.Start(t, hub, "a", desc.Rules(), patient)
	apitest.Start(t, hub, "b", desc.Rules(), patient)
	testutil.Eventually(t, 10*time.Second, func() (bool, string) {
		for _, p := range a.Node.Peers() {
			if p.Peer == "b" && p.State.String() == "alive" {
				return true, ""
			}
		}
		return false, "a sees b alive"
	})
	reg := prometheus.NewRegistry()
	srv, err := envoy.New(envoy.Config{Node: a.Node, Descriptors: desc, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(serveLoopback(t, srv), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	rls := rlspb.NewRateLimitServiceClient(conn)
	hub.Cut("a", "b") // b stays alive (patient), and acknowledges nothing
	r := req("edge", [][][2]string{{{"ip", "10.0.0.1"}}}, 1)
	for i := range 5 { // a's share of 10 over 2 members, without a deadline
		if resp, err := rls.ShouldRateLimit(context.Background(), r); err != nil || resp.GetOverallCode() != ok {
			t.Fatalf("call %d: %v %v", i, resp, err)
		}
	}
	// Through gRPC, with the share_wait as the deadline: held for its
	// share_wait, the call would miss it; held at most half of it, it is
	// answered with half a second to spare, which a machine busy with
	// other tests still meets.
	held := a.Node.HoldStats().Held
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	start := time.Now()
	resp, err := rls.ShouldRateLimit(ctx, r)
	took := time.Since(start)
	cancel()
	if err != nil || resp.GetOverallCode() != over {
		t.Errorf("with a 1 s deadline: %v %v after %v, want OVER_LIMIT in time", resp, err, took)
	}
	t.Logf("with a 1 s deadline: answered in %v", took.Round(100*time.Microsecond))
	if h := a.Node.HoldStats().Held; h != held+1 {
		t.Errorf("%d holds with a 1 s deadline, want 1", h-held)
	}
	inTime, late, none := answers(t, reg, "in_time"), answers(t, reg, "late"), answers(t, reg, "no_deadline")
	if inTime+late != 1 || none != 5 {
		t.Errorf("answers: %v in time, %v late, %v without a deadline; want 1 with a deadline and 5 without", inTime, late, none)
	}

	// Envoy's 20 ms (under MinHoldTimeout), and a deadline already past
	// (the server began to handle the call late): decided at once, without
	// holding, never an error.
	held = a.Node.HoldStats().Held
	for _, left := range []time.Duration{envoy.MinHoldTimeout - time.Millisecond, 20 * time.Millisecond, -time.Millisecond} {
		ctx, cancel := context.WithDeadline(context.Background(), time.Now().Add(left))
		start := time.Now()
		resp, err := srv.ShouldRateLimit(ctx, r)
		took := time.Since(start)
		cancel()
		if err != nil || resp.GetOverallCode() != over || took > 900*time.Millisecond {
			t.Errorf("with %v left: %v %v after %v, want OVER_LIMIT without holding for share_wait", left, resp, err, took)
		}
		t.Logf("with %v left: decided in %v", left, took.Round(100*time.Microsecond))
	}
	if h := a.Node.HoldStats().Held; h != held {
		t.Errorf("%d holds of calls with less than %v left, want none", h-held, envoy.MinHoldTimeout)
	}
}

// answers returns ratemesh_deadline_answers_total{api="grpc",outcome}.
func answers(t *testing.T, reg *prometheus.Registry, outcome string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "ratemesh_deadline_answers_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["api"] == "grpc" && labels["outcome"] == outcome {
				return m.GetCounter().GetValue()
			}
		}
	}
	t.Fatalf("no ratemesh_deadline_answers_total{api=\"grpc\",outcome=%q}", outcome)
	return 0
}

// patient keeps a silent member alive for the test's whole length, however
// slowly a busy host runs it: b must hold its share while cut off.
func patient(c *node.Config) {
	c.SuspectAfter, c.DeadAfter, c.EvictAfter = time.Minute, 2*time.Minute, 3*time.Minute
}
