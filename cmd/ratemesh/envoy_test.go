package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"gopkg.in/yaml.v3"

	"github.com/ratemesh/ratemesh/envoy"
	"github.com/ratemesh/ratemesh/internal/apitest"
	"github.com/ratemesh/ratemesh/internal/testutil"
)

func TestVersion(t *testing.T) {
	for _, args := range [][]string{{"version"}, {"--version"}} {
		code, out, errOut := runCLI(args...)
		if code != 0 || !strings.HasPrefix(out, "ratemesh ") || !strings.Contains(out, " commit ") || !strings.Contains(out, "go1.") || errOut != "" {
			t.Errorf("%v: exit %d, stdout %q, stderr %q", args, code, out, errOut)
		}
	}
}

func TestHelpDescribesEveryCommand(t *testing.T) {
	code, out, _ := runCLI("--help")
	if code != 0 {
		t.Fatalf("--help exit %d", code)
	}
	for _, c := range commands() {
		if c.description == "" || !strings.Contains(out, c.description) {
			t.Errorf("help lacks the description of %s", c.name)
		}
		code, _, errOut := runCLI(c.name, "--help")
		if code != 0 || !strings.Contains(errOut, c.description) {
			t.Errorf("%s --help: exit %d: %q", c.name, code, errOut)
		}
		if strings.Contains(errOut, "\n  -") && !strings.Contains(errOut, "\n  --") {
			t.Errorf("%s --help spells flags with one dash: %q", c.name, errOut)
		}
	}
	_, _, errOut := runCLI("check", "--nope")
	if !strings.Contains(errOut, "flag provided but not defined: --nope") {
		t.Errorf("a bad flag is named with two dashes: %q", errOut)
	}
}

func TestValidate(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.yaml")
	write(t, good, "rules:\n  - {name: api, algorithm: fixed_window, limit: 10, window: 1s}\nenvoy:\n  config: "+filepath.Join("..", "..", "envoy", "testdata", "integration")+"\n")
	code, out, errOut := runCLI("validate", "--config", good)
	if code != 0 || !strings.Contains(out, "good.yaml: ok, 1 rule(s)") || !strings.Contains(out, "domains [another basic], 9 descriptor(s), 9 generated rule(s)") {
		t.Errorf("good: exit %d\n%s\n%s", code, out, errOut)
	}
	bad := filepath.Join(dir, "bad.yaml")
	write(t, bad, "rules:\n  - {name: api, algorithm: fixed_window, limit: 10, window: -1s}\n")
	if code, out, errOut := runCLI("validate", "--config", bad); code != 1 || out != "" || !strings.Contains(errOut, `rules[0] "api": window`) {
		t.Errorf("bad rule: exit %d %q %q", code, out, errOut)
	}
	clash := filepath.Join(dir, "clash.yaml")
	write(t, clash, "rules:\n  - {name: \"envoy:basic.key1\", algorithm: fixed_window, limit: 10, window: 1s}\n")
	if code, _, errOut := runCLI("validate", "--config", clash, "--envoy-config", "../../envoy/testdata/integration/basic.yaml"); code != 1 || !strings.Contains(errOut, "the prefix envoy: is kept") {
		t.Errorf("clash: exit %d %q", code, errOut)
	}
	if code, _, _ := runCLI("validate"); code != 2 {
		t.Errorf("no file: exit %d, want 2", code)
	}
}

