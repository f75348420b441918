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

// proc is one server process the harness started.
type proc struct {
	name string
	cmd  *exec.Cmd
	done chan struct{} // closed once it has exited and its pipes are drained
	// first is the first line on stdout (ratemesh's ready line); closed
	// without a value when stdout ends first.
	first chan string

	mu   sync.Mutex
	tail []string // the last lines of stderr
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

func (p *proc) lastLines() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.tail) == 0 {
		return "(nothing on stderr)"
	}
	return strings.Join(p.tail, "\n")
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// procs owns every process the harness starts: kill them all with
// killAll. Its methods are safe for concurrent use.
type procs struct {
	dir string // logs go to dir/<name>.log

	mu   sync.Mutex
	live []*proc
}

// start starts bin with args and env (added to the harness's environment
// but for the variables named in drop, by prefix). Its stderr goes to
// dir/<name>.log, and the last lines are kept for errors. The process is
// killed should the harness die (Pdeathsig).
func (ps *procs) start(name, bin string, args, env, drop []string) (*proc, error) {
	logf, err := os.Create(filepath.Join(ps.dir, name+".log"))
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = environ(drop, env)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		logf.Close()
		return nil, err
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		logf.Close()
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, done: make(chan struct{}), first: make(chan string, 1)}
	ps.mu.Lock()
	ps.live = append(ps.live, p)
	ps.mu.Unlock()
	var pipes sync.WaitGroup
	pipes.Go(func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		if sc.Scan() {
			p.first <- sc.Text()
		}
		close(p.first)
		_, _ = io.Copy(io.Discard, stdout)
	})
	pipes.Go(func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			fmt.Fprintln(logf, line)
			p.mu.Lock()
			if p.tail = append(p.tail, line); len(p.tail) > 15 {
				p.tail = p.tail[len(p.tail)-15:]
			}
			p.mu.Unlock()
		}
		_, _ = io.Copy(io.Discard, stderr)
	})
	go func() {
		pipes.Wait() // Wait closes the pipes: read them to the end first
		_ = cmd.Wait()
		logf.Close()
		close(p.done)
	}()
	return p, nil
}

// environ is the harness's environment without the variables whose names
// start with a prefix in drop, followed by add.
func environ(drop, add []string) []string {
	var out []string
	for _, kv := range os.Environ() {
		keep := true
		for _, d := range drop {
			if strings.HasPrefix(kv, d) {
				keep = false
				break
			}
		}
		if keep {
			out = append(out, kv)
		}
	}
	return append(out, add...)
}

// kill kills p and waits for it to exit.
func (ps *procs) kill(p *proc) {
	_ = p.cmd.Process.Kill()
	<-p.done
	ps.mu.Lock()
	defer ps.mu.Unlock()
	for i, q := range ps.live {
		if q == p {
			ps.live = append(ps.live[:i], ps.live[i+1:]...)
			break
		}
	}
}

// killAll kills every process still running and waits for them.
func (ps *procs) killAll() {
	ps.mu.Lock()
	live := ps.live
	ps.live = nil
	ps.mu.Unlock()
	for _, p := range live {
		_ = p.cmd.Process.Kill()
	}
	for _, p := range live {
		<-p.done
	}
}

// pollUntil calls check every 50 ms until it returns nil, ctx ends or d
// has passed; the error then is check's last.
func pollUntil(ctx context.Context, d time.Duration, check func() error) error {
	deadline := time.Now().Add(d)
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		err := check()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not within %v: %w", d, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

// sleepCtx waits d unless ctx ends first; false when it did.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// freePort returns a port on ip free for TCP and UDP at the moment
// (member-list listens on both).
func freePort(ip string) (string, error) {
	for range 20 {
		l, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
		if err != nil {
			return "", err
		}
		_, port, _ := net.SplitHostPort(l.Addr().String())
		u, err := net.ListenPacket("udp", net.JoinHostPort(ip, port))
		l.Close()
		if err == nil {
			u.Close()
			return port, nil
		}
	}
	return "", fmt.Errorf("no port on %s free for both TCP and UDP in 20 tries", ip)
}

// getJSON GETs url and decodes a 200's JSON body into out.
func getJSON(ctx context.Context, c *http.Client, url string, out any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: HTTP %d: %s", url, resp.StatusCode, strings.TrimSpace(string(b)))
	}
	if out == nil {
		return nil
	}
	if s, ok := out.(*string); ok {
		*s = string(b)
		return nil
	}
	return json.Unmarshal(b, out)
}

// node is one server of a system under test.
type node struct {
	p    *proc
	http string // HOST:PORT of its HTTP API
	grpc string // HOST:PORT of its gRPC API ("" when off)
	id   string // ratemesh: its peer ID
	boot string // ratemesh: a multiaddr of it to bootstrap others with
}

// cluster is the nodes of one system.
type cluster struct {
	system string
	nodes  []*node
}

func (c *cluster) pids() []int {
	var out []int
	for _, n := range c.nodes {
		out = append(out, n.p.pid())
	}
	return out
}

