package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"
)

// The single-node scenarios' limit: one no key reaches, so that every
// request is admitted and both systems count every one (a denial can be
// cheaper than an admission: ratemesh publishes what it admits).
var tputLimit = limitSpec{name: "tput", limit: 1_000_000_000, window: time.Second}

// configs writes ratemesh's config file (every scenario's rule) and the
// Envoy descriptor file of the grpc scenario into dir.
func configs(dir string, o *options) (cfg, envoyCfg string, err error) {
	cfg, envoyCfg = filepath.Join(dir, "ratemesh.yaml"), filepath.Join(dir, "envoy.yaml")
	// persist_min_window above the memory rule's 10 minutes: nothing is
	// persisted, as Gubernator persists nothing by default.
	y := fmt.Sprintf(`node:
  persist_min_window: 1h
rules:
  - {name: %s, algorithm: fixed_window, limit: %d, window: %dms}
  - {name: acc, algorithm: fixed_window, limit: %d, window: %dms}
  - {name: %s, algorithm: fixed_window, limit: %d, window: %dms, max_keys: %d}
`, tputLimit.name, tputLimit.limit, tputLimit.window.Milliseconds(),
		o.Limit, o.Window.Milliseconds(),
		memLimit.name, memLimit.limit, memLimit.window.Milliseconds(), o.MemKeys+2*memWarmKeys)
	if err := os.WriteFile(cfg, []byte(y), 0o644); err != nil {
		return "", "", err
	}
	e := fmt.Sprintf("domain: bench\ndescriptors:\n  - key: key\n    rate_limit: {unit: second, requests_per_unit: %d}\n", tputLimit.limit)
	if err := os.WriteFile(envoyCfg, []byte(e), 0o644); err != nil {
		return "", "", err
	}
	return cfg, envoyCfg, nil
}

// run builds both systems and runs the scenarios o names; the report
// holds whatever ran before an error or an interruption.
func run(ctx context.Context, o *options, args []string, progress io.Writer) (*report, error) {
	mode := "full"
	if o.Quick {
		mode = "quick"
	}
	rep := &report{Mode: mode, Gubernator: "v2.13.0", CPUs: runtime.NumCPU(), Concurrency: o.Concurrency,
		Rounds: o.Rounds, PhaseSec: o.Phase.Seconds(), Keys: o.Keys, Scenarios: o.Scenarios,
		Command: strings.TrimSpace("cd bench && go run . " + strings.Join(args, " "))}
	if o.has("memory") || o.has("memory-mesh") {
		rep.MemKeys = o.MemKeys
	}
	if o.has("memory") {
		rep.GuberCache = guberCacheSize(o.MemKeys)
	}
	if o.has("memory-mesh") {
		rep.MeshWorkers = o.MeshWorkers
	}
	modDir := moduleDir(ctx)
	rep.Ratemesh = ratemeshVersion(ctx, modDir)
	rmBin, gbBin, err := build(ctx, o, modDir, progress)
	if err != nil {
		return rep, err
	}
	tmp, err := os.MkdirTemp("", "ratemesh-bench-")
	if err != nil {
		return rep, err
	}
	if o.KeepLogs {
		fmt.Fprintf(progress, "bench: nodes' data and logs in %s (kept)\n", tmp)
	} else {
		defer os.RemoveAll(tmp)
	}
	ps := &procs{dir: tmp}
	defer ps.killAll()
	cfg, envoyCfg, err := configs(tmp, o)
	if err != nil {
		return rep, err
	}
	b := &bench{o: o, ps: ps, rep: rep, progress: progress, rmBin: rmBin, gbBin: gbBin, cfg: cfg, envoyCfg: envoyCfg}
	if o.has("hot") || o.has("keys") || o.has("grpc") {
		if err := b.single(ctx); err != nil {
			return rep, err
		}
	}
	if o.has("cluster") {
		if err := b.cluster(ctx); err != nil {
			return rep, err
		}
	}
	for _, s := range []string{"memory", "memory-mesh"} {
		if o.has(s) {
			if err := b.memory(ctx, s); err != nil {
				return rep, err
			}
		}
	}
	return rep, nil
}

// bench is one run's state.
type bench struct {
	o             *options
	ps            *procs
	rep           *report
	progress      io.Writer
	rmBin, gbBin  string
	cfg, envoyCfg string
}

// step is one scenario's phase against one system.
type step struct {
	scenario, system string
	d                *driver
	op               op
	server, idle     []int
}

// order is the systems' order in round r: alternating, so that neither
// always runs first (after a rest) or second.
func order[T any](r int, xs []T) []T {
	out := make([]T, len(xs))
	for i := range xs {
		out[i] = xs[(i+r)%len(xs)]
	}
	return out
}