// TestServeRefusesInvalidEnvoyConfigs: each of envoyproxy/ratelimit's
// invalid test configurations stops `serve` at start with a message
// naming the file (and validate says the same).
func TestServeRefusesInvalidEnvoyConfigs(t *testing.T) {
	names, err := filepath.Glob("../../envoy/testdata/invalid/*.yaml")
	if err != nil || len(names) < 13 {
		t.Fatalf("%d invalid configurations: %v", len(names), err)
	}
	for _, n := range names {
		path := n
		if strings.HasSuffix(n, "duplicate_domain.yaml") {
			// Invalid beside another file of the same domain.
			dir := t.TempDir()
			write(t, filepath.Join(dir, "a.yaml"), read(t, "../../envoy/testdata/basic_config.yaml"))
			write(t, filepath.Join(dir, "b.yaml"), read(t, n))
			path = dir
		}
		dataDir := t.TempDir()
		code, out, errOut := runCLI("serve", "--envoy-config", path, "--api", "127.0.0.1:0", "--listen", "/ip4/127.0.0.1/tcp/0", "--data-dir", dataDir, "--grpc", "127.0.0.1:0")
		base := filepath.Base(n)
		if filepath.Base(path) != base {
			base = "b.yaml"
		}
		if code != 1 || out != "" || !strings.Contains(errOut, base+":") || !strings.Contains(errOut, "invalid rate limit configuration") {
			t.Errorf("%s: exit %d, stdout %q, stderr %q", n, code, out, errOut)
		}
		if entries, _ := os.ReadDir(dataDir); len(entries) != 0 {
			t.Errorf("%s: serve wrote to its data dir before refusing", n)
		}
		if code, _, errOut2 := runCLI("validate", "--envoy-config", path); code != 1 || !strings.Contains(errOut2, base+":") {
			t.Errorf("validate %s: exit %d %q", n, code, errOut2)
		}
	}
}

