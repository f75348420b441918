package main

import (
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"
)

// scenarioNames are the scenarios in the order they run.
var scenarioNames = []string{"hot", "keys", "healthz", "grpc", "cluster", "memory", "memory-mesh"}

// scenarioHelp describes each scenario for --help.
var scenarioHelp = map[string]string{
	"hot":         "one node, one hot key, HTTP: ratemesh POST /v1/allow vs Gubernator POST /v1/GetRateLimits",
	"keys":        "one node, --keys keys chosen at random, HTTP, as hot",
	"healthz":     "beside keys: each node's cheapest HTTP answer (ratemesh GET /healthz, Gubernator GET /v1/HealthCheck) in the same round, and decisions ÷ that",
	"grpc":        "one node, --keys keys, gRPC: ratemesh's Envoy RLS ShouldRateLimit vs Gubernator's V1 GetRateLimits",
	"cluster":     "three nodes, a flood on one key at all three over HTTP: admitted per window against --limit (ratemesh; Gubernator's default forwarding and its GLOBAL behaviour), and decisions/s",
	"memory":      "one fresh node per round: RSS growth per key after touching --mem-keys distinct keys once (batches of 64), again after --mem-idle, and the idle node's CPU",
	"memory-mesh": "one fresh 3-member ratemesh mesh per round: --mem-keys keys touched once at member 1 as in memory; each member's RSS growth per key once every member holds them, again after --mem-idle, and its idle CPU; against Gubernator's lone node of memory when both run",
}

// options are the harness's settings, from the flags.
type options struct {
	Quick       bool
	Rounds      int
	Phase       time.Duration
	Warmup      time.Duration
	Concurrency int
	Keys        int
	Flood       time.Duration
	Limit       int
	Window      time.Duration
	MemKeys     int
	MemIdle     time.Duration
	MeshWorkers int
	Scenarios   []string
	BinDir      string
	RatemeshBin string
	GuberBin    string
	JSON        bool
	BoundRatio  float64
	SkipFlagged bool
	KeepLogs    bool
}

// modeDefaults are the values --quick and the full mode give the flags
// that are not set explicitly.
type modeDefaults struct {
	rounds  int
	phase   time.Duration
	flood   time.Duration
	memKeys int
	memIdle time.Duration
}

var (
	quickMode = modeDefaults{rounds: 3, phase: 2 * time.Second, flood: 3 * time.Second, memKeys: 100_000, memIdle: 3 * time.Second}
	fullMode  = modeDefaults{rounds: 5, phase: 10 * time.Second, flood: 6 * time.Second, memKeys: 1_000_000, memIdle: 10 * time.Second}
)

const usageHead = `bench runs ratemesh and Gubernator v2.13.0 side by side on loopback and
drives both with one load generator in interleaved rounds: in each round
every scenario runs against both systems in turn (the order alternates
from round to round), so that whatever else the machine is doing weighs on
both alike. It prints each round, then min / median / max over the rounds
and the ratios ratemesh ÷ Gubernator.

It builds both first (go build, from this module: ratemesh through the
replace of ../, Gubernator's daemon from ./gubernator, a module of its own
on v2.13.0's own dependency versions) into --bin-dir, and kills every
process it started when it ends, on an error or on Ctrl-C.

usage: cd bench && go run . [--quick] [flags]

  go run . --quick            # about two minutes once built
  go run .                    # the full mode: 1M keys for memory, about 16 minutes, plus under a minute a round for memory-mesh
  go run . --scenarios hot,keys --rounds 7 --json

Scenarios (--scenarios, comma-separated; default all):
`

