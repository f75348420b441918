package limiter

import (
	"fmt"
	"testing"
	"time"

	"github.com/ratemesh/ratemesh/crdt"
)

func pacedRule(t testing.TB, alg Algorithm, limit uint64) Rule {
	t.Helper()
	return normalized(t, Rule{Name: "api", Algorithm: alg, Limit: limit, Window: time.Second, Pace: true})
}

func TestPaceCap(t *testing.T) {
	tests := []struct {
		L, e, want float64
	}{
		{1000, 0, 100},      // the burst allowance: 10 %
		{1000, 0.01, 110},   // 10 ms into a 1 s window
		{1000, 0.5, 600},    // half way
		{1000, 0.9, 1000},   // the whole quota from 900 ms on
		{1000, 0.999, 1000}, // never above L
		{10, 0, 1},
		{10, 0.05, 1}, // floor(0.5 + 1)
		{10, 0.1, 2},
		{5, 0, 1},     // 10 % of 5 is below one credit: B = 1
		{5, 0.199, 1}, // floor(0.995 + 1)
		{5, 0.2, 2},
		{15, 0.1, 3},    // floor(1.5 + 1.5)
		{0.5, 0.3, 0.5}, // a partition-scaled L below 1: L itself
		{1000, 0.001, 101},
		{1000, 0.003, 103}, // 0.003·1000 is 2.9999999999999996 in floats
	}
	for _, tt := range tests {
		if got := PaceCap(tt.L, tt.e); got != tt.want {
			t.Errorf("PaceCap(%v, %v) = %v, want %v", tt.L, tt.e, got, tt.want)
		}
	}
}

