package main

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"

	"github.com/ratemesh/ratemesh/limiter"
	"github.com/ratemesh/ratemesh/mesh"
	"github.com/ratemesh/ratemesh/node"
)

// demoNodes is how many members the demo runs; demoOverload is how many
// times the limit the traffic offers; demoWorkers the goroutines per node.
const (
	demoNodes     = 3
	demoOverload  = 5
	demoWorkers   = 4
	demoRule      = "demo"
	demoKey       = "user:42"
	demoTolerance = 1.02 // a window within limit × this counts as held
)

// demoWindow is one window's outcome: admitted per node (counted from the
// decisions), their sum, and the merged total node 1 saw 30 ms before the
// window ended (absent when the sample came too late, on a loaded machine).
type demoWindow struct {
	Window   int64    `json:"window"`
	Admitted []uint64 `json:"admitted"`
	Total    uint64   `json:"total"`
	Merged   *uint64  `json:"merged,omitempty"`
	Members  int      `json:"members"`
	Full     bool     `json:"full"`
}

// demoSummary is the demo's result, printed as JSON with --json.
type demoSummary struct {
	Nodes       int          `json:"nodes"`
	PeerIDs     []string     `json:"peer_ids"`
	Rule        string       `json:"rule"`
	Algorithm   string       `json:"algorithm"`
	Limit       uint64       `json:"limit"`
	WindowMs    int64        `json:"window_ms"`
	Offered     uint64       `json:"offered"`
	Admitted    uint64       `json:"admitted"`
	FullWindows int          `json:"full_windows"`
	MaxAdmitted uint64       `json:"max_admitted"`
	MaxRatio    float64      `json:"max_ratio"`
	Held        bool         `json:"held"`
	Windows     []demoWindow `json:"windows"`
}

func runDemo(args []string, stdout, stderr io.Writer) int {
	fset := flag.NewFlagSet("demo", flag.ContinueOnError)
	setUsage(fset, stderr)
	duration := fset.Duration("duration", 10*time.Second, "how long to offer traffic")
	limit := fset.Uint64("limit", 100, "the demo rule's limit per second (sliding window)")
	asJSON := fset.Bool("json", false, "print only the JSON summary on stdout; the table goes to stderr")
	if err := fset.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fset.NArg() > 0 {
		fmt.Fprintln(stderr, "usage: ratemesh demo [--duration D] [--limit N] [--json]")
		return 2
	}
	switch {
	case *duration < 2*time.Second || *duration > time.Hour:
		fmt.Fprintf(stderr, "ratemesh demo: --duration %v: must be between 2s (one full window) and 1h\n", *duration)
		return 2
	case *limit < 1 || *limit > 100_000:
		fmt.Fprintf(stderr, "ratemesh demo: --limit %d: must be between 1 and 100000\n", *limit)
		return 2
	}
	// The nodes log to stderr while the table is written: under --json
	// both go to it at once.
	stderr = &syncWriter{w: stderr}
	table := stdout
	if *asJSON {
		table = stderr
	}
	sum, err := demo(context.Background(), *duration, *limit, table, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "ratemesh demo: %v\n", err)
		return 1
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(sum); err != nil {
			fmt.Fprintf(stderr, "ratemesh demo: %v\n", err)
			return 1
		}
	} else {
		sum.writeText(stdout)
	}
	if !sum.Held {
		return 1
	}
	return 0
}

// demoCluster is the demo's three members and what their traffic saw.
type demoCluster struct {
	nodes  []*node.Node
	ids    []string
	window time.Duration

	mu       sync.Mutex
	admitted []map[int64]uint64 // per node: window index → admitted
	offered  uint64
}

