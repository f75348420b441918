package main

import (
	"testing"

	"github.com/ratemesh/ratemesh/config"
	"github.com/ratemesh/ratemesh/mesh"
)

func TestRoutable(t *testing.T) {
	for addr, want := range map[string]bool{
		"/ip4/127.0.0.1/tcp/4001":     false,
		"/ip6/::1/tcp/4001":           false,
		"/ip4/0.0.0.0/tcp/4001":       true,
		"/ip4/10.1.2.3/udp/1/quic-v1": true,
		"/ip6/::/tcp/4001":            true,
		"not a multiaddr":             false, // mesh.New names it
	} {
		if got := routable(addr); got != want {
			t.Errorf("routable(%q) = %v, want %v", addr, got, want)
		}
	}
}

// TestMeshConfig: the file's transport settings reach mesh.Config, the
// dns: bootstrap entries excepted (startDNS resolves them).
func TestMeshConfig(t *testing.T) {
	cfg, err := config.Parse([]byte(`
node:
  listen: ["/ip4/127.0.0.1/tcp/4010"]
  bootstrap: ["dns:ratemesh:8080", "/ip4/127.0.0.1/tcp/4001/p2p/12D3KooWDpJ7As7BWAwRMfu1VU2WCqNjvq387JEYKDBj4kx6nXTN"]
  mdns: true
mesh: {namespace: edge}
`))
	if err != nil {
		t.Fatal(err)
	}
	mc := meshConfig(cfg)
	if mc.Namespace != "edge" || !mc.MDNS || len(mc.Listen) != 1 || mc.Listen[0] != "/ip4/127.0.0.1/tcp/4010" {
		t.Errorf("mesh config %+v", mc)
	}
	if len(mc.Bootstrap) != 1 || mc.Bootstrap[0] != cfg.Node.Bootstrap[1] {
		t.Errorf("bootstrap %v, want only the multiaddr", mc.Bootstrap)
	}
	if def := mesh.DefaultConfig(); mc.DialTimeout != def.DialTimeout || mc.MaxMessageBytes != def.MaxMessageBytes {
		t.Errorf("mesh defaults lost: %+v", mc)
	}
}
