package p2plimit_test

import (
	"context"
	"fmt"
	"maps"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	pubsub "github.com/libp2p/go-libp2p-pubsub"
	"github.com/libp2p/go-libp2p/core/host"

	"github.com/ratemesh/ratemesh/internal/p2ptest"
	"github.com/ratemesh/ratemesh/internal/testutil"
	"github.com/ratemesh/ratemesh/limiter"
	"github.com/ratemesh/ratemesh/mesh"
	"github.com/ratemesh/ratemesh/node"
	"github.com/ratemesh/ratemesh/node/p2plimit"
)

// svc is a p2p service as the issue describes it: its own host and
// gossipsub router (libp2p's defaults), its own topic, and an echo
// protocol wrapped with p2plimit over a node attached to that host.
type svc struct {
	h     host.Host
	ps    *pubsub.PubSub
	topic *p2ptest.Topic // the service's own topic
	m     *mesh.Mesh
	n     *node.Node
}

const newsTopic = "/svc/news"

// startServices starts count services, each attached to ratemesh with
// rules and bootstrapped from the ones before, and waits until every
// member sees every other alive. The wrappers decide through tl, which
// records every decision; handled counts the handler's runs.
func startServices(t *testing.T, count int, rules []limiter.Rule, tl *windowTally, handled *atomic.Int64) []*svc {
	t.Helper()
	var out []*svc
	for i := range count {
		s := &svc{h: p2ptest.Host(t)}
		ctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(cancel)
		var err error
		if s.ps, err = pubsub.NewGossipSub(ctx, s.h); err != nil {
			t.Fatal(err)
		}
		s.topic = p2ptest.Join(t, s.ps, newsTopic)

		mcfg := mesh.DefaultConfig()
		mcfg.Namespace, mcfg.Listen = "p2plimit-test", nil
		mcfg.Logger = nil
		mcfg.Plausible = mesh.PlausibleFor(rules, 0)
		for _, o := range out {
			mcfg.Bootstrap = append(mcfg.Bootstrap, o.m.Addrs()[0])
		}
		if s.m, err = mesh.Attach(s.h, s.ps, mcfg); err != nil {
			t.Fatal(err)
		}
		ncfg := node.DefaultConfig()
		ncfg.Peer, ncfg.Rules, ncfg.Transport = s.m.PeerID(), rules, s.m
		ncfg.Join = i > 0
		ncfg.JoinTimeout = 5 * time.Second
		sctx, scancel := context.WithTimeout(context.Background(), 20*time.Second)
		s.n, err = node.Start(sctx, ncfg)
		scancel()
		if err != nil {
			t.Fatalf("node.Start: %v", err)
		}
		t.Cleanup(func() { _ = s.n.Close() })

		lcfg := p2plimit.DefaultConfig()
		lcfg.Rule = rules[0].Name
		limit, err := p2plimit.New(recording{s.n, tl}, lcfg)
		if err != nil {
			t.Fatal(err)
		}
		s.h.SetStreamHandler(echoProto, limit(echo(handled)))
		out = append(out, s)
	}
	testutil.Eventually(t, 10*time.Second, func() (bool, string) {
		for i, a := range out {
			for j, b := range out {
				if i != j && stateOf(a.n, b.m.PeerID()) != "alive" {
					return false, fmt.Sprintf("service %d sees service %d %s", i, j, stateOf(a.n, b.m.PeerID()))
				}
			}
		}
		return true, ""
	})
	return out
}

func stateOf(n *node.Node, p string) string {
	for _, pi := range n.Peers() {
		if pi.Peer == p {
			return pi.State.String()
		}
	}
	return "absent"
}

// windowTally counts admitted and offered streams per key and window.
type windowTally struct {
	winMs int64
	mu    sync.Mutex
	adm   map[keyWindow]int
	off   map[keyWindow]int
}

type keyWindow struct {
	key    string
	window int64
}

func newWindowTally(w time.Duration) *windowTally {
	return &windowTally{winMs: w.Milliseconds(), adm: map[keyWindow]int{}, off: map[keyWindow]int{}}
}

