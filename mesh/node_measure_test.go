package mesh

import (
	"context"
	"encoding/binary"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratemesh/ratemesh/internal/testutil"
	"github.com/ratemesh/ratemesh/limiter"
	"github.com/ratemesh/ratemesh/node"
)

// timedTransport is a Mesh whose deliveries are seen by a probe before
// the node runtime gets them.
type timedTransport struct {
	*Mesh
	probe func(node.Inbound)
}

func (tt timedTransport) Start(ctx context.Context, h node.Handler) error {
	return tt.Mesh.Start(ctx, probeHandler{h, tt.probe})
}

type probeHandler struct {
	node.Handler
	probe func(node.Inbound)
}

func (p probeHandler) HandleBatch(in node.Inbound) {
	p.probe(in)
	p.Handler.HandleBatch(in)
}

// changeClock remembers when each key was changed, and how long each
// change took to reach each other member.
type changeClock struct {
	mu      sync.Mutex
	prefix  string // only keys with it are measured
	changed map[string]time.Time
	seen    map[[2]string]bool
	lat     latencies
}

func (c *changeClock) change(key string, at time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.changed[key] = at
}

// probe is called by receiver's transport for every delivered batch.
func (c *changeClock) probe(receiver string) func(node.Inbound) {
	return func(in node.Inbound) {
		now := time.Now()
		c.mu.Lock()
		defer c.mu.Unlock()
		for _, e := range in.Batch.Windows {
			at, ok := c.changed[e.Key]
			k := [2]string{receiver, e.Key}
			if !ok || c.seen[k] || !strings.HasPrefix(e.Key, c.prefix) {
				continue
			}
			c.seen[k] = true
			c.lat.add(now.Sub(at), e.Key)
		}
	}
}

