package simulator

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// mixed exercises every event kind, churn, loss, skew, classes, costs,
// node sets, held share denials (share_wait) and lease clients (crashing
// ones too) in a few virtual seconds.
const mixed = `
name: mixed
seed: 7
duration: 6s
nodes: 8
network: {latency: 5ms, jitter: 4ms, loss: 0.02}
mesh: {sync_interval: 20ms, heartbeat: 200ms, suspect_after: 600ms, dead_after: 1s, evict_after: 2s}
rules:
  - {name: api, algorithm: sliding_window, limit: 200, window: 1s, share_wait: 60ms}
  - {name: fixed, algorithm: fixed_window, limit: 50, window: 500ms, classes: {gold: 2}}
  - {name: conns, algorithm: concurrency, limit: 20, lease_ttl: 900ms}
workload:
  - {rule: api, rate: 2000, keys: 5, key_dist: "zipf:1.2", node_dist: "skew:0.5:2"}
  - {rule: api, rate: 20, keys: 4, well_behaved: true}
  - {rule: fixed, rate: 500, keys: 3, cost: 2, class: gold, nodes: "0-3"}
  - {rule: conns, rate: 80, keys: 2, hold: 500ms, crash: 0.3}
events:
  - {at: 0s, skew: {nodes: "0-7", spread: 30ms}}
  - {at: 1s, partition: ["0-3", "4-7"]}
  - {at: 2s, heal: true}
  - {at: 2500ms, crash: [1]}
  - {at: 3s, restart: [1]}
  - {at: 3200ms, join: 1}
  - {at: 4s, leave: [2]}
  - {at: 4500ms, rate: {rule: api, rate: 4000, node_dist: uniform}}
churn: {every: 2s, fraction: 0.25, down_for: 500ms}
`

func mustParse(t testing.TB, data string) *Scenario {
	t.Helper()
	sc, err := Parse([]byte(data))
	if err != nil {
		t.Fatal(err)
	}
	return sc
}

// outputs runs sc and returns every output file by name, the JSON with
// wall_seconds zeroed.
func outputs(t testing.TB, sc *Scenario, opt Options) map[string][]byte {
	t.Helper()
	res, err := Run(sc, opt)
	if err != nil {
		t.Fatal(err)
	}
	res.Summary.WallSeconds = 0
	var js, table bytes.Buffer
	if err := res.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	if err := res.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := res.WriteFiles(dir); err != nil {
		t.Fatal(err)
	}
	out := map[string][]byte{"summary.json": js.Bytes(), "table.txt": table.Bytes()}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		data, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		out[e.Name()] = data
	}
	return out
}

func TestSameSeedSameBytes(t *testing.T) {
	sc := mustParse(t, mixed)
	a := outputs(t, sc, Options{})
	b := outputs(t, sc, Options{})
	// More workers must not change a byte either (cores share nothing).
	c := outputs(t, sc, Options{Workers: 3, parallelMin: 1})
	for _, name := range []string{"summary.json", "table.txt", "windows.csv", "seconds.csv", "nodes.csv", "admitted.svg", "bytes.svg", "inwindow.csv", "inwindow.svg", "subintervals.csv", "subintervals.svg", "sides.csv", "leases.csv", "leases.svg"} {
		if a[name] == nil {
			t.Fatalf("%s is missing from the outputs", name)
		}
	}
	for name, data := range a {
		if !bytes.Equal(data, b[name]) {
			t.Errorf("%s differs between two runs of seed %d", name, sc.Seed)
		}
		if !bytes.Equal(data, c[name]) {
			t.Errorf("%s differs with 3 workers (seed %d)", name, sc.Seed)
		}
	}
	for _, name := range []string{"windows.csv", "seconds.csv", "nodes.csv"} {
		if lines := bytes.Count(a[name], []byte("\n")); lines < 3 {
			t.Errorf("%s has %d lines", name, lines)
		}
	}
	if !bytes.Contains(a["admitted.svg"], []byte(`<title>partition</title>`)) || !bytes.Contains(a["admitted.svg"], []byte(`<title>down</title>`)) {
		t.Error("admitted.svg shades neither the partition nor the crashes")
	}
	if !bytes.Contains(a["subintervals.svg"], []byte("workload 3 (rule conns): a concurrency rule")) || bytes.Contains(a["subintervals.svg"], []byte("unlimited class")) {
		t.Error("subintervals.svg plots the lease workload as credits, or calls a class unlimited")
	}
	t.Logf("%s", a["table.txt"])
}

