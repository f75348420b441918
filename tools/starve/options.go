package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
)

// options are the harness's flags; defaultOptions gives each default.
type options struct {
	Bin        string
	OldBin     string
	Nodes      int
	Limit      int
	Window     time.Duration
	Policy     string
	Scenario   string
	Duration   time.Duration
	Flood      float64
	Keys       int
	KeyRate    float64
	Workers    int
	Busy       int
	CPUMax     string
	Pauses     bool
	PauseEvery time.Duration
	Seed       int64
	Signal     string
	Burst      int
	BurstLimit int
	ShareWait  time.Duration
	Bound      float64
	Verbose    bool
	JSON       bool

	quota, period int // parsed from CPUMax, in µs; 0 when unset
}

func defaultOptions() options {
	return options{
		Nodes:      3,                // the mesh
		Limit:      100,              // a flood of 10× stays within a 2-core host's reach
		Window:     time.Second,      // the window the bound is about
		Policy:     "strict",         // serve's default
		Scenario:   "soak",           // the flood for --duration
		Duration:   60 * time.Second, // long enough for the load average to climb
		Flood:      10,               // the 10× flood on one hot key
		Keys:       20000,            // the rotating keys
		KeyRate:    200,              // rotating-key requests per second, on top of the flood
		Workers:    64,               // keep-alive connections of the flood: enough for 1000/s at 60 ms a request
		PauseEvery: time.Second,      // mean gap between two pauses
		Seed:       1,
		Signal:     "kill", // a rolling restart by crash
		Burst:      900,    // the burst …
		BurstLimit: 1000,   // … under a limit of 1000
		Bound:      1.02,   // the bound on a window
	}
}

