package node_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/ratemesh/ratemesh/limiter"
	"github.com/ratemesh/ratemesh/node"
)

// TestCoreClockSkew runs 5 cores, one with its clock off by a fixed
// amount: after a few heartbeats its Offset() is about minus that (less at
// most the one-way latency), the others' about zero, and every core's
// MeshMs agrees within 20 ms, so they open windows together. Beyond
// max_skew (500 ms) the skewed core reports the skew in its Ready.
func TestCoreClockSkew(t *testing.T) {
	const delay = 5 * time.Millisecond
	for _, skew := range []time.Duration{400 * time.Millisecond, -300 * time.Millisecond, 700 * time.Millisecond} {
		t.Run(fmt.Sprint(skew), func(t *testing.T) {
			const seed = 71
			reportSeed(t, seed)
			net := cluster(t, 5, seed, apiRule(limiter.FixedWindow, 1000), nil)
			net.Delay = delay
			net.Skew(4, skew)
			exceeded := make([]bool, net.Len()) // as the members' Readies report it
			net.OnReady = func(i int, _ time.Time, rd node.Ready) {
				if rd.Skew != nil {
					exceeded[i] = rd.Skew.Exceeded
				}
			}
			run(t, net, 3200*time.Millisecond, nil)

			// A receiver measures the sender's raw clock minus its own at
			// receipt: the skew difference minus the latency, and keeps
			// the least-delayed sample, so its estimate lies between the
			// true offset less the latency and the true offset.
			within := func(got, want, tol time.Duration) bool { return got >= want-tol && got <= want+delay+tol }
			for i := range 5 {
				c := net.Core(i)
				want := -delay
				if i == 4 {
					want = -skew - delay
				}
				if got := c.Offset(); !within(got, want, 2*time.Millisecond) {
					t.Errorf("member %d: Offset() = %v, want about %v", i, got, want)
				}
				if got, want := exceeded[i], i == 4 && skew > 500*time.Millisecond; got != want {
					t.Errorf("member %d: Ready.Skew says exceeded %v, want %v", i, got, want)
				}
			}
			ref := net.Core(0).MeshMs(net.Local(0))
			for i := range 5 {
				if d := net.Core(i).MeshMs(net.Local(i)) - ref; d < -20 || d > 20 {
					t.Errorf("member %d: MeshMs off member 0's by %d ms", i, d)
				}
			}
			// The skewed core counts in the same window as the others.
			if got := allowN(t, net, 4, "api", "k", 3); got != 3 {
				t.Fatalf("admitted %d of 3", got)
			}
			run(t, net, 100*time.Millisecond, nil)
			for i := range 5 {
				rep, err := net.Core(i).Usage(net.Local(i), "api", "k")
				if err != nil {
					t.Fatal(err)
				}
				if rep.Total != 3 {
					t.Errorf("member %d: window %d total %d, want 3", i, rep.Window, rep.Total)
				}
				if s := net.Core(i).Stats(); s.DroppedFuture+s.DroppedExpired != 0 {
					t.Errorf("member %d dropped %d future and %d expired entries", i, s.DroppedFuture, s.DroppedExpired)
				}
			}
		})
	}
}
