package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
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

	"github.com/ratemesh/ratemesh/httpapi"
	"github.com/ratemesh/ratemesh/internal/testutil"
)

// buildBinary builds ratemesh into a temporary directory.
func buildBinary(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds the binary and runs processes")
	}
	bin := filepath.Join(t.TempDir(), "ratemesh")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// proc is one running `ratemesh serve`.
type proc struct {
	cmd    *exec.Cmd
	ready  ReadyLine
	stderr *lockedBuffer
	done   chan error
	client *http.Client
}

// lockedBuffer collects a process's stderr while the test reads it. It
// has only Write (no ReadFrom), so exec's copy goes through the lock.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// startServe starts `ratemesh serve args...` and waits for its ready line.
func startServe(t *testing.T, bin string, args ...string) *proc {
	t.Helper()
	return startServeIn(t, "", bin, args...)
}

// startServeIn is startServe inside the network namespace netns ("": this
// one; see netlab).
func startServeIn(t *testing.T, netns, bin string, args ...string) *proc {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"serve"}, args...)...)
	if netns != "" {
		cmd = exec.Command("ip", append([]string{"netns", "exec", netns, bin, "serve"}, args...)...)
	}
	errBuf := &lockedBuffer{}
	cmd.Stderr = errBuf
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{cmd: cmd, stderr: errBuf, done: make(chan error, 1), client: &http.Client{Timeout: 10 * time.Second}}
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		if sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
		for sc.Scan() {
			t.Errorf("serve printed a second line on stdout: %q", sc.Text())
		}
	}()
	go func() { p.done <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-p.done
		if t.Failed() || os.Getenv("RATEMESH_TEST_STDERR") != "" {
			t.Logf("stderr of serve %v:\n%s", args, errBuf.String())
		}
	})
	select {
	case line, ok := <-lines:
		if !ok {
			t.Fatalf("serve exited without a ready line")
		}
		if err := json.Unmarshal([]byte(line), &p.ready); err != nil || p.ready.API == "" || p.ready.PeerID == "" || len(p.ready.Addrs) == 0 {
			t.Fatalf("ready line %q: %+v %v", line, p.ready, err)
		}
		for _, a := range p.ready.Addrs {
			if !strings.HasSuffix(a, "/p2p/"+p.ready.PeerID) {
				t.Fatalf("ready addr %q does not end in /p2p/<peer_id>", a)
			}
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("no ready line within 30 s")
	}
	return p
}

// logged reports whether the process's stderr holds substr within d. A
// line the process wrote before its ready line (or before an answer the
// test saw) may still be in the pipe: exec copies stderr on a goroutine
// of its own, which a busy host can run late.
func (p *proc) logged(substr string, d time.Duration) bool {
	return p.loggedLine(d, substr)
}

// loggedLine reports whether one line of the process's stderr holds every
// one of subs within d (see logged).
func (p *proc) loggedLine(d time.Duration, subs ...string) bool {
	deadline := time.Now().Add(d)
	for {
		for _, line := range strings.Split(p.stderr.String(), "\n") {
			all := true
			for _, s := range subs {
				all = all && strings.Contains(line, s)
			}
			if all {
				return true
			}
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond) // polling the buffer, with a deadline
	}
}

func (p *proc) url(path string) string { return "http://" + p.ready.API + path }

func (p *proc) post(path, body string, out any) (int, error) {
	resp, err := p.client.Post(p.url(path), "application/json", strings.NewReader(body))
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	return resp.StatusCode, json.NewDecoder(resp.Body).Decode(out)
}

func (p *proc) get(path string, out any) (int, error) {
	resp, err := p.client.Get(p.url(path))
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if out == nil {
		return resp.StatusCode, nil
	}
	return resp.StatusCode, json.NewDecoder(resp.Body).Decode(out)
}

// states returns the member states p sees, by peer ID.
func (p *proc) states(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, pj := range peersOf(t, p) {
		out[pj.PeerID] = pj.State
	}
	return out
}

const e2eLimit = 100

const e2eConfig = `
mesh:
  suspect_after: 1s
  dead_after: 2s
  evict_after: 3s
rules:
  - {name: e2e, algorithm: fixed_window, limit: 100, window: 1s}
`

// outcome is one answered request.
type outcome struct {
	node    int
	window  int64 // the window index the decision fell in
	allowed bool
}

