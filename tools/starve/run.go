package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/ratemesh/ratemesh/httpapi"
)

const (
	hotRule   = "hot"
	burstRule = "burst"
)

// config is the serve processes' config file.
func (o *options) config() string {
	extra := ""
	if o.ShareWait > 0 {
		extra = fmt.Sprintf(", share_wait: %dms", o.ShareWait.Milliseconds())
	}
	return fmt.Sprintf(`mesh:
  partition_policy: %s
rules:
  - {name: %s, algorithm: fixed_window, limit: %d, window: %dms%s}
  - {name: %s, algorithm: fixed_window, limit: %d, window: %dms%s}
`, o.Policy, hotRule, o.Limit, o.Window.Milliseconds(), extra, burstRule, o.BurstLimit, o.Window.Milliseconds(), extra)
}

// buildBinary builds ./cmd/ratemesh of the module the current directory
// is in into dir.
func buildBinary(ctx context.Context, dir string) (string, error) {
	out, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
	gomod := strings.TrimSpace(string(out))
	if err != nil || gomod == "" || gomod == os.DevNull {
		return "", fmt.Errorf("--bin: not given, and not inside the ratemesh module to build it (go env GOMOD: %q %v)", gomod, err)
	}
	bin := filepath.Join(dir, "ratemesh")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/ratemesh")
	cmd.Dir = filepath.Dir(gomod)
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/ratemesh: %v\n%s", err, out)
	}
	return bin, nil
}

