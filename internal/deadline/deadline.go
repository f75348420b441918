// Package deadline serves a decision within its caller's deadline, and
// counts how the answers fared against it, for the APIs in front of a
// node: Envoy's rate limit service (grpc-timeout) and the HTTP API
// (max_wait_ms, X-Ratemesh-Max-Wait-Ms).
//
// A node never holds a request past its context's deadline and leaves
// part of the time left for the answer (node.Node.Allow). What the APIs
// add is that the deadline passing never turns into an error: Bound hands
// the node a context that carries the deadline but is never cancelled, so
// a request whose time is up is still decided at once, without holding,
// and answered. Metrics counts every answer as in time, late (after the
// deadline) or expired on arrival (the deadline had passed before the
// server began to handle the call):
//
//	ctx = deadline.Bound(ctx, dl)     // dl: the caller's deadline
//	d, err := n.Allow(ctx, rule, key) // holds at most until dl, less a margin
//	… write the answer …
//	m.Observe(dl, true, arrived, time.Now())
//
// Everything here is safe for concurrent use.
package deadline

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Bound returns a context that carries ctx's values and the deadline dl,
// and is never cancelled: neither dl passing nor ctx ending cancels it.
// Handed to a node's Allow, AllowAll or Acquire, dl bounds a hold for the
// share (with the node's margin), and a request whose deadline has passed
// is decided at once instead of failing with the context's error. Derive
// no context from it that relies on dl to end: nothing cancels it at dl.
func Bound(ctx context.Context, dl time.Time) context.Context {
	return bound{Context: context.WithoutCancel(ctx), dl: dl}
}

type bound struct {
	context.Context // WithoutCancel: values only, never done
	dl              time.Time
}

func (b bound) Deadline() (time.Time, bool) { return b.dl, true }

// Outcome is how an answer fared against its caller's deadline.
type Outcome uint8

// Outcomes, by the label the metrics give them.
const (
	// NoDeadline: the caller set none.
	NoDeadline Outcome = iota
	// InTime: answered at or before the deadline.
	InTime
	// Late: answered after the deadline, which had not passed when the
	// server began to handle the call.
	Late
	// ExpiredOnArrival: the deadline had passed before the server began
	// to handle the call (it waited in queues on a starved host); the
	// call was still decided, without holding, and answered.
	ExpiredOnArrival
	numOutcomes
)

var outcomeNames = [numOutcomes]string{NoDeadline: "no_deadline", InTime: "in_time", Late: "late", ExpiredOnArrival: "expired_on_arrival"}

// String returns the outcome's metric label.
func (o Outcome) String() string {
	if o < numOutcomes {
		return outcomeNames[o]
	}
	return "unknown"
}

// Classify tells how an answer at answered fared against the deadline dl
// (none when !hasDL) of a call the server began to handle at arrived.
func Classify(dl time.Time, hasDL bool, arrived, answered time.Time) Outcome {
	switch {
	case !hasDL:
		return NoDeadline
	case arrived.After(dl):
		return ExpiredOnArrival
	case answered.After(dl):
		return Late
	}
	return InTime
}

// Metrics are one API's deadline metrics:
//
//	ratemesh_deadline_answers_total{api, outcome}
//	ratemesh_deadline_left_seconds{api} (histogram)
//
// api is a constant label, so that each API registers its own Metrics in
// one registry. A Metrics is a prometheus.Collector. The zero value is not
// usable: NewMetrics.
type Metrics struct {
	answers [numOutcomes]prometheus.Counter
	vec     *prometheus.CounterVec
	left    prometheus.Histogram
}

// LeftBuckets are the buckets of ratemesh_deadline_left_seconds: fine
// around Envoy's default 20 ms timeout, coarse up to HTTP callers' seconds.
var LeftBuckets = []float64{0.001, 0.002, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.05, 0.1, 0.5, 1, 5, 30}

// NewMetrics returns the deadline metrics of the API named api ("grpc",
// "http"), every outcome at 0.
func NewMetrics(api string) *Metrics {
	m := &Metrics{
		vec: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name:        "ratemesh_deadline_answers_total",
			Help:        "Decisions answered, by API and by how the answer fared against the caller's deadline (grpc-timeout; max_wait_ms or X-Ratemesh-Max-Wait-Ms): in_time, late, expired_on_arrival (the deadline had passed before the server began to handle the call), no_deadline.",
			ConstLabels: prometheus.Labels{"api": api},
		}, []string{"outcome"}),
		left: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:        "ratemesh_deadline_left_seconds",
			Help:        "Time left of the caller's deadline when an answer left in time, by API (late answers are counted in ratemesh_deadline_answers_total only).",
			ConstLabels: prometheus.Labels{"api": api},
			Buckets:     LeftBuckets,
		}),
	}
	for o := range numOutcomes {
		m.answers[o] = m.vec.WithLabelValues(o.String())
	}
	return m
}

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	m.vec.Describe(ch)
	m.left.Describe(ch)
}

// Collect implements prometheus.Collector.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	m.vec.Collect(ch)
	m.left.Collect(ch)
}

// Observe counts one answer (see Classify) and returns its outcome.
func (m *Metrics) Observe(dl time.Time, hasDL bool, arrived, answered time.Time) Outcome {
	o := Classify(dl, hasDL, arrived, answered)
	m.answers[o].Inc()
	if o == InTime {
		m.left.Observe(dl.Sub(answered).Seconds())
	}
	return o
}
