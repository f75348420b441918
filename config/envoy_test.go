package config_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ratemesh/ratemesh/config"
	"github.com/ratemesh/ratemesh/limiter"
	"github.com/ratemesh/ratemesh/node"
)

// TestEnvoyKeysAndDNSBootstrap: node.grpc, envoy.config and dns: bootstrap
// entries are read, checked by name, and the dns: entries reach the node
// (it joins) but not the mesh's multiaddr list.
func TestEnvoyKeysAndDNSBootstrap(t *testing.T) {
	cfg, err := config.Parse([]byte(`
node:
  grpc: "127.0.0.1:8081"
  bootstrap: ["dns:ratemesh:8080", "/ip4/127.0.0.1/tcp/4001/p2p/12D3KooWDpJ7As7BWAwRMfu1VU2WCqNjvq387JEYKDBj4kx6nXTN"]
envoy:
  config: /etc/ratemesh/descriptors
`))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Node.GRPC != "127.0.0.1:8081" || cfg.Envoy.Config != "/etc/ratemesh/descriptors" {
		t.Errorf("grpc %q envoy.config %q", cfg.Node.GRPC, cfg.Envoy.Config)
	}
	if got := cfg.DNSBootstrap(); len(got) != 1 || got[0] != "ratemesh:8080" {
		t.Errorf("DNSBootstrap %v", got)
	}
	if pb := cfg.PeerBootstrap(); len(pb) != 1 || strings.HasPrefix(pb[0], "dns:") {
		t.Errorf("PeerBootstrap %v", pb)
	}
	if !cfg.NodeConfig(node.DefaultConfig()).Join {
		t.Error("a node with bootstrap entries joins")
	}
	host, port, err := config.SplitDNS("ratemesh:8080")
	if host != "ratemesh" || port != 8080 || err != nil {
		t.Errorf("SplitDNS: %q %d %v", host, port, err)
	}

	for _, c := range []struct{ yaml, want string }{
		{"node: {grpc: nohostport}", "node.grpc"},
		{"node: {bootstrap: [\"dns:ratemesh\"]}", "node.bootstrap[0]"},
		{"node: {bootstrap: [\"dns::8080\"]}", "node.bootstrap[0]"},
		{"node: {bootstrap: [\"dns:ratemesh:99999\"]}", "node.bootstrap[0]"},
		{"envoy: {config: 3, extra: 1}", "envoy.extra"},
	} {
		_, err := config.Parse([]byte(c.yaml))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error naming %s", c.yaml, err, c.want)
		}
	}
}

// TestReloadOfBadYAMLAndRestartSettings: a file that is not YAML is told
// apart (ErrYAML), and the settings a reload cannot apply are named.
func TestReloadOfBadYAMLAndRestartSettings(t *testing.T) {
	running := config.Default()
	_, errs := config.Reload(running.Rules, []byte("rules: [\n"))
	if len(errs) != 1 || !errors.Is(errs[0], config.ErrYAML) {
		t.Errorf("unparsable reload: %v", errs)
	}
	_, errs = config.Reload(running.Rules, []byte("rules:\n  - {name: a, algorithm: nope, limit: 1, window: 1s}\n"))
	for _, e := range errs {
		if errors.Is(e, config.ErrYAML) {
			t.Errorf("an invalid rule is not a YAML error: %v", e)
		}
	}
	got := config.ChangedSettings(&running, []byte(`
node: {api: "127.0.0.1:9999", grpc: ":8081"}
mesh: {heartbeat: 1s}
envoy: {config: x.yaml}
rules: [{name: a, algorithm: fixed_window, limit: 1, window: 1s}]
`))
	if strings.Join(got, ",") != "node.api,node.grpc,mesh.heartbeat,envoy.config" {
		t.Errorf("changed settings %v", got)
	}
	if got := config.ChangedSettings(&running, []byte("rules: [{name: a, algorithm: fixed_window, limit: 1, window: 1s}]\n")); len(got) != 0 {
		t.Errorf("rules only: %v", got)
	}
}

