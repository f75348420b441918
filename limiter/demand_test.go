package limiter

import (
	"math"
	"testing"
	"time"

	"github.com/ratemesh/ratemesh/crdt"
)

func demandRule(t testing.TB, alg Algorithm, limit uint64, floor float64) Rule {
	t.Helper()
	return normalized(t, Rule{Name: "api", Algorithm: alg, Limit: limit, Window: time.Second, Share: Demand, DemandFloor: floor})
}

func TestDemandShare(t *testing.T) {
	r := demandRule(t, SlidingWindow, 1000, 0.05)
	equalFloor := demandRule(t, SlidingWindow, 1000, 1)
	n10 := &Env{Members: 10}
	tests := []struct {
		name string
		rule *Rule
		u    Usage
		e    float64
		cost uint64
		want float64
	}{
		// f = floor/N + (1 − floor)·own/all, each counting the request.
		{"all the demand is mine", &r, Usage{PrevAttempted: 2000, OwnPrevAttempted: 2000, CurAttempted: 1000, OwnCurAttempted: 1000}, 0.5, 1,
			0.005 + 0.95},
		{"idle, the first request", &r, Usage{PrevAttempted: 2000, CurAttempted: 999}, 0.5, 1,
			0.005 + 0.95*1.0/2000},
		{"a tenth of the demand", &r, Usage{PrevAttempted: 1000, OwnPrevAttempted: 100, CurAttempted: 499, OwnCurAttempted: 49}, 0.5, 1,
			0.005 + 0.95*0.1},
		{"the previous window weighs 1 − e", &r, Usage{PrevAttempted: 1000, OwnPrevAttempted: 1000, CurAttempted: 249}, 0.75, 1,
			0.005 + 0.95*251.0/500},
		{"a fresh key: the request is all the demand", &r, Usage{}, 0.2, 1, 0.005 + 0.95},
		{"a peek on a fresh key: equal share", &r, Usage{}, 0.2, 0, 0.1},
		{"demand_floor 1 is equal share", &equalFloor, Usage{PrevAttempted: 2000, OwnPrevAttempted: 2000}, 0.5, 1, 0.1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := tt.rule.demandShare(&tt.u, n10, tt.e, tt.cost)
			if math.Abs(got-tt.want) > 1e-12 {
				t.Errorf("demandShare = %v, want %v", got, tt.want)
			}
			if !(got > 0 && got <= 1) {
				t.Errorf("demandShare = %v, want within (0, 1]", got)
			}
		})
	}
}

// TestDemandSharesSumToOne: members that see the same merged demand get
// shares that add up to one (up to the request each counts), whatever the
// spread of demand — so demand moves headroom, never creates it — and no
// member's share is ever zero, even for limits below N.
func TestDemandSharesSumToOne(t *testing.T) {
	r := demandRule(t, FixedWindow, 10, 0.05)
	for _, own := range [][]uint64{
		{1000, 0, 0, 0, 0},
		{200, 200, 200, 200, 200},
		{1, 2, 3, 4, 990},
		{0, 0, 0, 0, 1},
	} {
		var all uint64
		for _, o := range own {
			all += o
		}
		env := &Env{Members: len(own)}
		sum := 0.0
		for _, o := range own {
			f := r.demandShare(&Usage{CurAttempted: all, OwnCurAttempted: o}, env, 0.5, 0)
			if !(f > 0) {
				t.Errorf("demand %v: a share of %v", own, f)
			}
			sum += f
		}
		if math.Abs(sum-1) > 1e-9 {
			t.Errorf("demand %v: shares sum to %v, want 1", own, sum)
		}
	}
}