// TestLazyDeliveryChangesNothing compares the engine, which steps a
// receiver's deliveries only when its core is next driven, with stepping
// every delivery the millisecond it happens: the cores see the same calls,
// so every output must be the same, with one worker and with several.
func TestLazyDeliveryChangesNothing(t *testing.T) {
	sc := mustParse(t, mixed)
	eager := outputs(t, sc, Options{eager: true})
	for _, opt := range []Options{{}, {Workers: 2, parallelMin: 1}, {Workers: 2, parallelMin: 1, eager: true}} {
		got := outputs(t, sc, opt)
		for name, data := range eager {
			if !bytes.Equal(data, got[name]) {
				t.Errorf("%s differs between eager delivery and %+v (seed %d)", name, opt, sc.Seed)
			}
		}
	}
}

func TestSeedsDiffer(t *testing.T) {
	sc := mustParse(t, mixed)
	one, two := uint64(1), uint64(2)
	a := outputs(t, sc, Options{Seed: &one})
	b := outputs(t, sc, Options{Seed: &two})
	if bytes.Equal(a["summary.json"], b["summary.json"]) || bytes.Equal(a["windows.csv"], b["windows.csv"]) {
		t.Errorf("seeds 1 and 2 gave the same outputs:\n%s", a["summary.json"])
	}
	if !bytes.Contains(b["summary.json"], []byte(`"seed": 2`)) {
		t.Errorf("summary does not carry the overriding seed:\n%s", b["summary.json"])
	}
}

func TestMixedRunAccounting(t *testing.T) {
	sc := mustParse(t, mixed)
	res, err := Run(sc, Options{})
	if err != nil {
		t.Fatal(err)
	}
	// Churn may crash a node a scripted event then finds down; it is skipped.
	t.Logf("%d scripted actions skipped", res.Skipped)
	for _, rs := range res.Summary.Rules {
		if rs.Offered == 0 || rs.Admitted == 0 || rs.Admitted > rs.Offered || rs.Windows == 0 {
			t.Errorf("rule %s: %+v", rs.Name, rs)
		}
		if rs.MessagesPerNodePerS <= 0 || rs.BytesPerNodePerS <= 0 {
			t.Errorf("rule %s reports no traffic: %+v", rs.Name, rs)
		}
	}
	// The joined node (index 8) sent something; the departed one (2) stops.
	if len(res.Nodes) != 9 || res.Nodes[8].Messages == 0 {
		t.Errorf("node rows %+v", res.Nodes)
	}
}

func runLibrary(t *testing.T, name string, seed *uint64) *Result {
	t.Helper()
	data, err := LibraryScenario(name)
	if err != nil {
		t.Fatal(err)
	}
	res, err := Run(mustParse(t, string(data)), Options{Seed: seed, Workers: 2})
	if err != nil {
		t.Fatal(err)
	}
	for _, rs := range res.Summary.Rules {
		t.Logf("%s seed %d: %+v", name, res.Summary.Seed, rs)
	}
	return res
}

func TestSteadyIsAccurate(t *testing.T) {
	res := runLibrary(t, "steady", nil)
	rs := res.Summary.Rules[0]
	if rs.OvershootMax > 0.02 {
		t.Errorf("steady (seed %d): overshoot_max %v > 0.02", res.Summary.Seed, rs.OvershootMax)
	}
	if rs.Utilisation < 0.95 {
		t.Errorf("steady (seed %d): utilisation %v < 0.95", res.Summary.Seed, rs.Utilisation)
	}
	if rs.FalseRejections != 0 {
		t.Errorf("steady (seed %d): %d false rejections", res.Summary.Seed, rs.FalseRejections)
	}
}

