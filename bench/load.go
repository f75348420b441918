package main

import (
	"bytes"
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"
)

// errDone is what an op returns when it has no more work: the phase ends
// once every worker has seen it.
var errDone = errors.New("done")

// outcome is what one request decided: the decisions it carried (one, or
// a batch's), how many were admitted and, when the op tracks windows, the
// end of the window each admission counted in (Unix ms).
type outcome struct {
	decisions, allowed int
	ends               []int64
}

// op sends one request as worker w and waits for its answer.
type op func(ctx context.Context, w *worker) (outcome, error)

// worker is one closed-loop client: one request in flight at a time, on
// a connection of its own. Nothing in it is shared with other workers.
type worker struct {
	id  int
	rng *rand.Rand
	buf bytes.Buffer
	// The node this worker talks to, and its connections to it.
	node *node
	http httpConn
	grpc grpcConn

	// One phase's tallies.
	lat                         []time.Duration
	n, errs, decisions, allowed uint64
	err                         error
	ends                        []int64
}

// phase is the outcome of driving one system in one scenario of a round.
type phase struct {
	Scenario  string  `json:"scenario"`
	System    string  `json:"system"`
	Requests  uint64  `json:"requests"`
	Decisions uint64  `json:"decisions"`
	Allowed   uint64  `json:"allowed"`
	Errors    uint64  `json:"errors"`
	Seconds   float64 `json:"seconds"`
	// PerSecond is decisions per second (requests per second for the
	// health phases).
	PerSecond float64 `json:"per_second"`
	P50Ms     float64 `json:"p50_ms"`
	P99Ms     float64 `json:"p99_ms"`
	MaxMs     float64 `json:"max_ms"`
	FirstErr  string  `json:"first_error,omitempty"`
	CPU       cpuUse  `json:"cpu"`
	// Bound: the host was busy and the load generator used at least
	// --bound-ratio times the CPU of the system under test.
	Bound bool `json:"loadgen_bound"`
	// Starved: other processes on the host took at least three quarters
	// of its CPUs; the phase says more about them than about the system.
	Starved bool `json:"host_starved"`
	// Accuracy judges the flooded key's windows (cluster).
	Accuracy *accuracy `json:"accuracy,omitempty"`

	ends []int64 // admissions' window ends (cluster)
}

// cpuUse is the CPU a phase cost, in cores (CPU seconds per second), by
// whom: the load generator (this process), the system under test, the
// other system's idle processes, and everything else on the host.
type cpuUse struct {
	Loadgen  float64 `json:"loadgen_cores"`
	Server   float64 `json:"server_cores"`
	IdleSys  float64 `json:"idle_system_cores"`
	Other    float64 `json:"other_cores"`
	HostBusy float64 `json:"host_busy_fraction"`
	Steal    float64 `json:"steal_cores"`
}

// cpuSample is a reading of every clock a phase's cpuUse is made of.
type cpuSample struct {
	at     time.Time
	self   time.Duration
	server time.Duration
	idle   time.Duration
	host   hostCPU
}

func sampleCPU(server, idle []int) cpuSample {
	s := cpuSample{at: time.Now(), self: selfCPU()}
	for _, pid := range server {
		if d, err := procCPU(pid); err == nil {
			s.server += d
		}
	}
	for _, pid := range idle {
		if d, err := procCPU(pid); err == nil {
			s.idle += d
		}
	}
	s.host, _ = readHostCPU()
	return s
}

// cpuBetween is the CPU used from a to b.
func cpuBetween(a, b cpuSample, ncpu int) cpuUse {
	wall := b.at.Sub(a.at).Seconds()
	if wall <= 0 {
		return cpuUse{}
	}
	cores := func(d time.Duration) float64 { return d.Seconds() / wall }
	u := cpuUse{
		Loadgen: cores(b.self - a.self),
		Server:  cores(b.server - a.server),
		IdleSys: cores(b.idle - a.idle),
		Steal:   cores(b.host.Steal - a.host.Steal),
	}
	if total := b.host.Total - a.host.Total; total > 0 {
		u.HostBusy = float64(b.host.Busy-a.host.Busy) / float64(total)
	}
	u.Other = max(0, u.HostBusy*float64(ncpu)-u.Loadgen-u.Server-u.IdleSys)
	return u
}

