package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	ma "github.com/multiformats/go-multiaddr"

	"github.com/ratemesh/ratemesh/httpapi"
	"github.com/ratemesh/ratemesh/internal/testutil"
)

// runServeToExit runs `ratemesh serve args...`, which must exit on its
// own within 30 s, and returns its exit code and output.
func runServeToExit(t *testing.T, bin string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, append([]string{"serve"}, args...)...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	_ = cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("serve %v still running after 30 s; stderr:\n%s", args, errb.String())
	}
	return cmd.ProcessState.ExitCode(), out.String(), errb.String()
}

// TestServeRefusesPortsInUse: a second serve on a libp2p port a running
// node holds (once shared silently through SO_REUSEPORT), or on its API
// address, exits 1 without a ready line, naming the address; the first
// node serves on.
func TestServeRefusesPortsInUse(t *testing.T) {
	bin := buildBinary(t)
	dir := t.TempDir()
	first := startServe(t, bin, "--api", "127.0.0.1:0", "--listen", "/ip4/127.0.0.1/tcp/0", "--data-dir", filepath.Join(dir, "a"))
	full, err := ma.NewMultiaddr(first.ready.Addrs[0])
	if err != nil {
		t.Fatal(err)
	}
	listen, _ := ma.SplitFunc(full, func(c ma.Component) bool { return c.Protocol().Code == ma.P_P2P })
	port, err := listen.ValueForProtocol(ma.P_TCP)
	if err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name string
		args []string
		want []string
	}{
		{"libp2p port", []string{"--api", "127.0.0.1:0", "--listen", listen.String()},
			[]string{"listen address in use", listen.String(), "tcp port " + port, "address already in use"}},
		{"libp2p port among others", []string{"--api", "127.0.0.1:0", "--listen", "/ip4/127.0.0.1/tcp/0", "--listen", listen.String()},
			[]string{"listen address in use", "tcp port " + port}},
		{"API address", []string{"--api", first.ready.API, "--listen", "/ip4/127.0.0.1/tcp/0"},
			[]string{"node.api", first.ready.API, "address already in use"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append(tc.args, "--data-dir", filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "-")))
			code, stdout, stderr := runServeToExit(t, bin, args...)
			if code != 1 || stdout != "" {
				t.Fatalf("exit %d, stdout %q; want exit 1 and no ready line; stderr:\n%s", code, stdout, stderr)
			}
			for _, w := range tc.want {
				if !strings.Contains(stderr, w) {
					t.Errorf("stderr does not name %q:\n%s", w, stderr)
				}
			}
		})
	}
	var ar httpapi.AllowResponse
	if status, err := first.post("/v1/allow", `{"rule":"default","key":"k"}`, &ar); err != nil || status != 200 || !ar.Allowed {
		t.Fatalf("the first node after the refusals: %d %v %+v", status, err, ar)
	}
}

// slowClient opens a connection to addr and sends head, calls sent, then
// sends one byte of trickle a second until the server closes the
// connection. It returns how long the server took to close it, and the
// status line it answered with, if any.
func slowClient(addr, head, trickle string, limit time.Duration, sent func()) (time.Duration, string, error) {
	defer sent() // at the latest
	start := time.Now()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return 0, "", err
	}
	defer c.Close()
	if _, err := io.WriteString(c, head); err != nil {
		return 0, "", err
	}
	sent()
	closed := make(chan struct{})
	var status string
	var took time.Duration
	go func() {
		defer close(closed)
		_ = c.SetReadDeadline(start.Add(limit))
		r := bufio.NewReader(c)
		status, _ = r.ReadString('\n')
		_, _ = io.Copy(io.Discard, r) // until the server closes
		took = time.Since(start)
	}()
	tick := time.NewTicker(time.Second) // the client's pace: one byte a second
	defer tick.Stop()
	for i := 0; ; i++ {
		select {
		case <-closed:
			if took >= limit {
				return took, status, fmt.Errorf("still open after %v", limit)
			}
			return took, strings.TrimSpace(status), nil
		case <-tick.C:
			_, _ = c.Write([]byte{trickle[i%len(trickle)]})
		}
	}
}