// TestPartitionBeforeSuspect is the small, race-friendly form of
// partition-strict: the split heals before anyone turns suspect, and the
// two sides together still stay within the limit.
func TestPartitionBeforeSuspect(t *testing.T) {
	sc := mustParse(t, `
name: split-before-suspect
seed: 3
duration: 8s
nodes: 10
network: {latency: 10ms, jitter: 5ms, loss: 0.01}
mesh: {sync_interval: 20ms, heartbeat: 500ms, suspect_after: 2s, partition_policy: strict}
rules:
  - {name: api, algorithm: sliding_window, limit: 1000, window: 1s}
  - {name: fixed, algorithm: fixed_window, limit: 500, window: 1s}
workload:
  - {rule: api, rate: 10000, keys: 3, node_dist: uniform}
  - {rule: fixed, rate: 5000, keys: 3, node_dist: uniform}
events:
  - {at: 2300ms, partition: ["0-4", "5-9"]}
  - {at: 4000ms, heal: true}
`)
	for _, seed := range []uint64{1, 2, 3} {
		res, err := Run(sc, Options{Seed: &seed})
		if err != nil {
			t.Fatal(err)
		}
		for _, rs := range res.Summary.Rules {
			if rs.OvershootMax > 0.02 {
				t.Errorf("seed %d, rule %s: overshoot_max %v > 0.02", seed, rs.Name, rs.OvershootMax)
			}
		}
	}
}

// TestLibraryScenarios runs every library scenario but scale-1000 (see
// TestScale1000) and checks the claims the library makes. It is heavy and
// single-threaded at heart, so it skips under -race and -short; CI without
// -race runs it.
func TestLibraryScenarios(t *testing.T) {
	if raceEnabled || testing.Short() {
		t.Skip("heavy scenarios skip under -race and -short; run go test ./simulator/ without them")
	}
	for _, name := range Library() {
		if name == "scale-1000" {
			continue
		}
		t.Run(name, func(t *testing.T) {
			res := runLibrary(t, name, nil)
			for _, rs := range res.Summary.Rules {
				if rs.Offered == 0 || rs.Admitted > rs.Offered {
					t.Errorf("rule %s: %+v", rs.Name, rs)
				}
			}
			rs := res.Summary.Rules[0]
			switch name {
			case "steady":
				if rs.OvershootMax > 0.02 || rs.Utilisation < 0.95 {
					t.Errorf("steady: overshoot_max %v, utilisation %v", rs.OvershootMax, rs.Utilisation)
				}
			case "partition-strict":
				if rs.OvershootMax > 0.02 {
					t.Errorf("partition-strict: overshoot_max %v > 0.02", rs.OvershootMax)
				}
				checkPartition(t, name, res) // partition_report_test.go
			case "partition-minority", "crash-strict", "join-one-seed":
				// Issue 12: a fenced minority, a majority's reclaim, and
				// joiners through one seed all hold the limit; the
				// reclaim brings the survivors back to the whole limit
				// within seconds (with evict_after, 30 s, crash-strict's
				// utilisation was about 0.9).
				minUtil := map[string]float64{"partition-minority": 0.8, "crash-strict": 0.95, "join-one-seed": 0.99}[name]
				if rs.OvershootMax > 0.02 || rs.Utilisation < minUtil {
					t.Errorf("%s: overshoot_max %v (want ≤ 0.02), utilisation %v (want ≥ %v)", name, rs.OvershootMax, rs.Utilisation, minUtil)
				}
			case "connections", "connections-strict":
				checkConnections(t, name, res) // leases_test.go
			case "partition-available":
				if rs.OvershootMax < 0.5 {
					t.Errorf("partition-available: overshoot_max %v; each side should use the whole limit", rs.OvershootMax)
				}
				checkPartition(t, name, res)
			}
		})
	}
}

