package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// TestServeFlagsReadEnv: every serve flag reads RATEMESH_<NAME>; a flag
// on the command line beats its variable; a repeatable flag's variable
// is a comma-separated list.
func TestServeFlagsReadEnv(t *testing.T) {
	values := map[string]string{"insecure-api": "true", "metrics-auth": "true", "upgrade-alone": "true", "config-poll": "5s", "envoy-share-wait": "7ms"}
	var o serveOpts
	fset := serveFlags(io.Discard, &o)
	env := map[string]string{}
	fset.VisitAll(func(f *flag.Flag) {
		v, ok := values[f.Name]
		if !ok {
			v = "from-env-" + f.Name
		}
		env[envName(f.Name)] = v
	})
	env["RATEMESH_BOOTSTRAP"] = "dns:ratemesh:8080, /ip4/10.0.0.1/tcp/4001/p2p/x,"
	if err := fset.Parse([]string{"--api", "127.0.0.1:9999"}); err != nil {
		t.Fatal(err)
	}
	fromEnv, err := applyEnv(fset, func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	fset.VisitAll(func(f *flag.Flag) {
		want := env[envName(f.Name)]
		switch f.Name {
		case "api":
			want = "127.0.0.1:9999" // the flag beats RATEMESH_API
		case "bootstrap":
			want = "dns:ratemesh:8080,/ip4/10.0.0.1/tcp/4001/p2p/x"
		}
		if got := f.Value.String(); got != want {
			t.Errorf("--%s = %q with %s=%q, want %q", f.Name, got, envName(f.Name), env[envName(f.Name)], want)
		}
		if fromEnv[f.Name] == (f.Name == "api") {
			t.Errorf("fromEnv[%s] = %v", f.Name, fromEnv[f.Name])
		}
		if !strings.Contains(f.Usage, "$"+envName(f.Name)) {
			t.Errorf("--%s's help does not name %s: %q", f.Name, envName(f.Name), f.Usage)
		}
	})
	if len(o.bootstrap) != 2 || !o.insecureAPI || o.configPoll.String() != "5s" {
		t.Errorf("opts %+v", o)
	}
	if got := envName("allow-peers-dns"); got != "RATEMESH_ALLOW_PEERS_DNS" {
		t.Errorf("envName = %s", got)
	}
	// A bad value names the variable and the flag.
	o = serveOpts{}
	fset = serveFlags(io.Discard, &o)
	_ = fset.Parse(nil)
	_, err = applyEnv(fset, func(k string) string { return map[string]string{"RATEMESH_CONFIG_POLL": "soon"}[k] })
	if err == nil || !strings.HasPrefix(err.Error(), `RATEMESH_CONFIG_POLL (--config-poll) "soon": `) {
		t.Errorf("bad variable: %v", err)
	}
}

// TestServeFlagErrors: a bad --bootstrap says what to write instead,
// naming the flag (or its variable); --log-level lists the levels;
// --pprof on a routable address without --insecure-api is refused.
func TestServeFlagErrors(t *testing.T) {
	dir := t.TempDir()
	base := []string{"--api", "127.0.0.1:0", "--listen", "/ip4/127.0.0.1/tcp/0", "--data-dir", filepath.Join(dir, "d")}
	for _, tc := range []struct {
		args []string
		env  string
		code int
		want string
	}{
		{[]string{"--bootstrap", "1.2.3.4:4001"}, "", 2, "ratemesh serve: --bootstrap 1.2.3.4:4001: not a multiaddr or dns:HOST:PORT; try /ip4/1.2.3.4/tcp/4001/p2p/<peer ID>\n"},
		{nil, "1.2.3.4:4001", 2, "ratemesh serve: RATEMESH_BOOTSTRAP (--bootstrap) 1.2.3.4:4001: not a multiaddr or dns:HOST:PORT; try /ip4/1.2.3.4/tcp/4001/p2p/<peer ID>\n"},
		{[]string{"--log-level", "verbose"}, "", 2, `ratemesh serve: --log-level: "verbose" is not a log level; want one of debug, info, warn, error` + "\n"},
		{[]string{"--pprof", "0.0.0.0:6060"}, "", 1, `ratemesh serve: --pprof: "0.0.0.0:6060" is not a loopback address`},
		{[]string{"--config-poll", "-1s"}, "", 2, "ratemesh serve: --config-poll -1s: must be 0 (off) or positive\n"},
		{[]string{"--envoy-share-wait", "2s"}, "", 2, "ratemesh serve: --envoy-share-wait 2s: must be from 0 (refuse at once) to 1s\n"},
		{[]string{"--envoy-share-wait", "5ms"}, "", 1, "ratemesh serve: envoy.share_wait, envoy.domains: they set the rules generated from the descriptor files, and envoy.config (--envoy-config) names none\n"},
	} {
		t.Setenv("RATEMESH_BOOTSTRAP", tc.env)
		var stdout, stderr bytes.Buffer
		code := runServe(append(append([]string(nil), base...), tc.args...), &stdout, &stderr)
		if code != tc.code || !strings.HasPrefix(stderr.String(), tc.want) || stdout.Len() != 0 {
			t.Errorf("%q (RATEMESH_BOOTSTRAP=%q): exit %d, stderr %q; want %d, %q", tc.args, tc.env, code, stderr.String(), tc.code, tc.want)
		}
	}
}

// TestPprofAddress: off unless asked; a bare port is loopback; a
// routable host needs insecure.
func TestPprofAddress(t *testing.T) {
	for _, tc := range []struct {
		addr     string
		insecure bool
		want     string // "error" for a refusal
	}{
		{"", false, ""},
		{":6060", false, "127.0.0.1:6060"},
		{"127.0.0.1:6060", false, "127.0.0.1:6060"},
		{"[::1]:6060", false, "[::1]:6060"},
		{"localhost:6060", false, "localhost:6060"},
		{"0.0.0.0:6060", false, "error"},
		{"10.1.2.3:6060", false, "error"},
		{"0.0.0.0:6060", true, "0.0.0.0:6060"},
		{"6060", false, "error"},
	} {
		got, err := pprofAddress(tc.addr, tc.insecure)
		if err != nil {
			got = "error"
		}
		if got != tc.want {
			t.Errorf("pprofAddress(%q, %v) = %q (%v), want %q", tc.addr, tc.insecure, got, err, tc.want)
		}
	}
}

// TestBuildInfoMetric: ratemesh_build_info is 1 with the version line's
// version, revision and Go version.
func TestBuildInfoMetric(t *testing.T) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(buildInfoCollector())
	mfs, err := reg.Gather()
	if err != nil || len(mfs) != 1 || mfs[0].GetName() != "ratemesh_build_info" {
		t.Fatalf("gathered %v %v", mfs, err)
	}
	m := mfs[0].GetMetric()[0]
	labels := map[string]string{}
	for _, l := range m.GetLabel() {
		labels[l.GetName()] = l.GetValue()
	}
	bi := readBuildInfo()
	if m.GetGauge().GetValue() != 1 || labels["version"] != bi.Version || labels["revision"] != bi.Revision || labels["go_version"] != bi.GoVersion || bi.GoVersion == "" {
		t.Errorf("build_info %v = %v, want 1 with %+v", labels, m.GetGauge().GetValue(), bi)
	}
	if want := "ratemesh " + bi.Version + " commit " + bi.Revision + " " + bi.GoVersion; !strings.HasPrefix(versionLine(), want) {
		t.Errorf("version line %q, want it to start %q", versionLine(), want)
	}
}

