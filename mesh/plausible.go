package mesh

import (
	"math"
	"sync"
	"sync/atomic"

	"github.com/ratemesh/ratemesh/limiter"
)

// DefaultSafetyFactor is the margin a plausibility bound puts above the
// largest admission a rule allows one slot in one window: wide enough
// that no honest member (a shared clock reading, a probabilistic
// admission, a rule changed mid-window, peers' clocks shifting a
// window's admissions) is ever refused, narrow enough that a bogus value
// of 2⁶⁴−1 is.
const DefaultSafetyFactor = 16

// PlausibleBound returns the largest value one slot may hold for r in one
// window (a token bucket's epoch): the most r can admit there
// (limiter.Rule.MostAdmissible) × factor (0 means DefaultSafetyFactor).
// A rule whose admissions nothing bounds (an unlimited class, shadow
// mode) has no bound: ok is false, as it is when the bound is beyond any
// counter. r must be normalised.
func PlausibleBound(r *limiter.Rule, factor uint64) (bound uint64, ok bool) {
	if factor == 0 {
		factor = DefaultSafetyFactor
	}
	most, ok := r.MostAdmissible()
	if !ok {
		return 0, false
	}
	b := math.Ceil(float64(most) * float64(factor))
	if b >= math.MaxUint64/2 {
		return 0, false // beyond any counter: nothing to check
	}
	return uint64(b), true
}

// PlausibleFor returns a Config.Plausible for a fixed rule set: each
// rule's PlausibleBound with factor (0 means DefaultSafetyFactor); a rule
// not in rules has no bound. The result only reads a map built here: it
// is safe for concurrent use. A member whose rules are reloaded uses a
// Plausibility instead.
func PlausibleFor(rules []limiter.Rule, factor uint64) func(rule string) (uint64, bool) {
	bound := make(map[string]uint64, len(rules))
	for i := range rules {
		if b, ok := PlausibleBound(&rules[i], factor); ok {
			bound[rules[i].Name] = b
		}
	}
	return func(rule string) (uint64, bool) {
		b, ok := bound[rule]
		return b, ok
	}
}

// Plausibility holds the plausibility bounds (PlausibleBound, factor
// DefaultSafetyFactor) of a rule set that reloads change; its Bound is a
// Config.Plausible. A rule's bound only grows while it lives, and a rule
// that once had none keeps none, so that peers still on an older, larger
// version of a rule during a rolling change are never refused. It is
// safe for concurrent use: Bound is a map read behind an atomic pointer.
type Plausibility struct {
	mu     sync.Mutex // serialises Update
	bounds atomic.Pointer[map[string]uint64]
}

// NewPlausibility returns the bounds of rules.
func NewPlausibility(rules []limiter.Rule) *Plausibility {
	p := &Plausibility{}
	p.Update(rules)
	return p
}

// Update adds the bounds of rules (a reloaded rule set), raising any
// bound a rule's new version raises; rules no longer present keep their
// bounds.
func (p *Plausibility) Update(rules []limiter.Rule) {
	p.mu.Lock()
	defer p.mu.Unlock()
	next := make(map[string]uint64, len(rules))
	if old := p.bounds.Load(); old != nil {
		for k, v := range *old {
			next[k] = v
		}
	}
	for i := range rules {
		r := &rules[i]
		b, ok := PlausibleBound(r, 0)
		if !ok {
			next[r.Name] = 0 // no bound, for good
			continue
		}
		if cur, seen := next[r.Name]; !seen || (cur != 0 && b > cur) {
			next[r.Name] = b
		}
	}
	p.bounds.Store(&next)
}

// Bound returns rule's bound; ok is false for a rule with no bound or not
// known.
func (p *Plausibility) Bound(rule string) (uint64, bool) {
	m := p.bounds.Load()
	if m == nil {
		return 0, false
	}
	b, ok := (*m)[rule]
	return b, ok && b > 0
}
