package simulator

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ratemesh/ratemesh/limiter"
	"github.com/ratemesh/ratemesh/node"
)

// designExample is the design contract's example scenario, verbatim: the
// scenario of the outside contract, kept beside the repository as
// ../shared/DESIGN.md (not in it).
const designExample = `
name: partition-strict
seed: 1
duration: 60s
nodes: 50
network: {latency: 20ms, jitter: 10ms, loss: 0.01}   # loss: per message per receiver
mesh: {sync_interval: 20ms, heartbeat: 1s, dead_after: 5s, partition_policy: strict}
rules:
  - {name: api, algorithm: sliding_window, limit: 1000, window: 1s}
workload:
  - {rule: api, rate: 10000, keys: 100, key_dist: "zipf:1.1", node_dist: uniform}
  - {rule: api, rate: 50, keys: 10, key_dist: uniform, node_dist: uniform, well_behaved: true}
events:
  - {at: 10s, skew: {nodes: "0-9", spread: 150ms}}   # each gets a fixed offset in ±spread
  - {at: 12s, skew: {nodes: "4", by: -120ms}}         # or exactly this offset
  - {at: 20s, partition: ["0-24", "25-49"]}           # inclusive index ranges, or lists
  - {at: 40s, heal: true}
  - {at: 45s, crash: [3, 4]}
  - {at: 50s, restart: [3]}
  - {at: 52s, join: 2}                                # two new nodes
  - {at: 55s, leave: [7]}                             # graceful
  - {at: 30s, rate: {rule: api, rate: 50000}}          # change a workload's offered rate
churn: {every: 10s, fraction: 0.1, down_for: 2s}      # optional random crash/restart
`

func TestParseDesignExample(t *testing.T) {
	sc, err := Parse([]byte(designExample))
	if err != nil {
		t.Fatal(err)
	}
	if sc.Nodes != 50 || sc.total() != 52 || len(sc.Events) != 9 || sc.Churn == nil || sc.Churn.Fraction != 0.1 {
		t.Fatalf("parsed %+v", sc)
	}
	var kinds []string
	for _, e := range sc.Events {
		kinds = append(kinds, string(e.Kind))
	}
	if got := strings.Join(kinds, ","); got != "skew,skew,partition,rate,heal,crash,restart,join,leave" {
		t.Errorf("events in time order: %s", got)
	}
	if e := sc.Events[3]; e.Workload != 0 || e.Rate != 50000 {
		t.Errorf("rate event %+v, want workload 0 to 50000", e)
	}
	if g := sc.Events[2].Groups; len(g) != 2 || len(g[0]) != 25 || g[1][0] != 25 {
		t.Errorf("partition groups %v", g)
	}
	if sc.Events[1].By != -120e6 || !sc.Events[1].HasBy {
		t.Errorf("skew by %v", sc.Events[1].By)
	}
}

func TestLibraryParses(t *testing.T) {
	names := Library()
	if len(names) < 10 {
		t.Fatalf("library holds %v", names)
	}
	for _, name := range names {
		data, err := LibraryScenario(name)
		if err != nil {
			t.Fatal(err)
		}
		sc, err := Parse(data)
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if sc.Name != name {
			t.Errorf("%s.yaml names itself %q", name, sc.Name)
		}
	}
}

