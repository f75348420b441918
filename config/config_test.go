package config_test

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ratemesh/ratemesh/config"
	"github.com/ratemesh/ratemesh/limiter"
	"github.com/ratemesh/ratemesh/node"
)

// designExample is the design contract's example config, verbatim: the
// config file of the outside contract, kept beside the repository as
// ../shared/DESIGN.md (not in it).
const designExample = `
node:
  listen: ["/ip4/127.0.0.1/tcp/4001"]
  api: "127.0.0.1:8080"
  data_dir: "./ratemesh-data"
  bootstrap: []
  mdns: false
  psk_file: ""               # swarm.key: only holders of this key can connect
  join_timeout: 3s
  flush_interval: 1s         # persistence batch
  persist_min_window: 1m     # windows at least this long survive restarts
mesh:
  namespace: "default"
  sync_interval: 20ms
  heartbeat: 500ms           # idle nodes still send this often
  repair_interval: 5s
  suspect_after: 2s          # silence that makes a member suspect
  dead_after: 5s
  evict_after: 30s           # strict: a member silent this long stops holding capacity
  partition_policy: strict   # or available
  max_skew: 500ms
rules:
  - name: publish
    algorithm: sliding_window   # fixed_window | sliding_window | concurrency
    limit: 1000
    window: 1s
    mode: reject                # or suppress
    share: equal                # or demand
    demand_floor: 0.05
    pace: false
    classes: {payer: 5, node: unlimited}
    costs: {query: {per: 10}, publish: {each: 100}, subscribe: {each: 10}}
    overrides: [{key: "acct:42", limit: 5000}]
    max_keys: 1000000
    shadow: false
    lease_ttl: 60s              # concurrency only
`

func TestDesignExample(t *testing.T) {
	cfg, err := config.Parse([]byte(designExample))
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Rules) != 1 {
		t.Fatalf("%d rules", len(cfg.Rules))
	}
	r := cfg.Rules[0]
	switch {
	case r.Name != "publish" || r.Algorithm != limiter.SlidingWindow || r.Limit != 1000 || r.Window != time.Second:
		t.Fatalf("rule %+v", r)
	case r.Classes["payer"].Multiplier != 5 || !r.Classes["node"].Unlimited:
		t.Fatalf("classes %+v", r.Classes)
	case r.Costs["query"].Per != 10 || r.Costs["publish"].Each != 100 || r.Costs["subscribe"].Each != 10:
		t.Fatalf("costs %+v", r.Costs)
	case r.Overrides["acct:42"] != 5000 || r.MaxKeys != 1_000_000 || r.DemandFloor != 0.05:
		t.Fatalf("overrides %+v max_keys %d", r.Overrides, r.MaxKeys)
	case r.LeaseTTL != 0 || len(cfg.Warnings) != 1 || !strings.Contains(cfg.Warnings[0], "lease_ttl"):
		t.Fatalf("lease_ttl on a windowed rule: %v, warnings %q", r.LeaseTTL, cfg.Warnings)
	}
	if cfg.Mesh.SyncInterval != 20*time.Millisecond || cfg.Mesh.Policy != node.Strict || cfg.Node.PersistMinWindow != time.Minute {
		t.Fatalf("sections %+v %+v", cfg.Node, cfg.Mesh)
	}
	nc := cfg.NodeConfig(node.DefaultConfig())
	if nc.SyncInterval != 20*time.Millisecond || nc.Join || len(nc.Rules) != 1 {
		t.Fatalf("node config %+v", nc.CoreConfig)
	}
}

func TestDefaults(t *testing.T) {
	for _, src := range []string{"", "# nothing\n", "node: {}\n"} {
		cfg, err := config.Parse([]byte(src))
		if err != nil {
			t.Fatalf("%q: %v", src, err)
		}
		def := config.Default()
		if cfg.Node.API != "127.0.0.1:8080" || cfg.Node.DataDir != "./ratemesh-data" || cfg.Node.Listen[0] != "/ip4/127.0.0.1/tcp/4001" || cfg.Node.MDNS {
			t.Fatalf("%q: node %+v", src, cfg.Node)
		}
		if len(cfg.Rules) != 1 || cfg.Rules[0].Name != "default" || cfg.Rules[0].Limit != 100 || cfg.Rules[0].Algorithm != limiter.SlidingWindow || cfg.Rules[0].Window != time.Second {
			t.Fatalf("%q: rules %+v", src, cfg.Rules)
		}
		if cfg.Mesh != def.Mesh {
			t.Fatalf("%q: mesh %+v", src, cfg.Mesh)
		}
	}
}