// drive sends /v1/allow for key to procs[i] for every i in targets, with
// workers concurrent clients each, until stop closes.
func drive(t *testing.T, procs []*proc, targets []int, workers int, key string, stop <-chan struct{}, record func(outcome)) *sync.WaitGroup {
	var wg sync.WaitGroup
	body := fmt.Sprintf(`{"rule":"e2e","key":%q}`, key)
	for _, i := range targets {
		for range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					sent := time.Now()
					var ar httpapi.AllowResponse
					status, err := procs[i].post("/v1/allow", body, &ar)
					if err != nil || status != 200 {
						select {
						case <-stop:
							return
						default:
						}
						t.Errorf("node %d: allow: %d %v", i, status, err)
						return
					}
					// The decision happened between sent and now; its
					// window ends reset_after_ms later, on a whole second.
					mid := sent.Add(time.Since(sent) / 2).UnixMilli()
					end := int64(math.Round(float64(mid+ar.ResetAfterMs)/1000)) * 1000
					record(outcome{node: i, window: end/1000 - 1, allowed: ar.Allowed})
				}
			}()
		}
	}
	return &wg
}

// admittedPerWindow sums admissions of the windows wholly inside
// [from, to).
func admittedPerWindow(outs []outcome, from, to time.Time) (windows []int64, admitted map[int64]int) {
	admitted = make(map[int64]int)
	first := (from.UnixMilli() + 999) / 1000
	last := to.UnixMilli()/1000 - 1
	for w := first; w <= last; w++ {
		windows = append(windows, w)
		admitted[w] = 0
	}
	for _, o := range outs {
		if _, ok := admitted[o.window]; ok && o.allowed {
			admitted[o.window]++
		}
	}
	sort.Slice(windows, func(i, j int) bool { return windows[i] < windows[j] })
	return windows, admitted
}