// TestDecidePaced decides at fixed instants of a window: 0 ms, 10 ms,
// 500 ms and 999 ms.
func TestDecidePaced(t *testing.T) {
	fixed := pacedRule(t, FixedWindow, 1000)
	sliding := pacedRule(t, SlidingWindow, 1000)
	small := pacedRule(t, FixedWindow, 5)
	unpaced := windowRule(t, FixedWindow, 1000)
	demand := normalized(t, Rule{Name: "api", Algorithm: FixedWindow, Limit: 1000, Window: time.Second, Pace: true, Share: Demand})
	// All the key's demand is this member's: its demand share is
	// 0.05/4 + 0.95 = 0.9625 of the headroom.
	busy := func(cur uint64) Usage {
		return Usage{Cur: cur, CurUnacked: cur, CurAttempted: 200, OwnCurAttempted: 200}
	}
	ms := time.Millisecond
	n1 := func(at int64) Env { return Env{NowMs: t0 + at, Members: 1} }
	n4 := func(at int64) Env { return Env{NowMs: t0 + at, Members: 4, AckDelay: 40 * ms} }

	tests := []struct {
		name   string
		rule   Rule
		limit  uint64
		cost   uint64
		u      Usage
		env    Env
		draw   float64
		allow  bool
		reason Reason
		retry  time.Duration
	}{
		// N = 1, fixed window, L = 1000, B = 100: cap = min(1000, 1000·e + 100).
		{"0ms empty", fixed, 1000, 1, Usage{}, n1(0), 0.99, true, ReasonAdmitted, 0},
		{"0ms 99 held", fixed, 1000, 1, Usage{Cur: 99}, n1(0), 0.99, true, ReasonAdmitted, 0},
		{"0ms burst spent", fixed, 1000, 1, Usage{Cur: 100}, n1(0), 0, false, ReasonLimit, ms},
		{"0ms unpaced admits half the quota at once", unpaced, 1000, 1, Usage{Cur: 500}, n1(0), 0.99, true, ReasonAdmitted, 0},
		{"0ms cost 5 over the burst", fixed, 1000, 5, Usage{Cur: 96}, n1(0), 0, false, ReasonLimit, ms},
		{"0ms cost 150 waits 50ms", fixed, 1000, 150, Usage{}, n1(0), 0, false, ReasonLimit, 50 * ms},
		{"10ms 109 held", fixed, 1000, 1, Usage{Cur: 109}, n1(10), 0.99, true, ReasonAdmitted, 0},
		{"10ms 110 held", fixed, 1000, 1, Usage{Cur: 110}, n1(10), 0, false, ReasonLimit, ms},
		{"10ms 200 held", fixed, 1000, 1, Usage{Cur: 200}, n1(10), 0, false, ReasonLimit, 91 * ms},
		{"500ms 599 held", fixed, 1000, 1, Usage{Cur: 599}, n1(500), 0.99, true, ReasonAdmitted, 0},
		{"500ms 600 held", fixed, 1000, 1, Usage{Cur: 600}, n1(500), 0, false, ReasonLimit, ms},
		{"500ms 700 held", fixed, 1000, 1, Usage{Cur: 700}, n1(500), 0, false, ReasonLimit, 101 * ms},
		{"999ms 999 held", fixed, 1000, 1, Usage{Cur: 999}, n1(999), 0.99, true, ReasonAdmitted, 0},
		{"999ms full: the next window's burst", fixed, 1000, 1, Usage{Cur: 1000}, n1(999), 0, false, ReasonLimit, ms},
		{"peek on a spent burst", fixed, 1000, 0, Usage{Cur: 100}, n1(0), 0, false, ReasonLimit, ms},
		{"peek within the pace", fixed, 1000, 0, Usage{Cur: 99}, n1(0), 0.99, true, ReasonAdmitted, 0},
		{"scale 0.5 halves the pace", fixed, 1000, 1, Usage{Cur: 50}, Env{NowMs: t0, Members: 1, Scale: 0.5}, 0, false, ReasonLimit, 2 * ms},

		// A limit below 1/PaceBurst: B = 1, one credit per 200 ms.
		{"L5 0ms first", small, 5, 1, Usage{}, n1(0), 0.99, true, ReasonAdmitted, 0},
		{"L5 0ms second", small, 5, 1, Usage{Cur: 1}, n1(0), 0, false, ReasonLimit, 200 * ms},
		{"L5 500ms third", small, 5, 1, Usage{Cur: 2}, n1(500), 0.99, true, ReasonAdmitted, 0},
		{"L5 500ms fourth", small, 5, 1, Usage{Cur: 3}, n1(500), 0, false, ReasonLimit, 100 * ms},
		{"L5 999ms last", small, 5, 1, Usage{Cur: 4}, n1(999), 0.99, true, ReasonAdmitted, 0},

		// N = 4: each member takes a quarter of the paced headroom,
		// P + 4·(u + c) ≤ cap.
		{"N4 0ms u=24", fixed, 1000, 1, Usage{Cur: 24, CurUnacked: 24}, n4(0), 0.99, true, ReasonAdmitted, 0},
		{"N4 0ms u=25 share", fixed, 1000, 1, Usage{Cur: 25, CurUnacked: 25}, n4(0), 0, false, ReasonShare, 40 * ms},
		{"N4 500ms P=400 u=49", fixed, 1000, 1, Usage{Cur: 449, CurUnacked: 49}, n4(500), 0.99, true, ReasonAdmitted, 0},
		{"N4 500ms P=400 u=50 share", fixed, 1000, 1, Usage{Cur: 450, CurUnacked: 50}, n4(500), 0, false, ReasonShare, 40 * ms},
		{"N4 500ms P=600 over the pace", fixed, 1000, 1, Usage{Cur: 600}, n4(500), 0, false, ReasonLimit, ms},
		// share (100 − 98)/4 = 0.5 < c = 1, room under the cap: the lottery.
		{"N4 0ms lottery wins", fixed, 1000, 1, Usage{Cur: 98}, n4(0), 0.4, true, ReasonAdmitted, 0},
		{"N4 0ms lottery loses", fixed, 1000, 1, Usage{Cur: 98}, n4(0), 0.6, false, ReasonShare, 40 * ms},
		// Share demand: the busy member takes its demand share of the
		// paced headroom, 0.9625·100 at 0 ms, where equal share gives 25.
		{"N4 demand 0ms u=90", demand, 1000, 1, busy(90), n4(0), 0.99, true, ReasonAdmitted, 0},
		{"N4 demand 0ms u=97 past its share of the pace", demand, 1000, 1, busy(97), n4(0), 0, false, ReasonShare, 40 * ms},
		{"N4 equal 0ms u=90", fixed, 1000, 1, busy(90), n4(0), 0, false, ReasonShare, 40 * ms},
		// 999 ms: the cap is L, the projection alone decides.
		{"N4 999ms P=996", fixed, 1000, 1, Usage{Cur: 996}, n4(999), 0.99, true, ReasonAdmitted, 0},

		// Sliding: after a quiet window the pace binds; after a full one
		// the sliding condition does.
		{"sliding 0ms quiet prev burst spent", sliding, 1000, 1, Usage{Cur: 100}, n1(0), 0, false, ReasonLimit, ms},
		{"sliding 100ms prev 200 cur 300", sliding, 1000, 1, Usage{Prev: 200, Cur: 300}, n1(100), 0, false, ReasonLimit, 101 * ms},
		{"sliding 500ms full prev cur 499", sliding, 1000, 1, Usage{Prev: 1000, Cur: 499}, n1(500), 0.99, true, ReasonAdmitted, 0},
		{"sliding 500ms full prev cur 500", sliding, 1000, 1, Usage{Prev: 1000, Cur: 500}, n1(500), 0, false, ReasonLimit, ms},
		{"sliding 500ms prev 300 cur 599", sliding, 1000, 1, Usage{Prev: 300, Cur: 599}, n1(500), 0.99, true, ReasonAdmitted, 0},
		{"sliding 500ms prev 300 cur 600", sliding, 1000, 1, Usage{Prev: 300, Cur: 600}, n1(500), 0, false, ReasonLimit, ms},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := tt.rule
			d := r.Decide(tt.limit, tt.cost, tt.u, tt.env, tt.draw)
			if d.Allowed != tt.allow || d.Reason != tt.reason || d.RetryAfter != tt.retry {
				t.Errorf("Decide(limit %d, cost %d, %+v, +%dms, N %d) = allowed %t %v retry %v, want %t %v retry %v",
					tt.limit, tt.cost, tt.u, tt.env.NowMs-t0, tt.env.Members, d.Allowed, d.Reason, d.RetryAfter, tt.allow, tt.reason, tt.retry)
			}
			if d.Limit != tt.limit {
				t.Errorf("Limit = %d, want %d", d.Limit, tt.limit)
			}
		})
	}
}

