package node_test

import (
	"testing"
	"time"

	"github.com/ratemesh/ratemesh/limiter"
	"github.com/ratemesh/ratemesh/node"
)

// TestCorePartition splits 5 cores into 2 + 3 at 2.3 s with 10× a limit of 1000
// per 1 s window offered on both sides, and checks the admitted credits per
// true window of each side and of both:
//
//   - before anyone turns suspect (partition shorter than suspect_after)
//     the missing acknowledgements throttle both sides: ≤ 1.02 × the limit;
//   - strict: still ≤ 1.02 × after the silent members turn suspect; the
//     minority side (2 of 5) fences itself and admits nothing, the majority
//     keeps its 3/5 part of the limit until it reclaims the silent members'
//     capacity (reclaim_after, 5 s), and from the first window that begins
//     after the reclaim it admits ≥ 0.95 × the limit alone;
//   - available: ≤ 2.04 × in all, and each side admits ≥ 0.9 × the limit
//     once the other side is dead.
func TestCorePartition(t *testing.T) {
	const (
		limit  = 1000
		seed   = 3
		cutAt  = 2300 * time.Millisecond
		offerd = 10 * limit
	)
	sideA, sideB := []int{0, 1}, []int{2, 3, 4}
	type check struct {
		from, to    int64   // windows [from, to) after the start
		maxTotal    float64 // × limit
		maxA, maxB  float64 // × limit, 0: no bound
		minA, minB  float64 // × limit
		fencedA     bool    // side A admits nothing
		description string
	}
	cases := []struct {
		name   string
		policy node.Policy
		cutFor time.Duration // then recover
		after  time.Duration // run after the recovery
		checks []check
	}{
		{
			name: "before_suspect", policy: node.Strict, cutFor: 1700 * time.Millisecond, after: 2 * time.Second, // ends at 6 s
			checks: []check{
				{from: 1, to: 6, maxTotal: 1.02, description: "throttled by missing acknowledgements"},
				{from: 3, to: 4, maxTotal: 1.02, minA: 0.05, minB: 0.05, description: "both sides admit while cut"},
			},
		},
		{
			name: "strict", policy: node.Strict, cutFor: 8900 * time.Millisecond, after: 2800 * time.Millisecond,
			checks: []check{
				{from: 1, to: 14, maxTotal: 1.02, description: "never over the limit"},
				// Suspect from 4.3 s on: side A fences itself, side B
				// scales the limit by 3/5 until it reclaims at 7.3 s.
				{from: 5, to: 8, maxTotal: 1.02, maxB: 0.6 * 1.02, minB: 0.5, fencedA: true, description: "suspect: minority fenced, majority scaled"},
				// Windows from 8 on begin after the reclaim (a sliding
				// window's reads the one before, held to 3/5, too); by
				// window 10 the majority admits the whole limit.
				{from: 8, to: 11, maxTotal: 1.02, fencedA: true, description: "reclaimed, minority still fenced"},
				{from: 10, to: 11, maxTotal: 1.02, minB: 0.95, fencedA: true, description: "reclaimed: majority has the whole limit"},
				// Healed at 11.2 s: side A learns of its eviction and rejoins.
				{from: 12, to: 14, maxTotal: 1.02, minA: 0.05, minB: 0.05, description: "healed"},
			},
		},
		{
			name: "available", policy: node.Available, cutFor: 8 * time.Second, after: 2700 * time.Millisecond,
			checks: []check{
				{from: 1, to: 4, maxTotal: 1.02, description: "before suspect"},
				{from: 1, to: 13, maxTotal: 2.04, maxA: 1.02, maxB: 1.02, description: "each side within the limit"},
				// Suspect from 4.3 s on: the suspects' acknowledgements are no
				// longer awaited and the limit is not scaled, so each side
				// may already take (nearly) the whole limit; dead from 7.3 s
				// on, it may take all of it.
				{from: 8, to: 10, maxTotal: 2.04, minA: 0.9, minB: 0.9, description: "dead: each side the whole limit"},
				// Healed at 10.3 s.
				{from: 11, to: 13, maxTotal: 1.02, description: "healed"},
			},
		},
	}
	for _, tc := range cases {
		for _, alg := range []limiter.Algorithm{limiter.FixedWindow, limiter.SlidingWindow} {
			t.Run(tc.name+"/"+string(alg), func(t *testing.T) {
				reportSeed(t, seed)
				net := cluster(t, 5, seed, apiRule(alg, limit), func(c *node.CoreConfig) { c.Policy = tc.policy })
				net.Delay = 5 * time.Millisecond
				a := &offer{rate: offerd * 2 / 5, members: sideA, key: "k", perWin: map[int64]uint64{}}
				b := &offer{rate: offerd * 3 / 5, members: sideB, key: "k", perWin: map[int64]uint64{}}
				da, db := a.drive(t, net, net.Step), b.drive(t, net, net.Step)
				drive := func(now time.Time) { da(now); db(now) }
				run(t, net, cutAt, drive)
				net.Partition(sideA, sideB)
				run(t, net, tc.cutFor, drive)
				if tc.policy == node.Strict && tc.cutFor > 2*time.Second {
					if n, scale := net.Core(0).Members(); n != 5 || scale != 0.4 || !net.Core(0).Fenced() {
						t.Errorf("strict, side A after suspect_after: Members() = %d, %v, fenced %v; want 5, 0.4, fenced", n, scale, net.Core(0).Fenced())
					}
					if n, _ := net.Core(2).Members(); n != 3 || net.Core(2).Fenced() {
						t.Errorf("strict, side B after reclaim_after: Members() = %d, fenced %v; want 3, not fenced", n, net.Core(2).Fenced())
					}
				}
				if tc.policy == node.Available && tc.cutFor > 5*time.Second {
					if n, scale := net.Core(0).Members(); n != 2 || scale != 1 {
						t.Errorf("available, side A after dead_after: Members() = %d, %v; want 2, 1", n, scale)
					}
				}
				net.Recover()
				run(t, net, tc.after, drive)

				first := t0.UnixMilli() / 1000
				last := first + int64((cutAt+tc.cutFor+tc.after)/time.Second)
				for w := first + 1; w < last; w++ {
					t.Logf("window %2d: side A %4d + side B %4d = %4d", w-first, a.perWin[w], b.perWin[w], a.perWin[w]+b.perWin[w])
				}
				for _, ck := range tc.checks {
					for w := first + ck.from; w < first+ck.to; w++ {
						ga, gb := float64(a.perWin[w]), float64(b.perWin[w])
						switch {
						case ga+gb > ck.maxTotal*limit:
							t.Errorf("%s: window %d admitted %v, over %v × the limit", ck.description, w-first, ga+gb, ck.maxTotal)
						case ck.maxA > 0 && ga > ck.maxA*limit, ck.maxB > 0 && gb > ck.maxB*limit:
							t.Errorf("%s: window %d sides admitted %v + %v, over %v and %v × the limit", ck.description, w-first, ga, gb, ck.maxA, ck.maxB)
						case ck.fencedA && ga > 0:
							t.Errorf("%s: window %d fenced side A admitted %v", ck.description, w-first, ga)
						case ga < ck.minA*limit || gb < ck.minB*limit:
							t.Errorf("%s: window %d sides admitted %v + %v, under %v and %v × the limit", ck.description, w-first, ga, gb, ck.minA, ck.minB)
						}
					}
				}
			})
		}
	}
}
