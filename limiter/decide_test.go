package limiter

import (
	"fmt"
	"testing"
	"time"

	"github.com/ratemesh/ratemesh/crdt"
)

// t0 is a window boundary for every window length the tests use (1 s,
// 100 ms, 10 ms): Unix ms of 2023-11-14T22:13:20Z.
const t0 int64 = 1_700_000_000_000

// normalized returns r after Normalize, failing the test if it is invalid.
func normalized(t testing.TB, r Rule) Rule {
	t.Helper()
	if err := r.Normalize(); err != nil {
		t.Fatalf("Normalize(%+v): %v", r, err)
	}
	return r
}

func windowRule(t testing.TB, alg Algorithm, limit uint64) Rule {
	t.Helper()
	return normalized(t, Rule{Name: "api", Algorithm: alg, Limit: limit, Window: time.Second})
}

func TestDecide(t *testing.T) {
	fixed := windowRule(t, FixedWindow, 10)
	fixed100 := windowRule(t, FixedWindow, 100)
	sliding := windowRule(t, SlidingWindow, 10)
	shadow := fixed
	shadow.Shadow = true
	shadowSliding := sliding
	shadowSliding.Shadow = true
	conc := normalized(t, Rule{Name: "conn", Algorithm: Concurrency, Limit: 3})

	n1 := func(now int64) Env { return Env{NowMs: now, Members: 1} }
	n5 := func(now int64) Env { return Env{NowMs: now, Members: 5, AckDelay: 40500 * time.Microsecond} }
	const ack = 41 * time.Millisecond // ceil(40.5ms)

	tests := []struct {
		name  string
		rule  Rule
		limit uint64
		cost  uint64
		u     Usage
		env   Env
		draw  float64
		want  Decision
	}{
		// N = 1: an exact local limiter.
		{"N1 empty", fixed, 10, 1, Usage{}, n1(t0 + 250), 0.99,
			Decision{Allowed: true, Limit: 10, Remaining: 9, ResetAfter: 750 * time.Millisecond}},
		{"N1 last credit", fixed, 10, 1, Usage{Cur: 9}, n1(t0 + 250), 0.99,
			Decision{Allowed: true, Limit: 10, Remaining: 0, ResetAfter: 750 * time.Millisecond}},
		{"N1 L+1 denied", fixed, 10, 1, Usage{Cur: 10}, n1(t0 + 250), 0,
			Decision{Limit: 10, Remaining: 0, ResetAfter: 750 * time.Millisecond, RetryAfter: 750 * time.Millisecond, Reason: ReasonLimit}},
		// share 1 < c = 2, but 9 + 2 > 10: no lottery, even with draw 0.
		{"N1 cost 2 with 1 left", fixed, 10, 2, Usage{Cur: 9}, n1(t0 + 250), 0,
			Decision{Limit: 10, Remaining: 0, ResetAfter: 750 * time.Millisecond, RetryAfter: 750 * time.Millisecond, Reason: ReasonLimit}},
		{"N1 cost = limit", fixed, 10, 10, Usage{}, n1(t0 + 250), 0.99,
			Decision{Allowed: true, Limit: 10, Remaining: 0, ResetAfter: 750 * time.Millisecond}},
		{"Members 0 means 1", fixed, 10, 1, Usage{Cur: 9}, Env{NowMs: t0 + 250}, 0.99,
			Decision{Allowed: true, Limit: 10, Remaining: 0, ResetAfter: 750 * time.Millisecond}},
		{"remaining floors at 0", fixed, 10, 1, Usage{Cur: 15}, n1(t0 + 250), 0,
			Decision{Limit: 10, Remaining: 0, ResetAfter: 750 * time.Millisecond, RetryAfter: 750 * time.Millisecond, Reason: ReasonLimit}},

		// Projection P + N·(u + c) ≤ L with N = 5, L = 100.
		{"N5 empty", fixed100, 100, 1, Usage{}, n5(t0 + 250), 0.99,
			Decision{Allowed: true, Limit: 100, Remaining: 99, ResetAfter: 750 * time.Millisecond}},
		{"N5 u=19: 0+5·20 = 100", fixed100, 100, 1, Usage{Cur: 19, CurUnacked: 19}, n5(t0 + 250), 0.99,
			Decision{Allowed: true, Limit: 100, Remaining: 80, ResetAfter: 750 * time.Millisecond}},
		{"N5 u=20: 0+5·21 > 100, share", fixed100, 100, 1, Usage{Cur: 20, CurUnacked: 20}, n5(t0 + 250), 0,
			Decision{Limit: 100, Remaining: 0, ResetAfter: 750 * time.Millisecond, RetryAfter: ack, Reason: ReasonShare}},
		{"N5 P=50 u=9: 50+5·10 = 100", fixed100, 100, 1, Usage{Cur: 59, CurUnacked: 9}, n5(t0 + 250), 0.99,
			Decision{Allowed: true, Limit: 100, Remaining: 40, ResetAfter: 750 * time.Millisecond}},
		{"N5 P=50 u=10: share", fixed100, 100, 1, Usage{Cur: 60, CurUnacked: 10}, n5(t0 + 250), 0,
			Decision{Limit: 100, Remaining: 0, ResetAfter: 750 * time.Millisecond, RetryAfter: ack, Reason: ReasonShare}},
		{"N5 P=80 cost 4: 80+5·4 = 100", fixed100, 100, 4, Usage{Cur: 80}, n5(t0 + 250), 0.99,
			Decision{Allowed: true, Limit: 100, Remaining: 16, ResetAfter: 750 * time.Millisecond}},
		{"N5 P=100: limit", fixed100, 100, 1, Usage{Cur: 100}, n5(t0 + 250), 0,
			Decision{Limit: 100, Remaining: 0, ResetAfter: 750 * time.Millisecond, RetryAfter: 750 * time.Millisecond, Reason: ReasonLimit}},
		{"N5 P=99 u=1: limit", fixed100, 100, 1, Usage{Cur: 100, CurUnacked: 1}, n5(t0 + 250), 0,
			Decision{Limit: 100, Remaining: 0, ResetAfter: 750 * time.Millisecond, RetryAfter: 750 * time.Millisecond, Reason: ReasonLimit}},

		// Fractional share (L−P)/N − u = 0.8 with c = 1: allowed iff draw < 0.8.
		{"share 0.8 draw below", fixed100, 100, 1, Usage{Cur: 96}, n5(t0 + 250), 0.8 - 1e-9,
			Decision{Allowed: true, Limit: 100, Remaining: 3, ResetAfter: 750 * time.Millisecond}},
		{"share 0.8 draw above", fixed100, 100, 1, Usage{Cur: 96}, n5(t0 + 250), 0.8 + 1e-9,
			Decision{Limit: 100, Remaining: 0, ResetAfter: 750 * time.Millisecond, RetryAfter: ack, Reason: ReasonShare}},
		{"share 0.8 draw equal", fixed100, 100, 1, Usage{Cur: 96}, n5(t0 + 250), 0.8,
			Decision{Limit: 100, Remaining: 0, ResetAfter: 750 * time.Millisecond, RetryAfter: ack, Reason: ReasonShare}},
		// share 4 with c = 5: allowed iff draw < 0.8.
		{"share 4 cost 5 draw below", fixed100, 100, 5, Usage{Cur: 80}, n5(t0 + 250), 0.79,
			Decision{Allowed: true, Limit: 100, Remaining: 15, ResetAfter: 750 * time.Millisecond}},
		{"share 4 cost 5 draw above", fixed100, 100, 5, Usage{Cur: 80}, n5(t0 + 250), 0.81,
			Decision{Limit: 100, Remaining: 0, ResetAfter: 750 * time.Millisecond, RetryAfter: ack, Reason: ReasonShare}},
		// share 0.8, but 96 + 5 > 100: no room, so no lottery ticket.
		{"share 0.8 cost 5 beyond limit draw 0", fixed100, 100, 5, Usage{Cur: 96}, n5(t0 + 250), 0,
			Decision{Limit: 100, Remaining: 0, ResetAfter: 750 * time.Millisecond, RetryAfter: 750 * time.Millisecond, Reason: ReasonLimit}},
		{"draw 0 with share 0 is denied", fixed100, 100, 1, Usage{Cur: 20, CurUnacked: 20}, n5(t0 + 250), 0,
			Decision{Limit: 100, Remaining: 0, ResetAfter: 750 * time.Millisecond, RetryAfter: ack, Reason: ReasonShare}},

		// Partition scale: L = 100 × 0.5 = 50; Limit and Remaining stay unscaled.
		{"scale 0.5 room", fixed100, 100, 1, Usage{Cur: 49}, Env{NowMs: t0 + 250, Members: 1, Scale: 0.5}, 0.99,
			Decision{Allowed: true, Limit: 100, Remaining: 50, ResetAfter: 750 * time.Millisecond}},
		{"scale 0.5 full", fixed100, 100, 1, Usage{Cur: 50}, Env{NowMs: t0 + 250, Members: 1, Scale: 0.5}, 0,
			Decision{Limit: 100, Remaining: 0, ResetAfter: 750 * time.Millisecond, RetryAfter: 750 * time.Millisecond, Reason: ReasonLimit}},
		{"scale 0.5 N5 share", fixed100, 100, 1, Usage{Cur: 10, CurUnacked: 10}, Env{NowMs: t0 + 250, Members: 5, Scale: 0.5, AckDelay: 40500 * time.Microsecond}, 0.99,
			Decision{Limit: 100, Remaining: 0, ResetAfter: 750 * time.Millisecond, RetryAfter: ack, Reason: ReasonShare}},
		{"scale over 1 means 1", fixed100, 100, 1, Usage{Cur: 99}, Env{NowMs: t0 + 250, Members: 1, Scale: 1.5}, 0.99,
			Decision{Allowed: true, Limit: 100, Remaining: 0, ResetAfter: 750 * time.Millisecond}},
		{"scale over 1 still limits at L", fixed100, 100, 1, Usage{Cur: 100}, Env{NowMs: t0 + 250, Members: 1, Scale: 1.5}, 0,
			Decision{Limit: 100, Remaining: 0, ResetAfter: 750 * time.Millisecond, RetryAfter: 750 * time.Millisecond, Reason: ReasonLimit}},

		// A cost over the limit can never be admitted.
		{"cost > limit", fixed, 10, 11, Usage{}, n1(t0 + 250), 0,
			Decision{Limit: 10, Remaining: 10, ResetAfter: 750 * time.Millisecond, RetryAfter: Never, Reason: ReasonCost}},
		{"cost > limit N5", fixed100, 100, 101, Usage{Cur: 3}, n5(t0 + 250), 0,
			Decision{Limit: 100, Remaining: 97, ResetAfter: 750 * time.Millisecond, RetryAfter: Never, Reason: ReasonCost}},

		// Peek: cost 0 consumes nothing; allowed unless the share is exhausted.
		{"peek empty", fixed, 10, 0, Usage{}, n1(t0 + 250), 0.99,
			Decision{Allowed: true, Limit: 10, Remaining: 10, ResetAfter: 750 * time.Millisecond}},
		{"peek with room", fixed, 10, 0, Usage{Cur: 9}, n1(t0 + 250), 0.99,
			Decision{Allowed: true, Limit: 10, Remaining: 1, ResetAfter: 750 * time.Millisecond}},
		{"peek full", fixed, 10, 0, Usage{Cur: 10}, n1(t0 + 250), 0,
			Decision{Limit: 10, Remaining: 0, ResetAfter: 750 * time.Millisecond, RetryAfter: 750 * time.Millisecond, Reason: ReasonLimit}},
		{"peek over", fixed, 10, 0, Usage{Cur: 12}, n1(t0 + 250), 0,
			Decision{Limit: 10, Remaining: 0, ResetAfter: 750 * time.Millisecond, RetryAfter: 750 * time.Millisecond, Reason: ReasonLimit}},
		{"peek share exhausted", fixed100, 100, 0, Usage{Cur: 20, CurUnacked: 20}, n5(t0 + 250), 0,
			Decision{Limit: 100, Remaining: 0, ResetAfter: 750 * time.Millisecond, RetryAfter: ack, Reason: ReasonShare}},
		{"peek fractional share", fixed100, 100, 0, Usage{Cur: 96}, n5(t0 + 250), 0.99,
			Decision{Allowed: true, Limit: 100, Remaining: 4, ResetAfter: 750 * time.Millisecond}},

		// Shadow: decides and reports, never denies.
		{"shadow with room", shadow, 10, 1, Usage{Cur: 3}, n1(t0 + 250), 0.99,
			Decision{Allowed: true, Limit: 10, Remaining: 6, ResetAfter: 750 * time.Millisecond}},
		{"shadow over limit", shadow, 10, 1, Usage{Cur: 10}, n1(t0 + 250), 0,
			Decision{Allowed: true, Shadow: true, Limit: 10, Remaining: 0, ResetAfter: 750 * time.Millisecond, RetryAfter: 750 * time.Millisecond, Reason: ReasonLimit}},
		{"shadow cost > limit", shadow, 10, 11, Usage{}, n1(t0 + 250), 0,
			Decision{Allowed: true, Shadow: true, Limit: 10, Remaining: 0, ResetAfter: 750 * time.Millisecond, RetryAfter: Never, Reason: ReasonCost}},
		{"shadow share", shadow, 10, 1, Usage{Cur: 2, CurUnacked: 2}, n5(t0 + 250), 0.99,
			Decision{Allowed: true, Shadow: true, Limit: 10, Remaining: 7, ResetAfter: 750 * time.Millisecond, RetryAfter: ack, Reason: ReasonShare}},
		{"shadow sliding", shadowSliding, 10, 1, Usage{Prev: 10}, n1(t0), 0.99,
			Decision{Allowed: true, Shadow: true, Limit: 10, Remaining: 0, ResetAfter: time.Second, RetryAfter: 100 * time.Millisecond, Reason: ReasonLimit}},

		// ResetAfter at the window's edges.
		{"on a boundary", fixed, 10, 1, Usage{}, n1(t0), 0.99,
			Decision{Allowed: true, Limit: 10, Remaining: 9, ResetAfter: time.Second}},
		{"1ms before a boundary", fixed, 10, 1, Usage{}, n1(t0 - 1), 0.99,
			Decision{Allowed: true, Limit: 10, Remaining: 9, ResetAfter: time.Millisecond}},
		{"full 1ms before a boundary", fixed, 10, 1, Usage{Cur: 10}, n1(t0 - 1), 0,
			Decision{Limit: 10, Remaining: 0, ResetAfter: time.Millisecond, RetryAfter: time.Millisecond, Reason: ReasonLimit}},
		{"1ms after a boundary", fixed, 10, 1, Usage{}, n1(t0 + 1), 0.99,
			Decision{Allowed: true, Limit: 10, Remaining: 9, ResetAfter: 999 * time.Millisecond}},
		{"before the epoch", fixed, 10, 1, Usage{}, n1(-1), 0.99,
			Decision{Allowed: true, Limit: 10, Remaining: 9, ResetAfter: time.Millisecond}},
		{"on a boundary before the epoch", fixed, 10, 1, Usage{}, n1(-2000), 0.99,
			Decision{Allowed: true, Limit: 10, Remaining: 9, ResetAfter: time.Second}},

		// Sliding window: usage = prev·(1 − elapsed) + cur.
		{"sliding prev full at elapsed 0", sliding, 10, 1, Usage{Prev: 10}, n1(t0), 0,
			Decision{Limit: 10, Remaining: 0, ResetAfter: time.Second, RetryAfter: 100 * time.Millisecond, Reason: ReasonLimit}},
		{"sliding prev full at elapsed 0.5", sliding, 10, 1, Usage{Prev: 10}, n1(t0 + 500), 0.99,
			Decision{Allowed: true, Limit: 10, Remaining: 4, ResetAfter: 500 * time.Millisecond}},
		{"sliding prev full at 0.5 with cur 4", sliding, 10, 1, Usage{Prev: 10, Cur: 4}, n1(t0 + 500), 0.99,
			Decision{Allowed: true, Limit: 10, Remaining: 0, ResetAfter: 500 * time.Millisecond}},
		{"sliding prev full at 0.5 with cur 5", sliding, 10, 1, Usage{Prev: 10, Cur: 5}, n1(t0 + 500), 0,
			Decision{Limit: 10, Remaining: 0, ResetAfter: 500 * time.Millisecond, RetryAfter: 100 * time.Millisecond, Reason: ReasonLimit}},
		{"sliding fractional usage floors remaining", sliding, 10, 1, Usage{Prev: 9}, n1(t0 + 500), 0.99,
			Decision{Allowed: true, Limit: 10, Remaining: 4, ResetAfter: 500 * time.Millisecond}}, // 10 − 4.5 − 1 = 4.5
		// At elapsed 0.05 the usage is 9.5: share 0.5 with N = 1.
		// but 9.5 + 1 > 10: the lottery never admits beyond L, whatever the draw.
		{"sliding share 0.5 over L draw 0", sliding, 10, 1, Usage{Prev: 10}, n1(t0 + 50), 0,
			Decision{Limit: 10, Remaining: 0, ResetAfter: 950 * time.Millisecond, RetryAfter: 50 * time.Millisecond, Reason: ReasonLimit}},
		{"sliding share 0.5 over L draw 0.51", sliding, 10, 1, Usage{Prev: 10}, n1(t0 + 50), 0.51,
			Decision{Limit: 10, Remaining: 0, ResetAfter: 950 * time.Millisecond, RetryAfter: 50 * time.Millisecond, Reason: ReasonLimit}},
		// N = 5 at elapsed 0.45: used 5.5, share 0.9 and 5.5 + 1 ≤ 10: a lottery.
		{"sliding N5 share 0.9 draw below", sliding, 10, 1, Usage{Prev: 10}, n5(t0 + 450), 0.89,
			Decision{Allowed: true, Limit: 10, Remaining: 3, ResetAfter: 550 * time.Millisecond}},
		{"sliding N5 share 0.9 draw above", sliding, 10, 1, Usage{Prev: 10}, n5(t0 + 450), 0.91,
			Decision{Limit: 10, Remaining: 0, ResetAfter: 550 * time.Millisecond, RetryAfter: ack, Reason: ReasonShare}},
		// Unacknowledged previous-window usage is weighted too: at 0.5,
		// used 5, unacked 2.5, P 2.5: share (10−2.5)/5 − 2.5 = −1.
		{"sliding unacked prev", sliding, 10, 1, Usage{Prev: 10, PrevUnacked: 5}, n5(t0 + 500), 0.99,
			Decision{Limit: 10, Remaining: 0, ResetAfter: 500 * time.Millisecond, RetryAfter: ack, Reason: ReasonShare}},
		{"fixed ignores prev", fixed, 10, 1, Usage{Prev: 10, PrevUnacked: 10}, n1(t0), 0.99,
			Decision{Allowed: true, Limit: 10, Remaining: 9, ResetAfter: time.Second}},

		// Concurrency: Cur is live leases; no window.
		{"concurrency room", conc, 3, 1, Usage{Cur: 2}, n1(t0 + 250), 0.99,
			Decision{Allowed: true, Limit: 3, Remaining: 0}},
		{"concurrency full", conc, 3, 1, Usage{Cur: 3}, n1(t0 + 250), 0,
			Decision{Limit: 3, Remaining: 0, RetryAfter: DefaultLeaseTTL, Reason: ReasonLimit}},
		{"concurrency ignores prev", conc, 3, 1, Usage{Cur: 2, Prev: 3}, n1(t0 + 250), 0.99,
			Decision{Allowed: true, Limit: 3, Remaining: 0}},
		// Leases draw per epoch of 10 acknowledgement delays (400 ms here,
		// t0 starts one) and the lottery is closed for the first delay:
		// share 3/5 is a draw, denied at t0+10 whatever the draw, …
		{"concurrency lottery closed at an epoch's start", conc, 3, 1, Usage{}, n5(t0 + 10), 0,
			Decision{Limit: 3, Remaining: 0, RetryAfter: ack, Reason: ReasonShare}},
		{"concurrency lottery closed until the delay ends", conc, 3, 1, Usage{}, n5(t0 + 439), 0,
			Decision{Limit: 3, Remaining: 0, RetryAfter: ack, Reason: ReasonShare}},
		// … open after it, …
		{"concurrency lottery open after the delay", conc, 3, 1, Usage{}, n5(t0 + 40), 0.59,
			Decision{Allowed: true, Limit: 3, Remaining: 2}},
		{"concurrency lottery open, draw lost", conc, 3, 1, Usage{}, n5(t0 + 399), 0.6,
			Decision{Limit: 3, Remaining: 0, RetryAfter: ack, Reason: ReasonShare}},
		// … and a whole share needs no draw, so it passes in the guard.
		{"concurrency whole share in the guard", conc, 10, 1, Usage{}, n5(t0 + 10), 0.99,
			Decision{Allowed: true, Limit: 10, Remaining: 9}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := tt.rule
			got := r.Decide(tt.limit, tt.cost, tt.u, tt.env, tt.draw)
			if got != tt.want {
				t.Errorf("Decide(limit %d, cost %d, %+v, %+v, draw %v)\n got %+v\nwant %+v",
					tt.limit, tt.cost, tt.u, tt.env, tt.draw, got, tt.want)
			}
			if !got.Allowed && got.RetryAfter == 0 {
				t.Errorf("denied with RetryAfter 0: %+v", got)
			}
		})
	}
}