func TestEarliestPaced(t *testing.T) {
	fixed := pacedRule(t, FixedWindow, 1000)
	sliding := pacedRule(t, SlidingWindow, 1000)
	ms := time.Millisecond
	n1 := func(at int64) Env { return Env{NowMs: t0 + at, Members: 1} }

	tests := []struct {
		name string
		rule Rule
		cost uint64
		u    Usage
		env  Env
		want time.Duration
	}{
		{"fixed 0ms room", fixed, 1, Usage{Cur: 99}, n1(0), 0},
		{"fixed 0ms burst spent", fixed, 1, Usage{Cur: 100}, n1(0), ms},
		{"fixed 0ms 500 held", fixed, 1, Usage{Cur: 500}, n1(0), 401 * ms},
		{"fixed 10ms 110 held", fixed, 1, Usage{Cur: 110}, n1(10), ms},
		{"fixed 500ms 800 held", fixed, 1, Usage{Cur: 800}, n1(500), 201 * ms},
		{"fixed 999ms 999 held", fixed, 1, Usage{Cur: 999}, n1(999), 0},
		{"fixed 999ms full", fixed, 1, Usage{Cur: 1000}, n1(999), ms},
		{"fixed full at 250ms: next window's start", fixed, 1, Usage{Cur: 1000}, n1(250), 750 * ms},
		{"fixed full cost 150: 50ms into the next", fixed, 150, Usage{Cur: 1000}, n1(250), 800 * ms},
		{"fixed cost = limit: 900ms into the window", fixed, 1000, Usage{}, n1(0), 900 * ms},
		{"fixed cost > limit", fixed, 1001, Usage{}, n1(0), Never},
		{"fixed scale 0.5", fixed, 1, Usage{Cur: 50}, Env{NowMs: t0, Members: 1, Scale: 0.5}, 2 * ms},
		{"fixed scale shrinks L below c", fixed, 1, Usage{}, Env{NowMs: t0 + 250, Members: 1, Scale: 0.0005}, 750 * ms},
		{"fixed ignores unacked and members", fixed, 1, Usage{Cur: 99, CurUnacked: 99}, Env{NowMs: t0, Members: 50}, 0},

		{"sliding 100ms prev 200 cur 300", sliding, 1, Usage{Prev: 200, Cur: 300}, n1(100), 101 * ms},
		// the sliding condition is later than the pace: w·(prev − (L − need))/prev
		{"sliding 0ms prev 1000 cur 0", sliding, 1, Usage{Prev: 1000}, n1(0), ms},
		{"sliding 200ms prev 1000 cur 400", sliding, 1, Usage{Prev: 1000, Cur: 400}, n1(200), 201 * ms},
		// next window: prev = 1000, need 1: 1 ms into it
		{"sliding full at 250ms", sliding, 1, Usage{Cur: 1000}, n1(250), 751 * ms},
		// next window needs the whole L with prev 1000: only the one
		// after, at 900 ms by the pace
		{"sliding cost = limit after a full window", sliding, 1000, Usage{Cur: 1000}, n1(250), 2650 * ms},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := tt.rule
			got := r.Earliest(1000, tt.cost, tt.u, tt.env)
			if got != tt.want {
				t.Errorf("Earliest(cost %d, %+v, +%dms) = %v, want %v", tt.cost, tt.u, tt.env.NowMs-t0, got, tt.want)
			}
		})
	}
}

