package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/ratemesh/ratemesh/httpapi"
)

// readyLine is the JSON line `ratemesh serve` prints on stdout once ready.
type readyLine struct {
	API    string   `json:"api"`
	PeerID string   `json:"peer_id"`
	Addrs  []string `json:"addrs"`
}

// proc is one run of `ratemesh serve`.
type proc struct {
	cmd   *exec.Cmd
	ready readyLine
	done  chan struct{} // closed once the process has exited
}

// member is one node of the cluster: its data dir and libp2p port stay
// across restarts, as in a deploy; its binary changes in an upgrade.
type member struct {
	bin     string
	dataDir string
	listen  string
	p       *proc     // the latest run; nil before the first
	down    bool      // stopped by the harness (or not started yet)
	stopped time.Time // when the harness last stopped it
	paused  bool      // SIGSTOPped by the pauser
}

// cluster runs the serve processes. Its methods are safe for concurrent
// use.
type cluster struct {
	cfg  string
	cg   *cgroup // nil: no CPU quota
	http *http.Client

	mu       sync.Mutex
	members  []*member
	skew     []string // "beyond max_skew" lines, prefixed with the node
	timeouts []string // "join timed out" lines, prefixed with the node
	tails    [][]string
}

// skewMarker is what the node logs when its clock offset to the mesh is
// beyond max_skew (node/runtime.go).
const skewMarker = "beyond max_skew"

// joinTimeoutMarker is what the node logs when it stopped waiting for its
// peers' state after join_timeout (node/runtime.go, every release since
// the first).
const joinTimeoutMarker = "join timed out"

// newCluster returns a cluster of n nodes, each to start on bin.
func newCluster(bin, dir, cfg string, n int, cg *cgroup) (*cluster, error) {
	c := &cluster{cfg: cfg, cg: cg, http: &http.Client{Timeout: 5 * time.Second}, tails: make([][]string, n)}
	for i := range n {
		port, err := freePort()
		if err != nil {
			return nil, fmt.Errorf("a libp2p port for node %d: %w", i, err)
		}
		c.members = append(c.members, &member{
			bin:     bin,
			dataDir: filepath.Join(dir, fmt.Sprintf("n%d", i)),
			listen:  "/ip4/127.0.0.1/tcp/" + port,
			down:    true,
		})
	}
	return c, nil
}

func freePort() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	_, port, err := net.SplitHostPort(l.Addr().String())
	return port, err
}

// setBin makes node i start on bin from its next start on.
func (c *cluster) setBin(i int, bin string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.members[i].bin = bin
}

// start starts node i (again) on its binary, data dir and port,
// bootstrapped to boot ("" for none), and returns once its ready line is
// out.
func (c *cluster) start(ctx context.Context, i int, boot string) (*proc, error) {
	m := c.members[i]
	args := []string{"serve", "--config", c.cfg, "--api", "127.0.0.1:0", "--listen", m.listen, "--data-dir", m.dataDir}
	if boot != "" {
		args = append(args, "--bootstrap", boot)
	}
	c.mu.Lock()
	bin := m.bin
	c.mu.Unlock()
	cmd := exec.Command(bin, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start node %d: %w", i, err)
	}
	p := &proc{cmd: cmd, done: make(chan struct{})}
	if c.cg != nil {
		if err := c.cg.add(cmd.Process.Pid); err != nil {
			_ = cmd.Process.Kill()
			_, _ = io.Copy(io.Discard, stdout)
			_, _ = io.Copy(io.Discard, stderr)
			_ = cmd.Wait()
			return nil, fmt.Errorf("node %d into cgroup %s: %w", i, c.cg.dir, err)
		}
	}
	lines := make(chan string, 1)
	var pipes sync.WaitGroup
	pipes.Add(2)
	go func() {
		defer pipes.Done()
		sc := bufio.NewScanner(stdout)
		if sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
		_, _ = io.Copy(io.Discard, stdout)
	}()
	go func() {
		defer pipes.Done()
		c.readStderr(i, stderr)
	}()
	go func() {
		pipes.Wait() // Wait closes the pipes: read them to the end first
		_ = cmd.Wait()
		close(p.done)
	}()
	timer := time.NewTimer(30 * time.Second)
	defer timer.Stop()
	select {
	case line, ok := <-lines:
		if !ok {
			<-p.done
			return nil, fmt.Errorf("node %d exited without a ready line (%v); its last lines:\n%s", i, cmd.ProcessState, c.tail(i))
		}
		if err := json.Unmarshal([]byte(line), &p.ready); err != nil || p.ready.API == "" || p.ready.PeerID == "" || len(p.ready.Addrs) == 0 {
			kill(p)
			return nil, fmt.Errorf("node %d: ready line %q: %v", i, line, err)
		}
	case <-timer.C:
		kill(p)
		return nil, fmt.Errorf("node %d: no ready line within 30 s; its last lines:\n%s", i, c.tail(i))
	case <-ctx.Done():
		kill(p)
		return nil, ctx.Err()
	}
	c.mu.Lock()
	m.p, m.down, m.paused = p, false, false
	c.mu.Unlock()
	return p, nil
}