// TestHelpCommand: ratemesh help CMD prints CMD's own usage and flags on
// stdout, not the top-level list.
func TestHelpCommand(t *testing.T) {
	for _, c := range commands() {
		var stdout, stderr bytes.Buffer
		if code := run([]string{"help", c.name}, &stdout, &stderr); code != 0 {
			t.Errorf("help %s: exit %d, stderr %q", c.name, code, stderr.String())
		}
		out := stdout.String()
		if !strings.HasPrefix(out, "usage: ratemesh "+c.synopsis+"\n") || strings.Contains(out, "commands:") {
			t.Errorf("help %s printed %q", c.name, out)
		}
	}
	var stdout, stderr bytes.Buffer
	if code := run([]string{"help", "serve"}, &stdout, &stderr); code != 0 || !strings.Contains(stdout.String(), "--pprof") || !strings.Contains(stdout.String(), "$RATEMESH_BOOTSTRAP") {
		t.Errorf("help serve lacks its flags: %q", stdout.String())
	}
	stdout.Reset()
	if code := run([]string{"help", "frobnicate"}, &stdout, &stderr); code != 2 || !strings.Contains(stderr.String(), `unknown command "frobnicate"`) {
		t.Errorf("help frobnicate: exit %d, stderr %q", code, stderr.String())
	}
}