// TestDecideHermes is the Hermes production bug at the level of the math:
// a limit of 10 over 96 members gives every member a share of 10/96 of a
// request, which must stay admissible (a lottery ticket), never a negative
// or zero share that stalls the key. Across 96 members whose draws spread
// uniformly over [0, 1), about 10 admit.
func TestDecideHermes(t *testing.T) {
	tests := []struct {
		limit   uint64
		members int
		want    int
	}{
		{10, 96, 10},
		{1, 96, 1},
		{1, 2, 1},
		{95, 96, 95},
		{96, 96, 96}, // share exactly 1: everyone admits
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("L%d_N%d", tt.limit, tt.members), func(t *testing.T) {
			r := windowRule(t, SlidingWindow, tt.limit)
			env := Env{NowMs: t0 + 123, Members: tt.members, AckDelay: 40 * time.Millisecond}
			admitted := 0
			for i := 0; i < tt.members; i++ {
				d := r.Decide(tt.limit, 1, Usage{}, env, float64(i)/float64(tt.members))
				if d.Allowed {
					admitted++
				} else if d.Reason != ReasonShare || d.RetryAfter != 40*time.Millisecond {
					t.Errorf("draw %d/%d: denied with %v, RetryAfter %v; want share, 40ms", i, tt.members, d.Reason, d.RetryAfter)
				}
			}
			if admitted < tt.want-4 || admitted > tt.want+4 {
				t.Errorf("admitted %d of %d members, want %d ± 4", admitted, tt.members, tt.want)
			}
			if admitted != tt.want {
				t.Errorf("admitted %d with evenly spread draws, want exactly %d", admitted, tt.want)
			}
		})
	}
}