// bound reports whether the load generator rather than the system under
// test kept the host busy: the host at 90 % of its CPUs or more, and the
// load generator using at least ratio times the server's CPU.
func (u cpuUse) bound(ratio float64) bool {
	return u.HostBusy >= 0.9 && u.Loadgen >= ratio*u.Server
}

// flagged reports whether p is flagged load-generator-bound or starved.
func (p phase) flagged() bool { return p.Bound || p.Starved }

// flags names p's flags.
func (p phase) flags() string {
	var f []string
	if p.Bound {
		f = append(f, "lg-bound")
	}
	if p.Starved {
		f = append(f, "starved")
	}
	return strings.Join(f, ",")
}

// runPhase runs op on every worker in a loop for d (or, with d = 0,
// until op returns errDone) and returns the tallies. server and idle are
// the PIDs of the system under test and of the other, idle system.
func runPhase(ctx context.Context, workers []*worker, d time.Duration, o op, server, idle []int, boundRatio float64) phase {
	for _, w := range workers {
		w.lat, w.n, w.errs, w.decisions, w.allowed, w.err, w.ends = w.lat[:0], 0, 0, 0, 0, nil, w.ends[:0]
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	before := sampleCPU(server, idle)
	var deadline time.Time
	if d > 0 {
		deadline = before.at.Add(d)
		t := time.AfterFunc(d+30*time.Second, cancel) // a request stuck past the phase
		defer t.Stop()
	}
	var wg sync.WaitGroup
	for _, w := range workers {
		wg.Go(func() {
			for ctx.Err() == nil {
				t0 := time.Now()
				if d > 0 && !t0.Before(deadline) {
					return
				}
				out, err := o(ctx, w)
				if errors.Is(err, errDone) {
					return
				}
				if err != nil {
					if ctx.Err() != nil {
						return
					}
					w.errs++
					if w.err == nil {
						w.err = err
					}
					continue
				}
				w.lat = append(w.lat, time.Since(t0))
				w.n++
				w.decisions += uint64(out.decisions)
				w.allowed += uint64(out.allowed)
				w.ends = append(w.ends, out.ends...)
			}
		})
	}
	wg.Wait()
	after := sampleCPU(server, idle)
	p := phase{Seconds: after.at.Sub(before.at).Seconds(), CPU: cpuBetween(before, after, runtime.NumCPU())}
	var lat []time.Duration
	for _, w := range workers {
		p.Requests += w.n
		p.Errors += w.errs
		p.Decisions += w.decisions
		p.Allowed += w.allowed
		if w.err != nil && p.FirstErr == "" {
			p.FirstErr = w.err.Error()
		}
		lat = append(lat, w.lat...)
		p.ends = append(p.ends, w.ends...)
	}
	if p.Seconds > 0 {
		p.PerSecond = float64(p.Decisions) / p.Seconds
		if p.Decisions == 0 { // a health phase
			p.PerSecond = float64(p.Requests) / p.Seconds
		}
	}
	p.P50Ms, p.P99Ms, p.MaxMs = percentileMs(lat, 50), percentileMs(lat, 99), percentileMs(lat, 100)
	p.Bound = p.CPU.bound(boundRatio)
	p.Starved = p.CPU.Other >= 0.75*float64(runtime.NumCPU())
	return p
}

// percentileMs is the q-th percentile of lat in milliseconds (lat is
// sorted in place); 0 for none.
func percentileMs(lat []time.Duration, q int) float64 {
	if len(lat) == 0 {
		return 0
	}
	slices.Sort(lat)
	d := lat[min(len(lat)-1, len(lat)*q/100)]
	return math.Round(float64(d.Microseconds())) / 1000
}
