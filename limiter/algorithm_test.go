package limiter

import (
	"testing"
	"time"
)

func normRule(t *testing.T, r Rule) *Rule {
	t.Helper()
	if err := r.Normalize(); err != nil {
		t.Fatal(err)
	}
	return &r
}

func TestRuleAlgorithmQuestions(t *testing.T) {
	fixed := normRule(t, Rule{Name: "f", Algorithm: FixedWindow, Limit: 100, Window: time.Second})
	sliding := normRule(t, Rule{Name: "s", Algorithm: SlidingWindow, Limit: 100, Window: time.Second})
	conc := normRule(t, Rule{Name: "c", Algorithm: Concurrency, Limit: 7})
	// Epoch: 2 × 10 s to fill from empty = 20 s.
	bucket := normRule(t, Rule{Name: "b", Algorithm: TokenBucket, Limit: 10, Refill: 1, Interval: time.Second})
	tests := []struct {
		name      string
		r         *Rule
		leased    bool
		oldest    int64 // at nowMs 42_500; -1: none
		ratePerMs float64
	}{
		{"fixed", fixed, false, 42_000, 0.1},
		{"sliding", sliding, false, 41_000, 0.1},
		{"concurrency", conc, true, -1, 0},
		{"bucket", bucket, false, 40_000, 0.001},
	}
	for _, tc := range tests {
		if got := tc.r.Leased(); got != tc.leased {
			t.Errorf("%s: Leased %v, want %v", tc.name, got, tc.leased)
		}
		start, ok := tc.r.OldestWindowStart(42_500)
		if ok != (tc.oldest >= 0) || ok && start != tc.oldest {
			t.Errorf("%s: OldestWindowStart %d %v, want %d", tc.name, start, ok, tc.oldest)
		}
		if got := tc.r.RatePerMs(tc.r.Limit); got != tc.ratePerMs {
			t.Errorf("%s: RatePerMs %v, want %v", tc.name, got, tc.ratePerMs)
		}
	}
	// A bucket's rate scales with the key's max (an override of 20: twice
	// the refill); a window's with its limit.
	if got := bucket.RatePerMs(20); got != 0.002 {
		t.Errorf("bucket RatePerMs(20) = %v, want 0.002", got)
	}
	if got := fixed.RatePerMs(300); got != 0.3 {
		t.Errorf("fixed RatePerMs(300) = %v, want 0.3", got)
	}
}

func TestRuleMostAdmissible(t *testing.T) {
	window := func(r Rule) *Rule {
		r.Algorithm, r.Window = FixedWindow, time.Second
		return normRule(t, r)
	}
	tests := []struct {
		name string
		r    *Rule
		want uint64 // 0: no bound
	}{
		{"plain", window(Rule{Name: "p", Limit: 100}), 100},
		{"override and class", window(Rule{Name: "a", Limit: 100,
			Classes: map[string]Class{"x": {Multiplier: 3}}, Overrides: map[string]uint64{"big": 200}}), 600},
		{"override below the limit", window(Rule{Name: "o", Limit: 100, Overrides: map[string]uint64{"small": 5}}), 100},
		{"class below 1", window(Rule{Name: "h", Limit: 100, Classes: map[string]Class{"x": {Multiplier: 0.5}}}), 100},
		{"fractional class, rounded up", window(Rule{Name: "f", Limit: 3, Classes: map[string]Class{"x": {Multiplier: 1.5}}}), 5},
		{"concurrency", normRule(t, Rule{Name: "c", Algorithm: Concurrency, Limit: 7}), 7},
		{"unlimited class", window(Rule{Name: "u", Limit: 100, Classes: map[string]Class{"node": {Unlimited: true}}}), 0},
		{"shadow", window(Rule{Name: "s", Limit: 100, Shadow: true}), 0},
		// A bucket that refills faster than it holds: its epoch is the
		// interval (1 s, longer than twice the 50 ms it takes to fill),
		// in which it admits max + refill.
		{"fast bucket", normRule(t, Rule{Name: "fb", Algorithm: TokenBucket, Limit: 10, Refill: 200, Interval: time.Second}), 210},
		// A slow bucket: epoch 2 × 10 s to fill, 10 + 2 × 10 admitted.
		{"slow bucket", normRule(t, Rule{Name: "sb", Algorithm: TokenBucket, Limit: 10, Refill: 1, Interval: time.Second}), 30},
		// An override scales the refill as it scales max.
		{"bucket override", normRule(t, Rule{Name: "bo", Algorithm: TokenBucket, Limit: 10, Refill: 1, Interval: time.Second,
			Overrides: map[string]uint64{"big": 20}}), 60},
		{"beyond any counter", &Rule{Name: "x", Algorithm: FixedWindow, Limit: MaxLimit, Classes: map[string]Class{"x": {Multiplier: 1 << 20}}}, 0},
	}
	for _, tc := range tests {
		got, ok := tc.r.MostAdmissible()
		if ok != (tc.want != 0) || got != tc.want {
			t.Errorf("%s: MostAdmissible %d %v, want %d", tc.name, got, ok, tc.want)
		}
	}
}

func TestRuleReference(t *testing.T) {
	for _, r := range []*Rule{
		normRule(t, Rule{Name: "f", Algorithm: FixedWindow, Limit: 100, Window: time.Second}),
		normRule(t, Rule{Name: "s", Algorithm: SlidingWindow, Limit: 100, Window: time.Second}),
		normRule(t, Rule{Name: "c", Algorithm: Concurrency, Limit: 7}),
	} {
		if ref, ok := r.Reference(r.Limit); ok || ref != nil {
			t.Errorf("%s: a reference, want none (the limit is what a window holds)", r.Algorithm)
		}
	}
	// A bucket of 4, refilling 1 per 100 ms, starting with 2.
	bucket := normRule(t, Rule{Name: "b", Algorithm: TokenBucket, Limit: 4, Refill: 1, Interval: 100 * time.Millisecond, Initial: 2, HasInitial: true})
	ref, ok := bucket.Reference(4)
	if !ok {
		t.Fatal("bucket: no reference")
	}
	steps := []struct {
		nowMs int64
		cost  uint64
		want  uint64
	}{
		{1000, 1, 1}, // starts at its first request with initial 2
		{1000, 1, 1},
		{1000, 1, 0}, // empty
		{1050, 1, 0}, // half a credit refilled
		{1100, 1, 1}, // one credit
		{2000, 5, 0}, // full at 4: a cost of 5 never fits
		{2000, 4, 4},
	}
	for i, s := range steps {
		if got := ref.Take(s.nowMs, s.cost); got != s.want {
			t.Errorf("step %d: Take(%d, %d) = %d, want %d", i, s.nowMs, s.cost, got, s.want)
		}
	}
	// Twice the max (an override): twice the initial credits and refill.
	ref, _ = bucket.Reference(8)
	if got := ref.Take(0, 4); got != 4 {
		t.Errorf("scaled: Take(0, 4) = %d, want 4 (initial 2 × 2)", got)
	}
	if got := ref.Take(100, 2); got != 2 {
		t.Errorf("scaled: Take(100, 2) = %d, want 2 (refill 1 × 2)", got)
	}
	// Limit 0 (an unlimited class): admits nothing.
	ref, ok = bucket.Reference(0)
	if !ok || ref.Take(0, 1) != 0 {
		t.Errorf("limit 0: %v, admits; want a reference that admits nothing", ok)
	}
}