func write(t *testing.T, path, s string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

func read(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

const envoyE2E = `domain: edge
descriptors:
  - key: remote_address
    rate_limit:
      unit: second
      requests_per_unit: 100
`

// TestServeEnvoyThreeProcesses: three `ratemesh serve` processes with
// --grpc and envoyproxy/ratelimit descriptors, the second and third
// finding the first by a dns: bootstrap entry (localhost, the system
// resolver), JSON logs. Clients of go-control-plane's generated gRPC code
// offer several times a descriptor's limit at all three; every full window
// admits within 2 % of the limit. A SIGHUP with new descriptors applies
// them; one that does not parse is counted as failed.
func TestServeEnvoyThreeProcesses(t *testing.T) {
	bin := buildBinary(t)
	dir := t.TempDir()
	desc := filepath.Join(dir, "descriptors.yaml")
	write(t, desc, envoyE2E)
	cfgPath := filepath.Join(dir, "ratemesh.yaml")
	write(t, cfgPath, "mesh: {suspect_after: 1s, dead_after: 2s, evict_after: 3s}\n")
	args := func(i int, extra ...string) []string {
		return append([]string{"--config", cfgPath, "--api", "127.0.0.1:0", "--listen", "/ip4/127.0.0.1/tcp/0", "--grpc", "127.0.0.1:0",
			"--envoy-config", desc, "--log-format", "json", "--data-dir", filepath.Join(dir, fmt.Sprintf("n%d", i))}, extra...)
	}
	procs := []*proc{startServe(t, bin, args(0)...)}
	_, port, _ := net.SplitHostPort(procs[0].ready.API)
	for i := 1; i < 3; i++ {
		procs = append(procs, startServe(t, bin, args(i, "--bootstrap", "dns:localhost:"+port)...))
	}
	clients := make([]rlspb.RateLimitServiceClient, 3)
	for i, p := range procs {
		if p.ready.GRPC == "" {
			t.Fatalf("node %d: no grpc address in the ready line", i)
		}
		conn, err := grpc.NewClient(p.ready.GRPC, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = conn.Close() })
		clients[i] = rlspb.NewRateLimitServiceClient(conn)
		h, err := healthpb.NewHealthClient(conn).Check(context.Background(), &healthpb.HealthCheckRequest{Service: "envoy.service.ratelimit.v3.RateLimitService"})
		if err != nil || h.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("node %d health: %v %v", i, h, err)
		}
	}
	for i, p := range procs {
		testutil.Eventually(t, 20*time.Second, func() (bool, string) {
			st := p.states(t)
			alive := 0
			for _, s := range st {
				if s == "alive" {
					alive++
				}
			}
			return alive == 3, fmt.Sprintf("node %d sees 3 alive members: %v", i, st)
		})
	}

	ask := func(c rlspb.RateLimitServiceClient, value string) (*rlspb.RateLimitResponse, error) {
		return c.ShouldRateLimit(context.Background(), &rlspb.RateLimitRequest{Domain: "edge", Descriptors: []*rlcommon.RateLimitDescriptor{
			{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "remote_address", Value: value}}}}})
	}
	// Offer the limit several times over, from three clients per node,
	// for 6 s; count OK answers per window (duration_until_reset is in
	// whole seconds, too coarse to tell the window).
	var mu sync.Mutex
	admitted := map[int64]int{}
	offered := 0
	stop := make(chan struct{})
	var wg sync.WaitGroup
	// Start the flood just after a window boundary: a flood started late
	// in a window spends that window's admissions at its end, and answers
	// still in flight at the boundary would be counted in the first full
	// window (once 103 of 100 on a loaded machine).
	time.Sleep(time.Until(time.UnixMilli((time.Now().UnixMilli()/1000+1)*1000 + 20))) // a phase of the wall clock, not a condition
	start := time.Now()
	for i := range procs {
		for range 3 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					r, err := ask(clients[i], "10.0.0.1")
					if err != nil {
						t.Errorf("node %d: %v", i, err)
						return
					}
					// Under this flood a window's admissions come at its
					// start, so the time an answer came back (not when it
					// was sent) tells its window.
					mid := time.Now()
					mu.Lock()
					offered++
					if r.GetOverallCode() == rlspb.RateLimitResponse_OK {
						admitted[mid.UnixMilli()/1000]++
					}
					mu.Unlock()
				}
			}()
		}
	}
	time.Sleep(6 * time.Second) // the traffic phase itself, not a wait for a condition
	end := time.Now()
	close(stop)
	wg.Wait()
	var per []int
	for w := start.UnixMilli()/1000 + 1; w < end.UnixMilli()/1000; w++ {
		per = append(per, admitted[w])
		// Answers near a window's edge may be counted in the next one;
		// the share rule keeps every node inside the limit, so the sum
		// is judged per window with the 2 % bound.
		if a := admitted[w]; float64(a) > 1.02*100 || float64(a) < 0.95*100 {
			t.Errorf("window %d: %d OK, want within [95, 102]", w, a)
		}
	}
	t.Logf("offered %d over %v; OK per full window %v", offered, end.Sub(start).Round(time.Millisecond), per)
	if len(per) < 4 || offered < 3*6*100 {
		t.Fatalf("only %d windows, %d offered: not a test of the limit", len(per), offered)
	}
	// Another value of the key has its own counter.
	if r, err := ask(clients[1], "10.0.0.2"); err != nil || r.GetOverallCode() != rlspb.RateLimitResponse_OK || r.GetStatuses()[0].GetLimitRemaining() == 0 {
		t.Errorf("another value: %v %v", r, err)
	}

	// SIGHUP: new descriptors (a new domain) apply; a file that does not
	// parse keeps them and is counted as failed.
	write(t, desc, strings.Replace(envoyE2E, "domain: edge", "domain: edge2", 1))
	write(t, cfgPath, "mesh: {suspect_after: 1s, dead_after: 2s, evict_after: 4s}\n")
	if err := procs[0].cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, func() (bool, string) {
		r, err := clients[0].ShouldRateLimit(context.Background(), &rlspb.RateLimitRequest{Domain: "edge2", Descriptors: []*rlcommon.RateLimitDescriptor{
			{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "remote_address", Value: "x"}}}}})
		return err == nil && r.GetStatuses()[0].GetCurrentLimit() != nil, "the new domain applies: " + fmt.Sprint(r, err)
	})
	// stderr reaches the test through a pipe: poll for the line too.
	testutil.Eventually(t, 5*time.Second, func() (bool, string) {
		l := grepLines(procs[0].stderr.String(), "apply only after a restart")
		return strings.Contains(l, "mesh.evict_after"), fmt.Sprintf("the reload logs mesh.evict_after as needing a restart: %q", l)
	})
	write(t, desc, "domain: [\n")
	write(t, cfgPath, "rules: [\n")
	if err := procs[0].cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, func() (bool, string) {
		m := metric(t, procs[0], `ratemesh_config_reloads_total{result="failed"}`)
		return m == "1", "the failed reload is counted: " + m
	})
	if m := metric(t, procs[0], `ratemesh_config_reloads_total{result="ok"}`); m != "1" {
		t.Errorf("ok reloads: %s", m)
	}

	// Every line on stderr is one JSON object.
	for i, p := range procs {
		for _, line := range strings.Split(strings.TrimSpace(p.stderr.String()), "\n") {
			var obj map[string]any
			if err := json.Unmarshal([]byte(line), &obj); err != nil || obj["msg"] == nil || obj["level"] == nil {
				t.Errorf("node %d: a log line is not a JSON object with msg and level: %q", i, line)
				break
			}
		}
	}
	if !strings.Contains(procs[1].stderr.String(), `"msg":"dns discovery: connected"`) && !strings.Contains(procs[2].stderr.String(), `"msg":"dns discovery: connected"`) {
		t.Error("no node logged a peer found by DNS")
	}
}

