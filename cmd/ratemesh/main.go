// Command ratemesh is the ratemesh CLI. Each subcommand has its own flag
// set.
//
//	ratemesh serve [--config FILE] [--listen MULTIADDR]... [--api HOST:PORT] [--grpc HOST:PORT] [--envoy-config PATH]
//	               [--data-dir DIR] [--bootstrap MULTIADDR]... [--psk-file FILE] [--pprof HOST:PORT] …
//	               (every flag also reads RATEMESH_<FLAG>: RATEMESH_DATA_DIR)
//	ratemesh demo [--duration D] [--limit N] [--json]
//	ratemesh sim --scenario FILE [--seed N] [--out DIR] [--json]
//	ratemesh check [--api ADDR] --rule NAME --key KEY [--cost N] [--type T --units N] [--class NAME] [--json]
//	ratemesh peers [--api ADDR] [--json]
//	ratemesh peers evict PEER_ID [--api ADDR]
//	ratemesh bench --api ADDR... [--rule NAME] [--keys N] [--concurrency N] [--duration D] [--baseline D] [--grpc ADDR...] [--json]
//	ratemesh validate --config FILE [--envoy-config PATH]
//	ratemesh version                   # or ratemesh --version
//	ratemesh help [COMMAND]            # a command's flags
//
// ADDR is HOST:PORT or a URL; check's and peers' default is $RATEMESH_API,
// else 127.0.0.1:8080 (serve's). With --json, stdout carries only the JSON;
// progress and logs go to stderr.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"strings"

	"github.com/ratemesh/ratemesh/simulator"
)

// command is one subcommand: its name, a one-line synopsis, what it does,
// and its entry point, which returns the process exit code.
type command struct {
	name, synopsis, description string
	run                         func(args []string, stdout, stderr io.Writer) int
}

func commands() []command {
	return []command{
		{"serve", serveUsage, "Run a peer: the HTTP API, the mesh, persistence, and optionally Envoy's rate limit service over gRPC.", runServe},
		{"demo", "demo [--duration D] [--limit N] [--json]", "Start 3 nodes on loopback, offer 5x a limit and show whether the mesh holds it.", runDemo},
		{"sim", "sim --scenario FILE [--seed N] [--out DIR] [--json]", "Simulate hundreds of nodes under a virtual clock and report accuracy and bandwidth.", runSim},
		{"check", "check [--api ADDR] --rule NAME --key KEY [--cost N] [--type T --units N] [--class NAME] [--json]", "Ask a node whether one request may proceed.", runCheck},
		{"peers", "peers [--api ADDR] [--json] | peers evict PEER_ID [--api ADDR]", "Show a node's member table, or evict a silent member.", runPeers},
		{"bench", "bench --api ADDR... [--rule NAME] [--keys N] [--concurrency N] [--duration D] [--baseline D] [--grpc ADDR...] [--json]", "Measure decisions per second over HTTP (and over gRPC) against running nodes.", runBench},
		{"validate", "validate --config FILE [--envoy-config PATH]", "Check a config file (and envoyproxy/ratelimit descriptor files) without starting: exit 0, or the errors naming the field.", runValidate},
		{"version", "version", "Print the version, the commit and the Go version (also: ratemesh --version).", runVersion},
	}
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: ratemesh <command> [flags]    (ratemesh help <command> for its flags)")
	fmt.Fprintln(w, "commands:")
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-9s %s\n", c.name, c.description)
	}
	fmt.Fprintln(w, "synopses:")
	for _, c := range commands() {
		fmt.Fprintf(w, "  ratemesh %s\n", c.synopsis)
	}
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stderr)
		return 2
	}
	switch args[0] {
	case "help", "-h", "--help":
		if len(args) > 1 && args[0] == "help" {
			return runHelp(args[1:], stdout, stderr)
		}
		usage(stdout)
		return 0
	case "--version", "-version":
		return runVersion(args[1:], stdout, stderr)
	}
	for _, c := range commands() {
		if c.name == args[0] {
			return c.run(args[1:], stdout, stderr)
		}
	}
	fmt.Fprintf(stderr, "ratemesh: unknown command %q\n", args[0])
	usage(stderr)
	return 2
}

