package main

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
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

// TestMeshConfigAllowlist: the allowlist keys reach mesh.Config; DNS
// names turn on the run-time source.
func TestMeshConfigAllowlist(t *testing.T) {
	const id = "12D3KooWDpJ7As7BWAwRMfu1VU2WCqNjvq387JEYKDBj4kx6nXTN"
	cfg, err := config.Parse([]byte("node:\n  allow_peers: [" + id + "]\n  allow_peers_file: /etc/members\n  allow_peers_dns: [ratemesh.svc]\n"))
	if err != nil {
		t.Fatal(err)
	}
	mc := meshConfig(cfg)
	if len(mc.AllowPeers) != 1 || mc.AllowPeers[0] != id || mc.AllowPeersFile != "/etc/members" || !mc.AllowExternal {
		t.Errorf("mesh config %+v", mc)
	}
	if mc := meshConfig(ptr(config.Default())); len(mc.AllowPeers) != 0 || mc.AllowPeersFile != "" || mc.AllowExternal {
		t.Errorf("the defaults turn the allowlist on: %+v", mc)
	}
}

func ptr[T any](v T) *T { return &v }

// TestWarnAdmission: on a routable address, neither a PSK nor an
// allowlist is a warning; one of them alone is an info line saying what
// the other adds; on loopback nothing is said.
func TestWarnAdmission(t *testing.T) {
	for _, tc := range []struct {
		name   string
		listen string
		psk    bool
		allow  []string
		want   string
	}{
		{"neither", "/ip4/0.0.0.0/tcp/4001", false, nil, "level=WARN msg=\"listening on a routable address with neither a private network key nor an allowlist"},
		{"PSK only", "/ip4/0.0.0.0/tcp/4001", true, nil, "level=INFO msg=\"no allowlist"},
		{"allowlist only", "/ip4/0.0.0.0/tcp/4001", false, []string{"x"}, "level=INFO msg=\"no private network key"},
		{"both", "/ip4/0.0.0.0/tcp/4001", true, []string{"x"}, ""},
		{"loopback", "/ip4/127.0.0.1/tcp/4001", false, nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			cfg := config.Default()
			cfg.Node.Listen = []string{tc.listen}
			cfg.Node.AllowPeersDNS = tc.allow
			warnAdmission(&cfg, tc.psk, slog.New(slog.NewTextHandler(&buf, nil)))
			got := buf.String()
			if tc.want == "" && got != "" || tc.want != "" && !strings.Contains(got, tc.want) {
				t.Errorf("logged %q, want %q", got, tc.want)
			}
		})
	}
}

// TestServeBadAllowFile: serve refuses to start with an allowlist file it
// cannot read or parse, naming the key.
func TestServeBadAllowFile(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "members")
	if err := os.WriteFile(bad, []byte("# members\nnot-a-peer-id\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{bad, filepath.Join(dir, "missing")} {
		var stdout, stderr bytes.Buffer
		code := runServe([]string{"--api", "127.0.0.1:0", "--listen", "/ip4/127.0.0.1/tcp/0", "--data-dir", filepath.Join(dir, "data"), "--allow-peers-file", path}, &stdout, &stderr)
		if code != 1 || !strings.Contains(stderr.String(), "node.allow_peers_file") || stdout.Len() != 0 {
			t.Errorf("%s: exit %d, stderr %q", path, code, stderr.String())
		}
	}
}