func TestEarliest(t *testing.T) {
	fixed := windowRule(t, FixedWindow, 10)
	sliding := windowRule(t, SlidingWindow, 10)
	conc := normalized(t, Rule{Name: "conn", Algorithm: Concurrency, Limit: 3, LeaseTTL: 30 * time.Second})
	n1 := func(now int64) Env { return Env{NowMs: now, Members: 1} }
	ms := time.Millisecond

	tests := []struct {
		name  string
		rule  Rule
		limit uint64
		cost  uint64
		u     Usage
		env   Env
		want  time.Duration
	}{
		{"fixed room", fixed, 10, 1, Usage{Cur: 9}, n1(t0 + 250), 0},
		{"fixed full", fixed, 10, 1, Usage{Cur: 10}, n1(t0 + 250), 750 * ms},
		{"fixed cost 2 one left", fixed, 10, 2, Usage{Cur: 9}, n1(t0 + 250), 750 * ms},
		{"fixed full 1ms before end", fixed, 10, 1, Usage{Cur: 10}, n1(t0 - 1), ms},
		{"fixed full on boundary", fixed, 10, 1, Usage{Cur: 10}, n1(t0), time.Second},
		{"fixed cost > limit", fixed, 10, 11, Usage{}, n1(t0 + 250), Never},
		{"fixed cost = limit", fixed, 10, 10, Usage{}, n1(t0 + 250), 0},
		{"fixed ignores unacked and members", fixed, 10, 1, Usage{Cur: 9, CurUnacked: 9}, Env{NowMs: t0 + 250, Members: 50}, 0},
		{"fixed scale 0.5", fixed, 10, 1, Usage{Cur: 5}, Env{NowMs: t0 + 250, Members: 1, Scale: 0.5}, 750 * ms},
		{"fixed scale shrinks L below c", fixed, 10, 1, Usage{}, Env{NowMs: t0 + 250, Members: 1, Scale: 0.05}, 750 * ms},
		{"peek on a full window", fixed, 10, 0, Usage{Cur: 10}, n1(t0 + 250), 0},

		{"sliding room", sliding, 10, 1, Usage{Prev: 10}, n1(t0 + 500), 0},
		{"sliding empty", sliding, 10, 1, Usage{}, n1(t0), 0},
		// within this window: t = w(1−e) − w·(L−cur−c)/prev
		{"sliding prev 10 at e=0", sliding, 10, 1, Usage{Prev: 10}, n1(t0), 100 * ms},                       // 1000 − 900
		{"sliding prev 10 cur 5 at e=0.5", sliding, 10, 1, Usage{Prev: 10, Cur: 5}, n1(t0 + 500), 100 * ms}, // 500 − 400
		{"sliding prev 10 cur 3 at e=0.2", sliding, 10, 1, Usage{Prev: 10, Cur: 3}, n1(t0 + 200), 200 * ms}, // 800 − 600
		{"sliding prev 10 cost 5 at e=0", sliding, 10, 5, Usage{Prev: 10}, n1(t0), 500 * ms},                // 1000 − 500
		{"sliding rounds up", sliding, 2, 1, Usage{Prev: 3}, n1(t0), 667 * ms},                              // 1000 − 333.3
		{"sliding prev 10 at e=0.999", sliding, 10, 1, Usage{Prev: 10, Cur: 9}, n1(t0 + 999), ms},           // 1 − 0
		// next window: reset + w·(1 − (L−c)/cur)
		{"sliding next window", sliding, 10, 1, Usage{Cur: 10}, n1(t0 + 250), 850 * ms}, // 750 + 100
		{"sliding next window prev ignored", sliding, 10, 1, Usage{Cur: 10, Prev: 10}, n1(t0 + 250), 850 * ms},
		{"sliding next window rounds up", sliding, 4, 1, Usage{Cur: 7}, n1(t0 + 500), 1072 * ms}, // 500 + 571.43
		{"sliding next window cost = limit", sliding, 10, 10, Usage{Cur: 1}, n1(t0 + 250), 1750 * ms},
		{"sliding next window over-full", sliding, 10, 1, Usage{Cur: 20}, n1(t0), 1550 * ms}, // 1000 + 550
		{"sliding cost > limit", sliding, 10, 11, Usage{}, n1(t0), Never},
		{"sliding scale shrinks L below c", sliding, 10, 1, Usage{Cur: 1}, Env{NowMs: t0 + 250, Members: 1, Scale: 0.05}, 750 * ms},
		{"sliding scale 0.5", sliding, 10, 1, Usage{Prev: 10}, Env{NowMs: t0, Members: 1, Scale: 0.5}, 600 * ms}, // 1000 − 400

		{"concurrency room", conc, 3, 1, Usage{Cur: 2}, n1(t0), 0},
		{"concurrency full", conc, 3, 1, Usage{Cur: 3}, n1(t0), 30 * time.Second},
		{"concurrency cost > limit", conc, 3, 4, Usage{}, n1(t0), Never},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := tt.rule
			got := r.Earliest(tt.limit, tt.cost, tt.u, tt.env)
			if got != tt.want {
				t.Errorf("Earliest(limit %d, cost %d, %+v, NowMs %d) = %v, want %v", tt.limit, tt.cost, tt.u, tt.env.NowMs, got, tt.want)
			}
			if got > 0 && got%time.Millisecond != 0 {
				t.Errorf("Earliest = %v, not a whole number of milliseconds", got)
			}
		})
	}
}