// TestEnvoyShareWait: envoy.share_wait and envoy.domains.D.share_wait are
// read like a rule's share_wait (0 refuses at once), bounded, named in
// errors, and reloaded with the section.
func TestEnvoyShareWait(t *testing.T) {
	cfg, err := config.Parse([]byte(`
envoy:
  config: /etc/ratemesh/descriptors
  share_wait: 8ms
  domains:
    edge: {share_wait: 0}
    api: {share_wait: 150ms}
    quiet:
`))
	if err != nil {
		t.Fatal(err)
	}
	e := cfg.Envoy
	if e.ShareWait != 8*time.Millisecond || len(e.Domains) != 3 || e.Domains["edge"].ShareWait != limiter.NoShareWait || e.Domains["api"].ShareWait != 150*time.Millisecond {
		t.Errorf("envoy section: %+v", e)
	}
	if got := e.DomainShareWaits(); len(got) != 2 || got["edge"] != limiter.NoShareWait || got["api"] != 150*time.Millisecond {
		t.Errorf("DomainShareWaits: %v", got)
	}
	if cfg, err := config.Parse([]byte("envoy: {config: x}\n")); err != nil || cfg.Envoy.ShareWait != 0 || cfg.Envoy.DomainShareWaits() != nil {
		t.Errorf("without share_wait: %+v %v", cfg.Envoy, err)
	}
	for _, c := range []struct{ yaml, want string }{
		{"envoy: {share_wait: 2s}", "envoy.share_wait: line 1: 2s is over the maximum 1s"},
		{"envoy: {share_wait: -1ms}", "envoy.share_wait: line 1: must not be negative"},
		{"envoy: {share_wait: 5}", "envoy.share_wait: line 1: must be a duration"},
		{"envoy: {domains: [edge]}", "envoy.domains: line 1: must be a mapping of domains"},
		{"envoy: {domains: {edge: {share_wait: 1h}}}", "envoy.domains.edge.share_wait: line 1: 1h0m0s is over the maximum 1s"},
		{"envoy: {domains: {edge: {share_wiat: 1ms}}}", "envoy.domains.edge.share_wiat: line 1: unknown field (known: share_wait)"},
		{"envoy: {domains: {edge: 5ms}}", "envoy.domains.edge: line 1: must be a mapping"},
		{"envoy: {domains: {'': {share_wait: 1ms}}}", "envoy.domains: line 1: a domain name must not be empty"},
	} {
		_, err := config.Parse([]byte(c.yaml))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error containing %q", c.yaml, err, c.want)
		}
	}

	running := config.Default().Envoy
	got, err := config.ReloadEnvoy(running, []byte("envoy: {share_wait: 3ms, domains: {edge: {share_wait: 0}}}\nrules: [{name: a, algorithm: nope}]\n"))
	if err != nil || got.ShareWait != 3*time.Millisecond || got.Domains["edge"].ShareWait != limiter.NoShareWait {
		t.Errorf("reload beside an invalid rule: %+v %v", got, err)
	}
	if got, err := config.ReloadEnvoy(got, []byte("envoy: {share_wait: 3s}\n")); err == nil || got.ShareWait != 3*time.Millisecond || !strings.Contains(err.Error(), "envoy.share_wait") {
		t.Errorf("reload of an invalid share_wait keeps the running one: %+v %v", got, err)
	}
	if got, err := config.ReloadEnvoy(got, []byte("envoy: [\n")); err == nil || got.ShareWait != 3*time.Millisecond {
		t.Errorf("reload of a file that is not YAML: %+v %v", got, err)
	}
	if ch := config.ChangedSettings(&config.Config{Node: config.Default().Node, Mesh: config.Default().Mesh}, []byte("envoy: {share_wait: 3ms}\n")); len(ch) != 0 {
		t.Errorf("share_wait reloads, so it is no restart setting: %v", ch)
	}
}
