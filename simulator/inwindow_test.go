package simulator

import (
	"bytes"
	"strings"
	"testing"

	"github.com/ratemesh/ratemesh/limiter"
)

// TestPacedScenario runs the library's paced scenario: the paced rule's
// admissions inside the window follow the paced cap (cumulatively, per
// window, within 2 %), while the unpaced rule spends its quota in the
// window's first 150 ms. Both keep the limit.
func TestPacedScenario(t *testing.T) {
	res := runLibrary(t, "paced", nil)
	for _, rs := range res.Summary.Rules {
		if rs.OvershootMax > 0.02 || rs.Utilisation < 0.95 {
			t.Errorf("rule %s: overshoot_max %v, utilisation %v", rs.Name, rs.OvershootMax, rs.Utilisation)
		}
	}
	bins := map[string][]float64{}
	for _, row := range res.InWindow {
		bins[row.Rule] = append(bins[row.Rule], row.PerWindow)
	}
	paced, unpaced := bins["paced"], bins["unpaced"]
	if len(paced) != 20 || len(unpaced) != 20 {
		t.Fatalf("%d paced and %d unpaced bins, want 20 each (1 s windows)", len(paced), len(unpaced))
	}
	sum := 0.0
	for k, v := range paced {
		sum += v
		capK := limiter.PaceCap(1000, float64((k+1)*InWindowMs)/1000)
		if sum > capK*1.02 {
			t.Errorf("paced: %.1f credits per window by %d ms, over the paced cap %v", sum, (k+1)*InWindowMs, capK)
		}
	}
	if paced[0] > 150*1.02 || paced[0] < 100 {
		t.Errorf("paced: first 50 ms admit %.1f per window, want the burst allowance (100) plus up to one bin's pace (50)", paced[0])
	}
	if first := unpaced[0] + unpaced[1] + unpaced[2]; first < 900 {
		t.Errorf("unpaced: first 150 ms admit %.1f per window, want nearly the whole quota of 1000", first)
	}

	// Each rule has one key, so the key's profile is the rule's, and its
	// limit per 50 ms bin is 1000 spread over 20 bins.
	for _, row := range res.InWindow {
		if row.KeyAdmitted != row.Admitted || row.KeyPerWindow != row.PerWindow || row.KeyLimit != 50 {
			t.Errorf("%+v: the key's figures differ from the rule's, or its limit per bin is not 50", row)
		}
	}

	var csv bytes.Buffer
	if err := res.writeInWindowCSV(&csv); err != nil {
		t.Fatal(err)
	}
	// The first five columns are the outside contract; later ones are added.
	if lines := strings.Split(strings.TrimSpace(csv.String()), "\n"); len(lines) != 41 || !strings.HasPrefix(lines[0], "rule,window_ms,offset_ms,admitted_credits,per_window,") ||
		!strings.HasPrefix(lines[1], "paced,1000,0,") || !strings.HasSuffix(lines[1], ",w0-k0,"+strings.Join(strings.Split(lines[1], ",")[3:5], ",")+",50") {
		t.Errorf("inwindow.csv:\n%s", csv.String())
	}
	var svg bytes.Buffer
	if err := res.writeInWindowSVG(&svg); err != nil || !strings.Contains(svg.String(), "rule unpaced, key w1-k0") || !strings.Contains(svg.String(), "w1-k0's limit spread evenly") {
		t.Errorf("inwindow.svg: %v\n%.600s", err, svg.String())
	}
}

// TestInWindowRuleWithoutKeys: a rule no workload offers gets an empty
// panel that says so, not an "unlimited" key.
func TestInWindowRuleWithoutKeys(t *testing.T) {
	res, err := Run(mustParse(t, `
name: idle-rule
seed: 1
duration: 2s
nodes: 2
mesh: {sync_interval: 20ms}
rules:
  - {name: api, algorithm: fixed_window, limit: 100, window: 1s}
  - {name: idle, algorithm: fixed_window, limit: 100, window: 1s}
workload:
  - {rule: api, rate: 500, keys: 1}
`), Options{})
	if err != nil {
		t.Fatal(err)
	}
	var svg bytes.Buffer
	if err := res.writeInWindowSVG(&svg); err != nil {
		t.Fatal(err)
	}
	if s := svg.String(); !strings.Contains(s, "rule idle: no workload offers it") || strings.Contains(s, "unlimited") || !strings.Contains(s, "rule api, key w0-k0") {
		t.Errorf("inwindow.svg:\n%s", s)
	}
}