func (b *bench) logf(format string, args ...any) {
	fmt.Fprintf(b.progress, "bench: "+format+"\n", args...)
}

func (b *bench) printPhase(r int, p phase) {
	b.logf("round %d/%d %-8s %-18s %8.0f/s p99 %6.2f ms, errors %d; cpu: load generator %.2f, server %.2f, idle system %.2f, other %.2f %s",
		r, b.o.Rounds, p.Scenario, p.System, p.PerSecond, p.P99Ms, p.Errors, p.CPU.Loadgen, p.CPU.Server, p.CPU.IdleSys, p.CPU.Other, p.flags())
}

// single runs the one-node scenarios: hot, keys (with healthz) and grpc.
func (b *bench) single(ctx context.Context) error {
	o := b.o
	b.logf("one node each: starting ratemesh and Gubernator …")
	envoyCfg := ""
	if o.has("grpc") {
		envoyCfg = b.envoyCfg
	}
	rm, err := startRatemesh(ctx, b.ps, b.rmBin, b.cfg, envoyCfg, "rm", 1)
	if err != nil {
		return err
	}
	defer b.ps.stop(rm)
	gb, err := startGubernator(ctx, b.ps, b.gbBin, "gb", 1, 0)
	if err != nil {
		return err
	}
	defer b.ps.stop(gb)
	rmD := newDriver(rm, o.Concurrency)
	defer rmD.close()
	gbD := newDriver(gb, o.Concurrency)
	defer gbD.close()
	hot, keys := []string{"hot"}, keyNames("k", o.Keys)
	var steps [][2]step // per scenario: ratemesh, gubernator
	add := func(s string, rmOp, gbOp op) {
		steps = append(steps, [2]step{
			{scenario: s, system: "ratemesh", d: rmD, op: rmOp, server: rm.pids(), idle: gb.pids()},
			{scenario: s, system: "gubernator", d: gbD, op: gbOp, server: gb.pids(), idle: rm.pids()},
		})
	}
	for _, s := range o.Scenarios {
		switch s {
		case "hot", "keys":
			k := hot
			if s == "keys" {
				k = keys
			}
			rmOp, err := rmD.rmAllow(tputLimit, k, false)
			if err != nil {
				return err
			}
			gbOp, err := gbD.gbHTTP(tputLimit, k, false)
			if err != nil {
				return err
			}
			add(s, rmOp, gbOp)
		case "healthz":
			add(s, rmD.rmHealthz(), gbD.gbHealth())
		case "grpc":
			rmOp, err := rmD.rmRLS(keys)
			if err != nil {
				return err
			}
			add(s, rmOp, gbD.gbGRPC(tputLimit, keys))
		}
	}
	if o.Warmup > 0 {
		for _, pair := range steps {
			for _, st := range pair {
				b.logf("warm-up: %s, %s, %v", st.scenario, st.system, o.Warmup)
				p := runPhase(ctx, st.d.workers, o.Warmup, st.op, st.server, st.idle, o.BoundRatio)
				if err := ctx.Err(); err != nil {
					return err
				}
				if p.Requests == 0 {
					return fmt.Errorf("warm-up of %s against %s: no request succeeded: %s", st.scenario, st.system, p.FirstErr)
				}
			}
		}
	}
	for r := 1; r <= o.Rounds; r++ {
		for _, pair := range steps {
			for _, st := range order(r-1, pair[:]) {
				p := runPhase(ctx, st.d.workers, o.Phase, st.op, st.server, st.idle, o.BoundRatio)
				if err := ctx.Err(); err != nil {
					return err
				}
				p.Scenario, p.System = st.scenario, st.system
				b.printPhase(r, p)
				rr := b.rep.round(r)
				rr.Phases = append(rr.Phases, p)
			}
		}
	}
	return nil
}