// TestDecideDemand: P + (u + c)/f ≤ L, against equal share's
// P + N·(u + c) ≤ L, for a member holding all the demand among 10.
func TestDecideDemand(t *testing.T) {
	demand := demandRule(t, FixedWindow, 1000, 0.05)
	equal := windowRule(t, FixedWindow, 1000)
	env := Env{NowMs: t0 + 500, Members: 10, AckDelay: 40 * time.Millisecond}
	busy := func(cur, unacked uint64) Usage {
		return Usage{Cur: cur, CurUnacked: unacked, PrevAttempted: 2000, OwnPrevAttempted: 2000, CurAttempted: 1000, OwnCurAttempted: 1000}
	}
	f := 0.005 + 0.95
	tests := []struct {
		name    string
		rule    *Rule
		u       Usage
		draw    float64
		allowed bool
		reason  Reason
	}{
		// Equal: (1000 − 0)/10 − 100 = 0 < 1.
		{"equal, 100 unacknowledged", &equal, busy(100, 100), 0, false, ReasonShare},
		// Demand: 0.955·1000 − 100 ≥ 1.
		{"demand, 100 unacknowledged", &demand, busy(100, 100), 0.99, true, ReasonAdmitted},
		{"demand, at its share", &demand, busy(uint64(math.Floor(f*1000)), uint64(math.Floor(f*1000))), 0.99, false, ReasonShare},
		// 0.955·(1000 − 999) < 1: the lottery, at odds 0.955.
		{"demand, acknowledged up to the limit", &demand, busy(999, 0), 0.95, true, ReasonAdmitted},
		{"demand, acknowledged up to the limit, lottery lost", &demand, busy(999, 0), 0.96, false, ReasonShare},
		{"demand, the limit", &demand, busy(1000, 0), 0, false, ReasonLimit},
		// An idle member keeps floor/N = 0.005 of the headroom: 5
		// credits of 1000, then the lottery below one.
		{"demand, idle member within its floor", &demand, Usage{Cur: 0, PrevAttempted: 2000, CurAttempted: 1000}, 0.99, true, ReasonAdmitted},
		{"demand, idle member past its floor, lottery lost", &demand, Usage{Cur: 900, PrevAttempted: 2000, CurAttempted: 1000}, 0.6, false, ReasonShare},
		{"demand, idle member past its floor, lottery won", &demand, Usage{Cur: 900, PrevAttempted: 2000, CurAttempted: 1000}, 0.4, true, ReasonAdmitted},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := tt.rule.Decide(1000, 1, tt.u, env, tt.draw)
			if d.Allowed != tt.allowed || d.Reason != tt.reason {
				t.Errorf("Decide = allowed %v reason %v, want %v %v", d.Allowed, d.Reason, tt.allowed, tt.reason)
			}
		})
	}
}

// TestLimiterDemandReadsAttempted: a Limiter fills the demand signal only
// for rules that read it, from the key's current and previous windows.
func TestLimiterDemandReadsAttempted(t *testing.T) {
	for _, tt := range []struct {
		rule Rule
		want bool
	}{
		{windowRule(t, SlidingWindow, 100), false},
		{demandRule(t, SlidingWindow, 100, 0.05), true},
		{suppressRule(t, SlidingWindow, 100), true},
	} {
		l, err := New(tt.rule, crdt.NewContainer(), self)
		if err != nil {
			t.Fatal(err)
		}
		s := l.Set().Ensure("k")
		s.EnsureWindow(1000, t0/1000-1).Attempted.Raise(other, 70)
		s.EnsureWindow(1000, t0/1000-1).Attempted.Raise(self, 30)
		s.EnsureWindow(1000, t0/1000).Attempted.Raise(other, 5)
		s.EnsureWindow(1000, t0/1000).Attempted.Raise(self, 2)
		s.EnsureWindow(1000, t0/1000-2).Attempted.Raise(self, 1000) // too old
		u := l.Usage("k", t0+10)
		want := Usage{}
		if tt.want {
			want = Usage{PrevAttempted: 100, OwnPrevAttempted: 30, CurAttempted: 7, OwnCurAttempted: 2}
		}
		if u != want {
			t.Errorf("mode %s share %s: Usage = %+v, want %+v", tt.rule.Mode, tt.rule.Share, u, want)
		}
	}
}

// BenchmarkAllowDemand is BenchmarkAllow under share demand: every call
// also reads the attempted counters and computes the member's share.
func BenchmarkAllowDemand(b *testing.B) {
	r := benchRule()
	r.Share = Demand
	l, err := New(r, crdt.NewContainer(), self)
	if err != nil {
		b.Fatal(err)
	}
	benchHotKey(b, l, true, nil)
}