// TestPeersAndCheckDefaultAPI: without --api, peers and check ask
// $RATEMESH_API, else serve's default.
func TestPeersAndCheckDefaultAPI(t *testing.T) {
	t.Setenv("RATEMESH_API", "")
	if got := defaultAPI(os.Getenv); got != "127.0.0.1:8080" {
		t.Errorf("default --api %q, want serve's 127.0.0.1:8080", got)
	}
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch r.URL.Path {
		case "/v1/peers":
			_, _ = w.Write([]byte(`{"peers":[{"peer_id":"12D3KooWself","incarnation":1,"state":"alive","self":true}]}`))
		case "/v1/allow":
			_, _ = w.Write([]byte(`{"allowed":true,"limit":5,"remaining":4}`))
		default:
			http.NotFound(w, r)
		}
	}))
	defer ts.Close()
	t.Setenv("RATEMESH_API", ts.URL)
	var stdout, stderr bytes.Buffer
	if code := run([]string{"peers"}, &stdout, &stderr); code != 0 || !strings.Contains(stdout.String(), "12D3KooWself") {
		t.Errorf("peers without --api: exit %d, stdout %q, stderr %q", code, stdout.String(), stderr.String())
	}
	stdout.Reset()
	if code := run([]string{"check", "--rule", "a", "--key", "k", "--json"}, &stdout, &stderr); code != 0 || !strings.Contains(stdout.String(), `"allowed": true`) {
		t.Errorf("check without --api: exit %d, stdout %q, stderr %q", code, stdout.String(), stderr.String())
	}
}

// TestFileWatchConfigMapSwap: a Kubernetes ConfigMap volume's file is
// config.yaml -> ..data/config.yaml, ..data -> ..<timestamp>; an update
// writes a new timestamped directory and renames a new ..data symlink
// over the old one. The watch sees it, once; it also sees an edit in
// place, and nothing when nothing changed or the file is missing.
func TestFileWatchConfigMapSwap(t *testing.T) {
	dir := t.TempDir()
	version := func(name, content string) {
		t.Helper()
		if err := os.Mkdir(filepath.Join(dir, name), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name, "config.yaml"), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		tmp := filepath.Join(dir, "..data_tmp")
		if err := os.Symlink(name, tmp); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
			t.Fatal(err)
		}
	}
	// The same size and modification time in both versions: only the
	// file's identity tells them apart.
	version("..2026_11_27_12_00_00.1", "rules: [{name: a}]\n")
	if err := os.Symlink("..data/config.yaml", filepath.Join(dir, "config.yaml")); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "config.yaml")
	w := newFileWatch(path)
	if w.check() {
		t.Fatal("a change reported before any")
	}
	fi, _ := os.Stat(path)
	version("..2026_11_27_12_01_00.2", "rules: [{name: b}]\n")
	newPath := filepath.Join(dir, "..2026_11_27_12_01_00.2", "config.yaml")
	if err := os.Chtimes(newPath, fi.ModTime(), fi.ModTime()); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(dir, "..2026_11_27_12_00_00.1")); err != nil {
		t.Fatal(err)
	}
	if !w.check() {
		t.Error("the ..data swap is not seen")
	}
	if w.check() {
		t.Error("the swap is seen twice")
	}
	// An edit in place that changes the size.
	if err := os.WriteFile(newPath, []byte("rules: [{name: bb}]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if !w.check() {
		t.Error("an edit in place is not seen")
	}
	// Missing (between a delete and a write): no change; back: a change.
	if err := os.Remove(newPath); err != nil {
		t.Fatal(err)
	}
	if w.check() {
		t.Error("a missing file reported as a change")
	}
	if err := os.WriteFile(newPath, []byte("rules: [{name: c}]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if !w.check() {
		t.Error("the file's return is not seen")
	}
}

// TestFrontHandlerBeforeStart: while the store and the transport open,
// before the API exists, /livez says the process is alive and /readyz
// and /healthz that it is not ready.
func TestFrontHandlerBeforeStart(t *testing.T) {
	var f frontHandler
	for path, want := range map[string]string{"/livez": "200 joining", "/readyz": "503 joining", "/healthz": "503 joining", "/v1/allow": "503 "} {
		rec := httptest.NewRecorder()
		f.ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
		var h struct{ State string }
		_ = json.Unmarshal(rec.Body.Bytes(), &h)
		if got := fmt.Sprintf("%d %s", rec.Code, h.State); got != want {
			t.Errorf("GET %s before the node starts: %s, want %s", path, got, want)
		}
	}
}
