package main

import (
	"context"
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestRLSServerAB compares ratemesh binaries' servers under the grpc
// scenario's load (64 grpcConn workers, ShouldRateLimit on 10,000 keys),
// phase by phase, alternating the order every round, and prints each
// phase and the median ratio of each binary's server CPU a decision to
// the first's. It runs only when BENCH_RLS_AB names the binaries:
//
//	BENCH_RLS_AB=base=/tmp/rm-a,new=/tmp/rm-b [BENCH_RLS_ROUNDS=10] [BENCH_RLS_PHASE=3s] \
//	  [BENCH_RLS_MAX_OTHER=0.1] go test -run RLSServerAB -v -timeout 1h
//
// The summary leaves out every round in which a phase saw other
// processes use more than BENCH_RLS_MAX_OTHER cores (default: none left
// out): on a shared host, what others run moves the CPU a call by ±20 %.
//
// Every binary serves for the whole test (an idle node costs little),
// as in the harness with the harness's config files.
func TestRLSServerAB(t *testing.T) {
	spec := os.Getenv("BENCH_RLS_AB")
	if spec == "" {
		t.Skip("BENCH_RLS_AB is not set")
	}
	rounds, phaseLen, maxOther := 10, 3*time.Second, math.Inf(1)
	if v := os.Getenv("BENCH_RLS_MAX_OTHER"); v != "" {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			t.Fatal(err)
		}
		maxOther = f
	}
	if v := os.Getenv("BENCH_RLS_ROUNDS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			t.Fatal(err)
		}
		rounds = n
	}
	if v := os.Getenv("BENCH_RLS_PHASE"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatal(err)
		}
		phaseLen = d
	}
	type bin struct {
		name, path string
		c          *cluster
		d          *driver
		o          op
		cpu        []float64 // server µs a decision, by round
		lg         []float64 // load generator µs a decision
		rate       []float64
	}
	var bins []*bin
	for _, f := range strings.Split(spec, ",") {
		name, path, ok := strings.Cut(f, "=")
		if !ok {
			t.Fatalf("BENCH_RLS_AB: %q is not name=path", f)
		}
		bins = append(bins, &bin{name: name, path: path})
	}
	ctx := context.Background()
	ps := &procs{dir: t.TempDir()}
	defer ps.killAll()
	o, err := parseOptions(nil, os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	cfg, envoyCfg, err := configs(ps.dir, o)
	if err != nil {
		t.Fatal(err)
	}
	keys := keyNames("k", o.Keys)
	for _, b := range bins {
		if b.c, err = startRatemesh(ctx, ps, b.path, cfg, envoyCfg, b.name, 1); err != nil {
			t.Fatal(err)
		}
		b.d = newDriver(b.c, o.Concurrency)
		defer b.d.close()
		if b.o, err = b.d.rmRLS(keys); err != nil {
			t.Fatal(err)
		}
	}
	others := func(b *bin) []int {
		var p []int
		for _, x := range bins {
			if x != b {
				p = append(p, x.c.pids()...)
			}
		}
		return p
	}
	for _, b := range bins { // warm: connections, keys
		runPhase(ctx, b.d.workers, time.Second, b.o, b.c.pids(), others(b), 1)
	}
	for r := range rounds {
		order := slices.Clone(bins)
		if r%2 == 1 {
			slices.Reverse(order)
		}
		quiet := true
		for _, b := range order {
			p := runPhase(ctx, b.d.workers, phaseLen, b.o, b.c.pids(), others(b), 1)
			if p.Errors > 0 || p.Decisions == 0 {
				t.Fatalf("%s: %d errors, %d decisions: %s", b.name, p.Errors, p.Decisions, p.FirstErr)
			}
			per := func(cores float64) float64 { return cores * p.Seconds / float64(p.Decisions) * 1e6 }
			b.cpu, b.lg, b.rate = append(b.cpu, per(p.CPU.Server)), append(b.lg, per(p.CPU.Loadgen)), append(b.rate, p.PerSecond)
			quiet = quiet && p.CPU.Other <= maxOther
			t.Logf("round %2d %-8s %7.0f/s  server %5.1f µs  loadgen %5.1f µs  other %.2f cores  idle %.2f  steal %.2f",
				r, b.name, p.PerSecond, per(p.CPU.Server), per(p.CPU.Loadgen), p.CPU.Other, p.CPU.IdleSys, p.CPU.Steal)
		}
		if !quiet { // drop the round from every binary's tallies
			for _, b := range bins {
				b.cpu, b.lg, b.rate = b.cpu[:len(b.cpu)-1], b.lg[:len(b.lg)-1], b.rate[:len(b.rate)-1]
			}
		}
	}
	if len(bins[0].cpu) == 0 {
		t.Skipf("no round with other processes at or under %.2f cores", maxOther)
	}
	t.Logf("%d of %d rounds kept", len(bins[0].cpu), rounds)
	median := func(v []float64) float64 {
		v = slices.Clone(v)
		slices.Sort(v)
		if len(v)%2 == 1 {
			return v[len(v)/2]
		}
		return (v[len(v)/2-1] + v[len(v)/2]) / 2
	}
	base := bins[0]
	for _, b := range bins {
		var cpuR, rateR []float64
		for i := range b.cpu {
			cpuR = append(cpuR, b.cpu[i]/base.cpu[i])
			rateR = append(rateR, b.rate[i]/base.rate[i])
		}
		t.Logf("%-8s server %5.1f µs (median; %5.1f–%5.1f)  loadgen %5.1f µs  rate %6.0f/s  ÷ %s: server CPU %.3f, rate %.3f (medians of the rounds' ratios; CPU %.3f–%.3f)",
			b.name, median(b.cpu), slices.Min(b.cpu), slices.Max(b.cpu), median(b.lg), median(b.rate), base.name,
			median(cpuR), median(rateR), slices.Min(cpuR), slices.Max(cpuR))
	}
	fmt.Fprintln(os.Stderr)
}
