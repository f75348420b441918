package node_test

import (
	"testing"
	"time"

	"golang.org/x/time/rate"

	"github.com/ratemesh/ratemesh/limiter"
)

// TestBucketFiveCores floods one token bucket (max 1000, 1000 credits/s)
// with 10× its rate spread over 5 cores, and feeds the same arrivals, at
// the same instants, to one golang.org/x/time/rate bucket: the mesh admits
// within 2% of it, on a plain, a jittery and a lossy network, and no
// second holds more than the bucket's envelope (max + refill·1s) + 2%.
// Wait (Earliest) and Usage work on the bucket as on windows.
func TestBucketFiveCores(t *testing.T) {
	cases := []struct {
		name          string
		delay, jitter time.Duration
		loss          float64
	}{
		{"delay_5ms", 5 * time.Millisecond, 0, 0},
		{"jitter_5ms", 5 * time.Millisecond, 5 * time.Millisecond, 0},
		{"loss_1pct", 5 * time.Millisecond, 0, 0.01},
	}
	rules := []limiter.Rule{{Name: "api", Algorithm: limiter.TokenBucket, Limit: 1000, Refill: 100, Interval: 100 * time.Millisecond}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			const seed = 11
			reportSeed(t, seed)
			net := cluster(t, 5, seed, rules, nil)
			net.Delay, net.Jitter, net.Loss = tc.delay, tc.jitter, tc.loss
			ref := rate.NewLimiter(1000, 1000)
			var got, want uint64
			perSec := map[int64]uint64{}
			acc := 0.0
			drive := func(now time.Time) {
				acc += 10000 * net.Step.Seconds()
				for acc >= 1 {
					acc--
					i := net.Rand().IntN(5)
					d, err := net.Core(i).Allow(net.Local(i), "api", "k", limiter.Request{})
					if err != nil {
						t.Fatal(err)
					}
					if d.Allowed {
						got++
						perSec[now.UnixMilli()/1000]++
					}
					if ref.AllowN(now, 1) {
						want++
					}
				}
			}
			if err := net.Run(10*time.Second, drive); err != nil {
				t.Fatal(err)
			}
			ratio := float64(got) / float64(want)
			t.Logf("admitted %d, one bucket %d: ratio %.4f", got, want, ratio)
			if ratio > 1.02 || ratio < 0.98 {
				t.Errorf("admitted %d, one bucket %d: ratio %.4f outside 2%%", got, want, ratio)
			}
			for s, n := range perSec {
				if n > 2040 {
					t.Errorf("second %d admitted %d, over max + refill·1s = 2000 by more than 2%%", s-t0.Unix(), n)
				}
			}
			// The bucket is drained: Wait's earliest admission is within
			// one credit's refill (1 ms), and Usage reports the epoch.
			now := net.Local(0)
			early, err := net.Core(0).Earliest(now, "api", "k", limiter.Request{})
			if err != nil || early < 0 || early > 40*time.Millisecond {
				t.Errorf("Earliest: %v, %v; want a short wait on a drained bucket", early, err)
			}
			rep, err := net.Core(0).Usage(now, "api", "k")
			if err != nil || rep.WindowMs != 2000 || rep.Window != now.UnixMilli()/2000 {
				t.Errorf("Usage: %+v, %v; want the current 2 s epoch", rep, err)
			}
		})
	}
}