func TestParseErrorsNameTheField(t *testing.T) {
	base := func(extra string) string {
		return "name: x\nduration: 10s\nnodes: 3\nrules:\n  - {name: api, algorithm: fixed_window, limit: 100, window: 1s}\nworkload:\n  - {rule: api, rate: 10}\n" + extra
	}
	cases := []struct {
		name, yaml, want string
	}{
		{"unknown top-level field", base("colour: red\n"), "colour"},
		{"unknown network field", base("network: {latency: 5ms, bandwidth: 3}\n"), "bandwidth"},
		{"unknown rule field", strings.Replace(base(""), "window: 1s}", "window: 1s, burst: 3}", 1), "burst"},
		{"bad duration", strings.Replace(base(""), "duration: 10s", "duration: 10 seconds", 1), "duration"},
		{"duration without unit", strings.Replace(base(""), "duration: 10s", "duration: 10", 1), "duration"},
		{"type error quotes the line", strings.Replace(base(""), "nodes: 3", "nodes: many", 1), "nodes: many"},
		{"no nodes", strings.Replace(base(""), "nodes: 3", "nodes: 0", 1), "nodes"},
		{"negative loss", base("network: {loss: -0.1}\n"), "network.loss"},
		{"loss of one", base("network: {loss: 1}\n"), "network.loss"},
		{"bad jitter", base("network: {jitter: fast}\n"), "network.jitter"},
		{"zero limit", strings.Replace(base(""), "limit: 100", "limit: 0", 1), `rules[0] "api": limit`},
		{"bad algorithm", strings.Replace(base(""), "fixed_window", "leaky_bucket", 1), "algorithm"},
		{"bad mode", strings.Replace(base(""), "window: 1s}", "window: 1s, mode: drop}", 1), "mode"},
		{"bad share", strings.Replace(base(""), "window: 1s}", "window: 1s, share: fair}", 1), "share"},
		{"suppress on concurrency", strings.Replace(base(""), "fixed_window, limit: 100, window: 1s}", "concurrency, limit: 100, mode: suppress}", 1), "mode"},
		{"pace on concurrency", strings.Replace(base(""), "fixed_window, limit: 100, window: 1s}", "concurrency, limit: 100, pace: true}", 1), "pace"},
		{"bad class", strings.Replace(base(""), "window: 1s}", "window: 1s, classes: {gold: lots}}", 1), "classes.gold"},
		{"bad share_wait", strings.Replace(base(""), "window: 1s}", "window: 1s, share_wait: soon}", 1), `rules[0] "api": share_wait`},
		{"negative share_wait", strings.Replace(base(""), "window: 1s}", "window: 1s, share_wait: -1ms}", 1), `rules[0] "api": share_wait`},
		{"share_wait over max", strings.Replace(base(""), "window: 1s}", "window: 1s, share_wait: 2s}", 1), "share_wait"},
		{"bad policy", base("mesh: {partition_policy: lenient}\n"), "partition_policy"},
		{"heartbeat below sync", base("mesh: {sync_interval: 1s, heartbeat: 500ms}\n"), "mesh.heartbeat"},
		{"bad mesh duration", base("mesh: {dead_after: soon}\n"), "mesh.dead_after"},
		{"unknown mesh field", base("mesh: {gossip_factor: 3}\n"), "gossip_factor"},
		{"namespace", base("mesh: {namespace: edge}\n"), "mesh.namespace: does not apply"},
		{"bad local_clock", base("mesh: {local_clock: maybe}\n"), `mesh.local_clock: line 8: must be true or false, got "maybe"`},
		{"zero join_timeout", base("mesh: {join_timeout: 0s}\n"), "mesh.join_timeout: must be positive"},
		{"mesh not a mapping", base("mesh: 5\n"), "mesh: line 8: must be a mapping"},
		{"rules not a list", strings.Replace(base(""), "rules:\n  - {name: api, algorithm: fixed_window, limit: 100, window: 1s}", "rules: {name: api}", 1), "rules: line 4: must be a list of rules"},
		{"empty rules", strings.Replace(base(""), "rules:\n  - {name: api, algorithm: fixed_window, limit: 100, window: 1s}", "rules: []", 1), "rules: at least one rule is needed"},
		{"rule error names the line", strings.Replace(base(""), "limit: 100", "limit: lots", 1), `rules[0] "api": limit: line 5: must be a whole number`},
		{"unknown rule in workload", strings.Replace(base(""), "{rule: api, rate: 10}", "{rule: web, rate: 10}", 1), "workload[0].rule"},
		{"negative rate", strings.Replace(base(""), "rate: 10}", "rate: -1}", 1), "workload[0].rate"},
		{"missing rate", strings.Replace(base(""), "rate: 10}", "keys: 3}", 1), "workload[0].rate"},
		{"bad key_dist", strings.Replace(base(""), "rate: 10}", "rate: 10, key_dist: normal}", 1), "workload[0].key_dist"},
		{"bad zipf", strings.Replace(base(""), "rate: 10}", "rate: 10, key_dist: \"zipf:-1\"}", 1), "workload[0].key_dist"},
		{"bad node_dist", strings.Replace(base(""), "rate: 10}", "rate: 10, node_dist: \"skew:2:1\"}", 1), "workload[0].node_dist"},
		{"single beyond nodes", strings.Replace(base(""), "rate: 10}", "rate: 10, node_dist: \"single:7\"}", 1), "workload[0].node_dist"},
		{"too many keys", strings.Replace(base(""), "rate: 10}", "rate: 10, keys: 0}", 1), "workload[0].keys"},
		{"unknown class", strings.Replace(base(""), "rate: 10}", "rate: 10, class: gold}", 1), "workload[0].class"},
		{"well_behaved over the limit", strings.Replace(base(""), "rate: 10}", "rate: 500, well_behaved: true}", 1), "workload[0].rate"},
		{"unknown workload field", strings.Replace(base(""), "rate: 10}", "rate: 10, burst: 2}", 1), "burst"},
		{"event past the end", base("events:\n  - {at: 20s, heal: true}\n"), "events[0].at"},
		{"event without action", base("events:\n  - {at: 2s}\n"), "events[0]"},
		{"event with two actions", base("events:\n  - {at: 2s, heal: true, join: 1}\n"), "events[0]"},
		{"crash of a missing node", base("events:\n  - {at: 2s, crash: [5]}\n"), "events[0].crash"},
		{"bad range", base("events:\n  - {at: 2s, crash: \"2-1\"}\n"), "events[0].crash"},
		{"node in two groups", base("events:\n  - {at: 2s, partition: [\"0-1\", \"1-2\"]}\n"), "events[0].partition[1]"},
		{"skew with both", base("events:\n  - {at: 2s, skew: {nodes: 0, spread: 5ms, by: 5ms}}\n"), "events[0].skew"},
		{"rate of unknown rule", base("events:\n  - {at: 2s, rate: {rule: web, rate: 5}}\n"), "events[0].rate.rule"},
		{"rate of unknown workload", base("events:\n  - {at: 2s, rate: {workload: 3, rate: 5}}\n"), "events[0].rate.workload"},
		{"unknown event field", base("events:\n  - {at: 2s, heal: true, when: now}\n"), "when"},
		{"churn fraction", base("churn: {every: 5s, fraction: 2, down_for: 1s}\n"), "churn.fraction"},
		{"churn without every", base("churn: {fraction: 0.5, down_for: 1s}\n"), "churn.every"},
		{"no rules", "name: x\nduration: 1s\nnodes: 1\nworkload:\n  - {rule: api, rate: 1}\n", "rules"},
		{"duplicate rule", strings.Replace(base(""), "rules:\n", "rules:\n  - {name: api, algorithm: fixed_window, limit: 5, window: 1s}\n", 1), "defined twice"},
		{"no name", strings.Replace(base(""), "name: x\n", "", 1), "name"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse([]byte(c.yaml))
			if err == nil {
				t.Fatalf("no error for:\n%s", c.yaml)
			}
			if !errors.Is(err, ErrScenario) {
				t.Errorf("error %v does not wrap ErrScenario", err)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %q does not name %q", err, c.want)
			}
		})
	}
}

