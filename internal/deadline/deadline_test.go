package deadline_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"

	"github.com/ratemesh/ratemesh/internal/deadline"
)

type key struct{}

// TestBound: the bound context keeps the values and the given deadline,
// and neither its parent's end nor the deadline cancel it.
func TestBound(t *testing.T) {
	parent, cancel := context.WithTimeout(context.WithValue(context.Background(), key{}, "v"), time.Millisecond)
	dl := time.Now().Add(-time.Second)
	ctx := deadline.Bound(parent, dl)
	cancel()
	<-parent.Done()
	if got, ok := ctx.Deadline(); !ok || !got.Equal(dl) {
		t.Errorf("Deadline() = %v %v, want %v", got, ok, dl)
	}
	if ctx.Done() != nil || ctx.Err() != nil {
		t.Errorf("Done %v Err %v: a bound context is never cancelled", ctx.Done(), ctx.Err())
	}
	if ctx.Value(key{}) != "v" {
		t.Errorf("Value lost: %v", ctx.Value(key{}))
	}
}

func TestClassify(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	for _, c := range []struct {
		dl                time.Time
		has               bool
		arrived, answered time.Time
		want              deadline.Outcome
	}{
		{time.Time{}, false, ms(0), ms(500), deadline.NoDeadline},
		{ms(20), true, ms(0), ms(3), deadline.InTime},
		{ms(20), true, ms(0), ms(20), deadline.InTime},
		{ms(20), true, ms(0), ms(21), deadline.Late},
		{ms(20), true, ms(20), ms(21), deadline.Late},
		{ms(20), true, ms(21), ms(21), deadline.ExpiredOnArrival},
	} {
		if got := deadline.Classify(c.dl, c.has, c.arrived, c.answered); got != c.want {
			t.Errorf("Classify(%v, %v, %v, %v) = %v, want %v", c.dl.Sub(t0), c.has, c.arrived.Sub(t0), c.answered.Sub(t0), got, c.want)
		}
	}
	if deadline.Outcome(99).String() != "unknown" || deadline.ExpiredOnArrival.String() != "expired_on_arrival" {
		t.Error("outcome names")
	}
}

// TestMetrics: every outcome starts at 0, answers are counted by outcome,
// in-time answers observe the time left, and two APIs' metrics share one
// registry under their api label.
func TestMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	grpc, http := deadline.NewMetrics("grpc"), deadline.NewMetrics("http")
	reg.MustRegister(grpc, http)
	now := time.Now()
	grpc.Observe(now.Add(20*time.Millisecond), true, now, now.Add(8*time.Millisecond))
	grpc.Observe(now.Add(20*time.Millisecond), true, now, now.Add(30*time.Millisecond))
	grpc.Observe(now.Add(-time.Millisecond), true, now, now)
	http.Observe(time.Time{}, false, now, now)
	want := `
# HELP ratemesh_deadline_answers_total Decisions answered, by API and by how the answer fared against the caller's deadline (grpc-timeout; max_wait_ms or X-Ratemesh-Max-Wait-Ms): in_time, late, expired_on_arrival (the deadline had passed before the server began to handle the call), no_deadline.
# TYPE ratemesh_deadline_answers_total counter
ratemesh_deadline_answers_total{api="grpc",outcome="expired_on_arrival"} 1
ratemesh_deadline_answers_total{api="grpc",outcome="in_time"} 1
ratemesh_deadline_answers_total{api="grpc",outcome="late"} 1
ratemesh_deadline_answers_total{api="grpc",outcome="no_deadline"} 0
ratemesh_deadline_answers_total{api="http",outcome="expired_on_arrival"} 0
ratemesh_deadline_answers_total{api="http",outcome="in_time"} 0
ratemesh_deadline_answers_total{api="http",outcome="late"} 0
ratemesh_deadline_answers_total{api="http",outcome="no_deadline"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "ratemesh_deadline_answers_total"); err != nil {
		t.Error(err)
	}
	if n := testutil.CollectAndCount(grpc, "ratemesh_deadline_left_seconds"); n != 1 {
		t.Errorf("%d left_seconds series for grpc, want 1", n)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "ratemesh_deadline_left_seconds" {
			for _, m := range mf.GetMetric() {
				h := m.GetHistogram()
				if m.GetLabel()[0].GetValue() == "grpc" && (h.GetSampleCount() != 1 || h.GetSampleSum() < 0.011 || h.GetSampleSum() > 0.013) {
					t.Errorf("grpc left: %d samples, sum %v; want the in-time answer's 12 ms", h.GetSampleCount(), h.GetSampleSum())
				}
			}
		}
	}
	problems, err := promlint.NewWithMetricFamilies(mfs).Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("promlint: %s: %s", p.Metric, p.Text)
	}
}
