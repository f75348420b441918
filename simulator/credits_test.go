package simulator

import (
	"errors"
	"strings"
	"testing"
)

func TestWorkloadTypeAndUnits(t *testing.T) {
	const head = `
name: x
duration: 2s
nodes: 2
rules:
  - {name: api, algorithm: fixed_window, limit: 1000, window: 1s, classes: {payer: 5}, costs: {query: {per: 10}, publish: {each: 100}}}
workload:
`
	ok := []struct {
		wl   string
		cost uint64
	}{
		{"  - {rule: api, rate: 10, type: query, units: 50}", 5},
		{"  - {rule: api, rate: 10, type: query, units: 51}", 6}, // rounded up
		{"  - {rule: api, rate: 10, type: query, units: 1}", 1},
		{"  - {rule: api, rate: 10, type: publish, units: 3, class: payer}", 300},
		{"  - {rule: api, rate: 10}", 1},
	}
	for _, tt := range ok {
		sc, err := Parse([]byte(head + tt.wl))
		if err != nil {
			t.Errorf("%s: %v", tt.wl, err)
			continue
		}
		if w := sc.Workloads[0]; w.Cost != tt.cost {
			t.Errorf("%s: cost %d, want %d", tt.wl, w.Cost, tt.cost)
		}
	}
	bad := []struct{ wl, field string }{
		{"  - {rule: api, rate: 10, type: nope, units: 1}", "workload[0].type"},
		{"  - {rule: api, rate: 10, type: query}", "workload[0].units"},
		{"  - {rule: api, rate: 10, type: query, units: 0}", "workload[0].units"},
		{"  - {rule: api, rate: 10, units: 3}", "workload[0].units"},
		{"  - {rule: api, rate: 10, type: query, units: 5, cost: 2}", "workload[0].type"},
		{"  - {rule: api, rate: 10, type: publish, units: 100000}", "workload[0].units"},
		{"  - {rule: api, rate: 10, type: query, units: 5, unit: 2}", "unit"},
	}
	for _, tt := range bad {
		_, err := Parse([]byte(head + tt.wl))
		if !errors.Is(err, ErrScenario) || !strings.Contains(err.Error(), tt.field) {
			t.Errorf("%s: error %v, want one naming %s", tt.wl, err, tt.field)
		}
	}
}

// TestCreditsScenario: every limited class is held to its own multiple of
// the limit within 2 % on true windows (crate 002's budget is 10 %), the
// unlimited class is never refused, and the run is deterministic in its
// class figures.
func TestCreditsScenario(t *testing.T) {
	if raceEnabled || testing.Short() {
		t.Skip("scenario runs skip under -race and -short")
	}
	for _, seed := range []uint64{1, 2} {
		res := runLibrary(t, "credits", &seed)
		seen := map[string]bool{}
		for _, c := range res.Classes {
			seen[c.Class] = true
			t.Logf("seed %d: %+v", seed, c)
			switch c.Class {
			case "node":
				if c.Limit != 0 || c.AdmittedCredits != c.OfferedCredits || c.OfferedCredits == 0 {
					t.Errorf("seed %d: unlimited class %+v", seed, c)
				}
			case "", "payer":
				want := map[string]uint64{"": 1000, "payer": 5000}[c.Class]
				if c.Limit != want {
					t.Errorf("seed %d: class %q limit %d, want %d", seed, c.Class, c.Limit, want)
				}
				if c.OvershootMax > 0.02 {
					t.Errorf("seed %d: class %q overshoot_max %v > 0.02", seed, c.Class, c.OvershootMax)
				}
				if c.Utilisation < 0.75 {
					t.Errorf("seed %d: class %q utilisation %v < 0.75", seed, c.Class, c.Utilisation)
				}
			}
		}
		if len(seen) != 3 {
			t.Errorf("seed %d: classes %v, want regular, payer and node", seed, seen)
		}
	}
}
