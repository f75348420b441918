package main

import (
	"context"
	"errors"
	"flag"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestParseProcStat(t *testing.T) {
	// The command name may hold spaces and parentheses.
	line := "4242 (we ird) (name)) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 75 0 0 20 0 12 0 1000 0 0\n"
	got, err := parseProcStat(line)
	if err != nil {
		t.Fatal(err)
	}
	if want := 3250 * time.Millisecond; got != want { // (250 + 75) ticks of 10 ms
		t.Fatalf("parseProcStat = %v, want %v", got, want)
	}
	for _, bad := range []string{"", "1 (x S 1 2", "1 (x) S 1 2 3", "1 (x) S 1 2 3 4 5 6 7 8 9 10 u 7 0"} {
		if _, err := parseProcStat(bad); err == nil {
			t.Errorf("parseProcStat(%q): no error", bad)
		}
	}
}

func TestParseHostStat(t *testing.T) {
	text := "cpu  100 5 50 800 20 3 2 10 0 0\ncpu0 50 2 25 400 10 1 1 5 0 0\nintr 1\n"
	got, err := parseHostStat(text)
	if err != nil {
		t.Fatal(err)
	}
	// busy = total 990 − idle 800 − iowait 20 = 170 ticks; steal 10.
	want := hostCPU{Busy: 1700 * time.Millisecond, Total: 9900 * time.Millisecond, Steal: 100 * time.Millisecond}
	if got != want {
		t.Fatalf("parseHostStat = %+v, want %+v", got, want)
	}
	for _, bad := range []string{"intr 1\n", "cpu 1 2 3\n", "cpu 1 2 3 x 5 6 7 8\n"} {
		if _, err := parseHostStat(bad); err == nil {
			t.Errorf("parseHostStat(%q): no error", bad)
		}
	}
}

func TestParseVmRSS(t *testing.T) {
	got, err := parseVmRSS("Name:\tratemesh\nVmPeak:\t 999 kB\nVmRSS:\t   51200 kB\nThreads: 9\n")
	if err != nil || got != 51200*1024 {
		t.Fatalf("parseVmRSS = %d, %v; want %d", got, err, 51200*1024)
	}
	for _, bad := range []string{"Name: x\n", "VmRSS: 12 MB\n", "VmRSS: x kB\n"} {
		if _, err := parseVmRSS(bad); err == nil {
			t.Errorf("parseVmRSS(%q): no error", bad)
		}
	}
}

func TestMetricValue(t *testing.T) {
	text := `# HELP ratemesh_keys Keys held, by rule.
# TYPE ratemesh_keys gauge
ratemesh_keys{rule="mem"} 101000
ratemesh_keys{rule="tput"} 7
ratemesh_keys_evicted_total 3
gubernator_cache_size{worker="0"} 1.5e+06
gubernator_cache_size{worker="1"} 500000
go_memstats_heap_inuse_bytes 5.24288e+07
`
	for _, c := range []struct {
		name   string
		labels []string
		want   float64
		found  bool
	}{
		{"ratemesh_keys", []string{`rule="mem"`}, 101000, true},
		{"ratemesh_keys", nil, 101007, true},
		{"ratemesh_keys_evicted_total", nil, 3, true},
		{"gubernator_cache_size", nil, 2e6, true},
		{"go_memstats_heap_inuse_bytes", nil, 52428800, true},
		{"ratemesh_keys", []string{`rule="nope"`}, 0, false},
		{"go_memstats", nil, 0, false}, // a prefix of a name is not the name
	} {
		got, found, err := metricValue(text, c.name, c.labels...)
		if err != nil || got != c.want || found != c.found {
			t.Errorf("metricValue(%s, %v) = %v, %v, %v; want %v, %v", c.name, c.labels, got, found, err, c.want, c.found)
		}
	}
	if _, _, err := metricValue("x{a=\"b\" 1\n", "x"); err == nil {
		t.Error("unterminated labels: no error")
	}
}

func TestParseOptionsModes(t *testing.T) {
	o, err := parseOptions(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.Rounds != 5 || o.Phase != 10*time.Second || o.MemKeys != 1_000_000 || o.Flood != 6*time.Second || len(o.Scenarios) != len(scenarioNames) {
		t.Errorf("full defaults: %+v", o)
	}
	o, err = parseOptions([]string{"--quick", "--rounds", "4", "--mem-keys", "5000"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.Rounds != 4 || o.Phase != 2*time.Second || o.MemKeys != 5000 || o.MemIdle != 3*time.Second {
		t.Errorf("--quick with overrides: %+v", o)
	}
	o, err = parseOptions([]string{"--scenarios", " memory,healthz "}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(o.Scenarios, ","); got != "keys,healthz,memory" {
		t.Errorf("--scenarios memory,healthz = %s, want keys,healthz,memory (healthz brings keys; run order)", got)
	}
	if _, err := parseOptions([]string{"--help"}, io.Discard); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("--help: %v, want flag.ErrHelp", err)
	}
}

func TestParseOptionsErrorsNameTheFlag(t *testing.T) {
	for _, c := range []struct {
		args []string
		flag string
	}{
		{[]string{"--rounds", "0"}, "--rounds"},
		{[]string{"--rounds", "101"}, "--rounds"},
		{[]string{"--phase", "10ms"}, "--phase"},
		{[]string{"--warmup", "-1s"}, "--warmup"},
		{[]string{"--concurrency", "0"}, "--concurrency"},
		{[]string{"--keys", "0"}, "--keys"},
		{[]string{"--window", "1500us"}, "--window"},
		{[]string{"--window", "1s", "--flood", "1s"}, "--flood"},
		{[]string{"--limit", "0"}, "--limit"},
		{[]string{"--mem-keys", "10"}, "--mem-keys"},
		{[]string{"--mem-idle", "-1s"}, "--mem-idle"},
		{[]string{"--mesh-workers", "0"}, "--mesh-workers"},
		{[]string{"--bound-ratio", "0"}, "--bound-ratio"},
		{[]string{"--scenarios", "hot,warm"}, "--scenarios"},
		{[]string{"--scenarios", ","}, "--scenarios"},
		{[]string{"--rounds", "x"}, "-rounds"}, // the flag package's own message
		{[]string{"extra"}, "extra"},
	} {
		_, err := parseOptions(c.args, io.Discard)
		if err == nil || !strings.Contains(err.Error(), c.flag) {
			t.Errorf("parseOptions(%q) = %v, want an error naming %s", c.args, err, c.flag)
		}
	}
}

func TestRealMainBadFlagExits2(t *testing.T) {
	var stderr strings.Builder
	if got := realMain([]string{"--rounds", "0"}, io.Discard, &stderr); got != 2 {
		t.Fatalf("exit %d, want 2", got)
	}
	if !strings.Contains(stderr.String(), "--rounds 0: must be between 1 and 100") {
		t.Fatalf("stderr %q", stderr.String())
	}
	if got := realMain([]string{"--help"}, io.Discard, io.Discard); got != 0 {
		t.Fatalf("--help: exit %d, want 0", got)
	}
}

func TestStatOf(t *testing.T) {
	if got := statOf([]float64{3, 1, 2}); got != (stat{N: 3, Min: 1, Median: 2, Max: 3}) {
		t.Errorf("odd: %+v", got)
	}
	if got := statOf([]float64{4, 1, 3, 2}); got != (stat{N: 4, Min: 1, Median: 2.5, Max: 4}) {
		t.Errorf("even: %+v", got)
	}
	if got := statOf(nil); got.N != 0 {
		t.Errorf("none: %+v", got)
	}
}

func TestRmWindowEnd(t *testing.T) {
	at := func(ms int64) time.Time { return time.UnixMilli(ms) }
	for _, c := range []struct {
		sent, recv, reset int64
		want              int64
	}{
		{10_300, 10_302, 700, 11_000},   // a quick answer
		{10_990, 11_020, 10, 11_000},    // decided just before the boundary
		{10_990, 11_020, 985, 12_000},   // decided just after it
		{10_500, 10_510, 499, 11_000},   // reset_after_ms rounded down
		{10_100, 12_300, 400, -1},       // a slow answer spans two ends
		{10_000, 10_004, 1_001, 11_000}, // a millisecond of slack
	} {
		if got := rmWindowEnd(at(c.sent), at(c.recv), c.reset, time.Second); got != c.want {
			t.Errorf("rmWindowEnd(sent %d, recv %d, reset %d) = %d, want %d", c.sent, c.recv, c.reset, got, c.want)
		}
	}
}

func TestJudgeWindows(t *testing.T) {
	start := time.UnixMilli(100_000)
	stop := start.Add(3 * time.Second)
	rep := func(v int64, n int) []int64 {
		out := make([]int64, n)
		for i := range out {
			out[i] = v
		}
		return out
	}
	var ends []int64
	// ratemesh-like: three whole windows (one over the limit), then 7
	// admissions in a window that ended after the flood, 2 unattributed.
	ends = append(ends, rep(101_000, 100)...)
	ends = append(ends, rep(102_000, 103)...)
	ends = append(ends, rep(103_000, 99)...)
	ends = append(ends, rep(104_000, 7)...)
	ends = append(ends, -1, -1)
	a := judgeWindows(ends, start, stop, time.Second, 100)
	if got := a.PerWindow; len(got) != 3 || got[0] != 100 || got[1] != 103 || got[2] != 99 {
		t.Fatalf("PerWindow %v, want [100 103 99]", got)
	}
	if a.Over != 1 || a.Partial != 7 || a.Unattributed != 2 || a.FirstRatio != 1 || math.Abs(a.MaxRatio-1.03) > 1e-9 {
		t.Fatalf("judge: %+v", a)
	}

	// Gubernator-like: buckets from the first hit (5 ms in), ends a few
	// ms apart across nodes under GLOBAL; the third bucket ends after the
	// flood (partial).
	ends = ends[:0]
	ends = append(ends, rep(101_005, 60)...)
	ends = append(ends, rep(101_012, 70)...)
	ends = append(ends, rep(102_009, 100)...)
	ends = append(ends, rep(103_080, 40)...)
	a = judgeWindows(ends, start, stop, time.Second, 100)
	if got := a.PerWindow; len(got) != 2 || got[0] != 130 || got[1] != 100 || a.Partial != 40 || a.FirstRatio != 1.3 {
		t.Fatalf("GLOBAL-like: %+v", a)
	}
}

func TestAlignedStart(t *testing.T) {
	got := alignedStart(time.UnixMilli(10_930), time.Second, 50*time.Millisecond)
	if got.UnixMilli() != 11_000 {
		t.Errorf("alignedStart(10.930 s + 50 ms) = %d", got.UnixMilli())
	}
	got = alignedStart(time.UnixMilli(10_960), time.Second, 50*time.Millisecond)
	if got.UnixMilli() != 12_000 {
		t.Errorf("alignedStart(10.960 s + 50 ms) = %d", got.UnixMilli())
	}
}

func TestOrderAlternates(t *testing.T) {
	xs := []string{"a", "b", "c"}
	for r, want := range []string{"abc", "bca", "cab", "abc"} {
		if got := strings.Join(order(r, xs), ""); got != want {
			t.Errorf("order(%d) = %s, want %s", r, got, want)
		}
	}
}

func TestSummarizeRatiosPerRound(t *testing.T) {
	o, err := parseOptions([]string{"--scenarios", "hot", "--rounds", "3"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	rep := &report{}
	for r, v := range [][2]float64{{300, 100}, {400, 100}, {100, 200}} {
		rr := rep.round(r + 1)
		rr.Phases = append(rr.Phases,
			phase{Scenario: "hot", System: "ratemesh", Requests: 1, PerSecond: v[0], Bound: r == 2},
			phase{Scenario: "hot", System: "gubernator", Requests: 1, PerSecond: v[1]})
	}
	row := summarize(rep, o)[0]
	if row.Ratio != (stat{N: 3, Min: 0.5, Median: 3, Max: 4}) || row.Ratemesh.Median != 300 || row.Other.Median != 100 {
		t.Fatalf("row %+v", row)
	}
	if row.Flagged != "ratemesh: lg-bound 1 of 3" {
		t.Fatalf("flagged %q", row.Flagged)
	}
	o.SkipFlagged = true
	row = summarize(rep, o)[0]
	if row.Ratio != (stat{N: 2, Min: 3, Median: 3.5, Max: 4}) || row.Other.N != 3 {
		t.Fatalf("--skip-flagged: row %+v", row)
	}
}

// TestProcsKillAll starts processes the way the harness starts servers
// and checks that killAll leaves none running.
func TestProcsKillAll(t *testing.T) {
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Skip("no sleep binary")
	}
	ps := &procs{dir: t.TempDir()}
	var started []*proc
	for i := range 3 {
		p, err := ps.start("sleep"+strconv.Itoa(i), sleep, []string{"60"}, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		started = append(started, p)
	}
	ps.kill(started[0])
	if !started[0].exited() || len(ps.live) != 2 {
		t.Fatalf("kill: exited %v, %d live", started[0].exited(), len(ps.live))
	}
	ps.killAll()
	for _, p := range started {
		if !p.exited() {
			t.Fatalf("%s still running after killAll", p.name)
		}
		if err := syscall.Kill(p.pid(), 0); err == nil {
			t.Fatalf("%s: pid %d still exists", p.name, p.pid())
		}
	}
}

func TestPollUntilDeadline(t *testing.T) {
	calls := 0
	err := pollUntil(context.Background(), 120*time.Millisecond, func() error {
		calls++
		return errors.New("not yet")
	})
	if err == nil || !strings.Contains(err.Error(), "not yet") || calls < 2 {
		t.Fatalf("pollUntil = %v after %d calls", err, calls)
	}
	if err := pollUntil(context.Background(), time.Second, func() error { return nil }); err != nil {
		t.Fatal(err)
	}
}

// TestQuickestPath builds both systems and runs the cheapest scenario
// end to end, then interrupts a cluster run and checks that no process it
// started outlives it. It needs the module proxy for a first build of
// Gubernator (minutes), so it runs only with BENCH_E2E=1.
func TestQuickestPath(t *testing.T) {
	if os.Getenv("BENCH_E2E") != "1" {
		t.Skip("set BENCH_E2E=1 to build both systems and run them")
	}
	bin := filepath.Join(t.TempDir(), "bench")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	out, err := exec.Command(bin, "--scenarios", "hot", "--rounds", "1", "--phase", "300ms", "--warmup", "200ms", "--json").Output()
	if err != nil {
		t.Fatalf("bench --scenarios hot: %v", err)
	}
	if !strings.Contains(string(out), `"scenario": "hot"`) || !strings.Contains(string(out), `"system": "gubernator"`) {
		t.Fatalf("no hot phases in the report:\n%s", out)
	}

	// Interrupt a cluster run once its six nodes serve.
	cmd := exec.Command(bin, "--scenarios", "cluster", "--rounds", "50")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var log strings.Builder
	buf := make([]byte, 4096)
	for !strings.Contains(log.String(), "round 1/50 cluster") {
		n, err := stderr.Read(buf)
		if err != nil {
			_ = cmd.Process.Kill()
			t.Fatalf("bench ended before its first cluster round: %v\n%s", err, log.String())
		}
		log.Write(buf[:n])
	}
	children := childrenOf(cmd.Process.Pid)
	if len(children) < 6 {
		t.Fatalf("%d children of the harness, want at least 6 nodes", len(children))
	}
	_ = cmd.Process.Signal(os.Interrupt)
	go func() { _, _ = io.Copy(io.Discard, stderr) }()
	err = cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 130 {
		t.Fatalf("interrupted bench: %v, want exit 130", err)
	}
	for _, pid := range children {
		if syscall.Kill(pid, 0) == nil {
			t.Errorf("pid %d, started by the harness, outlived it", pid)
		}
	}
}

// childrenOf lists the processes whose parent is pid.
func childrenOf(pid int) []int {
	var out []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		child, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		f := strings.Fields(s[i+1:])
		if len(f) > 1 && f[1] == strconv.Itoa(pid) {
			out = append(out, child)
		}
	}
	return out
}