// TestNodePropagationFigures measures, among five node runtimes on
// loopback libp2p hosts (a full mesh, the default settings), how long a
// change — one Allow on a fresh key — takes to reach every other member's
// runtime: the wait for the publish (the leading edge, or the gap after
// the last batch) plus the gossip. In the same run, with the same pacing,
// the same hosts exchange raw gossipsub messages on a second topic of the
// same routers: the floor, and the propagation p99 is reported as a
// multiple of raw gossipsub's. Two more phases without raw traffic
// measure the gossip bytes on the wire: per delivered payload byte
// (gossip wire out ÷ (published bytes × (n − 1)): every batch is
// delivered to n − 1 members) and per delivered decision.
//
// It asserts that every change arrived everywhere, that the wire bytes
// per delivered payload byte stay within 4 when members change 20 keys
// per 17 ms each (bytes do not depend on the machine's speed), and only a
// loose latency bound (p99 within 2 × raw gossipsub's + 20 ms), which
// holds on a loaded machine under -race. Representative numbers come
// without -race:
//
//	go test -run TestNodePropagationFigures -count=5 -v ./mesh/
func TestNodePropagationFigures(t *testing.T) {
	if testing.Short() {
		t.Skip("measurement")
	}
	const (
		n = 5
		// Not a multiple of sync_interval, so changes fall at every phase
		// of the members' sync ticks.
		every  = 17 * time.Millisecond
		rounds = 60
	)
	rules := []limiter.Rule{{Name: "api", Algorithm: limiter.FixedWindow, Limit: 1_000_000, Window: time.Hour}}
	cc := &changeClock{changed: map[string]time.Time{}, seen: map[[2]string]bool{}}
	ms := make([]*Mesh, n)
	ns := make([]*node.Node, n)
	for i := range n {
		cfg := testConfig(t)
		cfg.Listen = []string{"/ip4/127.0.0.1/tcp/0"}
		cfg.Plausible = PlausibleFor(rules, 0)
		for _, o := range ms[:i] {
			cfg.Bootstrap = append(cfg.Bootstrap, tcpAddr(t, o))
		}
		ms[i] = newMesh(t, cfg)
		ncfg := node.DefaultConfig()
		ncfg.Peer, ncfg.Rules, ncfg.Join = ms[i].PeerID(), rules, i > 0
		ncfg.Transport = timedTransport{ms[i], cc.probe(ms[i].PeerID())}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		nd, err := node.Start(ctx, ncfg)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { nd.Close() })
		ns[i] = nd
	}
	ctx := context.Background()

	// Raw gossipsub on the same routers: another topic, no validator.
	var measuring atomic.Bool // from phase 1 on, warm-up stragglers are not measured
	rawLat, rawTopics := joinRaw(t, ms, func(key string) bool {
		return measuring.Load() && strings.HasPrefix(key, "warm-")
	})
	rawMsg := func(key string) []byte {
		var hdr [8]byte
		binary.BigEndian.PutUint64(hdr[:], uint64(time.Now().UnixNano()))
		return append(hdr[:], key...)
	}
	allow := func(i int, key string) {
		cc.change(key, time.Now())
		if d, err := ns[i].Allow(ctx, "api", key); err != nil || !d.Allowed {
			t.Errorf("Allow(%s) = %+v, %v", key, d, err)
		}
	}
	// Warm up until both topic meshes have formed: some round's changes
	// and raw messages reached everyone.
	round := 0
	rtEventually := func(what string, cond func() bool) {
		t.Helper()
		testutil.Eventually(t, 10*time.Second, func() (bool, string) { return cond(), what })
	}
	rtEventually("topic meshes formed", func() bool {
		round++
		for i := range ns {
			key := fmt.Sprintf("warm-%d-%d", i, round)
			allow(i, key)
			if err := rawTopics[i].Publish(ctx, rawMsg(key)); err != nil {
				t.Fatal(err)
			}
		}
	rounds:
		for r := max(1, round-5); r < round; r++ {
			for i := range ns {
				key := fmt.Sprintf("warm-%d-%d", i, r)
				if cc.lat.count(key) < n-1 || rawLat.count(key) < n-1 {
					continue rounds
				}
			}
			return true
		}
		return false
	})

	// Phase 1: a change and a raw message from every member every 20 ms,
	// in alternating order.
	cc.mu.Lock()
	cc.prefix = "m-"
	cc.mu.Unlock()
	measuring.Store(true)
	cc.lat.reset()
	rawLat.reset()
	pace := func(withRaw bool, prefix string, perTick, rounds int) {
		var wg sync.WaitGroup
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				tick := time.NewTicker(every)
				defer tick.Stop()
				for k := range rounds {
					<-tick.C
					key := fmt.Sprintf("%s-%d-%d", prefix, i, k)
					if !withRaw {
						allow(i, key)
						for j := 1; j < perTick; j++ {
							allow(i, fmt.Sprintf("%s-%d", key, j))
						}
						continue
					}
					pubRaw := func() {
						if err := rawTopics[i].Publish(ctx, rawMsg(key)); err != nil {
							t.Error(err)
						}
					}
					if (i+k)%2 == 0 {
						allow(i, key)
						pubRaw()
					} else {
						pubRaw()
						allow(i, key)
					}
				}
			}()
		}
		wg.Wait()
	}
	pace(true, "m", 1, rounds)
	want := n * rounds * (n - 1)
	rtEventually("every change and raw message delivered everywhere", func() bool {
		a, _, _, _ := cc.lat.summary()
		b, _, _, _ := rawLat.summary()
		return a >= want && b >= want
	})
	var p99s [2]time.Duration
	for i, x := range []struct {
		name string
		l    *latencies
	}{{"ratemesh delta (Allow → peer runtime)", &cc.lat}, {"raw gossipsub (Publish → peer)", rawLat}} {
		got, p50, p99, worst := x.l.summary()
		p99s[i] = p99
		t.Logf("%-38s %4d deliveries: p50 %7v  p99 %7v  max %7v", x.name, got, p50.Round(10*time.Microsecond), p99.Round(10*time.Microsecond), worst.Round(10*time.Microsecond))
	}
	t.Logf("propagation p99 ÷ raw gossipsub p99: %.2f", float64(p99s[0])/float64(max(p99s[1], 1)))
	if limit := 2*p99s[1] + 20*time.Millisecond; p99s[0] > limit {
		t.Errorf("propagation p99 %v is beyond 2 × raw gossipsub's p99 %v + 20 ms", p99s[0], p99s[1])
	}

	// Phases 2 and 3: changes only, one and 20 per member per tick of
	// the pacer; every byte gossipsub moves (each copy to each peer,
	// signatures, control, heartbeats and acknowledgements) divided by the
	// payload bytes delivered and by the decisions delivered.
	for _, ph := range []struct{ perTick, rounds int }{{1, rounds}, {20, 30}} {
		perTick, rounds := ph.perTick, ph.rounds
		prefix := fmt.Sprintf("b%d", perTick)
		cc.mu.Lock()
		cc.prefix = prefix + "-"
		cc.mu.Unlock()
		var before, encBefore, pubBefore uint64
		for _, m := range ms {
			st := m.Stats()
			before += st.GossipWireOut
			encBefore += st.PublishedBytes
			pubBefore += st.Published
		}
		start := time.Now()
		pace(false, prefix, perTick, rounds)
		paced := time.Since(start)
		rtEventually("every change delivered everywhere", func() bool {
			for i := range n {
				for k := range rounds {
					if cc.lat.count(fmt.Sprintf("%s-%d-%d", prefix, i, k)) < n-1 {
						return false
					}
				}
			}
			return true
		})
		elapsed := time.Since(start)
		var after, encAfter, pubAfter uint64
		for _, m := range ms {
			st := m.Stats()
			after += st.GossipWireOut
			encAfter += st.PublishedBytes
			pubAfter += st.Published
		}
		changes := uint64(n * rounds * perTick) // one decision each
		wire, payload := float64(after-before), float64(encAfter-encBefore)
		perByte := wire / (payload * (n - 1))
		t.Logf("%d decisions (%d per member per %v) in %v, delivered after %v: %d batches published, %.0f encoded bytes per decision; "+
			"gossipsub wire bytes sent by all members %.0f: %.2f per delivered payload byte, %.0f per delivered decision (%d receivers each)",
			changes, perTick, every, paced.Round(time.Millisecond), elapsed.Round(time.Millisecond), pubAfter-pubBefore, payload/float64(changes),
			wire, perByte, wire/float64(changes*(n-1)), n-1)
		if perTick > 1 && perByte > 4 {
			t.Errorf("%.2f gossip wire bytes per delivered payload byte, want at most 4", perByte)
		}
	}
}