// TestEarliestPacedIsWhenDecideAdmits checks Earliest against Decide for
// paced rules with N = 1: at the answer the request is admitted, and one
// millisecond before it still denied.
func TestEarliestPacedIsWhenDecideAdmits(t *testing.T) {
	for _, alg := range []Algorithm{FixedWindow, SlidingWindow} {
		for _, limit := range []uint64{5, 10, 1000} {
			r := pacedRule(t, alg, limit)
			var us []Usage
			for _, f := range []float64{0, 0.1, 0.3, 0.5, 0.9, 1} {
				for _, p := range []float64{0, 0.5, 1} {
					us = append(us, Usage{Cur: uint64(f * float64(limit)), Prev: uint64(p * float64(limit))})
				}
			}
			for _, u := range us {
				for _, at := range []int64{0, 10, 500, 999} {
					for _, cost := range []uint64{1, 3, limit / 2, limit} {
						now := t0 + at
						env := Env{NowMs: now, Members: 1}
						wait := r.Earliest(limit, cost, u, env)
						uAt := func(ms int64) Usage {
							switch floorDiv(ms, 1000) - floorDiv(now, 1000) {
							case 0:
								return u
							case 1:
								return Usage{Prev: u.Cur}
							}
							return Usage{}
						}
						then := now + wait.Milliseconds()
						if d := r.Decide(limit, cost, uAt(then), Env{NowMs: then, Members: 1}, 0.999999); !d.Allowed {
							t.Errorf("%s L%d %+v at +%d cost %d: denied (%v) after Earliest %v", alg, limit, u, at, cost, d.Reason, wait)
						}
						if wait == 0 {
							continue
						}
						if d := r.Decide(limit, cost, uAt(then-1), Env{NowMs: then - 1, Members: 1}, 0.999999); d.Allowed {
							t.Errorf("%s L%d %+v at +%d cost %d: admitted 1ms before Earliest %v", alg, limit, u, at, cost, wait)
						}
					}
				}
			}
		}
	}
}

// TestPacedPer50ms offers a window 3L every 50 ms through a real Limiter
// (N = 1): paced, it admits the burst allowance plus L/20 at the start and
// L/20 in every later 50 ms until the quota is spent; unpaced, the whole
// quota in the first instant.
func TestPacedPer50ms(t *testing.T) {
	const limit = 1000
	instants := make([]int64, 20)
	for i := range instants {
		instants[i] = t0 + int64(i)*50
	}
	for _, pace := range []bool{true, false} {
		t.Run(fmt.Sprintf("pace=%t", pace), func(t *testing.T) {
			l, err := New(Rule{Name: "api", Algorithm: FixedWindow, Limit: limit, Window: time.Second, Pace: pace}, crdt.NewContainer(), self)
			if err != nil {
				t.Fatal(err)
			}
			got := countAdmitted(t, l, "k", 3*limit, Env{Members: 1}, instants...)
			for i, n := range got {
				want := 0
				switch {
				case !pace && i == 0:
					want = limit
				case pace && i == 0:
					want = 100
				case pace && i < 19:
					want = 50 // cap(i·50 ms) − cap((i−1)·50 ms)
				case pace:
					want = 0 // cap reached L at 900 ms
				}
				if n != want {
					t.Errorf("admitted %v per 50 ms; at %d ms %d, want %d", got, i*50, n, want)
					break
				}
			}
		})
	}
}

// TestPacedMembersShareThePace runs four members that never hear each
// other (the worst case for the projection: every admission stays
// unacknowledged) against one paced key: each paces a quarter of the paced
// cap, so together they never pass the cap at any instant.
func TestPacedMembersShareThePace(t *testing.T) {
	const limit, members = 1000, 4
	ls := make([]*Limiter, members)
	for i := range ls {
		l, err := New(Rule{Name: "api", Algorithm: FixedWindow, Limit: limit, Window: time.Second, Pace: true}, crdt.NewContainer(), crdt.SlotID(i+1))
		if err != nil {
			t.Fatal(err)
		}
		ls[i] = l
	}
	total := 0
	// Every 100 ms, where the cap divides by 4 (in between, a fractional
	// share goes to the lottery).
	for at := int64(0); at < 1000; at += 100 {
		env := Env{NowMs: t0 + at, Members: members}
		for i, l := range ls {
			n := countAdmitted(t, l, "k", limit, env, t0+at)[0]
			total += n
			// Alone, member i may hold a quarter of the cap:
			// 4·(u + 1) ≤ cap.
			own := l.Usage("k", t0+at).Cur
			if want := uint64(PaceCap(limit, float64(at)/1000) / members); own != want {
				t.Errorf("member %d holds %d at %d ms, want %d", i, own, at, want)
			}
		}
		if c := PaceCap(limit, float64(at)/1000); float64(total) > c {
			t.Fatalf("members admitted %d by %d ms, over the paced cap %v", total, at, c)
		}
	}
	if total != limit {
		t.Errorf("members admitted %d over the window, want %d", total, limit)
	}
}