// startDemoCluster starts the members on loopback ephemeral ports, the 2nd
// and later bootstrapped to the 1st, and waits until each sees all alive.
func startDemoCluster(ctx context.Context, rule limiter.Rule, logs io.Writer) (*demoCluster, error) {
	logger := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	c := &demoCluster{window: rule.Window}
	plausible := mesh.PlausibleFor([]limiter.Rule{rule}, 0)
	var first string
	for i := range demoNodes {
		key, _, err := crypto.GenerateEd25519Key(rand.Reader)
		if err != nil {
			return c, err
		}
		mc := mesh.DefaultConfig()
		mc.Namespace = "demo"
		mc.PrivKey = key
		mc.Listen = []string{"/ip4/127.0.0.1/tcp/0"}
		mc.Logger = logger
		mc.Plausible = plausible
		if i > 0 {
			mc.Bootstrap = []string{first}
		}
		m, err := mesh.New(mc)
		if err != nil {
			return c, fmt.Errorf("node %d: %w", i+1, err)
		}
		if i == 0 {
			first = m.Addrs()[0]
		}
		nc := node.DefaultConfig()
		nc.Peer, nc.Rules, nc.Transport, nc.Logger = m.PeerID(), []limiter.Rule{rule}, m, logger
		nc.Join = i > 0
		sctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		n, err := node.Start(sctx, nc)
		cancel()
		if err != nil {
			_ = m.Close()
			return c, fmt.Errorf("node %d: %w", i+1, err)
		}
		c.nodes = append(c.nodes, n)
		c.ids = append(c.ids, m.PeerID())
		c.admitted = append(c.admitted, map[int64]uint64{})
	}
	deadline := time.Now().Add(15 * time.Second)
	for !c.meshed() {
		if time.Now().After(deadline) {
			return c, errors.New("the nodes did not see each other alive within 15s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	return c, nil
}

// meshed reports whether every member sees every member alive.
func (c *demoCluster) meshed() bool {
	for _, n := range c.nodes {
		if c.alive(n) != len(c.nodes) {
			return false
		}
	}
	return true
}

func (c *demoCluster) alive(n *node.Node) int {
	a := 0
	for _, p := range n.Peers() {
		if p.State == node.Alive {
			a++
		}
	}
	return a
}

func (c *demoCluster) close() {
	for _, n := range c.nodes {
		_ = n.Close()
	}
}

// worker offers rate requests per second from node i until ctx ends,
// counting admissions by the window the node decided them in.
func (c *demoCluster) worker(ctx context.Context, i int, rate float64) {
	n := c.nodes[i]
	const step = 10 * time.Millisecond
	t := time.NewTicker(step)
	defer t.Stop()
	last, owed := time.Now(), 0.0
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			owed += rate * now.Sub(last).Seconds()
			last = now
			for ; owed >= 1; owed-- {
				sent := time.Now()
				d, err := n.Allow(ctx, demoRule, demoKey)
				if err != nil {
					return
				}
				c.record(i, sent, d)
			}
		}
	}
}

// record counts one decision. The window is the one whose end the node
// reported (now + ResetAfter, to the nearest boundary), so a boundary seen
// a millisecond apart by this clock and the node's mesh clock is not
// misattributed.
func (c *demoCluster) record(i int, at time.Time, d node.Decision) {
	w := c.window.Milliseconds()
	end := int64(math.Round(float64(at.UnixMilli()+d.ResetAfter.Milliseconds()) / float64(w)))
	c.mu.Lock()
	defer c.mu.Unlock()
	c.offered++
	if d.Allowed {
		c.admitted[i][end-1]++
	}
}

func (c *demoCluster) windowCounts(idx int64) []uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]uint64, len(c.nodes))
	for i := range c.nodes {
		out[i] = c.admitted[i][idx]
	}
	return out
}