func TestServeThreeProcessesGlobalLimit(t *testing.T) {
	bin := buildBinary(t)
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "ratemesh.yaml")
	if err := os.WriteFile(cfgPath, []byte(e2eConfig), 0o644); err != nil {
		t.Fatal(err)
	}
	serveArgs := func(i int, extra ...string) []string {
		return append([]string{"--config", cfgPath, "--api", "127.0.0.1:0", "--listen", "/ip4/127.0.0.1/tcp/0",
			"--data-dir", filepath.Join(dir, fmt.Sprintf("n%d", i))}, extra...)
	}
	procs := []*proc{startServe(t, bin, serveArgs(0)...)}
	boot := procs[0].ready.Addrs[0]
	procs = append(procs, startServe(t, bin, serveArgs(1, "--bootstrap", boot)...), startServe(t, bin, serveArgs(2, "--bootstrap", boot)...))
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
		if status, _ := p.get("/healthz", nil); status != 200 {
			t.Fatalf("node %d healthz %d", i, status)
		}
	}

	var mu sync.Mutex
	var outs []outcome
	record := func(o outcome) { mu.Lock(); outs = append(outs, o); mu.Unlock() }
	snapshot := func() []outcome { mu.Lock(); defer mu.Unlock(); return append([]outcome(nil), outs...) }

	// Phase 1: traffic at all three.
	stop1 := make(chan struct{})
	start1 := time.Now()
	wg1 := drive(t, procs, []int{0, 1, 2}, 2, "k1", stop1, record)
	time.Sleep(6 * time.Second) // the traffic phase itself, not a wait for a condition
	end1 := time.Now()
	close(stop1)
	wg1.Wait()
	windows, admitted := admittedPerWindow(snapshot(), start1, end1)
	if len(windows) < 4 {
		t.Fatalf("only %d full windows in phase 1", len(windows))
	}
	perNode := map[int]int{}
	for _, o := range snapshot() {
		if o.allowed {
			perNode[o.node]++
		}
	}
	t.Logf("phase 1: %d requests, admitted per window %v, per node %v", len(snapshot()), ordered(windows, admitted), perNode)
	for _, w := range windows {
		if a := admitted[w]; float64(a) > 1.02*e2eLimit || float64(a) < 0.95*e2eLimit {
			t.Errorf("phase 1 window %d: %d admitted, want within [%v, %v]", w, a, 0.95*e2eLimit, 1.02*e2eLimit)
		}
	}
	for i := range procs {
		if perNode[i] == 0 {
			t.Errorf("node %d admitted nothing", i)
		}
	}

	// Phase 2: SIGKILL node 2 under load, on a fresh key.
	outs = nil
	stop2 := make(chan struct{})
	start2 := time.Now()
	wg2 := drive(t, procs, []int{0, 1}, 2, "k2", stop2, record)
	stop3 := make(chan struct{})
	wg3 := drive(t, procs, []int{2}, 2, "k2", stop3, record)
	time.Sleep(1500 * time.Millisecond)
	killed := time.Now()
	// stop3 closes first, so the requests the kill cuts off (connection
	// reset) are expected, not failures; they are in flight when it lands.
	close(stop3)
	if err := procs[2].cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	wg3.Wait()
	time.Sleep(8 * time.Second) // traffic at the survivors
	end2 := time.Now()
	close(stop2)
	wg2.Wait()
	windows, admitted = admittedPerWindow(snapshot(), start2, end2)
	t.Logf("phase 2 (node 2 killed at window %d): admitted per window %v", killed.UnixMilli()/1000, ordered(windows, admitted))
	after := (killed.UnixMilli() + 999) / 1000 // the first window wholly after the kill
	evicted := killed.Add(3*time.Second + 1500*time.Millisecond).UnixMilli()
	checked := 0
	for _, w := range windows {
		a := admitted[w]
		if w < after {
			continue // the killed node's last unpublished admissions count in the kill window only
		}
		checked++
		if float64(a) > 1.02*e2eLimit {
			t.Errorf("phase 2 window %d: %d admitted, over 1.02 × %d", w, a, e2eLimit)
		}
		if a == 0 {
			t.Errorf("phase 2 window %d: the survivors admitted nothing", w)
		}
		if w*1000 >= evicted && float64(a) < 0.95*e2eLimit {
			t.Errorf("phase 2 window %d (after the eviction of the killed node): %d admitted, want ≥ %v", w, a, 0.95*e2eLimit)
		}
	}
	if checked < 5 {
		t.Fatalf("only %d windows checked after the kill", checked)
	}
	for i, p := range procs[:2] {
		testutil.Eventually(t, 10*time.Second, func() (bool, string) {
			st := p.states(t)
			return st[procs[2].ready.PeerID] == "dead", fmt.Sprintf("node %d marks the killed node dead: %v", i, st)
		})
	}

	// A graceful stop: SIGTERM makes node 1 leave (the others see "left")
	// and exit 0.
	if err := procs[1].cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-procs[1].done:
		procs[1].done <- err // for the cleanup
		if err != nil {
			t.Fatalf("SIGTERM: exit %v, want 0", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("SIGTERM: still running after 15 s")
	}
	// Close hands the leave to every connected peer directly as well as
	// by gossip, so node 0 sees "left" at once, well before the silence
	// alone could make node 1 suspect or dead.
	testutil.Eventually(t, 2*time.Second, func() (bool, string) {
		last := procs[0].states(t)[procs[1].ready.PeerID]
		return last == "left", "node 0 sees node 1 left: " + last
	})
	var ar httpapi.AllowResponse
	if status, err := procs[0].post("/v1/allow", `{"rule":"e2e","key":"k3"}`, &ar); err != nil || status != 200 || !ar.Allowed {
		t.Fatalf("node 0 after the others went: %d %v %+v", status, err, ar)
	}
}

func ordered(ws []int64, m map[int64]int) []int {
	out := make([]int, len(ws))
	for i, w := range ws {
		out[i] = m[w]
	}
	return out
}