// TestHealStrictNoCascade runs heal-strict: a 2 | 3 split under strict
// healed after 31 s, the minority reconnecting with one majority member
// 300 ms before the others. Only the minority members, which the majority
// reclaimed, take new incarnations, one each; before, the minority
// reclaimed the two majority members it had not heard yet and they
// re-incarnated too.
func TestHealStrictNoCascade(t *testing.T) {
	res := runLibrary(t, "heal-strict", nil)
	var nodes []int
	for _, ri := range res.Summary.Reincarnations {
		nodes = append(nodes, ri.Node)
		if ri.AtS < 41 || ri.AtS > 42 {
			t.Errorf("node %d re-incarnated at %v s; want within a second of the heal at 41 s", ri.Node, ri.AtS)
		}
	}
	// In the order they report it, each at its own next tick: nodes'
	// ticks drift apart (a leading edge moves a node's next sync).
	sort.Ints(nodes)
	if fmt.Sprint(nodes) != "[0 1]" {
		t.Errorf("re-incarnated nodes %v; want [0 1], the minority, once each", nodes)
	}
	if rs := res.Summary.Rules[0]; rs.OvershootMax > 0.02 {
		t.Errorf("overshoot_max %v > 0.02", rs.OvershootMax)
	}
}

// TestScale1000 runs the 1000-node scenario. It takes many minutes with
// the current core (10 million Core.Step calls per virtual second), so it
// runs only when RATEMESH_SIM_SCALE=1.
func TestScale1000(t *testing.T) {
	if os.Getenv("RATEMESH_SIM_SCALE") != "1" || raceEnabled {
		t.Skip("set RATEMESH_SIM_SCALE=1 (without -race) to run scale-1000")
	}
	res := runLibrary(t, "scale-1000", nil)
	fmt.Fprintf(os.Stderr, "scale-1000: wall %.1fs\n", res.Summary.WallSeconds)
	if rs := res.Summary.Rules[0]; rs.OvershootMax > 0.02 {
		t.Errorf("overshoot_max %v", rs.OvershootMax)
	}
}

func TestP99(t *testing.T) {
	cases := []struct {
		pos  []float64
		n    uint64
		want float64
	}{
		{nil, 0, 0},
		{nil, 100, 0},
		{[]float64{0.5}, 100, 0},
		{[]float64{0.5, 0.7}, 100, 0.5},
		{[]float64{3, 1, 2}, 3, 3},
	}
	for _, c := range cases {
		if got := p99(append([]float64(nil), c.pos...), c.n); got != c.want {
			t.Errorf("p99(%v, %d) = %v, want %v", c.pos, c.n, got, c.want)
		}
	}
}

func TestTableNamesEveryRule(t *testing.T) {
	res := &Result{Summary: Summary{Scenario: "s", Rules: []RuleSummary{{Name: "alpha"}, {Name: "beta"}}}}
	var b strings.Builder
	if err := res.WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "alpha") || !strings.Contains(b.String(), "beta") {
		t.Errorf("table:\n%s", b.String())
	}
}

// TestShareWaitHolds: a burst of about 900 requests in 170 ms over three
// nodes, within a limit of 1000 per 20 s. Decided at once, the nodes'
// shares run out while their admissions await acknowledgements and some
// requests are refused although the limit has room; with share_wait the
// nodes hold them until the acknowledgements return, and admit all.
func TestShareWaitHolds(t *testing.T) {
	const burst = `
name: burst
seed: 1
duration: 3s
nodes: 3
network: {latency: 1ms, jitter: 1ms}
rules:
  - {name: api, algorithm: fixed_window, limit: 1000, window: 20s%s}
workload:
  - {rule: api, rate: 0, keys: 1}
events:
  - {at: 1s, rate: {workload: 0, rate: 5300}}
  - {at: 1170ms, rate: {workload: 0, rate: 0}}
`
	run := func(extra string) (offered, admitted uint64) {
		res, err := Run(mustParse(t, fmt.Sprintf(burst, extra)), Options{})
		if err != nil {
			t.Fatal(err)
		}
		r := res.Summary.Rules[0]
		return r.Offered, r.Admitted
	}
	off, adm := run("")
	if off < 800 || off > 1000 || adm >= off {
		t.Fatalf("refused at once: %d of %d admitted; want some refused (the test's premise)", adm, off)
	}
	offH, admH := run(", share_wait: 200ms")
	if offH != off || admH != offH {
		t.Errorf("held: %d of %d admitted, want all (refused at once: %d of %d)", admH, offH, adm, off)
	}
	t.Logf("refused at once: %d of %d admitted; held (share_wait 200ms): %d of %d", adm, off, admH, offH)
}
