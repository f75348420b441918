package mesh

import (
	"math"

	"github.com/ratemesh/ratemesh/limiter"
)

// DefaultSafetyFactor is the margin PlausibleFor puts above the largest
// admission a rule allows one slot in one window: wide enough that no
// honest member (a shared clock reading, a probabilistic admission, a
// rule changed mid-window) is ever refused, narrow enough that a bogus
// value of 2⁶⁴−1 is.
const DefaultSafetyFactor = 4

// PlausibleFor returns a Config.Plausible for rules: the largest value one
// slot may hold for a rule in one window is its limit (or its largest
// override, if higher) × its largest class multiplier (at least 1) ×
// factor. A rule with an unlimited class or in shadow mode (which counts
// without ever denying) has no bound, nor has a rule not in rules. The
// result only reads a map built here: it is safe for concurrent use, and a
// config reload builds a new one. A factor of 0 means DefaultSafetyFactor.
func PlausibleFor(rules []limiter.Rule, factor uint64) func(rule string) (uint64, bool) {
	if factor == 0 {
		factor = DefaultSafetyFactor
	}
	bound := make(map[string]uint64, len(rules))
	for i := range rules {
		r := &rules[i]
		if r.Shadow {
			continue
		}
		limit := r.Limit
		for _, o := range r.Overrides {
			limit = max(limit, o)
		}
		mult, unlimited := 1.0, false
		for _, c := range r.Classes {
			if c.Unlimited {
				unlimited = true
			}
			mult = max(mult, c.Multiplier)
		}
		if unlimited {
			continue
		}
		b := math.Ceil(float64(limit)*mult) * float64(factor)
		if b >= math.MaxUint64 {
			continue // beyond any counter: nothing to check
		}
		bound[r.Name] = uint64(b)
	}
	return func(rule string) (uint64, bool) {
		b, ok := bound[rule]
		return b, ok
	}
}