// ratemeshReady is the JSON line `ratemesh serve` prints once it serves.
type ratemeshReady struct {
	API    string   `json:"api"`
	PeerID string   `json:"peer_id"`
	Addrs  []string `json:"addrs"`
	GRPC   string   `json:"grpc"`
}

// startRatemesh starts n `ratemesh serve` nodes on 127.0.0.1 with the
// config file cfg (and, with envoyCfg, Envoy's RLS on gRPC), the second
// and third bootstrapped to the first, and returns once every node sees
// every node alive.
func startRatemesh(ctx context.Context, ps *procs, bin, cfg, envoyCfg, name string, n int) (*cluster, error) {
	c := &cluster{system: "ratemesh"}
	for i := range n {
		dir := filepath.Join(ps.dir, fmt.Sprintf("%s-%d", name, i))
		args := []string{"serve", "--config", cfg, "--api", "127.0.0.1:0", "--listen", "/ip4/127.0.0.1/tcp/0",
			"--data-dir", dir, "--log-level", "warn", "--config-poll", "0"}
		if envoyCfg != "" {
			args = append(args, "--grpc", "127.0.0.1:0", "--envoy-config", envoyCfg)
		}
		if i > 0 {
			args = append(args, "--bootstrap", c.nodes[0].boot)
		}
		p, err := ps.start(fmt.Sprintf("%s-%d", name, i), bin, args, nil, []string{"RATEMESH_"})
		if err != nil {
			return nil, err
		}
		var line string
		timer := time.NewTimer(60 * time.Second)
		select {
		case l, ok := <-p.first:
			timer.Stop()
			if !ok {
				<-p.done
				return nil, fmt.Errorf("ratemesh node %d exited without a ready line (%v); its last lines:\n%s", i, p.cmd.ProcessState, p.lastLines())
			}
			line = l
		case <-timer.C:
			return nil, fmt.Errorf("ratemesh node %d: no ready line within 60 s; its last lines:\n%s", i, p.lastLines())
		case <-ctx.Done():
			timer.Stop()
			return nil, ctx.Err()
		}
		var r ratemeshReady
		if err := json.Unmarshal([]byte(line), &r); err != nil || r.API == "" || r.PeerID == "" || len(r.Addrs) == 0 {
			return nil, fmt.Errorf("ratemesh node %d: ready line %q: %v", i, line, err)
		}
		if envoyCfg != "" && r.GRPC == "" {
			return nil, fmt.Errorf("ratemesh node %d: ready line %q names no gRPC address", i, line)
		}
		c.nodes = append(c.nodes, &node{p: p, http: r.API, grpc: r.GRPC, id: r.PeerID, boot: r.Addrs[0]})
	}
	if n == 1 {
		return c, nil
	}
	hc := &http.Client{Timeout: 2 * time.Second}
	err := pollUntil(ctx, 30*time.Second, func() error {
		for _, nd := range c.nodes {
			if nd.p.exited() {
				return fmt.Errorf("%s exited; its last lines:\n%s", nd.p.name, nd.p.lastLines())
			}
			var pr httpapi.PeersResponse
			if err := getJSON(ctx, hc, "http://"+nd.http+"/v1/peers", &pr); err != nil {
				return err
			}
			state := map[string]string{}
			for _, pj := range pr.Peers {
				state[pj.PeerID] = pj.State
			}
			for _, other := range c.nodes {
				if state[other.id] != "alive" {
					return fmt.Errorf("ratemesh node at %s sees %s %q", nd.http, other.id, state[other.id])
				}
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("ratemesh: not every node sees every node alive: %w", err)
	}
	return c, nil
}

// guberHealth is Gubernator's GET /v1/HealthCheck answer.
type guberHealth struct {
	Status    string `json:"status"`
	Message   string `json:"message"`
	PeerCount int32  `json:"peer_count"`
}

// startGubernator starts n Gubernator daemons, node i on 127.0.0.(i+1):
// member-list keys peers by IP and names members by host name, so each
// has an address and a name (GUBER_MEMBERLIST_NODE_NAME, read by the
// daemon of ./gubernator) of its own. cacheSize is GUBER_CACHE_SIZE (0:
// Gubernator's default of 50,000 keys). Traces are off
// (OTEL_TRACES_EXPORTER=none; by default they go to localhost:4317). It
// returns once every node is healthy and counts n peers.
func startGubernator(ctx context.Context, ps *procs, bin, name string, n, cacheSize int) (*cluster, error) {
	c := &cluster{system: "gubernator"}
	type addrs struct{ grpc, http, ml string }
	var as []addrs
	for i := range n {
		ip := fmt.Sprintf("127.0.0.%d", i+1)
		var a [3]string
		for j := range a {
			port, err := freePort(ip)
			if err != nil {
				return nil, fmt.Errorf("gubernator node %d: %w", i, err)
			}
			a[j] = net.JoinHostPort(ip, port)
		}
		as = append(as, addrs{a[0], a[1], a[2]})
	}
	for i, a := range as {
		env := []string{
			"OTEL_TRACES_EXPORTER=none",
			"GUBER_GRPC_ADDRESS=" + a.grpc,
			"GUBER_HTTP_ADDRESS=" + a.http,
			"GUBER_ADVERTISE_ADDRESS=" + a.grpc,
			"GUBER_PEER_DISCOVERY_TYPE=member-list",
			"GUBER_MEMBERLIST_ADDRESS=" + a.ml,
			"GUBER_MEMBERLIST_BIND_ADDRESS=" + a.ml,
			"GUBER_MEMBERLIST_KNOWN_NODES=" + as[0].ml,
			"GUBER_MEMBERLIST_NODE_NAME=" + fmt.Sprintf("%s-%d", name, i),
			"GUBER_INSTANCE_ID=" + fmt.Sprintf("%s-%d", name, i),
			"GUBER_LOG_LEVEL=warn",
			"GUBER_METRIC_FLAGS=golang",
		}
		if cacheSize > 0 {
			env = append(env, "GUBER_CACHE_SIZE="+strconv.Itoa(cacheSize))
		}
		p, err := ps.start(fmt.Sprintf("%s-%d", name, i), bin, nil, env, []string{"GUBER_", "OTEL_"})
		if err != nil {
			return nil, err
		}
		c.nodes = append(c.nodes, &node{p: p, http: a.http, grpc: a.grpc})
	}
	hc := &http.Client{Timeout: 2 * time.Second}
	err := pollUntil(ctx, 60*time.Second, func() error {
		for _, nd := range c.nodes {
			if nd.p.exited() {
				return fmt.Errorf("%s exited; its last lines:\n%s", nd.p.name, nd.p.lastLines())
			}
			var h guberHealth
			if err := getJSON(ctx, hc, "http://"+nd.http+"/v1/HealthCheck", &h); err != nil {
				return err
			}
			if h.Status != "healthy" || int(h.PeerCount) != n {
				return fmt.Errorf("gubernator at %s: %s, %d of %d peers %s", nd.http, h.Status, h.PeerCount, n, h.Message)
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("gubernator: %w", err)
	}
	return c, nil
}

// stop kills c's processes.
func (ps *procs) stop(c *cluster) {
	if c == nil {
		return
	}
	for _, n := range c.nodes {
		ps.kill(n.p)
	}
}

// build builds the binaries the options do not name into binDir and
// returns their paths. modDir is this module's directory.
func build(ctx context.Context, o *options, modDir string, progress io.Writer) (ratemesh, guber string, err error) {
	ratemesh, guber = o.RatemeshBin, o.GuberBin
	if ratemesh != "" && guber != "" {
		return ratemesh, guber, nil
	}
	if modDir == "" {
		return "", "", errors.New("not in the bench module (run it as `cd bench && go run .`), and --ratemesh-bin and --gubernator-bin are not both given")
	}
	dir := o.BinDir
	if dir == "" {
		cache, err := os.UserCacheDir()
		if err != nil {
			return "", "", fmt.Errorf("--bin-dir: not given, and no user cache dir: %w", err)
		}
		dir = filepath.Join(cache, "ratemesh-bench")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", "", fmt.Errorf("--bin-dir %s: %w", dir, err)
	}
	goBuild := func(what, out, pkg, in string) error {
		fmt.Fprintf(progress, "bench: go build %s (%s) …\n", pkg, what)
		cmd := exec.CommandContext(ctx, "go", "build", "-o", out, pkg)
		cmd.Dir = in
		cmd.Stdout, cmd.Stderr = progress, progress
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("go build %s in %s: %w", pkg, in, err)
		}
		return nil
	}
	if ratemesh == "" {
		ratemesh = filepath.Join(dir, "ratemesh")
		if err := goBuild("ratemesh, the main module through replace ../", ratemesh, "github.com/ratemesh/ratemesh/cmd/ratemesh", modDir); err != nil {
			return "", "", err
		}
	}
	if guber == "" {
		guber = filepath.Join(dir, "gubernator-v2.13.0")
		if err := goBuild("Gubernator v2.13.0's daemon, on its own go.mod's versions", guber, ".", filepath.Join(modDir, "gubernator")); err != nil {
			return "", "", err
		}
	}
	return ratemesh, guber, nil
}

// benchModule is this module's path in its go.mod.
const benchModule = "github.com/ratemesh/ratemesh/bench"

// moduleDir returns the bench module's directory when the working
// directory is in it, else "".
func moduleDir(ctx context.Context) string {
	out, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
	if err != nil {
		return ""
	}
	gomod := strings.TrimSpace(string(out))
	b, err := os.ReadFile(gomod)
	if err != nil || !strings.HasPrefix(string(b), "module "+benchModule+"\n") {
		return ""
	}
	return filepath.Dir(gomod)
}

// ratemeshVersion describes the commit of the repository around modDir.
func ratemeshVersion(ctx context.Context, modDir string) string {
	if modDir == "" {
		return "unknown"
	}
	out, err := exec.CommandContext(ctx, "git", "-C", modDir, "describe", "--always", "--dirty", "--exclude", "*").Output()
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(out))
}