// runHelp prints a command's help (its synopsis, description and
// flags) on stdout: ratemesh help serve.
func runHelp(args []string, stdout, stderr io.Writer) int {
	if len(args) != 1 {
		fmt.Fprintln(stderr, "usage: ratemesh help [COMMAND]")
		return 2
	}
	for _, c := range commands() {
		if c.name == args[0] {
			// Every command's --help prints its usage on its output
			// and exits 0.
			return c.run([]string{"--help"}, stdout, stdout)
		}
	}
	fmt.Fprintf(stderr, "ratemesh help: unknown command %q\n", args[0])
	usage(stderr)
	return 2
}

func runSim(args []string, stdout, stderr io.Writer) int {
	fset := flag.NewFlagSet("sim", flag.ContinueOnError)
	setUsage(fset, stderr)
	scenario := fset.String("scenario", "", "scenario YAML `file` (or the name of a built-in scenario: "+strings.Join(simulator.Library(), ", ")+")")
	seed := fset.Uint64("seed", 0, "replace the scenario's seed")
	out := fset.String("out", "", "write windows.csv, seconds.csv, nodes.csv and SVG plots into `dir`")
	asJSON := fset.Bool("json", false, "print only the JSON summary on stdout")
	workers := fset.Int("workers", runtime.GOMAXPROCS(0), "goroutines that step receivers in parallel (changes the wall time only, never the result)")
	cpuProfile := fset.String("cpuprofile", "", "write a CPU profile of the run to `file` (for tuning the engine)")
	if err := fset.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if *scenario == "" || fset.NArg() > 0 {
		fmt.Fprintln(stderr, "usage: ratemesh sim --scenario FILE [--seed N] [--out DIR] [--json]")
		return 2
	}
	data, err := os.ReadFile(*scenario)
	if errors.Is(err, fs.ErrNotExist) && !strings.ContainsAny(*scenario, "/.") {
		data, err = simulator.LibraryScenario(*scenario)
	}
	if err != nil {
		fmt.Fprintf(stderr, "ratemesh sim: %v\n", err)
		return 1
	}
	sc, err := simulator.Parse(data)
	if err != nil {
		fmt.Fprintf(stderr, "ratemesh sim: %s: %v\n", *scenario, err)
		return 1
	}
	for _, w := range sc.Warnings {
		fmt.Fprintf(stderr, "ratemesh sim: %s: warning: %s\n", *scenario, w)
	}
	simMemory()
	opt := simulator.Options{Progress: stderr, Workers: *workers}
	fset.Visit(func(f *flag.Flag) {
		if f.Name == "seed" {
			opt.Seed = seed
		}
	})
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			fmt.Fprintf(stderr, "ratemesh sim: %v\n", err)
			return 1
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintf(stderr, "ratemesh sim: %v\n", err)
			return 1
		}
		defer pprof.StopCPUProfile()
	}
	res, err := simulator.Run(sc, opt)
	if err != nil {
		fmt.Fprintf(stderr, "ratemesh sim: %v\n", err)
		return 1
	}
	if *out != "" {
		if err := res.WriteFiles(*out); err != nil {
			fmt.Fprintf(stderr, "ratemesh sim: %v\n", err)
			return 1
		}
	}
	if *asJSON {
		err = res.WriteJSON(stdout)
	} else {
		err = res.WriteTable(stdout)
	}
	if err != nil {
		fmt.Fprintf(stderr, "ratemesh sim: %v\n", err)
		return 1
	}
	return 0
}

// simMemoryLimit is the heap a simulation keeps to unless GOMEMLIMIT says
// otherwise. scale-1000 holds about 1.5 GB live; with the collector's
// default (GOGC 100: a heap of twice the live) it peaked at 3.6 GB, and
// it ran the collector more often than it needed to.
const simMemoryLimit = 3 << 30

// simMemory sets the collector of a simulation: a soft heap limit of
// simMemoryLimit, and collections only as the heap nears it or grows to
// five times what was live (GOGC 400), unless GOMEMLIMIT or GOGC are set.
// A simulation's heap is mostly state that lives as long as the run, so
// collecting at twice the live heap repeats the same marking for little.
// A scenario whose live state outgrows the limit still runs, with the
// collector working harder: raise GOMEMLIMIT for it.
func simMemory() {
	if os.Getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(simMemoryLimit)
	}
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(400)
	}
}
