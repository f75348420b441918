// Command starve is the starvation harness of issue 26: it runs `ratemesh
// serve` processes on 127.0.0.1 on a host kept busy by other processes
// (busy loops per core, a cgroup CPU quota, random SIGSTOP pauses), offers
// a flood on one hot key and rotating keys, and counts each window's
// admissions at the servers: after window W ends, every node's
// GET /v1/usage?window=W, each node's own slot. It exits 0 when every
// window stayed within --bound × --limit (and every burst was admitted
// whole), 1 when not, 2 on bad flags or a failed setup, 130 when
// interrupted (SIGINT, SIGTERM) with no failure so far; it kills every
// process it started before it exits.
//
//	go run ./tools/starve --scenario soak --duration 60s --busy 4 --pauses
//	go run ./tools/starve --scenario rolling --busy 4 --pauses
//	go run ./tools/starve --scenario crash --duration 20s --busy 4 --pauses
//	go run ./tools/starve --scenario burst --duration 20s --busy 4 --pauses
//
// docs/experiments.md ("Starved hosts") has the figures of real runs.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	os.Exit(realMain(os.Args[1:], os.Stdout, os.Stderr))
}

// realMain runs the harness and returns the exit status.
func realMain(args []string, stdout, stderr io.Writer) int {
	o, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "starve: %v\n", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	s, err := run(ctx, o, stderr, rand.New(rand.NewSource(o.Seed)))
	if err != nil {
		fmt.Fprintf(stderr, "starve: %v\n", err)
		return 2
	}
	if o.JSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(s); err != nil {
			fmt.Fprintf(stderr, "starve: %v\n", err)
			return 2
		}
	} else {
		printSummary(stdout, s)
	}
	switch {
	case !s.Pass:
		return 1
	case s.Interrupted:
		return 130
	}
	return 0
}

// printSummary writes s for people.
func printSummary(w io.Writer, s *summary) {
	fmt.Fprintf(w, "starve: %s, %d nodes, %s, limit %d per %dms, seed %d, %.1f s\n",
		s.Scenario, s.Nodes, s.Policy, s.Limit, s.WindowMs, s.Seed, s.ElapsedSec)
	st := s.Starve
	quota := "no cpu quota"
	if st.CPUMax != "" {
		quota = "cpu-max " + st.CPUMax + " (" + st.Cgroup + ")"
	}
	fmt.Fprintf(w, "starvation: %d busy loops, %s, %d pauses (%.1f s paused); load average (1 min) %.2f before, max %.2f, at the end %.2f; %.1f runnable on average\n",
		st.BusyProcs, quota, st.Pauses, float64(st.PausedMs)/1000, st.LoadAvg1Start, st.LoadAvg1Max, st.LoadAvg1End, st.RunnableAvg)
	l := s.Load
	fmt.Fprintf(w, "load: hot key %.0f/s asked, %.0f/s offered (%d admitted); rotating keys %.0f/s asked, %.0f/s offered; %d sent, %d failed, %d send slots missed, over %.1f s\n",
		l.HotTarget, l.HotOffered, l.HotAllowed, l.KeysTarget, l.KeysOffered, l.Sent, l.Failed, l.Missed, l.Seconds)
	for _, e := range s.Events {
		fmt.Fprintf(w, "event: %s\n", e)
	}
	if s.Counted > 0 {
		worst := s.Windows[0]
		for _, x := range s.Windows {
			if x.Window == s.WorstWindow {
				worst = x
			}
		}
		fmt.Fprintf(w, "windows: %d counted at the servers, worst %.3f (window %d: %d of %d), %d over %.2f × the limit, mean %.1f, %d incomplete\n",
			s.Counted, s.WorstRatio, s.WorstWindow, worst.Admitted, s.Limit, s.Over, s.Bound, s.MeanAdmitted, s.Incomplete)
	} else {
		fmt.Fprintf(w, "windows: none counted\n")
	}
	for _, b := range s.Bursts {
		fmt.Fprintf(w, "burst %s (window %d): %d of %d admitted in %d ms, %d at the servers, %d failed, %v; pauses during it: %v\n",
			b.Key, b.Window, b.Allowed, b.Sent, b.TookMs, b.Admitted, b.Failed, b.Reasons, b.Pauses)
	}
	fmt.Fprintf(w, "skew lines (%q): %d\n", skewMarker, len(s.SkewLines))
	for _, l := range s.SkewLines {
		fmt.Fprintf(w, "  %s\n", l)
	}
	for _, x := range s.Warnings {
		fmt.Fprintf(w, "warning: %s\n", x)
	}
	if s.Pass {
		fmt.Fprintf(w, "PASS\n")
		return
	}
	for _, f := range s.Failures {
		fmt.Fprintf(w, "FAIL: %s\n", f)
	}
}

// windowLine is the --verbose line of one counted window.
func windowLine(wc windowCount, limit uint64, bound float64) string {
	s := fmt.Sprintf("window %d: %d admitted (own %v", wc.Window, wc.Admitted, wc.Own)
	if wc.Relayed > 0 {
		s += fmt.Sprintf(", relayed %d", wc.Relayed)
	}
	s += fmt.Sprintf("), %.3f of %d", wc.Ratio, limit)
	if len(wc.Missing) > 0 {
		s += fmt.Sprintf(", nodes %v did not answer", wc.Missing)
	}
	if len(wc.Stopped) > 0 {
		s += fmt.Sprintf(", nodes %v stopped in it", wc.Stopped)
	}
	if float64(wc.Admitted) > bound*float64(limit) {
		s += " OVER"
	}
	return s
}