// demo runs the cluster, offers traffic for duration, writes a row per
// window to table, and returns the summary.
func demo(ctx context.Context, duration time.Duration, limit uint64, table, logs io.Writer) (*demoSummary, error) {
	rule := limiter.Rule{Name: demoRule, Algorithm: limiter.SlidingWindow, Limit: limit, Window: time.Second}
	fmt.Fprintf(logs, "starting %d nodes on 127.0.0.1 …\n", demoNodes)
	c, err := startDemoCluster(ctx, rule, logs)
	defer c.close()
	if err != nil {
		return nil, err
	}
	sum := &demoSummary{Nodes: demoNodes, PeerIDs: c.ids, Rule: rule.Name, Algorithm: string(rule.Algorithm),
		Limit: limit, WindowMs: rule.Window.Milliseconds()}
	fmt.Fprintf(table, "%d nodes, rule %q: %s, %d per %v; offering %d× the limit on key %q for %v\n",
		demoNodes, rule.Name, rule.Algorithm, limit, rule.Window, demoOverload, demoKey, duration)
	for i, id := range c.ids {
		fmt.Fprintf(table, "  n%d  %s\n", i+1, id)
	}
	fmt.Fprintln(table, "per window: admitted by each node, their total, the total as n1 sees it merged 30 ms before the window ends")
	fmt.Fprintln(table)

	tctx, stop := context.WithTimeout(ctx, duration)
	defer stop()
	start := time.Now()
	rate := float64(limit*demoOverload) / float64(demoNodes*demoWorkers) / rule.Window.Seconds()
	var wg sync.WaitGroup
	for i := range c.nodes {
		for range demoWorkers {
			wg.Go(func() { c.worker(tctx, i, rate) })
		}
	}

	// Fixed-width columns: rows appear one a second, so a tabwriter
	// cannot see them all before aligning.
	cw := max(7, len(fmt.Sprint(limit*demoOverload))+2)
	cell := func(v any) string { return fmt.Sprintf("%*v", cw, v) }
	header := cell("at")
	for i := range c.nodes {
		header += cell(fmt.Sprintf("n%d", i+1))
	}
	fmt.Fprintln(table, header+cell("total")+cell("merged")+cell("limit")+"  members")

	w := rule.Window
	// The first window that begins after traffic starts is the first full
	// one; the last full one ends before traffic stops.
	firstFull := start.UnixMilli()/w.Milliseconds() + 1
	endMs := start.Add(duration).UnixMilli()
	lastFull := endMs/w.Milliseconds() - 1
	for idx := firstFull - 1; ; idx++ {
		// Just before the window ends, read node 1's merged view …
		winEnd := time.UnixMilli((idx + 1) * w.Milliseconds())
		if !sleepUntil(ctx, winEnd.Add(-30*time.Millisecond)) {
			break
		}
		var merged *uint64
		mergedCell := "-"
		if rep, err := c.nodes[0].Usage(demoRule, demoKey); err == nil && rep.Window == idx {
			merged = &rep.Total
			mergedCell = fmt.Sprint(rep.Total)
		}
		members := c.alive(c.nodes[0])
		// … and once it has ended, the decisions counted in it.
		if !sleepUntil(ctx, winEnd.Add(100*time.Millisecond)) {
			break
		}
		counts := c.windowCounts(idx)
		row := demoWindow{Window: idx, Admitted: counts, Merged: merged, Members: members,
			Full: idx >= firstFull && idx <= lastFull}
		for _, a := range counts {
			row.Total += a
		}
		sum.Windows = append(sum.Windows, row)
		line := cell(fmt.Sprintf("%.1fs", time.UnixMilli((idx+1)*w.Milliseconds()).Sub(start).Seconds()))
		for _, a := range counts {
			line += cell(a)
		}
		mark := ""
		if !row.Full {
			mark = "  (partial window)"
		}
		fmt.Fprintf(table, "%s%s%s%s  %d alive%s\n", line, cell(row.Total), cell(mergedCell), cell(limit), members, mark)
		if winEnd.UnixMilli() >= endMs {
			break
		}
	}
	wg.Wait()

	// Late decisions (a worker delayed past the row's printing) count in
	// the summary: recount every window from the final tallies.
	c.mu.Lock()
	sum.Offered = c.offered
	seen := map[int64]int{}
	for j, row := range sum.Windows {
		seen[row.Window] = j
	}
	for i := range c.admitted {
		for idx := range c.admitted[i] {
			if _, ok := seen[idx]; !ok {
				seen[idx] = len(sum.Windows)
				sum.Windows = append(sum.Windows, demoWindow{Window: idx, Admitted: make([]uint64, len(c.nodes))})
			}
		}
	}
	for j := range sum.Windows {
		row := &sum.Windows[j]
		row.Total = 0
		for i := range c.admitted {
			row.Admitted[i] = c.admitted[i][row.Window]
			row.Total += row.Admitted[i]
		}
		sum.Admitted += row.Total
	}
	c.mu.Unlock()
	sum.Held = true
	for _, row := range sum.Windows {
		if !row.Full {
			continue
		}
		sum.FullWindows++
		sum.MaxAdmitted = max(sum.MaxAdmitted, row.Total)
		if float64(row.Total) > demoTolerance*float64(limit) {
			sum.Held = false
		}
	}
	sum.MaxRatio = float64(sum.MaxAdmitted) / float64(limit)
	if sum.FullWindows == 0 {
		sum.Held = false
	}
	sort.Slice(sum.Windows, func(i, j int) bool { return sum.Windows[i].Window < sum.Windows[j].Window })
	return sum, nil
}

// sleepUntil waits until t or ctx's end, and reports whether t came.
func sleepUntil(ctx context.Context, t time.Time) bool {
	timer := time.NewTimer(time.Until(t))
	defer timer.Stop()
	select {
	case <-timer.C:
		return true
	case <-ctx.Done():
		return false
	}
}

func (s *demoSummary) writeText(w io.Writer) {
	fmt.Fprintln(w)
	fmt.Fprintf(w, "offered %d requests, admitted %d (%.0f%%)\n", s.Offered, s.Admitted, 100*float64(s.Admitted)/math.Max(1, float64(s.Offered)))
	verdict := "HELD"
	if !s.Held {
		verdict = "NOT HELD"
	}
	var over []string
	for _, row := range s.Windows {
		if row.Full && float64(row.Total) > demoTolerance*float64(s.Limit) {
			over = append(over, fmt.Sprintf("window %d: %d", row.Window, row.Total))
		}
	}
	fmt.Fprintf(w, "limit %s: the busiest full window (of %d) admitted %d of %d (%.1f%%) across %d nodes",
		verdict, s.FullWindows, s.MaxAdmitted, s.Limit, 100*s.MaxRatio, s.Nodes)
	if len(over) > 0 {
		fmt.Fprintf(w, "; over the limit: %s", strings.Join(over, ", "))
	}
	fmt.Fprintln(w)
}

// syncWriter serialises the writes to w of several goroutines: the demo's
// table and its nodes' logs share stderr.
type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}