// parseOptions parses args. A bad value is an error naming its flag;
// --help prints the usage and returns flag.ErrHelp.
func parseOptions(args []string, stderr io.Writer) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.BoolVar(&o.Quick, "quick", false, "the quick mode: 3 rounds of 2 s phases, 3 s floods, 100,000 keys for memory (instead of 5 rounds of 10 s, 6 s floods, 1,000,000 keys)")
	fs.IntVar(&o.Rounds, "rounds", 0, "rounds of every scenario (default 5; 3 with --quick)")
	fs.DurationVar(&o.Phase, "phase", 0, "how long each system is driven in each throughput scenario of a round (default 10s; 2s with --quick)")
	fs.DurationVar(&o.Warmup, "warmup", time.Second, "a phase against each system before the first round, not counted: connections opened, keys created")
	fs.IntVar(&o.Concurrency, "concurrency", 64, "requests in flight: workers, each with its own keep-alive connection, closed loop")
	fs.IntVar(&o.Keys, "keys", 10_000, "distinct keys of the keys and grpc scenarios, chosen uniformly at random")
	fs.DurationVar(&o.Flood, "flood", 0, "how long each system is flooded in each round of cluster (default 6s; 3s with --quick)")
	fs.IntVar(&o.Limit, "limit", 1000, "cluster: the limit per --window of the flooded key")
	fs.DurationVar(&o.Window, "window", time.Second, "cluster: the window (whole milliseconds)")
	fs.IntVar(&o.MemKeys, "mem-keys", 0, "memory, memory-mesh: distinct keys touched once (default 1000000; 100000 with --quick)")
	fs.DurationVar(&o.MemIdle, "mem-idle", 0, "memory, memory-mesh: how long the filled nodes idle before RSS is read again and their idle CPU measured (default 10s; 3s with --quick)")
	fs.IntVar(&o.MeshWorkers, "mesh-workers", 8, "memory-mesh: workers of the fill at member 1 (with 64, three members and the load generator on 2 cores, the members starve and fence)")
	scen := fs.String("scenarios", strings.Join(scenarioNames, ","), "scenarios to run, comma-separated: "+strings.Join(scenarioNames, ", "))
	fs.StringVar(&o.BinDir, "bin-dir", "", "where the binaries are built (default: the user cache dir's ratemesh-bench)")
	fs.StringVar(&o.RatemeshBin, "ratemesh-bin", "", "use this ratemesh binary instead of building one")
	fs.StringVar(&o.GuberBin, "gubernator-bin", "", "use this Gubernator daemon instead of building ./gubernator (it must read GUBER_MEMBERLIST_NODE_NAME for cluster)")
	fs.BoolVar(&o.JSON, "json", false, "print the report as JSON on stdout (progress stays on stderr)")
	fs.Float64Var(&o.BoundRatio, "bound-ratio", 1.0, "flag a phase as load-generator-bound when the host is busy (≥ 90% of its CPUs) and the load generator used at least this many times the CPU of the system under test")
	fs.BoolVar(&o.SkipFlagged, "skip-flagged", false, "leave the phases flagged lg-bound or starved out of min/median/max and the ratios")
	fs.BoolVar(&o.KeepLogs, "keep-logs", false, "keep the temporary directory with the nodes' data and logs (its path is printed)")
	fs.Usage = func() {
		fmt.Fprint(stderr, usageHead)
		for _, s := range scenarioNames {
			fmt.Fprintf(stderr, "  %-11s %s\n", s, scenarioHelp[s])
		}
		fmt.Fprint(stderr, `
Every phase reports the CPU (in cores) of the load generator (this process),
of the system under test, of the other system (idle meanwhile) and of
everything else on the host. A phase is flagged lg-bound when the host was
busy (at least 90% of its CPUs) and the load generator used at least
--bound-ratio times the CPU of the system under test: the rate is then a
lower bound of the system's. It is flagged starved when other processes
took at least three quarters of the host's CPUs. Flagged phases are shown,
counted in the summary, and left out of it with --skip-flagged.

Flags:
`)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q (every setting is a flag; see --help)", fs.Arg(0))
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	m := fullMode
	if o.Quick {
		m = quickMode
	}
	if !set["rounds"] {
		o.Rounds = m.rounds
	}
	if !set["phase"] {
		o.Phase = m.phase
	}
	if !set["flood"] {
		o.Flood = m.flood
	}
	if !set["mem-keys"] {
		o.MemKeys = m.memKeys
	}
	if !set["mem-idle"] {
		o.MemIdle = m.memIdle
	}
	var err error
	if o.Scenarios, err = parseScenarios(*scen); err != nil {
		return nil, err
	}
	return o, o.validate()
}

// parseScenarios splits a comma-separated list of scenario names, in the
// order they run; healthz needs keys and brings it in.
func parseScenarios(s string) ([]string, error) {
	want := map[string]bool{}
	for _, n := range strings.Split(s, ",") {
		n = strings.TrimSpace(n)
		if n == "" {
			continue
		}
		if !slices.Contains(scenarioNames, n) {
			return nil, fmt.Errorf("--scenarios: unknown scenario %q (know %s)", n, strings.Join(scenarioNames, ", "))
		}
		want[n] = true
	}
	if len(want) == 0 {
		return nil, fmt.Errorf("--scenarios: empty (know %s)", strings.Join(scenarioNames, ", "))
	}
	if want["healthz"] {
		want["keys"] = true
	}
	var out []string
	for _, n := range scenarioNames {
		if want[n] {
			out = append(out, n)
		}
	}
	return out, nil
}

func (o *options) validate() error {
	switch {
	case o.Rounds < 1 || o.Rounds > 100:
		return fmt.Errorf("--rounds %d: must be between 1 and 100", o.Rounds)
	case o.Phase < 200*time.Millisecond || o.Phase > time.Hour:
		return fmt.Errorf("--phase %v: must be between 200ms and 1h", o.Phase)
	case o.Warmup < 0 || o.Warmup > time.Minute:
		return fmt.Errorf("--warmup %v: must be between 0 and 1m", o.Warmup)
	case o.Concurrency < 1 || o.Concurrency > 4096:
		return fmt.Errorf("--concurrency %d: must be between 1 and 4096", o.Concurrency)
	case o.Keys < 1 || o.Keys > 10_000_000:
		return fmt.Errorf("--keys %d: must be between 1 and 10000000", o.Keys)
	case o.Window < 100*time.Millisecond || o.Window > time.Minute || o.Window%time.Millisecond != 0:
		return fmt.Errorf("--window %v: must be whole milliseconds between 100ms and 1m", o.Window)
	case o.Flood < 2*o.Window || o.Flood > time.Hour:
		return fmt.Errorf("--flood %v: must be at least two windows (--window %v) and at most 1h", o.Flood, o.Window)
	case o.Limit < 1 || o.Limit > 1_000_000_000:
		return fmt.Errorf("--limit %d: must be between 1 and 1000000000", o.Limit)
	case o.MemKeys < 1000 || o.MemKeys > 20_000_000:
		return fmt.Errorf("--mem-keys %d: must be between 1000 and 20000000", o.MemKeys)
	case o.MemIdle < 0 || o.MemIdle > time.Hour:
		return fmt.Errorf("--mem-idle %v: must be between 0 and 1h", o.MemIdle)
	case o.MeshWorkers < 1 || o.MeshWorkers > 4096:
		return fmt.Errorf("--mesh-workers %d: must be between 1 and 4096", o.MeshWorkers)
	case o.BoundRatio <= 0:
		return fmt.Errorf("--bound-ratio %v: must be positive", o.BoundRatio)
	}
	return nil
}

// has reports whether scenario s is to run.
func (o *options) has(s string) bool { return slices.Contains(o.Scenarios, s) }
