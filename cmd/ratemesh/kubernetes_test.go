package main

import (
	"flag"
	"io"
	"net"
	"path"
	"slices"
	"strings"
	"testing"
	"time"

	ma "github.com/multiformats/go-multiaddr"

	"github.com/ratemesh/ratemesh/apiauth"
	"github.com/ratemesh/ratemesh/config"
	"github.com/ratemesh/ratemesh/httpapi"
)

// TestKubernetesConstants asserts what deploy/kubernetes/manifest_test
// states about the binary (that module cannot import this one): serve's
// flags, the default API and mesh ports, the open probe paths, the
// shutdown budget and the dns: prefix. A change here that fails this test
// must change the manifests' test (and the manifests) too.
func TestKubernetesConstants(t *testing.T) {
	// deploy/kubernetes/manifest_test/manifest_test.go: serveFlags, boolFlags.
	wantFlags := []string{
		"allow-peer", "allow-peers-dns", "allow-peers-file", "api", "bootstrap", "client-ca", "config",
		"config-poll", "data-dir", "envoy-config", "envoy-share-wait", "grpc", "insecure-api", "listen", "log-format",
		"log-level", "metrics-auth", "pprof", "psk-file", "tls-cert", "tls-key", "token-file", "upgrade-alone",
	}
	wantBool := []string{"insecure-api", "metrics-auth", "upgrade-alone"}
	var o serveOpts
	fset := serveFlags(io.Discard, &o)
	var names, bools []string
	fset.VisitAll(func(f *flag.Flag) {
		names = append(names, f.Name)
		if b, ok := f.Value.(interface{ IsBoolFlag() bool }); ok && b.IsBoolFlag() {
			bools = append(bools, f.Name)
		}
	})
	if !slices.Equal(names, wantFlags) || !slices.Equal(bools, wantBool) {
		t.Errorf("serve's flags %q (bool %q), the manifests' test states %q (bool %q)", names, bools, wantFlags, wantBool)
	}

	def := config.Default()
	if _, p, _ := net.SplitHostPort(def.Node.API); p != "8080" { // defaultAPIPort
		t.Errorf("default node.api %s, the manifests' test states port 8080", def.Node.API)
	}
	a, err := ma.NewMultiaddr(def.Node.Listen[0])
	if err != nil {
		t.Fatal(err)
	}
	if p, err := a.ValueForProtocol(ma.P_TCP); err != nil || p != "4001" { // defaultMeshPort
		t.Errorf("default node.listen %s, the manifests' test states port 4001", def.Node.Listen)
	}
	for _, path := range []string{"/livez", "/readyz"} { // livePath, readyPath
		if !slices.Contains(httpapi.Scopes(true), httpapi.Route{Method: "GET", Path: path, Scope: apiauth.None}) {
			t.Errorf("GET %s is not an open route (probes send no token)", path)
		}
	}
	if shutdownBudget != 9*time.Second { // shutdownBudget
		t.Errorf("shutdownBudget %v, the manifests' test states 9s", shutdownBudget)
	}
	if config.DNSPrefix != "dns:" { // dnsPrefix
		t.Errorf("config.DNSPrefix %q, the manifests' test states dns:", config.DNSPrefix)
	}
}

// TestDockerignore: the image's build context leaves out the repository's
// history, data directories (identity.key), keys and local binaries, and
// keeps what the build needs.
func TestDockerignore(t *testing.T) {
	lines := strings.Split(read(t, "../../.dockerignore"), "\n")
	for _, want := range []string{".git", "ratemesh-data", "**/ratemesh-data", "**/*.key", "secrets", "*.test"} {
		if !slices.Contains(lines, want) {
			t.Errorf(".dockerignore lacks %s", want)
		}
	}
	for _, l := range lines {
		for _, needed := range []string{"go.mod", "go.sum", "cmd/ratemesh/main.go", "simulator/scenarios/x.yaml", "deploy/descriptors/edge.yaml"} {
			pat := strings.TrimPrefix(strings.TrimPrefix(l, "**/"), "/")
			if ok, _ := path.Match(pat, needed); ok || l != "" && !strings.HasPrefix(l, "#") && strings.HasPrefix(needed, pat+"/") {
				t.Errorf(".dockerignore's %q leaves out %s, which the build needs", l, needed)
			}
		}
	}
}
