package mesh_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p"
	pubsub "github.com/libp2p/go-libp2p-pubsub"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/host"

	"github.com/ratemesh/ratemesh/internal/testutil"
	"github.com/ratemesh/ratemesh/limiter"
	"github.com/ratemesh/ratemesh/mesh"
	"github.com/ratemesh/ratemesh/node"
)

// The tests in this package start real node runtimes (node.Start) on real
// libp2p hosts listening on 127.0.0.1, one mesh.Mesh each: the whole
// stack a ratemesh serve process runs, minus the HTTP API.

// member is one started node and its transport.
type member struct {
	n *node.Node
	m *mesh.Mesh
}

// spec describes a member to start.
type spec struct {
	rules     []limiter.Rule
	bootstrap []*mesh.Mesh // dialled at start; Join is set when any
	psk       []byte
	clock     func() time.Time
	// join overrides Join (set when bootstrap is not empty); joinTimeout
	// overrides JoinTimeout (default 5 s, so a failed join shows).
	joinTimeout time.Duration
	core        func(*node.CoreConfig)
	store       node.Store // nil: none
	// key is the member's identity (a fresh one when nil); allow its
	// allowlist (mesh.Config.AllowPeers; off when empty).
	key   crypto.PrivKey
	allow []string
}

// logger discards, or writes debug logs to stderr with MESH_TEST_LOG set.
func logger() *slog.Logger {
	if os.Getenv("MESH_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

// newTransport builds a loopback TCP mesh for s, closed when the test
// ends (node.Close closes it first; Close is idempotent).
func newTransport(t testing.TB, s spec) *mesh.Mesh {
	t.Helper()
	key := s.key
	if key == nil {
		var err error
		if key, _, err = crypto.GenerateEd25519Key(nil); err != nil {
			t.Fatal(err)
		}
	}
	cfg := mesh.DefaultConfig()
	cfg.AllowPeers = s.allow
	cfg.Namespace = "nodetest"
	cfg.PrivKey = key
	cfg.PSK = s.psk
	cfg.Listen = []string{"/ip4/127.0.0.1/tcp/0"}
	cfg.Logger = logger()
	cfg.Plausible = mesh.PlausibleFor(s.rules, 0)
	cfg.DialTimeout = time.Second
	cfg.SyncTimeout = 5 * time.Second
	cfg.RedialMin = 20 * time.Millisecond
	cfg.RedialMax = 300 * time.Millisecond
	for _, b := range s.bootstrap {
		cfg.Bootstrap = append(cfg.Bootstrap, tcpAddrOf(t, b))
	}
	m, err := mesh.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	return m
}

// startMember starts a node on a fresh mesh; it leaves when the test ends.
func startMember(t testing.TB, s spec) member {
	t.Helper()
	m := newTransport(t, s)
	cfg := node.DefaultConfig()
	cfg.Peer, cfg.Rules, cfg.Transport = m.PeerID(), s.rules, m
	cfg.Logger = logger().With("test", t.Name())
	cfg.Join = len(s.bootstrap) > 0
	cfg.JoinTimeout = 5 * time.Second
	if s.joinTimeout > 0 {
		cfg.JoinTimeout = s.joinTimeout
	}
	if s.clock != nil {
		cfg.Clock = s.clock
	}
	if s.core != nil {
		s.core(&cfg.CoreConfig)
	}
	if s.store != nil {
		cfg.Store = s.store
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	n, err := node.Start(ctx, cfg)
	if err != nil {
		t.Fatalf("node.Start: %v", err)
	}
	t.Cleanup(func() { _ = n.Close() })
	return member{n: n, m: m}
}

// startMembers starts count members, each dialling every one started
// before it (a full mesh, as bootstrap lists of every peer give), and
// waits until every member holds every other alive.
func startMembers(t testing.TB, count int, s spec) []member {
	t.Helper()
	ms := make([]member, 0, count)
	for range count {
		si := s
		si.bootstrap = nil
		for _, o := range ms {
			si.bootstrap = append(si.bootstrap, o.m)
		}
		ms = append(ms, startMember(t, si))
	}
	waitAlive(t, ms, 10*time.Second)
	return ms
}

// waitAlive waits until every member sees every other one alive.
func waitAlive(t testing.TB, ms []member, d time.Duration) {
	t.Helper()
	testutil.Eventually(t, d, func() (bool, string) {
		for i, a := range ms {
			for j, b := range ms {
				if s := stateOf(a.n, b.m.PeerID()); i != j && s != "alive" {
					return false, fmt.Sprintf("member %d sees member %d %s", i, j, s)
				}
			}
		}
		return true, ""
	})
}

func tcpAddrOf(t testing.TB, m *mesh.Mesh) string {
	t.Helper()
	for _, a := range m.Addrs() {
		if strings.Contains(a, "/tcp/") {
			return a
		}
	}
	t.Fatalf("no TCP address in %v", m.Addrs())
	return ""
}

// stateOf returns peer's state in n's view, or "absent".
func stateOf(n *node.Node, peer string) string {
	for _, p := range n.Peers() {
		if p.Peer == peer {
			return p.State.String()
		}
	}
	return "absent"
}

// usageDiff compares what the members hold of (rule, key): the window,
// the total and every slot's values. It returns "" when all agree.
func usageDiff(ms []member, rule, key string) string {
	var first node.UsageReport
	for i, x := range ms {
		rep, err := x.n.Usage(rule, key)
		if err != nil {
			return fmt.Sprintf("member %d: Usage: %v", i, err)
		}
		if i == 0 {
			first = rep
			continue
		}
		if rep.Window != first.Window || rep.Total != first.Total || !slices.Equal(rep.Slots, first.Slots) {
			return fmt.Sprintf("%s/%s: member 0 holds window %d total %d %v; member %d holds window %d total %d %v",
				rule, key, first.Window, first.Total, first.Slots, i, rep.Window, rep.Total, rep.Slots)
		}
	}
	return ""
}

// tally counts admitted credits per window index of a clock, from the
// test's own record of decisions.
type tally struct {
	mu       sync.Mutex
	winMs    int64
	admitted map[int64]uint64
	offered  map[int64]uint64
	denied   [limiter.NumReasons]uint64 // denials by reason
}

func newTally(w time.Duration) *tally {
	return &tally{winMs: w.Milliseconds(), admitted: map[int64]uint64{}, offered: map[int64]uint64{}}
}

// addDecision records d, answered by a member before the clock read done
// (on that member's clock), in the member's own window — the mesh-time
// window the decision counted in, which the member tells by
// d.ResetAfter: done + ResetAfter lands on the window's end, give or take
// the member's mesh offset and how long the answer took to come back
// after the decision (both far under half a window). Stamping decisions
// with a time alone misplaces those that wait across a boundary (under
// the race detector, for tens of ms) and reads as overshoot of a window
// the mesh never let happen; and the time the call began misplaces held
// requests, decided up to share_wait (1 s on a starved host) later.
func (t *tally) addDecision(done time.Time, d node.Decision) {
	end := (done.UnixMilli() + d.ResetAfter.Milliseconds() + t.winMs/2) / t.winMs
	t.addWindow(end-1, d.Allowed)
	if !d.Allowed && int(d.Reason) < limiter.NumReasons {
		t.mu.Lock()
		t.denied[d.Reason]++
		t.mu.Unlock()
	}
}

// denials returns the denials so far by reason, those with none left out.
func (t *tally) denials() map[string]uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	m := map[string]uint64{}
	for r, n := range t.denied {
		if n > 0 {
			m[limiter.Reason(r).String()] = n
		}
	}
	return m
}

func (t *tally) addWindow(w int64, admitted bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.offered[w]++
	if admitted {
		t.admitted[w]++
	}
}

func (t *tally) total() (n uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, a := range t.admitted {
		n += a
	}
	return n
}

// windows returns the admitted credits of the windows wholly inside
// [from, to), in order.
func (t *tally) windows(from, to time.Time) (idx []int64, admitted []uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	first := (from.UnixMilli() + t.winMs - 1) / t.winMs
	last := to.UnixMilli()/t.winMs - 1
	for w := first; w <= last; w++ {
		idx = append(idx, w)
		admitted = append(admitted, t.admitted[w])
	}
	return idx, admitted
}

// offer sends rate requests per second of (rule, key) to n until stop
// closes, spread uniformly (as many as are due every millisecond), and
// records each decision in tl in the window it counted in (addDecision).
// Errors go to errs. The requests come from offerClients concurrent
// clients, as a service's would: a request the node holds for its share
// (share_wait) delays only its own client. Requests due while every
// client is busy and the queue is full are not sent.
func offer(n *node.Node, clock func() time.Time, rule, key string, rate float64, tl *tally, stop <-chan struct{}, errs chan<- error) {
	ctx := context.Background()
	due := make(chan struct{}, offerQueue)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer close(due)
	for range offerClients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range due {
				d, err := n.Allow(ctx, rule, key)
				if err != nil {
					select {
					case errs <- err:
					default:
					}
					return
				}
				tl.addDecision(clock(), d)
			}
		}()
	}
	start := time.Now()
	issued := 0
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
		}
		for target := int(time.Since(start).Seconds() * rate); issued < target; issued++ {
			select {
			case due <- struct{}{}:
			default: // every client busy and the queue full: dropped
			}
		}
	}
}

// offerClients and offerQueue shape offer's concurrent clients.
const (
	offerClients = 16
	offerQueue   = 256
)

func fixedRule(name string, limit uint64, w time.Duration) limiter.Rule {
	return limiter.Rule{Name: name, Algorithm: limiter.FixedWindow, Limit: limit, Window: w}
}

// rawGossip is a peer running plain gossipsub (flood publishing, no
// validator) subscribed to topic on a loopback host of its own: it
// publishes whatever a test encodes, signed by its own key. The context
// lives until the test ends.
func rawGossip(t testing.TB, topic string) (context.Context, host.Host, *pubsub.Topic) {
	t.Helper()
	h, err := libp2p.New(libp2p.ListenAddrStrings("/ip4/127.0.0.1/tcp/0"), libp2p.DisableRelay(), libp2p.DisableMetrics())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() { cancel(); h.Close() })
	ps, err := pubsub.NewGossipSub(ctx, h, pubsub.WithFloodPublish(true))
	if err != nil {
		t.Fatal(err)
	}
	tp, err := ps.Join(topic)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tp.Subscribe(); err != nil {
		t.Fatal(err)
	}
	return ctx, h, tp
}
