package config_test

import (
	"strings"
	"testing"

	"github.com/ratemesh/ratemesh/config"
)

// TestCheckBootstrap: a HOST:PORT is refused with the multiaddr to write
// instead; a multiaddr without its peer ID says so; good entries pass.
func TestCheckBootstrap(t *testing.T) {
	const id = "12D3KooWDpJ7As7BWAwRMfu1VU2WCqNjvq387JEYKDBj4kx6nXTN"
	for entry, want := range map[string]string{
		"1.2.3.4:4001":                    "not a multiaddr or dns:HOST:PORT; try /ip4/1.2.3.4/tcp/4001/p2p/<peer ID>",
		"[::1]:4001":                      "not a multiaddr or dns:HOST:PORT; try /ip6/::1/tcp/4001/p2p/<peer ID>",
		"ratemesh:8080":                   "not a multiaddr or dns:HOST:PORT; try dns:ratemesh:<API port>",
		"garbage":                         "not a multiaddr or dns:HOST:PORT",
		"/ip4/1.2.3.4/tcp/4001":           "want a multiaddr ending in /p2p/<peer ID>",
		"/ip4/1.2.3.4/tcpx/4001":          "not a multiaddr: ",
		"dns:ratemesh":                    "want dns:HOST:PORT",
		"dns:ratemesh:8080":               "",
		"/ip4/1.2.3.4/tcp/4001/p2p/" + id: "",
		"/dns/ratemesh-0.ratemesh/tcp/4001/p2p/" + id: "",
	} {
		err := config.CheckBootstrap(entry)
		switch {
		case want == "" && err != nil:
			t.Errorf("CheckBootstrap(%q) = %v, want nil", entry, err)
		case want != "" && (err == nil || !strings.HasPrefix(err.Error(), want)):
			t.Errorf("CheckBootstrap(%q) = %v, want %q", entry, err, want)
		}
	}
	_, err := config.Parse([]byte("node:\n  bootstrap: [\"1.2.3.4:4001\"]\n"))
	if err == nil || !strings.Contains(err.Error(), `node.bootstrap[0]: "1.2.3.4:4001": not a multiaddr or dns:HOST:PORT; try /ip4/1.2.3.4/tcp/4001/p2p/<peer ID>`) {
		t.Errorf("a HOST:PORT in the file: %v", err)
	}
}

// TestNoRulesWarns: a file without rules (empty, or node settings only)
// warns that only the built-in rule exists; a file with rules does not.
func TestNoRulesWarns(t *testing.T) {
	for src, want := range map[string]bool{
		"":                               true,
		"node:\n  api: 127.0.0.1:9000\n": true,
		"rules:\n  - {name: a, algorithm: fixed_window, limit: 5, window: 1s}\n": false,
	} {
		cfg, err := config.Parse([]byte(src))
		if err != nil {
			t.Fatalf("%q: %v", src, err)
		}
		got := len(cfg.Warnings) == 1 && cfg.Warnings[0] == config.NoRulesWarning
		if got != want || !want && len(cfg.Warnings) > 0 {
			t.Errorf("%q: warnings %q, want the no-rules warning: %v", src, cfg.Warnings, want)
		}
	}
}