// kill kills p and waits for it to exit.
func kill(p *proc) {
	_ = p.cmd.Process.Kill()
	<-p.done
}

// readStderr keeps node i's last lines, every skew line and every join
// timeout.
func (c *cluster) readStderr(i int, r io.Reader) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		c.mu.Lock()
		if strings.Contains(line, skewMarker) && len(c.skew) < 1000 {
			c.skew = append(c.skew, fmt.Sprintf("node %d: %s", i, line))
		}
		if strings.Contains(line, joinTimeoutMarker) && len(c.timeouts) < 1000 {
			c.timeouts = append(c.timeouts, fmt.Sprintf("node %d: %s", i, line))
		}
		t := append(c.tails[i], line)
		if len(t) > 20 {
			t = t[len(t)-20:]
		}
		c.tails[i] = t
		c.mu.Unlock()
	}
}

func (c *cluster) tail(i int) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return strings.Join(c.tails[i], "\n")
}

func (c *cluster) skewLines() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string{}, c.skew...)
}

func (c *cluster) joinTimeouts() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string{}, c.timeouts...)
}

// running returns the process of node i, or nil while it is down.
func (c *cluster) running(i int) *proc {
	c.mu.Lock()
	defer c.mu.Unlock()
	if m := c.members[i]; !m.down {
		return m.p
	}
	return nil
}

// stop signals node i (SIGKILL or SIGTERM, after a SIGCONT should the
// pauser hold it) and waits up to 15 s for it to exit.
func (c *cluster) stop(i int, sig syscall.Signal) error {
	c.mu.Lock()
	m := c.members[i]
	p := m.p
	m.down, m.stopped = true, time.Now()
	c.mu.Unlock()
	if p == nil {
		return nil
	}
	_ = p.cmd.Process.Signal(syscall.SIGCONT)
	if err := p.cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("node %d: %v: %w", i, sig, err)
	}
	select {
	case <-p.done:
		return nil
	case <-time.After(15 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
		return fmt.Errorf("node %d: still running 15 s after %v; killed", i, sig)
	}
}

// close kills every process and waits for them.
func (c *cluster) close() {
	c.mu.Lock()
	ps := make([]*proc, 0, len(c.members))
	for _, m := range c.members {
		m.down = true
		if m.p != nil {
			ps = append(ps, m.p)
		}
	}
	c.mu.Unlock()
	for _, p := range ps {
		_ = p.cmd.Process.Kill()
	}
	for _, p := range ps {
		<-p.done
	}
}

// peers reads p's member table.
func (c *cluster) peers(ctx context.Context, p *proc) (httpapi.PeersResponse, error) {
	var pr httpapi.PeersResponse
	err := c.getJSON(ctx, p, "/v1/peers", &pr)
	return pr, err
}

// malformed reads p's count of received batches it refused as malformed:
// the sum of ratemesh_mesh_rejected_total{reason="malformed"} over its
// channels, which every release since 821b92d exports. A node refuses a
// peer's batch as malformed when it cannot decode it, as a release that
// predates a field refuses a batch carrying it.
func (c *cluster) malformed(ctx context.Context, p *proc) (uint64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.ready.API+"/metrics", nil)
	if err != nil {
		return 0, err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("GET /metrics: %d", resp.StatusCode)
	}
	return sumMetric(resp.Body, "ratemesh_mesh_rejected_total", `reason="malformed"`)
}

