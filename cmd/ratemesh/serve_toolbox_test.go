package main

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/ratemesh/ratemesh/httpapi"
	"github.com/ratemesh/ratemesh/internal/testutil"
)

// TestServeEnvReloadAndToolbox runs the binary as a Kubernetes pod would:
//   - the data dir comes from RATEMESH_DATA_DIR over the file's
//     node.data_dir, and --api beats RATEMESH_API;
//   - the config file is a ConfigMap volume's (config.yaml ->
//     ..data/config.yaml); swapping ..data reloads the rules without a
//     SIGHUP, and the reload does not report node.data_dir, node.api or
//     node.listen changed (flags and variables decide them), only what
//     did change (mesh.namespace);
//   - /livez and /readyz answer 200 ready, /metrics has
//     ratemesh_build_info, and --pprof serves the profiler on loopback.
func TestServeEnvReloadAndToolbox(t *testing.T) {
	bin := buildBinary(t)
	dir := t.TempDir()
	cm := filepath.Join(dir, "cm")
	if err := os.Mkdir(cm, 0o755); err != nil {
		t.Fatal(err)
	}
	n := 0
	publish := func(content string) {
		t.Helper()
		n++
		ts := fmt.Sprintf("..2026_11_27_12_00_%02d.%d", n, n)
		if err := os.Mkdir(filepath.Join(cm, ts), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(cm, ts, "config.yaml"), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(ts, filepath.Join(cm, "..data_tmp")); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(filepath.Join(cm, "..data_tmp"), filepath.Join(cm, "..data")); err != nil {
			t.Fatal(err)
		}
	}
	fileData, envData := filepath.Join(dir, "file-data"), filepath.Join(dir, "env-data")
	head := fmt.Sprintf("node:\n  data_dir: %q\n  api: 127.0.0.1:1\n  listen: [/ip4/127.0.0.1/tcp/1]\n", fileData)
	publish(head + "rules:\n  - {name: a, algorithm: fixed_window, limit: 5, window: 1h}\n")
	if err := os.Symlink("..data/config.yaml", filepath.Join(cm, "config.yaml")); err != nil {
		t.Fatal(err)
	}
	t.Setenv("RATEMESH_CONFIG", filepath.Join(cm, "config.yaml"))
	t.Setenv("RATEMESH_DATA_DIR", envData)
	t.Setenv("RATEMESH_API", "127.0.0.1:2")
	t.Setenv("RATEMESH_LISTEN", "/ip4/127.0.0.1/tcp/0")
	t.Setenv("RATEMESH_CONFIG_POLL", "100ms")
	t.Setenv("RATEMESH_PPROF", ":0")
	p := startServe(t, bin, "--api", "127.0.0.1:0")

	if strings.HasSuffix(p.ready.API, ":2") || strings.HasSuffix(p.ready.API, ":1") {
		t.Errorf("API on %s: --api 127.0.0.1:0 must beat RATEMESH_API and the file", p.ready.API)
	}
	if _, err := os.Stat(filepath.Join(envData, "identity.key")); err != nil {
		t.Errorf("RATEMESH_DATA_DIR not used: %v", err)
	}
	if _, err := os.Stat(fileData); !os.IsNotExist(err) {
		t.Errorf("the file's node.data_dir was used: %v", err)
	}
	for _, path := range []string{"/livez", "/readyz", "/healthz"} {
		var h httpapi.HealthResponse
		if status, err := p.get(path, &h); err != nil || status != 200 || h.State != "ready" {
			t.Errorf("GET %s: %d %v %+v", path, status, err, h)
		}
	}
	if text := metrics(t, p); !regexp.MustCompile(`(?m)^ratemesh_build_info\{go_version="go[^"]+",revision="[^"]+",version="[^"]+"\} 1$`).MatchString(text) {
		t.Errorf("/metrics lacks ratemesh_build_info:\n%s", grepLines(text, "build_info"))
	}

	// The profiler: on loopback, its own port, logged.
	var pprofAddr string
	testutil.Eventually(t, 5*time.Second, func() (bool, string) {
		m := regexp.MustCompile(`pprof=(127\.0\.0\.1:\d+)`).FindStringSubmatch(p.stderr.String())
		if m != nil {
			pprofAddr = m[1]
		}
		return m != nil, "the profiler's address is logged"
	})
	resp, err := http.Get("http://" + pprofAddr + "/debug/pprof/goroutine?debug=1")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("pprof goroutine: %d", resp.StatusCode)
	}
	if resp, err := http.Get(p.url("/debug/pprof/")); err == nil {
		resp.Body.Close()
		if resp.StatusCode != 404 {
			t.Errorf("the API serves the profiler: %d", resp.StatusCode)
		}
	}

	// A ConfigMap update: a's limit rises, b is new, the namespace changes.
	publish(head + "mesh: {namespace: other}\nrules:\n  - {name: a, algorithm: fixed_window, limit: 8, window: 1h}\n  - {name: b, algorithm: fixed_window, limit: 2, window: 1h}\n")
	testutil.Eventually(t, 10*time.Second, func() (bool, string) {
		var ar httpapi.AllowResponse
		status, err := p.post("/v1/allow", `{"rule":"b","key":"k","cost":0}`, &ar)
		return status == 200 && err == nil && ar.Limit == 2, fmt.Sprintf("the swapped file is applied: %d %v %+v", status, err, ar)
	})
	var ar httpapi.AllowResponse
	if status, err := p.post("/v1/allow", `{"rule":"a","key":"k","cost":0}`, &ar); err != nil || status != 200 || ar.Limit != 8 {
		t.Errorf("a after the swap: %d %v %+v", status, err, ar)
	}
	testutil.Eventually(t, 5*time.Second, func() (bool, string) {
		return strings.Contains(metrics(t, p), `ratemesh_config_reloads_total{result="ok"} 1`), "one reload counted"
	})
	if !p.logged("the config file changed on disk", 5*time.Second) {
		t.Errorf("the reload is not logged")
	}
	logs := p.stderr.String()
	warn := grepLines(logs, "apply only after a restart")
	if !strings.Contains(warn, "mesh.namespace") || strings.Contains(warn, "node.") {
		t.Errorf("reload warning %q: want mesh.namespace alone (node.api, node.listen and node.data_dir come from flags and variables)", warn)
	}
}

// TestServePprofOffByDefault: without --pprof nothing listens beyond the
// API and the mesh, and nothing is logged about a profiler.
func TestServePprofOffByDefault(t *testing.T) {
	bin := buildBinary(t)
	p := startServe(t, bin, "--api", "127.0.0.1:0", "--listen", "/ip4/127.0.0.1/tcp/0", "--data-dir", filepath.Join(t.TempDir(), "d"))
	if strings.Contains(p.stderr.String(), "pprof") {
		t.Errorf("a profiler is mentioned without --pprof:\n%s", grepLines(p.stderr.String(), "pprof"))
	}
	if resp, err := http.Get(p.url("/debug/pprof/")); err == nil {
		resp.Body.Close()
		if resp.StatusCode != 404 {
			t.Errorf("the API serves the profiler: %d", resp.StatusCode)
		}
	}
}
