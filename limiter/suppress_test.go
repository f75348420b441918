package limiter

import (
	"math"
	"testing"
	"time"

	"github.com/ratemesh/ratemesh/crdt"
)

func TestSuppression(t *testing.T) {
	const L = 1000.0
	tests := []struct {
		name string
		c    float64
		u    Usage
		e    float64
		want float64
	}{
		{"no demand", 1, Usage{}, 0.5, 1},
		{"within the limit in both windows", 1, Usage{PrevAttempted: 1000, CurAttempted: 999}, 0.9, 1},
		{"the last credit of the window is not suppressed", 1, Usage{PrevAttempted: 1000, CurAttempted: 999}, 0.1, 1},
		{"one over in this window", 1, Usage{CurAttempted: 1000}, 0.5, L / 2002},
		{"previous window 2x", 1, Usage{PrevAttempted: 2000}, 0.5, 0.5},
		{"previous window 100x", 1, Usage{PrevAttempted: 100_000, CurAttempted: 1000}, 0.01, 0.01},
		// The in-progress window below the previous one is ignored (a
		// lull, or replication still catching up)…
		{"in-progress below the previous", 1, Usage{PrevAttempted: 4000, CurAttempted: 1999}, 0.5, 0.25},
		// … and raises the estimate when above it: a spike reacts at once.
		{"in-progress above the previous", 1, Usage{PrevAttempted: 2000, CurAttempted: 1999}, 0.5, 0.25},
		// Early in a window the extrapolation is over a quarter window at
		// least, so a few early requests cannot pass for a flood.
		{"early: over a quarter window", 1, Usage{PrevAttempted: 2000, CurAttempted: 999}, 0.01, 0.25},
		{"cost counts", 10, Usage{CurAttempted: 995}, 0.5, L / 2010},
		{"a previous window at the limit", 1, Usage{PrevAttempted: 1000, CurAttempted: 500}, 0.5, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := suppression(L, tt.c, &tt.u, tt.e)
			if math.Abs(got-tt.want) > 1e-12 {
				t.Errorf("suppression(%v, %v, %+v, %v) = %v, want %v", L, tt.c, tt.u, tt.e, got, tt.want)
			}
		})
	}
}

// TestThinning checks the accumulator admits ⌊n·p + acc₀⌋ of n requests:
// within one of n·p over every prefix, where coin flips stray by √n.
func TestThinning(t *testing.T) {
	for _, p := range []float64{0.01, 0.1, 1.0 / 3, 0.5, 0.77, 0.999, 1} {
		for _, acc0 := range []float64{0, 0.3, 0.999} {
			th := thinning{acc: acc0}
			admitted := 0
			for n := 1; n <= 10_000; n++ {
				if th.take(p) {
					admitted++
				}
				want := math.Floor(float64(n)*p + acc0 + 1e-9)
				if math.Abs(float64(admitted)-want) > 1 {
					t.Fatalf("p %v acc0 %v: after %d requests admitted %d, want %v", p, acc0, n, admitted, want)
				}
			}
		}
	}
}

func suppressRule(t testing.TB, alg Algorithm, limit uint64) Rule {
	t.Helper()
	return normalized(t, Rule{Name: "api", Algorithm: alg, Limit: limit, Window: time.Second, Mode: Suppress})
}

// TestDecideSuppress is the pure decision: over the limit, admit iff the
// draw is below the fraction (Limiter uses its accumulator instead),
// denied with ReasonSuppressed; the limit still caps; within the limit, mode
// suppress decides like reject.
func TestDecideSuppress(t *testing.T) {
	fixed := suppressRule(t, FixedWindow, 100)
	n5 := Env{NowMs: t0 + 500, Members: 5, AckDelay: 40 * time.Millisecond}
	tests := []struct {
		name    string
		u       Usage
		draw    float64
		allowed bool
		reason  Reason
	}{
		{"flood, draw below 1/4", Usage{Cur: 50, PrevAttempted: 400, CurAttempted: 150}, 0.24, true, ReasonAdmitted},
		{"flood, draw above 1/4", Usage{Cur: 50, PrevAttempted: 400, CurAttempted: 150}, 0.26, false, ReasonSuppressed},
		// Thinning ignores the share: u = 40 unacknowledged is far over
		// 1/5 of the headroom, but the fraction divides by demand.
		{"flood ignores the share", Usage{Cur: 50, CurUnacked: 40, PrevAttempted: 400, CurAttempted: 150}, 0.1, true, ReasonAdmitted},
		{"flood at the limit", Usage{Cur: 100, PrevAttempted: 400, CurAttempted: 200}, 0, false, ReasonLimit},
		// A flood's first window (no previous demand over L): the share
		// still applies, as in reject.
		{"first window of a flood, over the share", Usage{Cur: 50, CurUnacked: 40, CurAttempted: 300}, 0, false, ReasonShare},
		{"first window of a flood, within the share", Usage{Cur: 50, CurAttempted: 300}, 0, true, ReasonAdmitted},
		// Within the limit: exactly reject's equal share.
		{"within the limit, within the share", Usage{Cur: 50, CurUnacked: 5, PrevAttempted: 90, CurAttempted: 60}, 0.99, true, ReasonAdmitted},
		{"within the limit, over the share", Usage{Cur: 50, CurUnacked: 15, PrevAttempted: 90, CurAttempted: 60}, 0.99, false, ReasonShare},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := fixed.Decide(100, 1, tt.u, n5, tt.draw)
			if d.Allowed != tt.allowed || d.Reason != tt.reason {
				t.Errorf("Decide = allowed %v reason %v, want %v %v", d.Allowed, d.Reason, tt.allowed, tt.reason)
			}
		})
	}
}

