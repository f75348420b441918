// Command starve is the starvation harness of issue 26: it runs `ratemesh
// serve` processes on 127.0.0.1 on a host kept busy by other processes
// (busy loops per core, a cgroup CPU quota, random SIGSTOP pauses), offers
// a flood on one hot key and rotating keys, and counts each window's
// admissions at the servers — after window W ends, every node's
// GET /v1/usage?window=W, each node's own slot — and at the clients, each
// admitted answer in the window its reset_after_ms places it in. It exits
// 0 when every window stayed within --bound × --limit (and every burst
// was admitted whole, and no request was denied as joining), 1 when not,
// 2 on bad flags or a failed setup, 130 when interrupted (SIGINT,
// SIGTERM) with no failure so far; it kills every process it started
// before it exits. The upgrade scenario starts the cluster on an older
// release (--old-bin) and brings the nodes back on the new build one at a
// time (issue 25).
//
//	go run ./tools/starve --scenario soak --duration 60s --busy 4 --pauses
//	go run ./tools/starve --scenario rolling --busy 4 --pauses
//	go run ./tools/starve --scenario crash --duration 20s --busy 4 --pauses
//	go run ./tools/starve --scenario burst --duration 20s --busy 4 --pauses
//	go run ./tools/starve --scenario upgrade --old-bin /tmp/ratemesh-821b92d --flood 3
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
	"sort"
	"strings"
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
	if u := s.Upgrade; u != nil {
		fmt.Fprintf(w, "upgrade: from %s to %s\n", u.OldBin, u.NewBin)
	}
	fmt.Fprintf(w, "load: hot key %.0f/s asked, %.0f/s offered (%d admitted); rotating keys %.0f/s asked, %.0f/s offered; %d sent, %d failed, %d send slots missed, over %.1f s\n",
		l.HotTarget, l.HotOffered, l.HotAllowed, l.KeysTarget, l.KeysOffered, l.Sent, l.Failed, l.Missed, l.Seconds)
	fmt.Fprintf(w, "answers by reason: %s", reasonList(l.Reasons))
	if l.Unplaced > 0 {
		fmt.Fprintf(w, "; %d hot admissions in no window (round trip over half a window)", l.Unplaced)
	}
	fmt.Fprintln(w)
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
		fmt.Fprintf(w, "windows: %d counted at the servers and the clients, worst %.3f (window %d: %d of %d at the servers, %d at the clients), %d over %.2f × the limit, mean %.1f, %d incomplete\n",
			s.Counted, s.WorstRatio, s.WorstWindow, worst.Admitted, s.Limit, worst.AtClient, s.Over, s.Bound, s.MeanAdmitted, s.Incomplete)
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
	fmt.Fprintf(w, "join timeouts (%q): %d\n", joinTimeoutMarker, len(s.JoinTimeouts))
	for _, l := range s.JoinTimeouts {
		fmt.Fprintf(w, "  %s\n", l)
	}
	for _, m := range s.Malformed {
		fmt.Fprintf(w, "refused as malformed: %s\n", m)
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

// reasonList writes answers by reason, sorted by reason.
func reasonList(m map[string]int64) string {
	if len(m) == 0 {
		return "none"
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for i, k := range keys {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s %d", k, m[k])
	}
	return b.String()
}

// windowLine is the --verbose line of one counted window.
func windowLine(wc windowCount, limit uint64, bound float64) string {
	s := fmt.Sprintf("window %d: %d admitted (own %v", wc.Window, wc.Admitted, wc.Own)
	if wc.Relayed > 0 {
		s += fmt.Sprintf(", relayed %d", wc.Relayed)
	}
	s += fmt.Sprintf("), %d at the clients, %.3f of %d", wc.AtClient, wc.Ratio, limit)
	if len(wc.Missing) > 0 {
		s += fmt.Sprintf(", nodes %v did not answer", wc.Missing)
	}
	if len(wc.Old) > 0 {
		s += fmt.Sprintf(", nodes %v cannot tell (an old release)", wc.Old)
	}
	if len(wc.Stopped) > 0 {
		s += fmt.Sprintf(", nodes %v stopped in it", wc.Stopped)
	}
	if float64(wc.most()) > bound*float64(limit) {
		s += " OVER"
	}
	return s
}
