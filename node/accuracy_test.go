package node_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/ratemesh/ratemesh/limiter"
	"github.com/ratemesh/ratemesh/node"
	"github.com/ratemesh/ratemesh/node/nodetest"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func newCore(t testing.TB, peer string, now time.Time, rules []limiter.Rule, mut func(*node.CoreConfig)) *node.Core {
	t.Helper()
	cfg := node.DefaultCoreConfig()
	cfg.Peer = peer
	cfg.Incarnation = node.NextIncarnation(0, now)
	cfg.Rules = rules
	if mut != nil {
		mut(&cfg)
	}
	c, err := node.NewCore(cfg, now)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func apiRule(alg limiter.Algorithm, limit uint64) []limiter.Rule {
	return []limiter.Rule{{Name: "api", Algorithm: alg, Limit: limit, Window: time.Second}}
}

// cluster builds n cores on a fresh network.
func cluster(t testing.TB, n int, seed uint64, rules []limiter.Rule, mut func(*node.CoreConfig)) *nodetest.Network {
	t.Helper()
	net := nodetest.New(seed, t0)
	for i := range n {
		net.Add(newCore(t, fmt.Sprintf("n%02d", i), t0, rules, mut))
	}
	return net
}

// offer drives rate requests per second of one key, spread uniformly over
// the given members, and counts admissions per true window.
type offer struct {
	rate    float64
	members []int
	key     string
	acc     float64
	perWin  map[int64]uint64
}

func (o *offer) drive(t testing.TB, net *nodetest.Network, step time.Duration) func(time.Time) {
	return func(now time.Time) {
		o.acc += o.rate * step.Seconds()
		for o.acc >= 1 {
			o.acc--
			i := o.members[net.Rand().IntN(len(o.members))]
			d, err := net.Core(i).Allow(net.Local(i), "api", o.key, limiter.Request{})
			if err != nil {
				t.Fatal(err)
			}
			if d.Allowed {
				o.perWin[now.UnixMilli()/1000]++
			}
		}
	}
}

// TestAccuracyFiveCores offers 10× a limit of 1000 per 1 s window
// uniformly over 5 cores and checks every full window admits within
// [0.95, 1.02] × the limit, on a plain 5 ms network, with jitter and with
// loss.
func TestAccuracyFiveCores(t *testing.T) {
	cases := []struct {
		name          string
		delay, jitter time.Duration
		loss          float64
	}{
		{"delay_5ms", 5 * time.Millisecond, 0, 0},
		{"jitter_5ms", 5 * time.Millisecond, 5 * time.Millisecond, 0},
		{"loss_1pct", 5 * time.Millisecond, 0, 0.01},
	}
	for _, tc := range cases {
		for _, alg := range []limiter.Algorithm{limiter.FixedWindow, limiter.SlidingWindow} {
			t.Run(tc.name+"/"+string(alg), func(t *testing.T) {
				const seed = 7
				reportSeed(t, seed)
				net := cluster(t, 5, seed, apiRule(alg, 1000), nil)
				net.Delay, net.Jitter, net.Loss = tc.delay, tc.jitter, tc.loss
				o := &offer{rate: 10000, members: []int{0, 1, 2, 3, 4}, key: "k", perWin: map[int64]uint64{}}
				if err := net.Run(6*time.Second, o.drive(t, net, net.Step)); err != nil {
					t.Fatal(err)
				}
				first := t0.UnixMilli() / 1000
				for w := first + 1; w < first+6; w++ {
					got := o.perWin[w]
					t.Logf("window %d: admitted %d", w-first, got)
					if got > 1020 || got < 950 {
						t.Errorf("window %d admitted %d, want within [950, 1020]", w-first, got)
					}
				}
			})
		}
	}
}