// TestServeCutsSlowClients: with the default node.http settings, 30
// clients sending a body at 1 byte/s and 10 sending their headers at 1
// byte/s are all cut off within 20 s (at read_timeout, 10 s), while 20
// normal decisions from other clients succeed at once; an oversized
// header set gets 431.
func TestServeCutsSlowClients(t *testing.T) {
	bin := buildBinary(t)
	p := startServe(t, bin, "--api", "127.0.0.1:0", "--listen", "/ip4/127.0.0.1/tcp/0", "--data-dir", t.TempDir())
	const limit = 20 * time.Second
	type result struct {
		kind   string
		took   time.Duration
		status string
		err    error
	}
	results := make(chan result, 40)
	var wg, connected sync.WaitGroup
	for i := range 40 {
		wg.Add(1)
		connected.Add(1)
		go func() {
			defer wg.Done()
			sent := sync.OnceFunc(connected.Done)
			if i < 30 {
				took, status, err := slowClient(p.ready.API, "POST /v1/allow HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 200\r\n\r\n", `{"rule":"default","key":"slow"}`, limit, sent)
				results <- result{"body", took, status, err}
				return
			}
			took, status, err := slowClient(p.ready.API, "GET /healthz HTTP/1.1\r\nHost: x\r\n", "X-Slow: abcdefghijklmnopqrstuvwxyz\r\n", limit, sent)
			results <- result{"header", took, status, err}
		}()
	}
	// The slow clients are connected and trickling; decisions go on.
	connected.Wait()
	client := &http.Client{Timeout: 5 * time.Second}
	var slowest time.Duration
	for i := range 20 {
		start := time.Now()
		resp, err := client.Post(p.url("/v1/allow"), "application/json", strings.NewReader(fmt.Sprintf(`{"rule":"default","key":"n%d"}`, i)))
		if err != nil {
			t.Fatalf("decision %d among slow clients: %v", i, err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("decision %d among slow clients: %d", i, resp.StatusCode)
		}
		slowest = max(slowest, time.Since(start))
	}
	if slowest > 2*time.Second {
		t.Errorf("slowest of 20 decisions among slow clients took %v", slowest)
	}
	// Headers over max_header_bytes (32 KiB by default) are refused.
	req, _ := http.NewRequest(http.MethodGet, p.url("/healthz"), nil)
	req.Header.Set("X-Big", strings.Repeat("a", 40<<10))
	if resp, err := client.Do(req); err != nil || resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("40 KiB of headers: %v %v, want 431", resp, err)
	} else {
		resp.Body.Close()
	}

	wg.Wait()
	close(results)
	var took []time.Duration
	worst := map[string]time.Duration{}
	answered := 0
	for r := range results {
		if r.err != nil {
			t.Errorf("slow %s client: %v", r.kind, r.err)
			continue
		}
		// A slow body gets 408 — or nothing, when the client's next byte
		// arrives after the server closed and the reset discards the
		// answer. It is never decided on.
		switch {
		case r.kind == "body" && strings.Contains(r.status, "408"):
			answered++
		case r.status != "":
			t.Errorf("slow %s client answered %q, want 408 or nothing", r.kind, r.status)
		}
		took = append(took, r.took)
		worst[r.kind] = max(worst[r.kind], r.took)
	}
	sort.Slice(took, func(i, j int) bool { return took[i] < took[j] })
	if len(took) == 40 {
		t.Logf("40 slow clients cut off after %v to %v (worst: body %v, header %v; %d of 30 slow bodies read their 408); 20 decisions meanwhile, slowest %v",
			took[0].Round(time.Millisecond), took[39].Round(time.Millisecond), worst["body"].Round(time.Millisecond), worst["header"].Round(time.Millisecond), answered, slowest.Round(time.Millisecond))
	}
}

// metricValue returns the value of the unlabelled metric name in text, or
// -1.
func metricValue(text, name string) float64 {
	for _, l := range strings.Split(text, "\n") {
		if v, ok := strings.CutPrefix(l, name+" "); ok {
			var f float64
			if _, err := fmt.Sscan(v, &f); err == nil {
				return f
			}
		}
	}
	return -1
}