// TestParseMeshAndRules: the mesh section and the rules are read as a
// config file's (config.ParseMesh, config.ParseRules), with the
// simulator's own mesh keys join_timeout and local_clock.
func TestParseMeshAndRules(t *testing.T) {
	sc, err := Parse([]byte(`name: x
duration: 10s
nodes: 3
mesh: {sync_interval: 10ms, heartbeat: 100ms, suspect_after: 1s, reclaim_after: 3s, partition_policy: available, join_timeout: 2s, local_clock: true}
rules:
  - {name: api, algorithm: fixed_window, limit: 100, window: 1s, lease_ttl: 5s, classes: {gold: 2}}
  - {name: conc, algorithm: concurrency, limit: 3}
workload:
  - {rule: api, rate: 10}
`))
	if err != nil {
		t.Fatal(err)
	}
	m := sc.Mesh
	if m.SyncInterval != 10*time.Millisecond || m.Heartbeat != 100*time.Millisecond || m.SuspectAfter != time.Second ||
		m.ReclaimAfter != 3*time.Second || m.Policy != node.Available || m.JoinTimeout != 2*time.Second || !m.LocalClock {
		t.Errorf("mesh %+v", m)
	}
	if def := node.DefaultCoreConfig(); m.DeadAfter != def.DeadAfter || m.MaxSkew != def.MaxSkew {
		t.Errorf("unset mesh settings %+v, want the defaults", m)
	}
	// Rules come normalised; lease_ttl on a windowed rule is ignored, with
	// a warning, as the daemon does.
	if r := sc.Rules[0]; r.Mode != limiter.Reject || r.LeaseTTL != 0 || r.Classes["gold"].Multiplier != 2 {
		t.Errorf("rule %+v", r)
	}
	if r := sc.Rules[1]; r.LeaseTTL != limiter.DefaultLeaseTTL {
		t.Errorf("concurrency rule's lease_ttl %v, want the default", r.LeaseTTL)
	}
	if len(sc.Warnings) != 1 || !strings.Contains(sc.Warnings[0], `rules[0] "api": lease_ttl`) {
		t.Errorf("warnings %q", sc.Warnings)
	}
}