// TestEarliestIsWhenDecideAdmits checks Earliest against Decide with N = 1:
// one millisecond before the answer a request of that cost is still
// denied, and at the answer it is admitted (every draw loses the lottery).
func TestEarliestIsWhenDecideAdmits(t *testing.T) {
	for _, alg := range []Algorithm{FixedWindow, SlidingWindow} {
		r := windowRule(t, alg, 10)
		for _, u := range []Usage{{Prev: 10}, {Prev: 10, Cur: 5}, {Prev: 3, Cur: 8}, {Cur: 10}, {Prev: 7, Cur: 10}, {Cur: 9}} {
			for _, at := range []int64{0, 1, 250, 999} {
				for _, cost := range []uint64{1, 3} {
					now := t0 + at
					wait := r.Earliest(10, cost, u, Env{NowMs: now, Members: 1})
					if wait == 0 {
						if d := r.Decide(10, cost, u, Env{NowMs: now, Members: 1}, 0.999999); !d.Allowed {
							t.Errorf("%s %+v at +%d cost %d: Earliest 0 but denied (%v)", alg, u, at, cost, d.Reason)
						}
						continue
					}
					// Usage moves one window back when the retry is in the next window.
					uAt := func(ms int64) Usage {
						if floorDiv(ms, 1000) == floorDiv(now, 1000) {
							return u
						}
						return Usage{Prev: u.Cur}
					}
					then := now + wait.Milliseconds()
					if d := r.Decide(10, cost, uAt(then), Env{NowMs: then, Members: 1}, 0.999999); !d.Allowed {
						t.Errorf("%s %+v at +%d cost %d: denied (%v) after Earliest %v", alg, u, at, cost, d.Reason, wait)
					}
					if d := r.Decide(10, cost, uAt(then-1), Env{NowMs: then - 1, Members: 1}, 0.999999); d.Allowed {
						t.Errorf("%s %+v at +%d cost %d: admitted 1ms before Earliest %v", alg, u, at, cost, wait)
					}
				}
			}
		}
	}
}