// metrics returns p's /metrics text.
func metrics(t *testing.T, p *proc) string {
	t.Helper()
	resp, err := p.client.Get(p.url("/metrics"))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// TestServeIdleAndConnectionCap: with node.http idle_timeout 2s and
// max_conns 200, 200 idle keep-alive connections are closed by the server
// after about 2 s of idleness; a 201st client is not served while they
// hold every slot, and is served once the server closes them.
func TestServeIdleAndConnectionCap(t *testing.T) {
	bin := buildBinary(t)
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "ratemesh.yaml")
	const idleTimeout = 2 * time.Second
	if err := os.WriteFile(cfgPath, []byte(fmt.Sprintf("node:\n  http: {idle_timeout: %v, max_conns: 200}\n", idleTimeout)), 0o600); err != nil {
		t.Fatal(err)
	}
	p := startServe(t, bin, "--config", cfgPath, "--api", "127.0.0.1:0", "--listen", "/ip4/127.0.0.1/tcp/0", "--data-dir", filepath.Join(dir, "d"))

	const idle = 200
	idleFor := make(chan time.Duration, idle) // from the answer to the server's close
	answered := make(chan time.Time, idle)
	for range idle {
		go func() {
			c, err := net.Dial("tcp", p.ready.API)
			if err != nil {
				t.Errorf("dial: %v", err)
				answered <- time.Time{}
				return
			}
			defer c.Close()
			// One request, answered, and the connection kept alive.
			_, _ = io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
			r := bufio.NewReader(c)
			resp, err := http.ReadResponse(r, nil)
			if err != nil {
				t.Errorf("healthz: %v", err)
				answered <- time.Time{}
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			at := time.Now()
			answered <- at
			_ = c.SetReadDeadline(at.Add(20 * time.Second))
			if _, err := r.ReadByte(); err == nil {
				t.Errorf("the server sent more on an idle connection")
			} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
				t.Errorf("an idle connection still open after 20 s")
				return
			}
			idleFor <- time.Since(at)
		}()
	}
	var first time.Time
	for range idle {
		at := <-answered
		if at.IsZero() {
			t.FailNow()
		}
		if first.IsZero() || at.Before(first) {
			first = at
		}
	}
	// Every slot is held. The next client is not served until the server
	// closes an idle connection, which none can be before first +
	// idle_timeout: until then it must not be answered.
	client := &http.Client{Timeout: 20 * time.Second}
	launched := time.Now()
	served := make(chan error, 1)
	go func() {
		resp, err := client.Post(p.url("/v1/allow"), "application/json", strings.NewReader(`{"rule":"default","key":"k"}`))
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode != 200 {
				err = fmt.Errorf("status %d", resp.StatusCode)
			}
		}
		served <- err
	}()
	if quiet := time.Until(first.Add(idleTimeout - 200*time.Millisecond)); quiet > 100*time.Millisecond {
		select {
		case err := <-served:
			t.Fatalf("a client past max_conns served (%v) while every slot was held", err)
		case <-time.After(quiet): // nothing may happen in this window
		}
	} else {
		t.Logf("opening the idle connections took too long to check the cap (%v left)", quiet)
	}
	var err error
	select {
	case err = <-served:
	case <-time.After(20 * time.Second):
		t.Fatal("a client past max_conns not served 20 s later")
	}
	if err != nil {
		t.Fatalf("a client past max_conns: %v", err)
	}
	waited := time.Since(launched)
	var shortest, longest time.Duration
	for i := range idle {
		var d time.Duration
		select {
		case d = <-idleFor:
		case <-time.After(20 * time.Second):
			t.Fatalf("idle connections still open 20 s later")
		}
		if i == 0 || d < shortest {
			shortest = d
		}
		longest = max(longest, d)
	}
	if shortest < idleTimeout/2 {
		t.Errorf("an idle connection closed after %v, well before idle_timeout %v", shortest, idleTimeout)
	}
	t.Logf("%d idle keep-alive connections closed by the server after %v to %v idle (idle_timeout %v); a client past max_conns 200 waited %v",
		idle, shortest.Round(time.Millisecond), longest.Round(time.Millisecond), idleTimeout, waited.Round(time.Millisecond))
	for i := range 20 {
		var ar httpapi.AllowResponse
		if status, err := p.post("/v1/allow", fmt.Sprintf(`{"rule":"default","key":"n%d"}`, i), &ar); err != nil || status != 200 {
			t.Fatalf("decision %d after the idle connections: %d %v", i, status, err)
		}
	}
}

// edgeRules: a long window (persisted: every flush has work) and a short
// one to hold a /v1/wait open.
const edgeRules = `
rules:
  - {name: long, algorithm: fixed_window, limit: 1000000, window: 1h}
  - {name: short, algorithm: fixed_window, limit: 1, window: 20s}
`

