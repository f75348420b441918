package limiter

import (
	"slices"
	"testing"
	"time"

	"github.com/ratemesh/ratemesh/crdt"
)

func TestReasonNames(t *testing.T) {
	want := []string{"admitted", "limit", "share", "cost", "key_cap", "joining", "unlimited", "suppressed", "fenced", "stale"}
	for r := range NumReasons {
		if got := Reason(r).String(); got != want[r] {
			t.Errorf("Reason(%d) = %q, want %q", r, got, want[r])
		}
	}
	if got := Reason(NumReasons).String(); got != "unknown" {
		t.Errorf("Reason(%d) = %q, want unknown", NumReasons, got)
	}
}

// TestRecordRetry: a held request counts one attempt per window however
// often it is decided again, and its admission once.
func TestRecordRetry(t *testing.T) {
	l, c := newLimiter(t, Rule{Name: "api", Algorithm: FixedWindow, Limit: 100, Window: time.Second})
	ch, err := l.Resolve("k", Request{Cost: 3, HasCost: true})
	if err != nil {
		t.Fatal(err)
	}
	now := t0 + 100
	l.Record(ch, false, now) // the first decision: denied, attempted
	counted := l.WindowIndex(now)
	for range 5 { // decided again and denied: nothing more
		if got := l.RecordRetry(ch, false, now+10, counted); got != counted {
			t.Fatalf("RecordRetry returned window %d, want %d", got, counted)
		}
	}
	w := window(t, c, "api", "k", now)
	if w.Attempted.Get(self) != 3 || w.Admitted.Get(self) != 0 {
		t.Fatalf("after denied retries: attempted %d admitted %d, want 3, 0", w.Attempted.Get(self), w.Admitted.Get(self))
	}
	l.RecordRetry(ch, true, now+20, counted)
	if w.Attempted.Get(self) != 3 || w.Admitted.Get(self) != 3 {
		t.Fatalf("after the admission: attempted %d admitted %d, want 3, 3", w.Attempted.Get(self), w.Admitted.Get(self))
	}
	// Held across a window's end: a new attempt in the new window.
	next := now + 1000
	if got := l.RecordRetry(ch, false, next, counted); got != counted+1 {
		t.Fatalf("RecordRetry in the next window returned %d, want %d", got, counted+1)
	}
	l.RecordRetry(ch, true, next+5, counted+1)
	w2 := window(t, c, "api", "k", next)
	if w2.Attempted.Get(self) != 3 || w2.Admitted.Get(self) != 3 {
		t.Errorf("next window: attempted %d admitted %d, want 3, 3", w2.Attempted.Get(self), w2.Admitted.Get(self))
	}
	// An admission whose attempt was never recorded keeps attempted ≥
	// admitted.
	l.RecordRetry(ch, true, next+6, counted+1)
	if w2.Attempted.Get(self) < w2.Admitted.Get(self) {
		t.Errorf("attempted %d under admitted %d", w2.Attempted.Get(self), w2.Admitted.Get(self))
	}
}