func TestParseNodeSets(t *testing.T) {
	sc, err := Parse([]byte(`name: x
duration: 10s
nodes: 10
rules: [{name: api, algorithm: fixed_window, limit: 100, window: 1s}]
workload: [{rule: api, rate: 10, nodes: "2-4", node_dist: "single:3"}]
events:
  - {at: 1s, crash: [1, "5-6", 6]}
  - {at: 2s, restart: "1,5"}
  - {at: 3s, partition: [[0, 1], "2-4"]}
`))
	if err != nil {
		t.Fatal(err)
	}
	if got := sc.Events[0].Nodes; len(got) != 3 || got[0] != 1 || got[1] != 5 || got[2] != 6 {
		t.Errorf("crash nodes %v, want [1 5 6]", got)
	}
	if got := sc.Events[1].Nodes; len(got) != 2 || got[1] != 5 {
		t.Errorf("restart nodes %v, want [1 5]", got)
	}
	if w := sc.Workloads[0]; len(w.Nodes) != 3 || w.NodeDist.Kind != "single" || w.NodeDist.Node != 3 {
		t.Errorf("workload %+v", w)
	}
}

// TestParsePublishGap: mesh.publish_gap is the runtime's
// node.Config.PublishGap, 0 its default (node.PublishGap), tick or a
// negative duration no leading edge (edge.go).
func TestParsePublishGap(t *testing.T) {
	const yml = "name: x\nduration: 10s\nnodes: 3\nmesh: {sync_interval: 100ms%s}\n" +
		"rules:\n  - {name: api, algorithm: fixed_window, limit: 100, window: 1s}\nworkload:\n  - {rule: api, rate: 10}\n"
	cases := []struct {
		mesh string
		want time.Duration
	}{
		{"", 0},
		{", publish_gap: 0", 0},
		{", publish_gap: 0s", 0},
		{", publish_gap: 20ms", 20 * time.Millisecond},
		{", publish_gap: tick", -1},
		{", publish_gap: -5ms", -1},
	}
	for _, c := range cases {
		sc := mustParse(t, strings.Replace(yml, "%s", c.mesh, 1))
		if sc.PublishGap != c.want {
			t.Errorf("mesh {sync_interval: 100ms%s}: PublishGap %v, want %v", c.mesh, sc.PublishGap, c.want)
		}
	}
	for _, bad := range []string{"soon", "10", "[1]", "true"} {
		_, err := Parse([]byte(strings.Replace(yml, "%s", ", publish_gap: "+bad, 1)))
		if err == nil || !errors.Is(err, ErrScenario) || !strings.Contains(err.Error(), "mesh.publish_gap: line 4: must be a duration") {
			t.Errorf("publish_gap: %s: error %v, want one naming mesh.publish_gap", bad, err)
		}
	}
}