// add records d, returned by a member for key when the wall clock read
// at, in the member's own window: the window the decision counted in,
// which the member tells by d.ResetAfter (at + ResetAfter lands on that
// window's end, give or take the member's mesh offset and the moments
// between the decision and its return, both far under half a window).
// Stamping a decision with the wall clock alone misplaces the burst each
// window opens with by whatever the members' mesh clocks differ from it;
// stamping it with the time of the call, by as long as a held share
// denial and a loaded machine delay it, past half a window under -race.
func (w *windowTally) add(key string, at time.Time, d node.Decision) {
	end := (at.UnixMilli() + d.ResetAfter.Milliseconds() + w.winMs/2) / w.winMs
	k := keyWindow{key, end - 1}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.off[k]++
	if d.Allowed {
		w.adm[k]++
	}
}

// recording is the node as p2plimit sees it, recording every decision.
type recording struct {
	*node.Node
	tl *windowTally
}

func (r recording) Allow(ctx context.Context, rule, key string, opts ...node.Option) (node.Decision, error) {
	d, err := r.Node.Allow(ctx, rule, key, opts...)
	if err == nil {
		r.tl.add(key, time.Now(), d)
	}
	return d, err
}

// TestThreeHostsOnePerPeerLimit: three services, each with its own host,
// gossipsub (libp2p's defaults) and topic, attach ratemesh and wrap their
// echo protocol with p2plimit under one rule of 100 streams per second per
// remote peer. Two clients open streams round-robin across the three, one
// at 3× the limit and one at 2×, for 6 s. For each client every whole
// window admits at most 1.02 × the limit, counted mesh-wide, and at least
// 0.95 × it — or, where the client could not offer the limit, 0.95 × what
// it offered; every refused stream is reset with CodeRateLimited; and the
// services' own topic carries most of their messages throughout. Without
// the race detector at least three windows of each client must see 1.5 ×
// the limit offered (else the load generator fell behind, and the test
// says so; a window a loaded machine stalls is still checked against what
// it offered). With it the limit is 60, as a loaded 2-core machine under
// -race opens a few hundred streams a second, and only the upper bound is
// checked (see below). The figures are logged:
//
//	go test -run TestThreeHostsOnePerPeerLimit -v ./node/p2plimit/
func TestThreeHostsOnePerPeerLimit(t *testing.T) {
	if testing.Short() {
		t.Skip("runs for seconds")
	}
	const (
		workers = 32 // per client
		runFor  = 6 * time.Second
	)
	limit := 100
	if raceEnabled {
		limit = 60
	}
	rules := []limiter.Rule{{Name: "echo", Algorithm: limiter.FixedWindow, Limit: uint64(limit), Window: time.Second}}
	tl := newWindowTally(time.Second)
	var handled atomic.Int64
	svcs := startServices(t, 3, rules, tl, &handled)
	type client struct {
		h                       host.Host
		offered                 float64 // streams per second
		next                    atomic.Uint64
		ok, denied, other, sent atomic.Int64
		otherErr                atomic.Value
		due                     chan struct{}
	}
	clients := []*client{{h: p2ptest.Host(t), offered: 3 * float64(limit)}, {h: p2ptest.Host(t), offered: 2 * float64(limit)}}
	var wg sync.WaitGroup
	for _, c := range clients {
		for _, s := range svcs {
			p2ptest.Connect(t, c.h, s.h)
		}
		c.due = make(chan struct{}, 256)
		for range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range c.due {
					s := svcs[c.next.Add(1)%uint64(len(svcs))]
					_, err := call(c.h, s.h, "ping")
					switch {
					case err == nil:
						c.ok.Add(1)
					case p2plimit.IsRateLimited(err):
						c.denied.Add(1)
					default:
						c.other.Add(1)
						c.otherErr.Store(err.Error())
					}
				}
			}()
		}
	}
	from := time.Now()
	start := time.Now()
	rounds := 0
	tick := time.NewTicker(time.Millisecond)
	for time.Since(start) < runFor {
		<-tick.C
		for _, c := range clients {
			for target := int64(time.Since(start).Seconds() * c.offered); c.sent.Load() < target; c.sent.Add(1) {
				select {
				case c.due <- struct{}{}:
				default: // every worker busy and the queue full: not sent
				}
			}
		}
		// The services' own topic, every 100 ms from each.
		if time.Since(start) >= time.Duration(rounds)*100*time.Millisecond {
			for i, s := range svcs {
				if err := s.topic.Publish(context.Background(), []byte(fmt.Sprintf("news-%d-%d", i, rounds))); err != nil {
					t.Errorf("service %d publishes on its own topic: %v", i, err)
				}
			}
			rounds++
		}
	}
	tick.Stop()
	to := time.Now()
	for _, c := range clients {
		close(c.due)
	}
	wg.Wait()

	tl.mu.Lock()
	adm, off := maps.Clone(tl.adm), maps.Clone(tl.off)
	tl.mu.Unlock()
	var admitted int64
	for _, n := range adm {
		admitted += int64(n)
	}
	if got := handled.Load(); got != admitted {
		t.Errorf("the handlers ran %d times for %d admitted streams", got, admitted)
	}
	for ci, c := range clients {
		if n := c.other.Load(); n > 0 {
			t.Errorf("client %d: %d streams failed otherwise than with CodeRateLimited, e.g. %v", ci, n, c.otherErr.Load())
		}
		t.Logf("client %d, offering %.0f streams/s: %d answered, %d reset with CodeRateLimited", ci, c.offered, c.ok.Load(), c.denied.Load())
		var counted, overloaded int
		for w := from.UnixMilli()/1000 + 1; w < to.UnixMilli()/1000; w++ {
			counted++
			k := keyWindow{c.h.ID().String(), w}
			got := adm[k]
			ratio := float64(got) / float64(limit)
			t.Logf("client %d, window %d: offered %d, admitted %d of %d (%.3f×)", ci, w, off[k], got, limit, ratio)
			if ratio > 1.02 {
				t.Errorf("client %d, window %d: admitted %d, over 1.02 × %d", ci, w, got, limit)
			}
			if float64(got) < 0.95*float64(min(limit, off[k])) && !raceEnabled {
				// Under the race detector on a loaded machine gossip
				// takes 100–300 ms, acknowledgements return late and a
				// member's share stays small past share_wait: as in
				// package mesh's TestNodesAccuracy, utilisation is
				// checked only without -race. The upper bound holds
				// either way.
				t.Errorf("client %d, window %d: admitted %d, under 0.95 × min(limit %d, offered %d)", ci, w, got, limit, off[k])
			}
			if float64(off[k]) >= 1.5*float64(limit) {
				overloaded++
			}
		}
		if counted < 4 {
			t.Fatalf("only %d whole windows", counted)
		}
		if overloaded < 3 && !raceEnabled {
			t.Errorf("client %d: only %d windows saw 1.5 × the limit offered; the load generator fell behind", ci, overloaded)
		}
	}
	// The services' own topic kept working: every service heard at least
	// 80% of the others' news of the run, and the news of its last second.
	// (Gossipsub on libp2p's defaults does not promise every message: its
	// queues of 32 drop under bursts, and the first rounds go out while
	// its meshes form.)
	last := rounds - 2
	testutil.Eventually(t, 5*time.Second, func() (bool, string) {
		for i := range svcs {
			for j, o := range svcs {
				if i == j {
					continue
				}
				heard, lastSecond := 0, false
				for r := 1; r <= last; r++ {
					if o.topic.Received(fmt.Sprintf("news-%d-%d", i, r)) {
						heard++
						lastSecond = lastSecond || r > last-10
					}
				}
				if heard < last*8/10 || !lastSecond {
					return false, fmt.Sprintf("service %d heard %d of service %d's %d news on its own topic (in the last second: %t)", j, heard, i, last, lastSecond)
				}
			}
		}
		return true, ""
	})
}