// countAdmitted offers n requests of key at each instant to l and returns
// how many it admitted at each.
func countAdmitted(t *testing.T, l *Limiter, key string, n int, env Env, instants ...int64) []int {
	t.Helper()
	out := make([]int, len(instants))
	for i, at := range instants {
		env.NowMs = at
		for j := 0; j < n; j++ {
			d, err := l.Allow(key, Request{}, env)
			if err != nil {
				t.Fatalf("Allow at %d: %v", at, err)
			}
			if d.Allowed {
				out[i]++
			}
		}
	}
	return out
}

// TestNoBurstAcrossBoundary fills a window to L in its last millisecond
// through a real Limiter over a crdt.Container (N = 1) and offers 3L more
// in each of the next window's first two milliseconds: the sliding window
// admits at most L+1 over those three milliseconds (none in the first
// millisecond of the new window), while the fixed window admits 2L.
func TestNoBurstAcrossBoundary(t *testing.T) {
	const limit = 10
	end := t0 + 1000 // the first millisecond of the next window
	for _, tt := range []struct {
		alg      Algorithm
		min, max int
	}{
		{SlidingWindow, limit, limit + 1},
		{FixedWindow, 2 * limit, 2 * limit},
	} {
		t.Run(string(tt.alg), func(t *testing.T) {
			l, err := New(Rule{Name: "api", Algorithm: tt.alg, Limit: limit, Window: time.Second}, crdt.NewContainer(), 0)
			if err != nil {
				t.Fatal(err)
			}
			got := countAdmitted(t, l, "k", 3*limit, Env{Members: 1}, end-1, end, end+1)
			total := got[0] + got[1] + got[2]
			if got[0] != limit {
				t.Errorf("admitted %d in the last ms of the window, want %d", got[0], limit)
			}
			if tt.alg == SlidingWindow && got[1] != 0 {
				t.Errorf("sliding admitted %d in the first ms of the next window, want 0", got[1])
			}
			if total < tt.min || total > tt.max {
				t.Errorf("admitted %v = %d over [end−1ms, start+1ms], want %d..%d", got, total, tt.min, tt.max)
			}
		})
	}
}