// TestLimiterSuppressSteady drives one member (N = 1, so its counters are
// the merged ones) with a key of a fixed window offered 100× its limit,
// 100 requests per millisecond. Under reject the window's quota goes in
// its first 10 ms;
// under suppress, after the first window, every 100 ms admits the limit's
// tenth to within one request per member, and the windows hold the limit.
func TestLimiterSuppressSteady(t *testing.T) {
	for _, mode := range []Mode{Reject, Suppress} {
		t.Run(string(mode), func(t *testing.T) {
			r := Rule{Name: "api", Algorithm: FixedWindow, Limit: 1000, Window: time.Second, Mode: mode}
			l, err := New(r, crdt.NewContainer(), self)
			if err != nil {
				t.Fatal(err)
			}
			perSub := make([]int, 30)
			for ms := int64(0); ms < 3000; ms++ {
				env := Env{NowMs: t0 + ms, Members: 1}
				for range 100 {
					d, err := l.Allow("k", Request{}, env)
					if err != nil {
						t.Fatal(err)
					}
					if d.Allowed {
						perSub[ms/100]++
					}
				}
			}
			t.Logf("%s: admitted per 100 ms: %v", mode, perSub)
			for k := 10; k < 30; k++ {
				got := perSub[k]
				if mode == Reject {
					continue
				}
				if got < 95 || got > 105 {
					t.Errorf("suppress: 100 ms #%d admitted %d, want 100 ± 5", k, got)
				}
			}
			if mode == Reject && (perSub[10] < 900 || perSub[15] > 100) {
				t.Errorf("reject: the baseline should admit in a burst at each window's start; got %v", perSub[10:20])
			}
			for w := 1; w < 3; w++ {
				sum := 0
				for _, v := range perSub[10*w : 10*w+10] {
					sum += v
				}
				if sum > 1000 || sum < 980 || (mode == Reject && perSub[10*w] != 1000) {
					t.Errorf("%s: window %d admitted %d, want within [980, 1000]", mode, w, sum)
				}
			}
		})
	}
}

// TestLimiterSuppressWellBehaved: a key whose demand stays within its limit
// is never suppressed — offered exactly its limit per window, all at once
// at the window's start or spread out — and its accumulator is never made.
func TestLimiterSuppressWellBehaved(t *testing.T) {
	l, err := New(suppressRule(t, FixedWindow, 100), crdt.NewContainer(), self)
	if err != nil {
		t.Fatal(err)
	}
	for w := int64(0); w < 5; w++ {
		for i := int64(0); i < 100; i++ {
			at := t0 + w*1000 // a burst at the window's start …
			if w%2 == 1 {
				at += i * 10 // … or spread over the window
			}
			d, err := l.Allow("calm", Request{}, Env{NowMs: at, Members: 1})
			if err != nil {
				t.Fatal(err)
			}
			if !d.Allowed {
				t.Fatalf("window %d request %d: denied (%v), want every request of a key within its limit admitted", w, i, d.Reason)
			}
		}
	}
	if len(l.thins) != 0 {
		t.Errorf("%d thinning accumulators made for a key never over its limit", len(l.thins))
	}
}

// TestLimiterThinPruned: accumulators of keys no longer flooded are dropped
// two windows on.
func TestLimiterThinPruned(t *testing.T) {
	l, err := New(suppressRule(t, FixedWindow, 10), crdt.NewContainer(), self)
	if err != nil {
		t.Fatal(err)
	}
	flood := func(key string, at int64) {
		t.Helper()
		for i := 0; i < 30; i++ {
			if _, err := l.Allow(key, Request{}, Env{NowMs: at, Members: 1}); err != nil {
				t.Fatal(err)
			}
		}
	}
	// A flood's second window thins.
	flood("a", t0+100)
	flood("a", t0+1100)
	if len(l.thins) != 1 {
		t.Fatalf("after a flood of a: %d accumulators, want 1", len(l.thins))
	}
	flood("b", t0+3100)
	flood("b", t0+4100)
	if _, ok := l.thins["a"]; ok || len(l.thins) != 1 {
		t.Errorf("three windows on: accumulators %v, want only b's", l.thins)
	}
}

// BenchmarkAllowSuppress is BenchmarkAllow's hot key under mode suppress,
// flooded: the previous window attempted 100× the limit, so every call
// reads the attempted counters, computes the fraction and steps the
// key's accumulator.
func BenchmarkAllowSuppress(b *testing.B) {
	r := benchRule()
	r.Limit, r.Mode = 1000, Suppress
	l, err := New(r, crdt.NewContainer(), self)
	if err != nil {
		b.Fatal(err)
	}
	benchHotKey(b, l, false, func(s *crdt.Series) {
		s.EnsureWindow(1000, floorDiv(benchNowMs, 1000)-1).Attempted.Raise(other, 100_000)
	})
}