// metric returns the value of the sample named line (metric name and
// labels as the text format writes them) on p's /metrics.
func metric(t *testing.T, p *proc, line string) string {
	t.Helper()
	resp, err := p.client.Get(p.url("/metrics"))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var b strings.Builder
	buf := make([]byte, 32<<10)
	for {
		n, err := resp.Body.Read(buf)
		b.Write(buf[:n])
		if err != nil {
			break
		}
	}
	for _, l := range strings.Split(b.String(), "\n") {
		if v, ok := strings.CutPrefix(l, line+" "); ok {
			return v
		}
	}
	return "absent"
}

// TestPackagingFiles: the Dockerfile, docker-compose.yaml and envoy.yaml
// cannot run here (no Docker, no Envoy); what can be checked is: the
// descriptor file the compose mounts loads, its domain is the one
// envoy.yaml's rate limit filter asks for, the nodes bootstrap by DNS on
// their compose service name and API port, envoy.yaml's rate limit
// cluster points at that name and the gRPC port, and its filter has the
// timeout and failure mode docs/envoy.md recommends.
func TestPackagingFiles(t *testing.T) {
	root := "../.."
	var compose struct {
		Services map[string]struct {
			Command []string `yaml:"command"`
			Volumes []string `yaml:"volumes"`
		} `yaml:"services"`
	}
	if err := yaml.Unmarshal([]byte(read(t, filepath.Join(root, "docker-compose.yaml"))), &compose); err != nil {
		t.Fatal(err)
	}
	rm, ok := compose.Services["ratemesh"]
	if !ok {
		t.Fatalf("no ratemesh service in docker-compose.yaml: %v", compose.Services)
	}
	cmd := strings.Join(rm.Command, " ")
	for _, want := range []string{"--bootstrap dns:ratemesh:8080", "--api 0.0.0.0:8080", "--grpc 0.0.0.0:8081", "--envoy-config /etc/ratemesh/descriptors",
		"--psk-file /secrets/swarm.key", "--token-file /secrets/tokens"} {
		if !strings.Contains(cmd, want) {
			t.Errorf("the ratemesh service's command %q lacks %q", cmd, want)
		}
	}
	// The image listens beyond loopback: it must bring credentials, and
	// the compose file must make them (none are committed).
	dockerfile := read(t, filepath.Join(root, "Dockerfile"))
	for _, want := range []string{`"--psk-file", "/secrets/swarm.key"`, `"--token-file", "/secrets/tokens"`} {
		if !strings.Contains(dockerfile, want) {
			t.Errorf("the Dockerfile's command lacks %s", want)
		}
	}
	if sec, ok := compose.Services["secrets"]; !ok || !strings.Contains(strings.Join(sec.Command, " "), "/dev/urandom") || !slices.Contains(rm.Volumes, "secrets:/secrets:ro") {
		t.Errorf("no secrets service generating the keys into a volume the nodes mount: %+v", sec)
	}
	if ev := strings.Join(compose.Services["envoy"].Command, " "); !strings.Contains(ev, "@ENVOY_TOKEN@") || !strings.Contains(ev, "/secrets/envoy.token") {
		t.Errorf("the envoy service does not fill in its token: %q", ev)
	}
	if !slices.Contains(rm.Volumes, "./deploy/descriptors:/etc/ratemesh/descriptors:ro") {
		t.Errorf("the ratemesh service does not mount deploy/descriptors: %v", rm.Volumes)
	}
	code, out, errOut := runCLI("validate", "--envoy-config", filepath.Join(root, "deploy", "descriptors"))
	if code != 0 {
		t.Fatalf("deploy/descriptors: %s", errOut)
	}
	envoyYAML := read(t, filepath.Join(root, "deploy", "envoy.yaml"))
	for _, want := range []string{"socket_address: {address: ratemesh, port_value: 8081}", "service_name: envoy.service.ratelimit.v3.RateLimitService", "domain: edge", "remote_address: {}",
		`initial_metadata:`, `- {key: authorization, value: "Bearer @ENVOY_TOKEN@"}`,
		"timeout: 0.05s", "failure_mode_deny: false"} { // docs/envoy.md, "Timeouts under load"
		if !strings.Contains(envoyYAML, want) {
			t.Errorf("deploy/envoy.yaml lacks %q", want)
		}
	}
	if !strings.Contains(out, "domains [edge]") {
		t.Errorf("deploy/descriptors: %s", out)
	}
	var ev any
	if err := yaml.Unmarshal([]byte(envoyYAML), &ev); err != nil {
		t.Errorf("deploy/envoy.yaml is not YAML: %v", err)
	}
}