// TestHTTPSection: node.http's defaults, and every field as written.
func TestHTTPSection(t *testing.T) {
	def := config.Default().Node.HTTP
	want := config.HTTP{ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second, IdleTimeout: time.Minute, MaxHeaderBytes: 32 << 10, MaxConns: 1024}
	if def != want {
		t.Fatalf("defaults %+v, want %+v", def, want)
	}
	cfg, err := config.Parse([]byte("node:\n  http: {idle_timeout: 2s}\n"))
	if err != nil || cfg.Node.HTTP.IdleTimeout != 2*time.Second || cfg.Node.HTTP.ReadTimeout != def.ReadTimeout || cfg.Node.HTTP.MaxConns != def.MaxConns {
		t.Fatalf("one field: %+v %v", cfg, err)
	}
	cfg, err = config.Parse([]byte(`node:
  http:
    read_timeout: 3s
    write_timeout: 4s
    idle_timeout: 5s
    max_header_bytes: 2048
    max_conns: 7
`))
	want = config.HTTP{ReadTimeout: 3 * time.Second, WriteTimeout: 4 * time.Second, IdleTimeout: 5 * time.Second, MaxHeaderBytes: 2048, MaxConns: 7}
	if err != nil || cfg.Node.HTTP != want {
		t.Fatalf("every field: %+v %v, want %+v", cfg.Node.HTTP, err, want)
	}
}

// TestNodeMaxKeys: node.max_keys's default, as written, into the node's
// CoreConfig.
func TestNodeMaxKeys(t *testing.T) {
	if got := config.Default().Node.MaxKeys; got != node.DefaultMaxKeys {
		t.Fatalf("default node.max_keys %d, want %d", got, node.DefaultMaxKeys)
	}
	cfg, err := config.Parse([]byte("node: {max_keys: 2000}\n"))
	if err != nil || cfg.Node.MaxKeys != 2000 {
		t.Fatalf("max_keys 2000: %d %v", cfg.Node.MaxKeys, err)
	}
	if got := cfg.NodeConfig(node.DefaultConfig()).MaxKeys; got != 2000 {
		t.Fatalf("the node's MaxKeys %d, want 2000", got)
	}
}

// TestAllowPeers: the allowlist keys of the node section, and that a
// change is reported as needing a restart.
func TestAllowPeers(t *testing.T) {
	const id = "12D3KooWD3eckifWpRn9wQpMG9R9hX3sD158z7EqHWmweQAJU5SA"
	src := "node:\n  allow_peers: [" + id + "]\n  allow_peers_file: /etc/ratemesh/members\n  allow_peers_dns: [ratemesh.default.svc]\n"
	cfg, err := config.Parse([]byte(src))
	if err != nil {
		t.Fatal(err)
	}
	n := cfg.Node
	if len(n.AllowPeers) != 1 || n.AllowPeers[0] != id || n.AllowPeersFile != "/etc/ratemesh/members" || len(n.AllowPeersDNS) != 1 || n.AllowPeersDNS[0] != "ratemesh.default.svc" {
		t.Fatalf("parsed %+v", n)
	}
	if d := config.Default().Node; d.AllowPeers != nil || d.AllowPeersFile != "" || d.AllowPeersDNS != nil {
		t.Fatalf("the allowlist is on by default: %+v", d)
	}
	running := config.Default()
	got := config.ChangedSettings(&running, []byte(src))
	if !slices.Equal(got, []string{"node.allow_peers", "node.allow_peers_file", "node.allow_peers_dns"}) {
		t.Errorf("ChangedSettings = %v", got)
	}
}