// TestLotteryWinners: an idle key under a limit of 2 across 3 members
// gives each a share of 2/3 of a request; the stratified draws admit
// exactly two members, so each loser learns a winner, and a winner learns
// none (its own draw admits). Keys with room only for the lottery behave
// alike; rules the equal lottery does not divide alone, a whole share, no
// room or a single member give none.
func TestLotteryWinners(t *testing.T) {
	env := func(rank int) Env {
		return Env{NowMs: t0 + 500, Members: 3, Rank: rank, AckDelay: 40 * time.Millisecond}
	}
	for _, alg := range []Algorithm{FixedWindow, SlidingWindow, Concurrency} {
		t.Run(string(alg), func(t *testing.T) {
			r := Rule{Name: "r", Algorithm: alg, Limit: 2, Window: time.Second}
			if alg == Concurrency {
				r.Window = 0
			}
			l, _ := newLimiter(t, r)
			for key := range 50 {
				k := "key" + string(rune('a'+key%26)) + string(rune('a'+key/26))
				var ch Check
				var err error
				if alg == Concurrency {
					ch, err = l.ResolveLease(k, "")
				} else {
					ch, err = l.Resolve(k, Request{})
				}
				if err != nil {
					t.Fatal(err)
				}
				var winners, losers []int
				for rank := range 3 {
					e := env(rank)
					if l.draw(k, &e) < 2.0/3 {
						winners = append(winners, rank)
					} else {
						losers = append(losers, rank)
					}
				}
				if len(winners) != 2 {
					t.Fatalf("key %s: %d winners of 3, want 2", k, len(winners))
				}
				for _, w := range winners {
					if got := l.LotteryWinners(ch, env(w), nil); got != nil {
						t.Errorf("key %s: winner %d is told of winners %v", k, w, got)
					}
				}
				got := l.LotteryWinners(ch, env(losers[0]), nil)
				want := []int{(losers[0] + 1) % 3, (losers[0] + 2) % 3}
				if !slices.Equal(got, want) {
					t.Errorf("key %s: loser %d is told %v, want %v (nearest first)", k, losers[0], got, want)
				}
			}
		})
	}
	t.Run("none", func(t *testing.T) {
		tests := []struct {
			name string
			rule Rule
			used uint64
			n    int
		}{
			{"whole share", Rule{Name: "r", Algorithm: FixedWindow, Limit: 30, Window: time.Second}, 0, 3},
			{"no room", Rule{Name: "r", Algorithm: FixedWindow, Limit: 2, Window: time.Second}, 2, 3},
			{"alone", Rule{Name: "r", Algorithm: FixedWindow, Limit: 2, Window: time.Second}, 0, 1},
			{"suppress", Rule{Name: "r", Algorithm: FixedWindow, Limit: 2, Window: time.Second, Mode: Suppress}, 0, 3},
			{"demand", Rule{Name: "r", Algorithm: FixedWindow, Limit: 2, Window: time.Second, Share: Demand}, 0, 3},
			{"pace", Rule{Name: "r", Algorithm: FixedWindow, Limit: 2, Window: time.Second, Pace: true}, 0, 3},
		}
		for _, tt := range tests {
			l, c := newLimiter(t, tt.rule)
			if tt.used > 0 {
				c.Rule("r").Ensure("k").EnsureWindow(1000, (t0+500)/1000).Raise(crdt.SlotID(1), tt.used, tt.used)
			}
			ch, _ := l.Resolve("k", Request{})
			for rank := range tt.n {
				e := Env{NowMs: t0 + 500, Members: tt.n, Rank: rank}
				if got := l.LotteryWinners(ch, e, nil); got != nil {
					t.Errorf("%s: rank %d told of winners %v, want none", tt.name, rank, got)
				}
			}
		}
	})
}

// TestDenialRemaining: a denial's Remaining is 0 (a retry now cannot pass)
// for every reason but the cost, where smaller requests may still pass.
func TestDenialRemaining(t *testing.T) {
	r := windowRule(t, FixedWindow, 100)
	env := Env{NowMs: t0 + 250, Members: 4, AckDelay: 40 * time.Millisecond}
	tests := []struct {
		name   string
		cost   uint64
		u      Usage
		reason Reason
		rem    uint64
	}{
		{"share", 1, Usage{Cur: 40, CurUnacked: 20}, ReasonShare, 0},
		{"limit, 3 left for a cost of 5", 5, Usage{Cur: 97}, ReasonLimit, 0},
		{"cost", 101, Usage{Cur: 10}, ReasonCost, 90},
	}
	for _, tt := range tests {
		d := r.Decide(100, tt.cost, tt.u, env, 0.99)
		if d.Allowed || d.Reason != tt.reason || d.Remaining != tt.rem {
			t.Errorf("%s: %+v, want denied (%v) with %d remaining", tt.name, d, tt.reason, tt.rem)
		}
	}
}