// TestBenchGRPC: bench's ShouldRateLimit phase against a node serving a
// descriptor file, over the same keys (and counters) as its /v1/allow
// phase.
func TestBenchGRPC(t *testing.T) {
	desc, err := envoy.Parse(envoy.File{Name: "bench.yaml", Data: []byte("domain: bench\ndescriptors:\n  - key: key\n    rate_limit: {unit: second, requests_per_unit: 3}\n")})
	if err != nil {
		t.Fatal(err)
	}
	m := apitest.Start(t, nil, "solo", desc.Rules())
	n, ts := m.Node, m.Server
	srv, err := envoy.New(envoy.Config{Node: n, Descriptors: desc})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Stop(context.Background()) })

	code, out, errOut := runCLI("bench", "--json", "--api", ts.URL, "--rule", "envoy:bench.key", "--keys", "4",
		"--concurrency", "4", "--duration", "2200ms", "--baseline", "0", "--rounds", "1", "--grpc", ln.Addr().String())
	if code != 0 {
		t.Fatalf("bench: %d %s", code, errOut)
	}
	var rep benchReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatal(err)
	}
	g := rep.GRPC
	if g == nil || g.Requests == 0 || g.Errors != 0 || g.Allowed+g.Denied != g.Requests || g.Allowed == 0 || g.Denied == 0 || rep.GRPCRatio <= 0 {
		t.Fatalf("grpc phase: %+v ratio %v", g, rep.GRPCRatio)
	}
	// 4 keys × 3 a second over about 2.2 s: the phase's OK answers stay
	// within the windows it touched (at most 4 windows).
	if g.Allowed > 4*3*4 {
		t.Errorf("gRPC admitted %d, over 4 keys × 3 × 4 windows", g.Allowed)
	}
	if code, _, errOut := runCLI("bench", "--api", ts.URL, "--rule", "envoy:bench.key", "--duration", "300ms", "--baseline", "0",
		"--grpc", ln.Addr().String(), "--domain", "nope"); code != 1 || !strings.Contains(errOut, "no limit applies") {
		t.Errorf("an unknown domain: %d %q", code, errOut)
	}
}