func TestBadFiles(t *testing.T) {
	rule := func(extra string) string {
		return "rules:\n  - name: a\n    algorithm: fixed_window\n    limit: 10\n    window: 1s\n  - name: publish\n    algorithm: sliding_window\n    limit: 10\n    window: 1s\n" + extra
	}
	tests := []struct {
		name, src, want string
	}{
		{"unknown top", "nodes: {}\n", "nodes: line 1: unknown field"},
		{"unknown node field", "node:\n  apii: x\n", "node.apii: line 2: unknown field"},
		{"unknown rule field", rule("    limt: 5\n"), `rules[1] "publish": limt: line 10: unknown field`},
		{"window zero", rule("    window: 0s\n"), `rules[1] "publish": window: line 10: defined twice`},
		{"window missing", "rules:\n  - {name: x, algorithm: fixed_window, limit: 5}\n", `rules[0] "x": window: must be positive`},
		{"window not a duration", "rules:\n  - {name: x, algorithm: fixed_window, limit: 5, window: 20}\n", `rules[0] "x": window: line 2: must be a duration`},
		{"negative limit", "rules:\n  - {name: x, algorithm: fixed_window, limit: -5, window: 1s}\n", `rules[0] "x": limit: line 2: must not be negative`},
		{"fractional limit", "rules:\n  - {name: x, algorithm: fixed_window, limit: 1.5, window: 1s}\n", `rules[0] "x": limit: line 2: must be a whole number`},
		{"string limit", "rules:\n  - {name: x, algorithm: fixed_window, limit: lots, window: 1s}\n", `rules[0] "x": limit: line 2: must be a whole number`},
		{"zero limit", "rules:\n  - {name: x, algorithm: fixed_window, limit: 0, window: 1s}\n", `rules[0] "x": limit: must be at least 1`},
		{"bad algorithm", "rules:\n  - {name: x, algorithm: leaky, limit: 5, window: 1s}\n", `rules[0] "x": algorithm: "leaky" is not one of`},
		{"duplicate names", "rules:\n  - {name: x, algorithm: fixed_window, limit: 5, window: 1s}\n  - {name: x, algorithm: fixed_window, limit: 6, window: 1s}\n", `rules[1] "x": name: defined twice`},
		{"suppress on concurrency", "rules:\n  - {name: x, algorithm: concurrency, limit: 5, mode: suppress}\n", `rules[0] "x": mode: suppress applies to windowed rules only`},
		{"demand on concurrency", "rules:\n  - {name: x, algorithm: concurrency, limit: 5, share: demand}\n", `rules[0] "x": share: demand applies to windowed rules only`},
		{"unknown mode", "rules:\n  - {name: x, algorithm: fixed_window, limit: 5, window: 1s, mode: drop}\n", `rules[0] "x": mode: "drop" is not one of reject, suppress`},
		{"unknown share", "rules:\n  - {name: x, algorithm: fixed_window, limit: 5, window: 1s, share: fair}\n", `rules[0] "x": share: "fair" is not one of equal, demand`},
		{"demand_floor over 1", "rules:\n  - {name: x, algorithm: fixed_window, limit: 5, window: 1s, share: demand, demand_floor: 1.5}\n", `rules[0] "x": demand_floor:`},
		{"pace on concurrency", "rules:\n  - {name: x, algorithm: concurrency, limit: 5, pace: true}\n", `rules[0] "x": pace: applies to fixed_window and sliding_window rules only`},
		{"pace not a bool", "rules:\n  - {name: x, algorithm: fixed_window, limit: 5, window: 1s, pace: 10%}\n", `rules[0] "x": pace: line 2: must be true or false`},
		{"bad class", "rules:\n  - {name: x, algorithm: fixed_window, limit: 5, window: 1s, classes: {a: -1}}\n", `rules[0] "x": classes.a: multiplier -1 must be positive`},
		{"class word", "rules:\n  - {name: x, algorithm: fixed_window, limit: 5, window: 1s, classes: {a: lots}}\n", `rules[0] "x": classes.a: must be a positive multiplier or unlimited`},
		{"bad cost", "rules:\n  - {name: x, algorithm: fixed_window, limit: 5, window: 1s, costs: {q: {each: 1, per: 2}}}\n", `rules[0] "x": costs.q: set exactly one of each and per`},
		{"unknown cost field", "rules:\n  - {name: x, algorithm: fixed_window, limit: 5, window: 1s, costs: {q: {every: 1}}}\n", `rules[0] "x": costs.q.every: line 2: unknown field`},
		{"override twice", "rules:\n  - {name: x, algorithm: fixed_window, limit: 5, window: 1s, overrides: [{key: a, limit: 1}, {key: a, limit: 2}]}\n", `rules[0] "x": overrides[1].key: "a" is overridden twice`},
		{"override no limit", "rules:\n  - {name: x, algorithm: fixed_window, limit: 5, window: 1s, overrides: [{key: a}]}\n", `rules[0] "x": overrides[0].limit: must be set`},
		{"max_keys zero", "rules:\n  - {name: x, algorithm: fixed_window, limit: 5, window: 1s, max_keys: 0}\n", `rules[0] "x": max_keys: must be at least 1`},
		{"lease_ttl negative", "rules:\n  - {name: x, algorithm: concurrency, limit: 5, lease_ttl: -1s}\n", `rules[0] "x": lease_ttl: line 2: must not be negative`},
		{"share_wait negative", "rules:\n  - {name: x, algorithm: fixed_window, limit: 5, window: 1s, share_wait: -1ms}\n", `rules[0] "x": share_wait: line 2: must not be negative`},
		{"share_wait over max", "rules:\n  - {name: x, algorithm: fixed_window, limit: 5, window: 1s, share_wait: 2s}\n", `rules[0] "x": share_wait: 2s is over the maximum 1s`},
		{"share_wait not a duration", "rules:\n  - {name: x, algorithm: fixed_window, limit: 5, window: 1s, share_wait: 100}\n", `rules[0] "x": share_wait: line 2: must be a duration`},
		{"no name", "rules:\n  - {algorithm: fixed_window, limit: 5, window: 1s}\n", `rules[0]: name: must not be empty`},
		{"empty rules", "rules: []\n", "rules: the list is empty"},
		{"policy", "mesh: {partition_policy: loose}\n", `mesh.partition_policy: "loose" is not one of strict, available`},
		{"heartbeat", "mesh: {heartbeat: 10ms}\n", "mesh.heartbeat: 10ms is shorter than sync_interval 20ms"},
		{"negative duration", "node: {join_timeout: -3s}\n", "node.join_timeout: line 1: must not be negative"},
		{"zero duration", "mesh: {dead_after: 0s}\n", "mesh.dead_after: must be positive"},
		{"bool", "node: {mdns: yes please}\n", `node.mdns: line 1: must be true or false, got "yes please"`},
		{"list", "node: {listen: /ip4/1.2.3.4/tcp/1}\n", "node.listen: line 1: must be a list of strings"},
		{"yaml", "node: [\n", "yaml: line"},
		{"not a mapping", "- a\n- b\n", "yaml: line 1: the file must be a mapping"},
		{"duplicate key", "node: {api: a, api: b}\n", "node.api: line 1: defined twice"},
		{"http unknown field", "node: {http: {read: 1s}}\n", "node.http.read: line 1: unknown field"},
		{"http not a mapping", "node: {http: 5}\n", "node.http: line 1: must be a mapping"},
		{"http zero timeout", "node: {http: {idle_timeout: 0s}}\n", "node.http.idle_timeout: must be positive"},
		{"http timeout not a duration", "node: {http: {read_timeout: 10}}\n", "node.http.read_timeout: line 1: must be a duration"},
		{"http small header cap", "node: {http: {max_header_bytes: 100}}\n", "node.http.max_header_bytes: 100, must be within 1024 and 1048576"},
		{"http zero conns", "node: {http: {max_conns: 0}}\n", "node.http.max_conns: 0, must be within 1 and 1048576"},
		{"http conns word", "node: {http: {max_conns: many}}\n", "node.http.max_conns: line 1: must be a whole number"},
		{"http negative conns", "node: {http: {max_conns: -1}}\n", "node.http.max_conns: line 1: must not be negative"},
		{"allow_peers bad ID", "node: {allow_peers: [not-a-peer]}\n", `node.allow_peers[0]: "not-a-peer" is not a peer ID`},
		{"allow_peers not a list", "node: {allow_peers: 12D3KooWnope}\n", "node.allow_peers: line 1: must be a list of strings"},
		{"allow_peers_dns bad name", "node: {allow_peers_dns: [\"ratemesh:8080\"]}\n", `node.allow_peers_dns[0]: "ratemesh:8080" is not a DNS name`},
		{"node max_keys zero", "node: {max_keys: 0}\n", "node.max_keys: must be at least 1, got 0"},
		{"node max_keys negative", "node: {max_keys: -5}\n", "node.max_keys: line 1: must not be negative"},
		{"allow_peers_file not a string", "node: {allow_peers_file: [a]}\n", "node.allow_peers_file: line 1: must be"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := config.Parse([]byte(tc.src))
			if err == nil {
				t.Fatalf("accepted:\n%s", tc.src)
			}
			if !strings.HasPrefix(err.Error(), tc.want) {
				t.Fatalf("error %q\nwant prefix %q", err, tc.want)
			}
			if !errors.Is(err, config.ErrInvalid) {
				t.Fatalf("error %v does not wrap ErrInvalid", err)
			}
		})
	}
}

