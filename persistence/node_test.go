package persistence_test

import (
	"bufio"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"

	"github.com/ratemesh/ratemesh/limiter"
	"github.com/ratemesh/ratemesh/mesh"
	"github.com/ratemesh/ratemesh/node"
	"github.com/ratemesh/ratemesh/node/memnet"
	"github.com/ratemesh/ratemesh/persistence"
)

// The helper process: the test binary re-executed with helperEnv set runs
// one member on a data directory instead of the tests (see TestMain).
const (
	helperEnv     = "RATEMESH_PERSIST_HELPER"
	helperFlush   = 200 * time.Millisecond
	helperSync    = 20 * time.Millisecond
	helperEvery   = 2 * time.Millisecond // one admission this often
	helperKey     = "k"
	helperRule    = "hour"
	helperNS      = "persist-test"
	helperTimeout = 30 * time.Second
)

func TestMain(m *testing.M) {
	if mode := os.Getenv(helperEnv); mode != "" {
		if err := helperMain(mode); err != nil {
			fmt.Fprintln(os.Stderr, "helper:", err)
			os.Exit(3)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func hourRules() []limiter.Rule {
	return []limiter.Rule{{Name: helperRule, Algorithm: limiter.FixedWindow, Limit: limiter.MaxLimit, Window: time.Hour}}
}

// midHour returns a clock at real speed from the middle of an hour, so an
// hour window never ends during a test. Processes that share it must
// share off.
func midHourOffset() time.Duration {
	return 30*time.Minute - time.Duration(time.Now().UnixNano()%int64(time.Hour))
}

// identity loads the store's libp2p key, creating and saving one on a
// fresh store: how a daemon keeps its peer ID.
func identity(ctx context.Context, st *persistence.Store) (crypto.PrivKey, error) {
	b, err := st.LoadIdentity(ctx)
	if err != nil {
		return nil, err
	}
	if b == nil {
		priv, _, err := crypto.GenerateEd25519Key(rand.Reader)
		if err != nil {
			return nil, err
		}
		if b, err = crypto.MarshalPrivateKey(priv); err != nil {
			return nil, err
		}
		if err := st.SaveIdentity(ctx, b); err != nil {
			return nil, err
		}
	}
	return crypto.UnmarshalPrivateKey(b)
}

// startMeshNode starts a member on a real libp2p host on 127.0.0.1 with
// store st.
func startMeshNode(ctx context.Context, st node.Store, priv crypto.PrivKey, bootstrap []string, off time.Duration) (*node.Node, *mesh.Mesh, error) {
	mc := mesh.DefaultConfig()
	mc.Namespace, mc.PrivKey, mc.Logger = helperNS, priv, slog.New(slog.DiscardHandler)
	mc.Listen, mc.Bootstrap = []string{"/ip4/127.0.0.1/tcp/0"}, bootstrap
	mc.DialTimeout, mc.RedialMin, mc.RedialMax = 2*time.Second, 20*time.Millisecond, 200*time.Millisecond
	m, err := mesh.New(mc)
	if err != nil {
		return nil, nil, err
	}
	cfg := node.DefaultConfig()
	cfg.Peer, cfg.Transport, cfg.Store, cfg.Rules = m.PeerID(), m, st, hourRules()
	cfg.SyncInterval, cfg.FlushInterval = helperSync, helperFlush
	cfg.Join, cfg.JoinTimeout = len(bootstrap) > 0, 5*time.Second
	cfg.Clock = func() time.Time { return time.Now().Add(off) }
	n, err := node.Start(ctx, cfg)
	if err != nil {
		_ = m.Close()
		return nil, nil, err
	}
	return n, m, nil
}

func tcpAddr(m *mesh.Mesh) string {
	for _, a := range m.Addrs() {
		if strings.Contains(a, "/tcp/") && strings.Contains(a, "/p2p/") {
			return a
		}
	}
	return ""
}

// helperMain runs one member. Its stdout protocol, one line each:
//
//	ready <peer> <incarnation>
//	A <admitted so far> <unix ns>   (mode traffic, after each admission)
//	S <peer> <incarnation> <admitted> (mode report: the key's slots)
func helperMain(mode string) error {
	ctx, cancel := context.WithTimeout(context.Background(), helperTimeout)
	defer cancel()
	off, _ := time.ParseDuration(os.Getenv("HELPER_OFFSET"))
	st, err := persistence.Open(os.Getenv("HELPER_DIR"))
	if err != nil {
		return err
	}
	if mode == "hold" {
		fmt.Println("ready")
		_, _ = io.Copy(io.Discard, os.Stdin) // until the parent closes stdin or kills us
		return st.Close()
	}
	priv, err := identity(ctx, st)
	if err != nil {
		return err
	}
	var boot []string
	if b := os.Getenv("HELPER_BOOTSTRAP"); b != "" {
		boot = []string{b}
	}
	n, m, err := startMeshNode(ctx, st, priv, boot, off)
	if err != nil {
		return err
	}
	out := bufio.NewWriter(os.Stdout)
	fmt.Fprintf(out, "ready %s %d\n", m.PeerID(), n.Incarnation())
	out.Flush()
	switch mode {
	case "traffic":
		admitted := 0
		tick := time.NewTicker(helperEvery)
		for range tick.C {
			d, err := n.Allow(ctx, helperRule, helperKey)
			if err != nil {
				return err
			}
			if d.Allowed {
				admitted++
				fmt.Fprintf(out, "A %d %d\n", admitted, time.Now().UnixNano())
				out.Flush()
			}
		}
	case "report":
		rep, err := n.Usage(helperRule, helperKey)
		if err != nil {
			return err
		}
		for _, s := range rep.Slots {
			fmt.Fprintf(out, "S %s %d %d\n", s.Peer, s.Incarnation, s.Admitted)
		}
		out.Flush()
	}
	return n.Close()
}

// helper is a running helper process.
type helper struct {
	cmd   *exec.Cmd
	lines chan string
	stdin io.WriteCloser
}

func startHelper(t *testing.T, mode, dir, bootstrap string, off time.Duration) *helper {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"="+mode, "HELPER_DIR="+dir, "HELPER_BOOTSTRAP="+bootstrap, "HELPER_OFFSET="+off.String())
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	h := &helper{cmd: cmd, lines: make(chan string, 1<<16), stdin: stdin}
	go func() {
		defer close(h.lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			h.lines <- sc.Text()
		}
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return h
}

// next returns the helper's next line, failing after a deadline.
func (h *helper) next(t *testing.T) (string, bool) {
	t.Helper()
	select {
	case l, ok := <-h.lines:
		return l, ok
	case <-time.After(helperTimeout):
		t.Fatal("helper said nothing for", helperTimeout)
		return "", false
	}
}

func fields(t *testing.T, line, tag string, n int) []string {
	t.Helper()
	f := strings.Fields(line)
	if len(f) != n || f[0] != tag {
		t.Fatalf("helper line %q, want %q and %d fields", line, tag, n)
	}
	return f
}

func atoi(t *testing.T, s string) uint64 {
	t.Helper()
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestSIGKILLLosesAtMostAFlushLocallyAndASyncClusterWide runs a member in
// its own process, serving traffic and meshed over libp2p on 127.0.0.1
// with a peer in this process; kills it with SIGKILL; restarts it on the
// same data directory; and compares what it had admitted with what its
// disk kept and what the peer kept.
func TestSIGKILLLosesAtMostAFlushLocallyAndASyncClusterWide(t *testing.T) {
	if testing.Short() {
		t.Skip("subprocess test")
	}
	ctx := context.Background()
	off := midHourOffset()
	peerKey, _, _ := crypto.GenerateEd25519Key(rand.Reader)
	p, pm, err := startMeshNode(ctx, persistence.NewMemory(), peerKey, nil, off)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	dir := t.TempDir()

	a := startHelper(t, "traffic", dir, tcpAddr(pm), off)
	ready := fields(t, mustNext(t, a), "ready", 3)
	peer, inc := ready[1], atoi(t, ready[2])
	// Serve until well past a few flushes, then SIGKILL mid-traffic.
	var admitted uint64
	var times []int64
	for admitted < uint64(3*helperFlush/helperEvery) {
		f := fields(t, mustNext(t, a), "A", 3)
		admitted = atoi(t, f[1])
		times = append(times, int64(atoi(t, f[2])))
	}
	if err := a.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for l, ok := a.next(t); ok; l, ok = a.next(t) { // what it said before dying
		f := fields(t, l, "A", 3)
		admitted = atoi(t, f[1])
		times = append(times, int64(atoi(t, f[2])))
	}
	_ = a.cmd.Wait()
	last := times[len(times)-1]
	// within counts the admissions in the last d before the kill (plus one
	// admitted and not yet printed).
	within := func(d time.Duration) uint64 {
		n := uint64(1)
		for _, at := range times {
			if at > last-d.Nanoseconds() {
				n++
			}
		}
		return n
	}

	// Cluster-wide: the peer, up throughout, lost at most the admissions
	// not yet published. Its view only grows; wait until it stops.
	var seen uint64
	prev, still := uint64(0), 0
	deadline := time.Now().Add(5 * time.Second)
	for still < 10 && time.Now().Before(deadline) {
		rep, err := p.Usage(helperRule, helperKey)
		if err != nil {
			t.Fatal(err)
		}
		seen = 0
		for _, s := range rep.Slots {
			if s.Peer == peer && s.Incarnation == inc {
				seen = s.Admitted
			}
		}
		if seen == prev {
			still++
		} else {
			still = 0
		}
		prev = seen
		<-time.After(helperSync) // polling interval, not a wait for a condition
	}
	lostMesh := admitted - min(seen, admitted)
	syncBound := within(2 * helperSync) // a sync interval, and the tick's own jitter
	t.Logf("admitted %d; the peer holds %d (lost %d, bound %d)", admitted, seen, lostMesh, syncBound)
	if seen > admitted+1 || lostMesh > syncBound {
		t.Errorf("the peer holds %d of %d admitted: lost %d, more than one sync interval's %d", seen, admitted, lostMesh, syncBound)
	}

	// Locally: restart on the same directory.
	b := startHelper(t, "report", dir, tcpAddr(pm), off)
	ready = fields(t, mustNext(t, b), "ready", 3)
	if ready[1] != peer {
		t.Errorf("peer ID after restart %s, want %s", ready[1], peer)
	}
	if inc2 := atoi(t, ready[2]); inc2 <= inc {
		t.Errorf("incarnation after restart %d, not above %d", inc2, inc)
	}
	var persisted uint64
	for l, ok := b.next(t); ok; l, ok = b.next(t) {
		f := fields(t, l, "S", 4)
		if f[1] == peer && atoi(t, f[2]) == inc {
			persisted = atoi(t, f[3])
		}
	}
	if err := b.cmd.Wait(); err != nil {
		t.Fatalf("restarted helper: %v", err)
	}
	lostDisk := admitted - min(persisted, admitted)
	flushBound := within(helperFlush + 50*time.Millisecond) // a flush interval, and the flush's own time
	t.Logf("admitted %d; the disk kept %d (lost %d, bound %d)", admitted, persisted, lostDisk, flushBound)
	if persisted > admitted+1 || lostDisk > flushBound {
		t.Errorf("the disk kept %d of %d admitted: lost %d, more than one flush interval's %d", persisted, admitted, lostDisk, flushBound)
	}
}

func mustNext(t *testing.T, h *helper) string {
	t.Helper()
	l, ok := h.next(t)
	if !ok {
		t.Fatal("helper exited early")
	}
	return l
}

// TestSecondMemberOnOneDirectoryFailsFast: a running member in another
// process holds the directory; opening it here fails at once, naming it.
func TestSecondMemberOnOneDirectoryFailsFast(t *testing.T) {
	if testing.Short() {
		t.Skip("subprocess test")
	}
	dir := t.TempDir()
	h := startHelper(t, "hold", dir, "", 0)
	if l := mustNext(t, h); l != "ready" {
		t.Fatalf("helper said %q", l)
	}
	start := time.Now()
	st, err := persistence.Open(dir)
	if err == nil {
		st.Close()
		t.Fatal("a second Open of a held directory succeeded")
	}
	if !strings.Contains(err.Error(), dir) || !strings.Contains(err.Error(), "locked") {
		t.Errorf("err = %v; want it to name %s and the lock", err, dir)
	}
	if el := time.Since(start); el > 2*time.Second {
		t.Errorf("Open took %v to fail", el)
	}
	h.stdin.Close()
	if err := h.cmd.Wait(); err != nil {
		t.Errorf("holder: %v", err)
	}
}

// TestRestartKeepsPeerIDAndLongWindows: a graceful restart on pebble keeps
// the identity, raises the incarnation, and keeps a 1-hour window's usage
// exactly.
func TestRestartKeepsPeerIDAndLongWindows(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	off := midHourOffset()
	hub := memnet.NewHub()
	start := func() (*node.Node, string) {
		st, err := persistence.Open(dir)
		if err != nil {
			t.Fatal(err)
		}
		priv, err := identity(ctx, st)
		if err != nil {
			t.Fatal(err)
		}
		id, err := peerID(priv)
		if err != nil {
			t.Fatal(err)
		}
		cfg := node.DefaultConfig()
		cfg.Peer, cfg.Transport, cfg.Store, cfg.Rules = id, hub.Transport(id), st, hourRules()
		cfg.Rules[0].Limit = 1000
		cfg.Logger = slog.New(slog.DiscardHandler)
		cfg.Clock = func() time.Time { return time.Now().Add(off) }
		n, err := node.Start(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		return n, id
	}
	n, id := start()
	for range 321 {
		if d, err := n.Allow(ctx, helperRule, helperKey); err != nil || !d.Allowed {
			t.Fatal(d, err)
		}
	}
	inc := n.Incarnation()
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	n2, id2 := start()
	defer n2.Close()
	if id2 != id {
		t.Errorf("peer ID %s after restart, want %s", id2, id)
	}
	if n2.Incarnation() <= inc {
		t.Errorf("incarnation %d after restart, not above %d", n2.Incarnation(), inc)
	}
	rep, err := n2.Usage(helperRule, helperKey)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Total != 321 || len(rep.Slots) != 1 || rep.Slots[0].Incarnation != inc || rep.Slots[0].Admitted != 321 {
		t.Errorf("usage after a graceful restart: %+v, want exactly 321 in the old slot", rep)
	}
	if d, _ := n2.Allow(ctx, helperRule, helperKey, node.Cost(1000-321)); !d.Allowed {
		t.Errorf("the remaining 679 were refused: %+v", d)
	}
	if d, _ := n2.Allow(ctx, helperRule, helperKey); d.Allowed {
		t.Errorf("admitted past the limit after a restart: %+v", d)
	}
}

func peerID(priv crypto.PrivKey) (string, error) {
	mc := mesh.DefaultConfig()
	mc.PrivKey, mc.Namespace, mc.Logger = priv, helperNS, slog.New(slog.DiscardHandler)
	m, err := mesh.New(mc) // no Listen: listens nowhere
	if err != nil {
		return "", err
	}
	defer m.Close()
	return m.PeerID(), nil
}