// run runs the scenario of o and returns its summary; an error is a
// failed setup (a binary that does not build, a mesh that does not
// form), not a verdict. Every process it starts is gone when it returns.
func run(ctx context.Context, o options, log io.Writer, r *rand.Rand) (*summary, error) {
	began := time.Now()
	s := &summary{Scenario: o.Scenario, Nodes: o.Nodes, Policy: o.Policy, Limit: uint64(o.Limit),
		WindowMs: o.Window.Milliseconds(), Bound: o.Bound, Seed: o.Seed, SkewLines: []string{}}
	if o.Scenario == "burst" {
		s.BurstWant = o.Burst
	}
	logf := func(format string, args ...any) {
		fmt.Fprintf(log, "starve %6.1fs: %s\n", time.Since(began).Seconds(), fmt.Sprintf(format, args...))
	}
	var events []string
	var evMu sync.Mutex
	event := func(format string, args ...any) {
		e := fmt.Sprintf("%.1fs: %s", time.Since(began).Seconds(), fmt.Sprintf(format, args...))
		evMu.Lock()
		events = append(events, e)
		evMu.Unlock()
		if o.Verbose {
			logf("%s", fmt.Sprintf(format, args...))
		}
	}

	dir, err := os.MkdirTemp("", "ratemesh-starve-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	bin := o.Bin
	if bin == "" {
		logf("building ./cmd/ratemesh")
		if bin, err = buildBinary(ctx, dir); err != nil {
			return nil, err
		}
	} else if _, err := os.Stat(bin); err != nil {
		return nil, fmt.Errorf("--bin: %w", err)
	}
	o.Bin = bin
	start := bin
	if o.Scenario == "upgrade" {
		if _, err := os.Stat(o.OldBin); err != nil {
			return nil, fmt.Errorf("--old-bin: %w", err)
		}
		start = o.OldBin
		s.Upgrade = &upgradeReport{OldBin: o.OldBin, NewBin: bin}
		logf("the cluster starts on %s; each node comes back on %s", o.OldBin, bin)
	}
	cfg := filepath.Join(dir, "ratemesh.yaml")
	if err := os.WriteFile(cfg, []byte(o.config()), 0o644); err != nil {
		return nil, err
	}

	var cg *cgroup
	if o.quota > 0 {
		if cg, err = newCgroup(o.quota, o.period); err != nil {
			s.Warnings = append(s.Warnings, "--cpu-max skipped: "+err.Error())
			logf("--cpu-max skipped: no writable cgroup with a CPU quota: %v", err)
		} else {
			defer func() {
				if err := cg.remove(); err != nil {
					logf("remove cgroup %s: %v", cg.dir, err)
				}
			}()
			s.Starve.CPUMax = fmt.Sprintf("%d/%d", o.quota, o.period)
			s.Starve.Cgroup = cg.kind + " " + cg.dir
			logf("serve processes run in %s (%s %s)", cg.dir, cg.kind, s.Starve.CPUMax)
		}
	}

	c, err := newCluster(start, dir, cfg, o.Nodes, cg)
	if err != nil {
		return nil, err
	}
	defer c.close()
	first, err := c.start(ctx, 0, "")
	if err != nil {
		return nil, err
	}
	for i := 1; i < o.Nodes; i++ {
		if _, err := c.start(ctx, i, first.ready.Addrs[0]); err != nil {
			return nil, err
		}
	}
	if err := c.waitAlive(ctx, 30*time.Second); err != nil {
		return nil, err
	}
	logf("%d nodes ready, every one sees every one alive", o.Nodes)

	// The starvation: busy loops, the load average, pauses.
	var before loadSampler
	before.sample()
	s.Starve.LoadAvg1Start = before.end
	s.Starve.BusyProcs = o.Busy * runtime.NumCPU()
	if s.Starve.BusyProcs > 0 {
		stopBusy, err := busyLoops(s.Starve.BusyProcs)
		if err != nil {
			return nil, err
		}
		defer stopBusy()
		logf("%d busy loops (%d per core)", s.Starve.BusyProcs, o.Busy)
	}
	sctx, stopStarve := context.WithCancel(ctx)
	defer stopStarve()
	var bg sync.WaitGroup
	sampler := &loadSampler{}
	bg.Add(1)
	go func() { defer bg.Done(); sampler.run(sctx) }()
	pz := &pauser{c: c, rand: r, every: o.PauseEvery}
	if o.Verbose {
		pz.events = logf
	}
	if o.Pauses {
		bg.Add(1)
		go func() { defer bg.Done(); pz.run(sctx) }()
	}

	// The load and the counting.
	lctx, stopLoad := context.WithCancel(sctx)
	defer stopLoad()
	g := &generator{c: c, rule: hotRule, wms: o.Window.Milliseconds()}
	g.run(lctx, o.hotRate(), o.Workers, o.Keys, o.KeyRate)
	k := &counter{c: c, wms: o.Window.Milliseconds()}
	end := make(chan time.Time, 1)
	var counted []windowCount
	var cw sync.WaitGroup
	if o.hotRate() > 0 {
		cw.Add(1)
		go func() {
			defer cw.Done()
			counted = k.run(sctx, hotRule, "hot", uint64(o.Limit), g.start, end, func(wc windowCount) {
				// The clients' count so far: the window ended half a
				// window ago (set again once the load has stopped).
				wc.setClient(g.tally.count(wc.Window), uint64(o.Limit))
				if o.Verbose {
					logf("%s", windowLine(wc, uint64(o.Limit), o.Bound))
				}
			})
		}()
	}

	serr := runScenario(lctx, o, c, k, pz, s, event)
	stopLoad()
	g.wait()
	g.report(&s.Load, time.Duration(pz.paused.Load()))
	end <- time.Now()
	cw.Wait()
	for i := range counted {
		counted[i].setClient(g.tally.count(counted[i].Window), uint64(o.Limit))
	}
	if o.Scenario == "rolling" || o.Scenario == "upgrade" {
		for i := range c.members {
			s.noteMalformed(ctx, c, i)
		}
	}
	stopStarve()
	bg.Wait()
	s.Starve.Pauses, s.Starve.PausedMs = int(pz.pauses.Load()), time.Duration(pz.paused.Load()).Milliseconds()
	sampler.report(&s.Starve)
	if serr != nil && ctx.Err() == nil {
		return nil, serr
	}
	if ctx.Err() != nil {
		s.Interrupted = true
		s.Warnings = append(s.Warnings, fmt.Sprintf("interrupted after %.1f s: the windows so far", time.Since(began).Seconds()))
	}
	s.Windows = counted
	s.Events = events
	s.SkewLines = append(s.SkewLines, c.skewLines()...)
	s.JoinTimeouts = append([]string{}, c.joinTimeouts()...)
	s.ElapsedSec = time.Since(began).Seconds()
	s.judge()
	return s, nil
}

// sleepCtx waits d or until ctx is done; it reports whether d passed.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// runScenario does the scenario's actions while the load runs, and
// returns when the load should stop.
func runScenario(ctx context.Context, o options, c *cluster, k *counter, pz *pauser, s *summary, event func(string, ...any)) error {
	start := time.Now()
	switch o.Scenario {
	case "soak":
		sleepCtx(ctx, o.Duration)
	case "crash":
		at := min(3*time.Second, o.Duration/3)
		if !sleepCtx(ctx, at) {
			return nil
		}
		last := o.Nodes - 1
		if err := c.stop(last, syscall.SIGKILL); err != nil {
			return err
		}
		event("node %d SIGKILLed, kept down", last)
		sleepCtx(ctx, time.Until(start.Add(o.Duration)))
	case "rolling", "upgrade":
		sig, name := syscall.SIGKILL, "SIGKILL"
		if o.Signal == "term" {
			sig, name = syscall.SIGTERM, "SIGTERM"
		}
		// A rolling restart stops a node a second; an upgrade spreads the
		// restarts over the load, so that every mix of the two releases
		// (all old, one new, …, all new) runs for an equal share of it.
		before, gap := min(2*time.Second, o.Duration/2), time.Second
		if o.Scenario == "upgrade" {
			gap = max(time.Second, o.Duration/time.Duration(o.Nodes+1))
			before = gap
		}
		if !sleepCtx(ctx, before) {
			return nil
		}
		for i := range o.Nodes {
			if i > 0 && !sleepCtx(ctx, time.Until(start.Add(before+time.Duration(i)*gap))) {
				return nil
			}
			s.noteMalformed(ctx, c, i)
			stopped := time.Now()
			if err := c.stop(i, sig); err != nil {
				return err
			}
			event("node %d: %s", i, name)
			if o.Scenario == "upgrade" {
				c.setBin(i, o.Bin)
				event("node %d: restarting on the new build", i)
			}
			seed := c.running((i + 1) % o.Nodes)
			if seed == nil {
				return fmt.Errorf("rolling: node %d is not running to bootstrap node %d", (i+1)%o.Nodes, i)
			}
			if _, err := c.start(ctx, i, seed.ready.Addrs[0]); err != nil {
				return fmt.Errorf("rolling: restart node %d: %w", i, err)
			}
			event("node %d ready again after %v", i, time.Since(stopped).Round(time.Millisecond))
			if err := c.waitAlive(ctx, 30*time.Second); err != nil {
				return fmt.Errorf("rolling: after restarting node %d: %w", i, err)
			}
			event("node %d: every node sees every node alive after %v", i, time.Since(stopped).Round(time.Millisecond))
			// At most one stop a second: a window then holds at most one
			// stop's unpublished admissions.
			if !sleepCtx(ctx, time.Until(stopped.Add(time.Second))) {
				return nil
			}
		}
		if o.Scenario == "upgrade" {
			event("every node runs the new build")
		}
		sleepCtx(ctx, max(before, time.Until(start.Add(o.Duration))))
	case "burst":
		wms := o.Window.Milliseconds()
		for n := 1; time.Since(start) < o.Duration; n++ {
			// The burst starts 20 ms into a window at least 300 ms away,
			// so its connections are dialled before.
			w := (time.Now().Add(300*time.Millisecond).UnixMilli() + wms - 1) / wms
			at := time.UnixMilli(w*wms + 20)
			key := fmt.Sprintf("burst-%d", n)
			allowed, failed, reasons, took, err := burst(ctx, c, burstRule, key, o.Burst, 64, at)
			if err != nil {
				if ctx.Err() != nil {
					return nil
				}
				return err
			}
			b := burstResult{Key: key, Window: w, Sent: o.Burst, Allowed: allowed, Failed: failed, Reasons: reasons, TookMs: took.Milliseconds(),
				Pauses: pz.during(at, at.Add(took))}
			// What the servers counted in the burst's window and the next.
			for _, x := range []int64{w, w + 1} {
				if !sleepCtx(ctx, time.Until(time.UnixMilli((x+1)*wms+wms/2))) {
					return nil
				}
				b.Admitted += k.count(ctx, burstRule, key, x, uint64(o.BurstLimit)).Admitted
			}
			s.Bursts = append(s.Bursts, b)
			event("burst %s in window %d: %d of %d admitted in %d ms (%d at the servers) %v; pauses during it: %v", key, w, allowed, o.Burst, b.TookMs, b.Admitted, reasons, b.Pauses)
			if took > o.Window {
				s.Warnings = append(s.Warnings, fmt.Sprintf("burst %s took %v, longer than a window", key, took.Round(time.Millisecond)))
			}
		}
	}
	return nil
}

// noteMalformed reads node i's count of batches refused as malformed, if
// it runs, and notes a count above zero in s.Malformed, naming the
// node's binary.
func (s *summary) noteMalformed(ctx context.Context, c *cluster, i int) {
	p := c.running(i)
	if p == nil {
		return
	}
	c.mu.Lock()
	bin := c.members[i].bin
	c.mu.Unlock()
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	n, err := c.malformed(rctx, p)
	switch {
	case err != nil:
		s.Warnings = append(s.Warnings, fmt.Sprintf("node %d (%s): malformed count not read: %v", i, bin, err))
	case n > 0:
		s.Malformed = append(s.Malformed, fmt.Sprintf("node %d (%s): %d", i, bin, n))
	}
}

// counter counts windows at the servers.
type counter struct {
	c   *cluster
	wms int64
}

// run counts (rule, key) in every window from the first that starts at
// or after from to the last that ends by the time end delivers, polling
// each window W half-way through W+1, and returns the counts.
func (k *counter) run(ctx context.Context, rule, key string, limit uint64, from time.Time, end <-chan time.Time, each func(windowCount)) []windowCount {
	var out []windowCount
	w := (from.UnixMilli() + k.wms - 1) / k.wms
	last := int64(1<<62 - 1)
	for w <= last {
		at := time.UnixMilli((w+1)*k.wms + k.wms/2)
		t := time.NewTimer(time.Until(at))
		select {
		case <-ctx.Done():
			t.Stop()
			return out
		case e := <-end:
			t.Stop()
			last = e.UnixMilli()/k.wms - 1
			continue
		case <-t.C:
		}
		wc := k.count(ctx, rule, key, w, limit)
		if ctx.Err() != nil {
			return out
		}
		out = append(out, wc)
		if each != nil {
			each(wc)
		}
		w++
	}
	return out
}

// publishedAfter bounds how long after an admission a node has published
// it: the longest pause (500 ms) plus a few sync intervals.
const publishedAfter = 600 * time.Millisecond

// count asks every running node for (rule, key) in window w,
// concurrently, each until it answers or w+1 ends (a node paused or
// starved past it can no longer tell), and sums them (countWindow). A
// node the harness stopped is not asked; it is marked Stopped when it
// stopped during w or within publishedAfter of its end.
func (k *counter) count(ctx context.Context, rule, key string, w int64, limit uint64) windowCount {
	n := len(k.c.members)
	views := make([]nodeUsage, n)
	deadline := time.UnixMilli((w+2)*k.wms - 20)
	from, to := time.UnixMilli(w*k.wms), time.UnixMilli((w+1)*k.wms).Add(publishedAfter)
	var wg sync.WaitGroup
	for i := range n {
		views[i].Node = i
		k.c.mu.Lock()
		m := k.c.members[i]
		down, stopped, p := m.down, m.stopped, m.p
		k.c.mu.Unlock()
		views[i].Stopped = stopped.After(from) && stopped.Before(to)
		if down {
			views[i].Down = true
			continue
		}
		views[i].PeerID = p.ready.PeerID
		wg.Add(1)
		go func() {
			defer wg.Done()
			path := fmt.Sprintf("/v1/usage?rule=%s&key=%s&window=%d", url.QueryEscape(rule), url.QueryEscape(key), w)
			for time.Now().Before(deadline) && ctx.Err() == nil {
				rctx, cancel := context.WithDeadline(ctx, deadline)
				var u httpapi.UsageResponse
				err := k.c.getJSON(rctx, p, path, &u)
				cancel()
				if err == nil {
					views[i].OK, views[i].Slots = true, u.Slots
					return
				}
				var se *statusError
				if errors.As(err, &se) && se.code == http.StatusBadRequest {
					// The window is gone at that node, or its release
					// predates window=N (27aa619): "window: unknown
					// query parameter".
					views[i].Old = strings.Contains(se.msg, "window: unknown query parameter")
					return
				}
				sleepCtx(ctx, 50*time.Millisecond)
			}
		}()
	}
	wg.Wait()
	return countWindow(w, limit, views)
}