func TestReloadKeepsInvalidRulesOldVersion(t *testing.T) {
	running, err := config.Parse([]byte(`rules:
  - {name: a, algorithm: fixed_window, limit: 10, window: 1s}
  - {name: b, algorithm: fixed_window, limit: 10, window: 1s}
  - {name: gone, algorithm: fixed_window, limit: 10, window: 1s}
`))
	if err != nil {
		t.Fatal(err)
	}
	rules, errs := config.Reload(running.Rules, []byte(`rules:
  - {name: a, algorithm: fixed_window, limit: 20, window: 1s}
  - {name: b, algorithm: fixed_window, limit: 20, window: 0s}
  - {name: c, algorithm: concurrency, limit: 5, mode: suppress}
  - {name: d, algorithm: fixed_window, limit: 7, window: 1s}
`))
	got := map[string]uint64{}
	for _, r := range rules {
		got[r.Name] = r.Limit
	}
	want := map[string]uint64{"a": 20, "b": 10, "d": 7}
	if len(got) != len(want) || got["a"] != 20 || got["b"] != 10 || got["d"] != 7 {
		t.Fatalf("merged %v, want %v", got, want)
	}
	if len(errs) != 2 || !strings.Contains(errs[0].Error(), `rules[1] "b": window`) || !strings.Contains(errs[0].Error(), "keeping the running version") ||
		!strings.Contains(errs[1].Error(), `rules[2] "c": mode`) || !errors.Is(errs[1], config.ErrInvalid) {
		t.Fatalf("errors %v", errs)
	}
	// Not YAML at all: everything stays.
	rules, errs = config.Reload(running.Rules, []byte("rules: [\n"))
	if len(rules) != 3 || len(errs) != 1 {
		t.Fatalf("broken file: %d rules, errs %v", len(rules), errs)
	}
	// A duplicate keeps the old version of the name.
	rules, errs = config.Reload(running.Rules, []byte(`rules:
  - {name: a, algorithm: fixed_window, limit: 30, window: 1s}
  - {name: a, algorithm: fixed_window, limit: 40, window: 1s}
`))
	if len(rules) != 1 || rules[0].Limit != 10 || len(errs) != 2 {
		t.Fatalf("duplicate: %+v, errs %v", rules, errs)
	}
}