// TestServeShutdownWithDataDirRemoved: a node whose data directory is
// removed — before SIGTERM, or during its shutdown (while an in-flight
// /v1/wait holds the HTTP drain) — exits within 10 s of the signal,
// non-zero, with a message naming the data directory, and less than 1 MB
// on stderr.
func TestServeShutdownWithDataDirRemoved(t *testing.T) {
	bin := buildBinary(t)
	for _, when := range []string{"before", "during"} {
		t.Run(when, func(t *testing.T) {
			dir := t.TempDir()
			cfgPath := filepath.Join(dir, "ratemesh.yaml")
			if err := os.WriteFile(cfgPath, []byte(edgeRules), 0o600); err != nil {
				t.Fatal(err)
			}
			data := filepath.Join(dir, "data")
			p := startServe(t, bin, "--config", cfgPath, "--api", "127.0.0.1:0", "--listen", "/ip4/127.0.0.1/tcp/0", "--data-dir", data)
			allow := func(key string) {
				t.Helper()
				var ar httpapi.AllowResponse
				if status, err := p.post("/v1/allow", fmt.Sprintf(`{"rule":"long","key":%q}`, key), &ar); err != nil || status != 200 || !ar.Allowed {
					t.Fatalf("allow: %d %v %+v", status, err, ar)
				}
			}
			for i := range 50 {
				allow(fmt.Sprintf("k%d", i))
			}
			var sent time.Time
			if when == "before" {
				if err := os.RemoveAll(data); err != nil {
					t.Fatal(err)
				}
				// The node runs on without its directory for a few flushes.
				testutil.Eventually(t, 10*time.Second, func() (bool, string) {
					allow("after-removal")
					n := metricValue(metrics(t, p), "ratemesh_persistence_errors_total")
					return n >= 3, fmt.Sprintf("flushes fail: %v persistence errors", n)
				})
				sent = time.Now()
				if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
					t.Fatal(err)
				}
			} else {
				// A /v1/wait that waits through the shutdown's HTTP drain:
				// the short rule's one credit is spent in a window with at
				// least 8 s left, so the next is 8 to 20 s away.
				var ar httpapi.AllowResponse
				testutil.Eventually(t, 25*time.Second, func() (bool, string) {
					status, err := p.post("/v1/allow", `{"rule":"short","key":"w","cost":0}`, &ar)
					return err == nil && status == 200 && ar.ResetAfterMs >= 8000, fmt.Sprintf("a short window with 8 s left: %d %v %+v", status, err, ar)
				})
				if status, err := p.post("/v1/allow", `{"rule":"short","key":"w"}`, &ar); err != nil || status != 200 || !ar.Allowed {
					t.Fatalf("allow short: %d %v %+v", status, err, ar)
				}
				waiting := make(chan struct{})
				go func() {
					defer close(waiting)
					var wr httpapi.AllowResponse
					_, _ = p.post("/v1/wait", `{"rule":"short","key":"w","max_wait_ms":25000}`, &wr)
				}()
				defer func() { <-waiting }()
				// The waiting request's first denial counts as an attempt.
				testutil.Eventually(t, 5*time.Second, func() (bool, string) {
					var u httpapi.UsageResponse
					status, err := p.get("/v1/usage?rule=short&key=w", &u)
					attempted := uint64(0)
					for _, s := range u.Slots {
						attempted += s.Attempted
					}
					return err == nil && status == 200 && attempted >= 2, fmt.Sprintf("the wait is in flight: %d %v %+v", status, err, u)
				})
				allow("before-signal")
				sent = time.Now()
				if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
					t.Fatal(err)
				}
				testutil.Eventually(t, 5*time.Second, func() (bool, string) {
					return strings.Contains(p.stderr.String(), "signal received"), "the shutdown begins"
				})
				if err := os.RemoveAll(data); err != nil {
					t.Fatal(err)
				}
				removed := time.Since(sent)
				select {
				case <-p.done:
					t.Fatalf("serve exited before the removal (%v after the signal): not during its shutdown", removed)
				default:
				}
				t.Logf("data directory removed %v after the signal, the node still shutting down", removed.Round(time.Millisecond))
			}
			var exit error
			select {
			case exit = <-p.done:
				p.done <- exit // for the cleanup
			case <-time.After(15 * time.Second):
				t.Fatalf("still running 15 s after SIGTERM")
			}
			took := time.Since(sent)
			stderr := p.stderr.String()
			code := p.cmd.ProcessState.ExitCode()
			t.Logf("exit %d %v after SIGTERM, %d bytes of stderr", code, took.Round(time.Millisecond), len(stderr))
			if testing.Verbose() {
				t.Logf("stderr:\n%s", stderr)
			}
			if took > 10*time.Second {
				t.Errorf("exit %v after SIGTERM, over 10 s", took)
			}
			if len(stderr) >= 1<<20 {
				t.Errorf("%d bytes of stderr, over 1 MB", len(stderr))
			}
			if code != 1 || !strings.Contains(stderr, "node.data_dir "+data) || !strings.Contains(stderr, "persistence failed") {
				t.Errorf("exit %d; want 1 with a message naming the data directory %s; stderr:\n%s", code, data, stderr)
			}
		})
	}
}