func TestServeReloadAndRefusals(t *testing.T) {
	bin := buildBinary(t)
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "ratemesh.yaml")
	write := func(s string) {
		t.Helper()
		if err := os.WriteFile(cfgPath, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}

	// An invalid file is refused at start with the rule and the field.
	for src, want := range map[string]string{
		"rules:\n  - {name: a, algorithm: concurrency, limit: 5, mode: suppress}\n":                                                            `rules[0] "a": mode: suppress applies to windowed rules only`,
		"rules:\n  - {name: a, algorithm: fixed_window, limit: 5, window: 1s, colour: red}\n":                                                  `rules[0] "a": colour: line 2: unknown field`,
		"rules:\n  - {name: a, algorithm: fixed_window, limit: 5, window: 1s}\n  - {name: a, algorithm: fixed_window, limit: 6, window: 1s}\n": `rules[1] "a": name: defined twice`,
	} {
		write(src)
		// Bounded: a config this version accepts would serve forever.
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		cmd := exec.CommandContext(ctx, bin, "serve", "--config", cfgPath, "--api", "127.0.0.1:0", "--listen", "/ip4/127.0.0.1/tcp/0", "--data-dir", filepath.Join(dir, "d"))
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		cancel()
		if code := cmd.ProcessState.ExitCode(); err == nil || code != 1 || !strings.Contains(stderr.String(), want) || stdout.Len() != 0 {
			t.Errorf("config %q: exit %d, stderr %q, stdout %q; want exit 1 naming %q", src, code, stderr.String(), stdout.String(), want)
		}
	}

	write("rules:\n  - {name: a, algorithm: fixed_window, limit: 5, window: 1h}\n  - {name: b, algorithm: fixed_window, limit: 5, window: 1h}\n")
	p := startServe(t, bin, "--config", cfgPath, "--api", "127.0.0.1:0", "--listen", "/ip4/127.0.0.1/tcp/0", "--data-dir", filepath.Join(dir, "d"))
	for range 3 {
		var ar httpapi.AllowResponse
		if status, err := p.post("/v1/allow", `{"rule":"a","key":"k"}`, &ar); err != nil || status != 200 || !ar.Allowed {
			t.Fatalf("allow: %d %v %+v", status, err, ar)
		}
	}
	// a's limit rises, its window stays: the 3 used stay. b turns invalid
	// and keeps its running version; c is new.
	write("rules:\n  - {name: a, algorithm: fixed_window, limit: 8, window: 1h}\n  - {name: b, algorithm: fixed_window, limit: 0, window: 1h}\n  - {name: c, algorithm: fixed_window, limit: 2, window: 1h}\n")
	if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, func() (bool, string) {
		var ar httpapi.AllowResponse
		status, err := p.post("/v1/allow", `{"rule":"a","key":"k","cost":0}`, &ar)
		return status == 200 && err == nil && ar.Limit == 8, fmt.Sprintf("reload applied: %d %v %+v", status, err, ar)
	})
	var ar httpapi.AllowResponse
	if status, err := p.post("/v1/allow", `{"rule":"a","key":"k","cost":0}`, &ar); err != nil || status != 200 || ar.Remaining != 5 {
		t.Fatalf("a after reload: %d %v %+v, want remaining 8−3 = 5", status, err, ar)
	}
	if status, err := p.post("/v1/allow", `{"rule":"b","key":"k","cost":0}`, &ar); err != nil || status != 200 || ar.Limit != 5 {
		t.Fatalf("b after an invalid reload: %d %v %+v, want its old limit 5", status, err, ar)
	}
	if status, err := p.post("/v1/allow", `{"rule":"c","key":"k","cost":0}`, &ar); err != nil || status != 200 || ar.Limit != 2 {
		t.Fatalf("c after reload: %d %v %+v", status, err, ar)
	}
	resp, err := p.client.Get(p.url("/metrics"))
	if err != nil {
		t.Fatal(err)
	}
	var body bytes.Buffer
	_, _ = body.ReadFrom(resp.Body)
	resp.Body.Close()
	if !strings.Contains(body.String(), `ratemesh_config_reloads_total{result="partial"} 1`) {
		t.Errorf("metrics lack the partial reload:\n%s", grepLines(body.String(), "reloads"))
	}
	testutil.Eventually(t, 5*time.Second, func() (bool, string) {
		s := p.stderr.String()
		return strings.Contains(s, `rules[1] \"b\": limit: must be at least 1 (keeping the running version)`), "the reload error is logged: " + s
	})

	// SIGTERM flushes to the data dir; a restart on it keeps a's hour
	// window (persist_min_window 1m) under a new incarnation.
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-p.done:
		p.done <- err
		if err != nil {
			t.Fatalf("SIGTERM: exit %v, want 0", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("SIGTERM: still running after 15 s")
	}
	write("rules:\n  - {name: a, algorithm: fixed_window, limit: 8, window: 1h}\n")
	p2 := startServe(t, bin, "--config", cfgPath, "--api", "127.0.0.1:0", "--listen", "/ip4/127.0.0.1/tcp/0", "--data-dir", filepath.Join(dir, "d"))
	if p2.ready.PeerID != p.ready.PeerID {
		t.Fatalf("peer ID changed across a restart: %s, then %s", p.ready.PeerID, p2.ready.PeerID)
	}
	if status, err := p2.post("/v1/allow", `{"rule":"a","key":"k","cost":0}`, &ar); err != nil || status != 200 || ar.Remaining != 5 {
		t.Fatalf("a after a restart: %d %v %+v, want remaining 5 from the disk", status, err, ar)
	}
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