// TestParseSuppressDemand: the daemon accepts mode: suppress and
// share: demand with a demand_floor, and hands them to the limiter as
// written.
func TestParseSuppressDemand(t *testing.T) {
	cfg, err := config.Parse([]byte(`rules:
  - {name: flood, algorithm: sliding_window, limit: 10000, window: 1s, mode: suppress}
  - {name: hermes, algorithm: fixed_window, limit: 10, window: 1s, share: demand, demand_floor: 0.2}
  - {name: both, algorithm: fixed_window, limit: 10, window: 1s, mode: suppress, share: demand}
`))
	if err != nil {
		t.Fatal(err)
	}
	want := []struct {
		mode  limiter.Mode
		share limiter.Share
		floor float64
	}{
		{limiter.Suppress, limiter.Equal, limiter.DefaultDemandFloor},
		{limiter.Reject, limiter.Demand, 0.2},
		{limiter.Suppress, limiter.Demand, limiter.DefaultDemandFloor},
	}
	if len(cfg.Rules) != len(want) {
		t.Fatalf("%d rules, want %d", len(cfg.Rules), len(want))
	}
	for i, w := range want {
		r := cfg.Rules[i]
		if r.Mode != w.mode || r.Share != w.share || r.DemandFloor != w.floor {
			t.Errorf("rule %q: mode %q share %q demand_floor %v, want %q %q %v", r.Name, r.Mode, r.Share, r.DemandFloor, w.mode, w.share, w.floor)
		}
	}
}

// TestParseShareWait: share_wait set, absent (the default) and 0 (refuse at
// once), on windowed and concurrency rules.
func TestParseShareWait(t *testing.T) {
	cfg, err := config.Parse([]byte(`
rules:
  - {name: set, algorithm: fixed_window, limit: 5, window: 1s, share_wait: 120ms}
  - {name: unset, algorithm: sliding_window, limit: 5, window: 1s}
  - {name: zero, algorithm: fixed_window, limit: 5, window: 1s, share_wait: 0}
  - {name: leases, algorithm: concurrency, limit: 2, share_wait: 50ms}
`))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]time.Duration{"set": 120 * time.Millisecond, "unset": 0, "zero": limiter.NoShareWait, "leases": 50 * time.Millisecond}
	for _, r := range cfg.Rules {
		if r.ShareWait != want[r.Name] {
			t.Errorf("rule %q: ShareWait %v, want %v", r.Name, r.ShareWait, want[r.Name])
		}
	}
	ack := 2 * cfg.Mesh.SyncInterval
	if got := cfg.Rules[1].ShareWaitFor(ack, 0); got != 200*time.Millisecond {
		t.Errorf("the default at sync_interval %v: %v, want 200ms", cfg.Mesh.SyncInterval, got)
	}
	if got := cfg.Rules[2].ShareWaitFor(ack, 0); got != 0 {
		t.Errorf("share_wait: 0 holds %v, want 0", got)
	}
}