// cluster runs three nodes of each system and floods one key at all
// three, each round a new key: ratemesh, Gubernator's default behaviour
// (a non-owner forwards to the key's owner, batched) and its GLOBAL one
// (every node answers from its copy; the owner broadcasts the state).
func (b *bench) cluster(ctx context.Context) error {
	o := b.o
	b.logf("three nodes each: starting ratemesh and Gubernator (127.0.0.1, .2, .3) …")
	rm, err := startRatemesh(ctx, b.ps, b.rmBin, b.cfg, "", "rm3", 3)
	if err != nil {
		return err
	}
	defer b.ps.stop(rm)
	gb, err := startGubernator(ctx, b.ps, b.gbBin, "gb3", 3, 0)
	if err != nil {
		return err
	}
	defer b.ps.stop(gb)
	rmD := newDriver(rm, o.Concurrency)
	defer rmD.close()
	gbD := newDriver(gb, o.Concurrency)
	defer gbD.close()
	acc := limitSpec{name: "acc", limit: int64(o.Limit), window: o.Window}
	global := acc
	global.behavior = guberGlobal
	type sys struct {
		name         string
		d            *driver
		server, idle []int
		op           func(key string) (op, error)
	}
	systems := []sys{
		{"ratemesh", rmD, rm.pids(), gb.pids(), func(k string) (op, error) { return rmD.rmAllow(acc, []string{k}, true) }},
		{"gubernator", gbD, gb.pids(), rm.pids(), func(k string) (op, error) { return gbD.gbHTTP(acc, []string{k}, true) }},
		{"gubernator GLOBAL", gbD, gb.pids(), rm.pids(), func(k string) (op, error) { return gbD.gbHTTP(global, []string{k}, true) }},
	}
	flood := (o.Flood + o.Window - 1) / o.Window * o.Window // whole windows
	for _, s := range systems {
		if o.Warmup <= 0 {
			break
		}
		f, err := s.op("warm-" + strings.ReplaceAll(s.name, " ", "-"))
		if err != nil {
			return err
		}
		b.logf("warm-up: cluster, %s, %v", s.name, o.Warmup)
		if p := runPhase(ctx, s.d.workers, o.Warmup, f, s.server, s.idle, o.BoundRatio); p.Requests == 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
			return fmt.Errorf("warm-up of cluster against %s: no request succeeded: %s", s.name, p.FirstErr)
		}
	}
	for r := 1; r <= o.Rounds; r++ {
		for _, s := range order(r-1, systems) {
			f, err := s.op(fmt.Sprintf("flood-%d-%s", r, strings.ReplaceAll(s.name, " ", "-")))
			if err != nil {
				return err
			}
			start := alignedStart(time.Now(), o.Window, 50*time.Millisecond)
			if !sleepCtx(ctx, time.Until(start)) {
				return ctx.Err()
			}
			p := runPhase(ctx, s.d.workers, flood, f, s.server, s.idle, o.BoundRatio)
			if err := ctx.Err(); err != nil {
				return err
			}
			p.Scenario, p.System = "cluster", s.name
			a := judgeWindows(p.ends, start, start.Add(flood), o.Window, acc.limit)
			p.Accuracy = &a
			b.printPhase(r, p)
			b.logf("round %d/%d cluster  %-18s admitted per whole window %v of %d; busiest %.3f, first %.3f of the limit",
				r, o.Rounds, s.name, a.PerWindow, a.Limit, a.MaxRatio, a.FirstRatio)
			rr := b.rep.round(r)
			rr.Phases = append(rr.Phases, p)
		}
	}
	return nil
}

// memory runs a memory scenario: each round, fresh nodes of each system
// in turn; for memory a lone node of each, for memory-mesh a 3-member
// ratemesh mesh (the keys are touched at its first member).
func (b *bench) memory(ctx context.Context, scenario string) error {
	o := b.o
	type setup struct {
		system string
		nodes  int
	}
	setups, prefix, what := []setup{{"ratemesh", 1}, {"gubernator", 1}}, "mem", "node"
	if scenario == "memory-mesh" {
		setups, prefix, what = []setup{{"ratemesh", 3}}, "memmesh", "3-member mesh"
	}
	keys := keyNames("m", o.MemKeys)
	for r := 1; r <= o.Rounds; r++ {
		for _, su := range order(r-1, setups) {
			name := fmt.Sprintf("%s%d-%s", prefix, r, su.system[:2])
			b.logf("round %d/%d %s: a fresh %s %s, %s keys …", r, o.Rounds, scenario, su.system, what, count(o.MemKeys))
			var c *cluster
			var err error
			if su.system == "ratemesh" {
				c, err = startRatemesh(ctx, b.ps, b.rmBin, b.cfg, "", name, su.nodes)
			} else {
				c, err = startGubernator(ctx, b.ps, b.gbBin, name, su.nodes, guberCacheSize(o.MemKeys))
			}
			if err != nil {
				return err
			}
			m := measureMemory(ctx, c, o, keys, nil)
			b.ps.stop(c)
			if err := ctx.Err(); err != nil {
				return err
			}
			m.Scenario = scenario
			for _, line := range m.lines() {
				b.logf("round %d/%d %s %s", r, o.Rounds, scenario, line)
			}
			rr := b.rep.round(r)
			rr.Memory = append(rr.Memory, m)
		}
	}
	return nil
}