// parseFlags parses args (without the program name). Errors name the
// flag; -h returns flag.ErrHelp after printing the usage to out.
func parseFlags(args []string, out io.Writer) (options, error) {
	o := defaultOptions()
	fs := flag.NewFlagSet("starve", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.Usage = func() {
		fmt.Fprintf(out, "usage: go run ./tools/starve [flags]\n\n%s\n\nflags:\n", usageText)
		fs.PrintDefaults()
	}
	fs.StringVar(&o.Bin, "bin", o.Bin, "the ratemesh binary (default: build ./cmd/ratemesh into the run's temp dir); upgrade: the new build")
	fs.StringVar(&o.OldBin, "old-bin", o.OldBin, "upgrade: the binary of the release the cluster starts on (required)")
	fs.IntVar(&o.Nodes, "nodes", o.Nodes, "serve processes, 1 to 9 (crash: at least 3)")
	fs.IntVar(&o.Limit, "limit", o.Limit, "the hot rule's limit per window")
	fs.DurationVar(&o.Window, "window", o.Window, "the hot rule's window, 100ms to 10s")
	fs.StringVar(&o.Policy, "policy", o.Policy, "mesh.partition_policy: strict or available")
	fs.StringVar(&o.Scenario, "scenario", o.Scenario, "soak, rolling, upgrade, crash or burst")
	fs.DurationVar(&o.Duration, "duration", o.Duration, "how long the load runs (rolling: before and after the restarts, at least; upgrade: the restarts spread over it)")
	fs.Float64Var(&o.Flood, "flood", o.Flood, "the hot key's offered rate as a multiple of the limit, 0 to 100")
	fs.IntVar(&o.Keys, "keys", o.Keys, "rotating keys, 0 to 1000000")
	fs.Float64Var(&o.KeyRate, "key-rate", o.KeyRate, "requests per second over the rotating keys")
	fs.IntVar(&o.Workers, "workers", o.Workers, "keep-alive connections of the flood, 1 to 1024")
	fs.IntVar(&o.Busy, "busy", o.Busy, "busy-loop processes per core, 0 to 64")
	fs.StringVar(&o.CPUMax, "cpu-max", o.CPUMax, "QUOTA/PERIOD in µs: a cgroup CPU quota on the serve processes (e.g. 50000/100000)")
	fs.BoolVar(&o.Pauses, "pauses", o.Pauses, "pause serve processes at random (SIGSTOP for 50–500 ms, then SIGCONT)")
	fs.DurationVar(&o.PauseEvery, "pause-every", o.PauseEvery, "mean gap between two pauses")
	fs.Int64Var(&o.Seed, "seed", o.Seed, "seeds the pauses")
	fs.StringVar(&o.Signal, "signal", o.Signal, "rolling, upgrade: kill (SIGKILL) or term (SIGTERM)")
	fs.IntVar(&o.Burst, "burst", o.Burst, "burst: requests in one window, all to be admitted")
	fs.IntVar(&o.BurstLimit, "burst-limit", o.BurstLimit, "burst: the burst rule's limit per window")
	fs.DurationVar(&o.ShareWait, "share-wait", o.ShareWait, "share_wait of both rules (default: the node's, stretched as acknowledgements slow)")
	fs.Float64Var(&o.Bound, "bound", o.Bound, "a window fails above bound × limit")
	fs.BoolVar(&o.Verbose, "verbose", o.Verbose, "print a line per counted window and the events as they happen")
	fs.BoolVar(&o.JSON, "json", o.JSON, "print the summary as JSON on stdout")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	return o, o.validate()
}

const usageText = `starve runs ratemesh serve processes on 127.0.0.1 on a host kept busy
(busy loops, a cgroup CPU quota, random SIGSTOP pauses), floods a hot key,
and counts every window's admissions at the servers (/v1/usage?window=N,
each node's own slot) and at the clients (each admitted answer's window,
from its reset_after_ms). It exits 1 when a window admits more than
--bound × --limit, a burst admits fewer than --burst, a node logs a clock
skew, or a request is denied as joining.

--scenario upgrade starts the cluster on --old-bin and brings each node
back on --bin, one at a time, under the load; it also fails when a node's
join times out or a node refuses a peer's batch as malformed. An old
release to start on:

  git worktree add --detach /tmp/rm-821b92d 821b92d
  (cd /tmp/rm-821b92d && go build -o /tmp/ratemesh-821b92d ./cmd/ratemesh)
  go run ./tools/starve --scenario upgrade --old-bin /tmp/ratemesh-821b92d --flood 3`

// validate checks o; its errors name the flag.
func (o *options) validate() error {
	var errs []error
	bad := func(flag, format string, args ...any) {
		errs = append(errs, fmt.Errorf("--%s: %s", flag, fmt.Sprintf(format, args...)))
	}
	switch o.Scenario {
	case "soak", "rolling", "upgrade", "crash", "burst":
	default:
		bad("scenario", "%q is not soak, rolling, upgrade, crash or burst", o.Scenario)
	}
	switch {
	case o.Scenario == "upgrade" && o.OldBin == "":
		bad("old-bin", "the upgrade scenario needs the old release's binary to start on")
	case o.Scenario != "upgrade" && o.OldBin != "":
		bad("old-bin", "only the upgrade scenario starts on another binary, not %s", o.Scenario)
	}
	if o.Nodes < 1 || o.Nodes > 9 {
		bad("nodes", "%d is not within 1 to 9", o.Nodes)
	} else if o.Nodes < 3 && o.Scenario == "crash" {
		bad("nodes", "a crash under strict needs at least 3 nodes, got %d", o.Nodes)
	} else if o.Nodes < 2 && (o.Scenario == "rolling" || o.Scenario == "upgrade") {
		bad("nodes", "a rolling restart needs at least 2 nodes, got %d", o.Nodes)
	}
	if o.Limit < 1 || o.Limit > 1_000_000 {
		bad("limit", "%d is not within 1 to 1000000", o.Limit)
	}
	if o.Window < 100*time.Millisecond || o.Window > 10*time.Second || o.Window%time.Millisecond != 0 {
		bad("window", "%v is not a whole number of milliseconds within 100ms to 10s", o.Window)
	}
	switch o.Policy {
	case "strict", "available":
	default:
		bad("policy", "%q is not strict or available", o.Policy)
	}
	if o.Duration < 2*time.Second || o.Duration > 30*time.Minute {
		bad("duration", "%v is not within 2s to 30m", o.Duration)
	} else if o.Scenario == "crash" && o.Duration < 6*time.Second {
		bad("duration", "a crash needs at least 6s of load, got %v", o.Duration)
	}
	if !(o.Flood >= 0 && o.Flood <= 100) { // also NaN
		bad("flood", "%v is not within 0 to 100", o.Flood)
	}
	if o.Keys < 0 || o.Keys > 1_000_000 {
		bad("keys", "%d is not within 0 to 1000000", o.Keys)
	}
	if !(o.KeyRate >= 0 && o.KeyRate <= 100_000) {
		bad("key-rate", "%v is not within 0 to 100000", o.KeyRate)
	}
	if o.Workers < 1 || o.Workers > 1024 {
		bad("workers", "%d is not within 1 to 1024", o.Workers)
	}
	if o.Busy < 0 || o.Busy > 64 {
		bad("busy", "%d is not within 0 to 64", o.Busy)
	}
	if o.CPUMax != "" {
		q, p, err := parseCPUMax(o.CPUMax)
		if err != nil {
			bad("cpu-max", "%v", err)
		}
		o.quota, o.period = q, p
	}
	if o.PauseEvery < 10*time.Millisecond || o.PauseEvery > time.Minute {
		bad("pause-every", "%v is not within 10ms to 1m", o.PauseEvery)
	}
	switch o.Signal {
	case "kill", "term":
	default:
		bad("signal", "%q is not kill or term", o.Signal)
	}
	if o.BurstLimit < 1 || o.BurstLimit > 1_000_000 {
		bad("burst-limit", "%d is not within 1 to 1000000", o.BurstLimit)
	}
	if o.Burst < 1 || o.Burst > o.BurstLimit || o.Burst > 100_000 {
		bad("burst", "%d is not within 1 to --burst-limit (%d) and 100000", o.Burst, o.BurstLimit)
	}
	if o.ShareWait < 0 || o.ShareWait > time.Second || o.ShareWait%time.Millisecond != 0 {
		bad("share-wait", "%v is not a whole number of milliseconds within 0 to 1s", o.ShareWait)
	}
	if !(o.Bound >= 1 && o.Bound <= 10) {
		bad("bound", "%v is not within 1 to 10", o.Bound)
	}
	return errors.Join(errs...)
}

// parseCPUMax parses "QUOTA/PERIOD" (µs, as cgroup v2's cpu.max) or
// "QUOTA" (period 100000).
func parseCPUMax(s string) (quota, period int, err error) {
	qs, ps, found := strings.Cut(s, "/")
	period = 100000
	if found {
		if period, err = strconv.Atoi(ps); err != nil || period < 1000 || period > 1_000_000 {
			return 0, 0, fmt.Errorf("period %q is not a number of µs within 1000 to 1000000", ps)
		}
	}
	if quota, err = strconv.Atoi(qs); err != nil || quota < 1000 || quota > 64*period {
		return 0, 0, fmt.Errorf("quota %q is not a number of µs within 1000 to 64 × the period", qs)
	}
	return quota, period, nil
}

// hotRate is the flood's offered rate per second.
func (o *options) hotRate() float64 {
	return o.Flood * float64(o.Limit) / o.Window.Seconds()
}
