package mesh

import (
	"testing"
	"time"

	"github.com/ratemesh/ratemesh/crdt"
	"github.com/ratemesh/ratemesh/limiter"
)

func TestPlausibleBound(t *testing.T) {
	norm := func(r limiter.Rule) *limiter.Rule {
		t.Helper()
		if err := r.Normalize(); err != nil {
			t.Fatal(err)
		}
		return &r
	}
	bucket := limiter.Rule{Name: "b", Algorithm: limiter.TokenBucket, Limit: 10, Refill: 200, Interval: time.Second}
	tests := []struct {
		name string
		r    *limiter.Rule
		want uint64 // 0: no bound
	}{
		{"plain", norm(limiter.Rule{Name: "p", Algorithm: limiter.FixedWindow, Limit: 100, Window: time.Second}), 100 * DefaultSafetyFactor},
		{"override and class", norm(limiter.Rule{Name: "a", Algorithm: limiter.FixedWindow, Limit: 100, Window: time.Second,
			Classes: map[string]limiter.Class{"x": {Multiplier: 3}}, Overrides: map[string]uint64{"big": 200}}), 200 * 3 * DefaultSafetyFactor},
		{"fractional class", norm(limiter.Rule{Name: "f", Algorithm: limiter.FixedWindow, Limit: 3, Window: time.Second,
			Classes: map[string]limiter.Class{"x": {Multiplier: 1.5}}}), 5 * DefaultSafetyFactor},
		{"concurrency", norm(limiter.Rule{Name: "c", Algorithm: limiter.Concurrency, Limit: 7}), 7 * DefaultSafetyFactor},
		{"unlimited class", norm(limiter.Rule{Name: "u", Algorithm: limiter.FixedWindow, Limit: 100, Window: time.Second,
			Classes: map[string]limiter.Class{"node": {Unlimited: true}}}), 0},
		{"shadow", norm(limiter.Rule{Name: "s", Algorithm: limiter.FixedWindow, Limit: 100, Window: time.Second, Shadow: true}), 0},
		// A bucket that refills faster than it holds: its epoch is the
		// interval (1 s, longer than twice the 50 ms it takes to fill), in
		// which it admits max + refill = 210 — 21 × its max, beyond any
		// factor on max alone.
		{"fast bucket", norm(bucket), 210 * DefaultSafetyFactor},
		// A slow bucket: epoch 2 × 10 s to fill, 10 + 2 × 10 admitted.
		{"slow bucket", norm(limiter.Rule{Name: "sb", Algorithm: limiter.TokenBucket, Limit: 10, Refill: 1, Interval: time.Second}), 30 * DefaultSafetyFactor},
	}
	for _, tc := range tests {
		b, ok := PlausibleBound(tc.r, 0)
		if ok != (tc.want != 0) || b != tc.want {
			t.Errorf("%s: bound %d %v, want %d", tc.name, b, ok, tc.want)
		}
	}
	if b, _ := PlausibleBound(tests[0].r, 4); b != 400 {
		t.Errorf("factor 4: %d, want 400", b)
	}
	// The fast bucket's honest epoch (210) passes the check, and a value
	// beyond the bound does not.
	p := PlausibleFor([]limiter.Rule{*norm(bucket)}, 0)
	if reason, err := checkBatch(bucketBatch("peer", 210), "peer", p, false); err != nil {
		t.Errorf("an honest bucket epoch refused: %v %v", reason, err)
	}
	if reason, err := checkBatch(bucketBatch("peer", 210*DefaultSafetyFactor+1), "peer", p, false); err == nil || reason != ReasonImplausible {
		t.Errorf("a value over the bound: %v %v, want implausible", reason, err)
	}
}

func bucketBatch(from string, admitted uint64) *crdt.Batch {
	b := batch(from, 1, "k", admitted)
	b.Windows[0].Rule = "b"
	return b
}

func TestPlausibility(t *testing.T) {
	p := NewPlausibility([]limiter.Rule{
		{Name: "a", Limit: 100, Classes: map[string]limiter.Class{"x": {Multiplier: 3}}, Overrides: map[string]uint64{"big": 200}},
		{Name: "u", Limit: 100, Classes: map[string]limiter.Class{"node": {Unlimited: true}}},
		{Name: "s", Limit: 100, Shadow: true},
	})
	if b, ok := p.Bound("a"); !ok || b != 200*3*DefaultSafetyFactor {
		t.Fatalf("a: %d %v, want %d", b, ok, 200*3*DefaultSafetyFactor)
	}
	for _, name := range []string{"u", "s", "unknown"} {
		if _, ok := p.Bound(name); ok {
			t.Errorf("%s: bounded, want no bound", name)
		}
	}
	// A reload that lowers a limit keeps the larger bound, so peers on the
	// older version are not rejected; a raise takes effect; a rule that
	// had no bound keeps none.
	p.Update([]limiter.Rule{{Name: "a", Limit: 10}, {Name: "u", Limit: 5}})
	if b, _ := p.Bound("a"); b != 200*3*DefaultSafetyFactor {
		t.Fatalf("a after a lower limit: %d", b)
	}
	if _, ok := p.Bound("u"); ok {
		t.Error("u: bounded after a reload; a rule that had no bound keeps none")
	}
	p.Update([]limiter.Rule{{Name: "a", Limit: 10_000}})
	if b, _ := p.Bound("a"); b != 10_000*DefaultSafetyFactor {
		t.Fatalf("a after a higher limit: %d", b)
	}
}