// sumMetric sums the samples of Prometheus text exposition r named name
// whose labels contain label.
func sumMetric(r io.Reader, name, label string) (uint64, error) {
	var sum uint64
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		rest, ok := strings.CutPrefix(line, name+"{")
		if !ok {
			continue
		}
		labels, value, ok := strings.Cut(rest, "} ")
		if !ok || !strings.Contains(labels, label) {
			continue
		}
		f, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
		if err != nil {
			return 0, fmt.Errorf("%s: %q: %v", name, line, err)
		}
		sum += uint64(f)
	}
	return sum, sc.Err()
}

// statusError is an answer other than 200.
type statusError struct {
	code int
	msg  string
}

func (e *statusError) Error() string { return e.msg }

func (c *cluster) getJSON(ctx context.Context, p *proc, path string, out any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.ready.API+path, nil)
	if err != nil {
		return err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return &statusError{code: resp.StatusCode, msg: fmt.Sprintf("GET %s: %d %s", path, resp.StatusCode, strings.TrimSpace(string(b)))}
	}
	return json.NewDecoder(resp.Body).Decode(out)
}

// waitAlive polls until every running node sees every running node alive,
// and itself under the peer ID of its ready line, or d has passed.
func (c *cluster) waitAlive(ctx context.Context, d time.Duration) error {
	deadline := time.Now().Add(d)
	for {
		why := c.allAlive(ctx)
		if why == "" {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not every node sees every node alive within %v: %s", d, why)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (c *cluster) allAlive(ctx context.Context) string {
	var ps []*proc
	for i := range c.members {
		if p := c.running(i); p != nil {
			ps = append(ps, p)
		}
	}
	for i, p := range ps {
		pr, err := c.peers(ctx, p)
		if err != nil {
			return fmt.Sprintf("node at %s: %v", p.ready.API, err)
		}
		states := map[string]string{}
		for _, pj := range pr.Peers {
			states[pj.PeerID] = pj.State
			if pj.Self && pj.PeerID != p.ready.PeerID {
				return fmt.Sprintf("node at %s calls itself %s, its ready line %s", p.ready.API, pj.PeerID, p.ready.PeerID)
			}
		}
		for _, q := range ps {
			if states[q.ready.PeerID] != "alive" {
				return fmt.Sprintf("process %d sees %s %q", i, q.ready.PeerID, states[q.ready.PeerID])
			}
		}
	}
	return ""
}

// cgroup is a CPU-limited control group the serve processes run in.
type cgroup struct {
	dir  string
	kind string // "cgroup v2 cpu.max" or "cgroup v1 cpu.cfs_quota_us"
}

// newCgroup makes a cgroup with the quota: cgroup v2's cpu.max where the
// cpu controller can be had, else cgroup v1's cpu.cfs_quota_us; an error
// says why neither could (read-only /sys/fs/cgroup, no cpu controller).
func newCgroup(quota, period int) (*cgroup, error) {
	name := fmt.Sprintf("ratemesh-starve-%d", os.Getpid())
	var why []string
	for _, root := range []string{"/sys/fs/cgroup", "/sys/fs/cgroup/unified"} {
		if _, err := os.Stat(filepath.Join(root, "cgroup.controllers")); err != nil {
			continue
		}
		own := ownCgroup("")
		for _, parent := range []string{filepath.Join(root, own), root} {
			dir := filepath.Join(parent, name)
			if err := os.Mkdir(dir, 0o755); err != nil {
				why = append(why, err.Error())
				continue
			}
			if _, err := os.Stat(filepath.Join(dir, "cpu.max")); err != nil {
				// Enabling cpu for children fails in a cgroup that holds
				// processes itself (no internal processes); try anyway.
				_ = os.WriteFile(filepath.Join(parent, "cgroup.subtree_control"), []byte("+cpu"), 0)
			}
			err := os.WriteFile(filepath.Join(dir, "cpu.max"), []byte(fmt.Sprintf("%d %d", quota, period)), 0)
			if err == nil {
				return &cgroup{dir: dir, kind: "cgroup v2 cpu.max"}, nil
			}
			why = append(why, fmt.Sprintf("%s/cpu.max: %v", dir, err))
			_ = os.Remove(dir)
		}
	}
	for _, root := range []string{"/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpu,cpuacct"} {
		if _, err := os.Stat(filepath.Join(root, "cpu.cfs_quota_us")); err != nil {
			continue
		}
		dir := filepath.Join(root, ownCgroup("cpu"), name)
		if err := os.Mkdir(dir, 0o755); err != nil {
			why = append(why, err.Error())
			continue
		}
		err := os.WriteFile(filepath.Join(dir, "cpu.cfs_period_us"), []byte(strconv.Itoa(period)), 0)
		if err == nil {
			err = os.WriteFile(filepath.Join(dir, "cpu.cfs_quota_us"), []byte(strconv.Itoa(quota)), 0)
		}
		if err == nil {
			return &cgroup{dir: dir, kind: "cgroup v1 cpu.cfs_quota_us"}, nil
		}
		why = append(why, fmt.Sprintf("%s: %v", dir, err))
		_ = os.Remove(dir)
	}
	if len(why) == 0 {
		why = append(why, "no cgroup v2 hierarchy with cpu.max and no cgroup v1 cpu controller under /sys/fs/cgroup")
	}
	return nil, errors.New(strings.Join(why, "; "))
}

// ownCgroup is this process's cgroup path in the v2 hierarchy (controller
// "") or the v1 hierarchy holding controller, from /proc/self/cgroup;
// "/" when unknown.
func ownCgroup(controller string) string {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return "/"
	}
	for _, line := range strings.Split(string(b), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		if controller == "" && parts[0] == "0" && parts[1] == "" {
			return parts[2]
		}
		for _, c := range strings.Split(parts[1], ",") {
			if controller != "" && c == controller {
				return parts[2]
			}
		}
	}
	return "/"
}

func (g *cgroup) add(pid int) error {
	return os.WriteFile(filepath.Join(g.dir, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0)
}

// remove deletes the cgroup once its processes are gone.
func (g *cgroup) remove() error {
	var err error
	for range 50 {
		if err = os.Remove(g.dir); err == nil {
			return nil
		}
		time.Sleep(20 * time.Millisecond) // the killed processes leave the cgroup
	}
	return err
}

// busyLoops starts n processes that spin on a core each, `sh -c 'while :;
// do :; done'`, outside the cgroup; stop kills them and waits.
func busyLoops(n int) (stop func(), err error) {
	var cmds []*exec.Cmd
	stop = func() {
		for _, c := range cmds {
			_ = c.Process.Kill()
		}
		for _, c := range cmds {
			_ = c.Wait()
		}
	}
	for range n {
		c := exec.Command("sh", "-c", "while :; do :; done")
		c.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := c.Start(); err != nil {
			stop()
			return nil, fmt.Errorf("start a busy loop: %w", err)
		}
		cmds = append(cmds, c)
	}
	return stop, nil
}

// loadSampler samples /proc/loadavg once a second.
type loadSampler struct {
	mu       sync.Mutex
	max, end float64
	running  float64
	samples  int
}

func (l *loadSampler) run(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		l.sample()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (l *loadSampler) sample() {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return
	}
	f := strings.Fields(string(b))
	if len(f) < 4 {
		return
	}
	one, err1 := strconv.ParseFloat(f[0], 64)
	run, _, _ := strings.Cut(f[3], "/")
	r, err2 := strconv.Atoi(run)
	if err1 != nil || err2 != nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.max, l.end = max(l.max, one), one
	l.running += float64(r)
	l.samples++
}

func (l *loadSampler) report(s *starveReport) {
	l.mu.Lock()
	defer l.mu.Unlock()
	s.LoadAvg1Max, s.LoadAvg1End = l.max, l.end
	if l.samples > 0 {
		s.RunnableAvg = l.running / float64(l.samples)
	}
}
