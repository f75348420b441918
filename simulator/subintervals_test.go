package simulator

import (
	"bytes"
	"fmt"
	"math"
	"strings"
	"testing"
)

// floodKey returns the flooded key's (workload 0's) admitted credits per
// sub-interval from fromMs on.
func floodKey(res *Result, fromMs int64) []float64 {
	var xs []float64
	for _, row := range res.Subintervals {
		if row.Workload == 0 && row.StartMs >= fromMs {
			xs = append(xs, float64(row.Admitted))
		}
	}
	return xs
}

func cv(xs []float64) float64 {
	var mean, ss float64
	for _, x := range xs {
		mean += x
	}
	mean /= float64(len(xs))
	for _, x := range xs {
		ss += (x - mean) * (x - mean)
	}
	return math.Sqrt(ss/float64(len(xs))) / mean
}

// TestFloodSuppress checks flood-suppress.yaml's claims beside flood.yaml
// (the Ably figures): after a warm-up window, the flooded key's
// admitted credits per 100 ms vary by at most 5% under suppress, every
// 1 s window is within 2% of the limit, and no well-behaved request is
// refused; reject, the baseline, oscillates far more.
func TestFloodSuppress(t *testing.T) {
	if raceEnabled || testing.Short() {
		t.Skip("heavy scenarios skip under -race and -short")
	}
	const warmMs, limit = 1000, 10_000
	reject := runLibrary(t, "flood", nil)
	suppress := runLibrary(t, "flood-suppress", nil)
	rs := suppress.Summary.Rules[0]
	if rs.FalseRejections != 0 || rs.OvershootMax > 0.02 {
		t.Errorf("flood-suppress: false_rejections %d, overshoot_max %v; want 0, ≤ 0.02", rs.FalseRejections, rs.OvershootMax)
	}
	subs := floodKey(suppress, warmMs)
	if c := cv(subs); c > 0.05 {
		t.Errorf("flood-suppress: CV per 100 ms %.2f%%, want ≤ 5%%", 100*c)
	}
	for w := 0; w+10 <= len(subs); w += 10 {
		sum := 0.0
		for _, x := range subs[w : w+10] {
			sum += x
		}
		if math.Abs(sum-limit) > 0.02*limit {
			t.Errorf("flood-suppress: window at %d ms admitted %v, want within 2%% of %d", warmMs+w*SubMs, sum, limit)
		}
	}
	cr, cs := cv(floodKey(reject, warmMs)), cv(subs)
	t.Logf("CV per 100 ms after %d ms: reject %.2f%%, suppress %.2f%%", warmMs, 100*cr, 100*cs)
	if cr < 4*cs {
		t.Errorf("flood (reject) CV %.2f%% is not well above suppress's %.2f%%: the baseline should oscillate", 100*cr, 100*cs)
	}
}

// TestDemandShareScenarios checks the Hermes scenarios: with all traffic
// on one node (moving between data centres, or one of 60 nodes), share
// demand uses at least 95% of the limit with overshoot_max ≤ 0.02, where
// equal share strands a clear part of it; and thin demand over 96 nodes
// (line-range) admits several times more under demand than under equal.
func TestDemandShareScenarios(t *testing.T) {
	if raceEnabled || testing.Short() {
		t.Skip("heavy scenarios skip under -race and -short")
	}
	for _, name := range []string{"dc-imbalance", "hermes-60"} {
		eq := runLibrary(t, name, nil).Summary.Rules[0]
		dm := runLibrary(t, name+"-demand", nil).Summary.Rules[0]
		t.Logf("%s: utilisation equal %.4f, demand %.4f; overshoot_max %v, %v", name, eq.Utilisation, dm.Utilisation, eq.OvershootMax, dm.OvershootMax)
		if dm.Utilisation < 0.95 || dm.OvershootMax > 0.02 {
			t.Errorf("%s-demand: utilisation %v, overshoot_max %v; want ≥ 0.95, ≤ 0.02", name, dm.Utilisation, dm.OvershootMax)
		}
		if eq.Utilisation > 0.9 {
			t.Errorf("%s (equal): utilisation %v; the baseline should strand capacity", name, eq.Utilisation)
		}
	}
	eq := runLibrary(t, "line-range", nil).Summary.Rules[0]
	dm := runLibrary(t, "line-range-demand", nil).Summary.Rules[0]
	t.Logf("line-range small rule: admitted equal %d, demand %d of %d offered", eq.Admitted, dm.Admitted, dm.Offered)
	if dm.Admitted < 3*eq.Admitted || dm.Utilisation < 0.6 || dm.OvershootMax > 0.02 {
		t.Errorf("line-range-demand: admitted %d (equal %d), utilisation %v, overshoot_max %v", dm.Admitted, eq.Admitted, dm.Utilisation, dm.OvershootMax)
	}
}

// TestSubintervalsPerKey checks that subintervals.csv's key columns
// profile one key against that key's limit: a one-key workload's key
// admits what the workload does; a five-key workload's first key keeps
// within its own limit per window although the workload's sum over keys
// is several times that limit (what the plot used to draw against one
// key's limit, reading as an overshoot).
func TestSubintervalsPerKey(t *testing.T) {
	sc := mustParse(t, `
name: keys
seed: 1
duration: 5s
nodes: 3
network: {latency: 5ms, jitter: 2ms, loss: 0}
mesh: {sync_interval: 20ms}
rules:
  - {name: api, algorithm: fixed_window, limit: 100, window: 1s}
  - {name: free, algorithm: fixed_window, limit: 100, window: 1s, classes: {node: unlimited}}
workload:
  - {rule: api, rate: 1000, keys: 1}
  - {rule: api, rate: 2000, keys: 5, key_dist: "zipf:1.1"}
  - {rule: free, rate: 50, keys: 2, class: node}
`)
	res, err := Run(sc, Options{})
	if err != nil {
		t.Fatal(err)
	}
	perWindow := map[[2]int64]uint64{} // workload, window start: admitted
	keyPerWindow := map[[2]int64]uint64{}
	for _, row := range res.Subintervals {
		wantKey, wantLimit := fmt.Sprintf("w%d-k0", row.Workload), 10.0
		if row.Workload == 2 {
			wantLimit = 0 // unlimited class
		}
		if row.Key != wantKey || row.KeyLimit != wantLimit || row.KeyAdmitted > row.Admitted {
			t.Fatalf("%+v: want key %s, limit %v per 100 ms, and no more admitted than the workload", row, wantKey, wantLimit)
		}
		if row.Workload == 0 && row.KeyAdmitted != row.Admitted {
			t.Errorf("%+v: a one-key workload's key admitted other than the workload", row)
		}
		w := [2]int64{int64(row.Workload), row.StartMs / 1000 * 1000}
		perWindow[w] += row.Admitted
		keyPerWindow[w] += row.KeyAdmitted
	}
	for w, adm := range keyPerWindow {
		if w[0] < 2 && adm > 102 {
			t.Errorf("workload %d, window at %d ms: the key admitted %d, over its limit of 100", w[0], w[1], adm)
		}
		if w[0] == 1 && perWindow[w] < 200 {
			t.Errorf("workload 1, window at %d ms: its 5 keys admitted %d; the test wants a sum over keys well above one key's limit", w[1], perWindow[w])
		}
	}
	var csv, svg bytes.Buffer
	if err := res.writeSubCSV(&csv); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(csv.String(), "\n")
	if lines[0] != "workload,rule,start_ms,admitted_credits,keys,key,key_admitted_credits,key_limit_credits" || !strings.Contains(lines[1], ",1,w0-k0,") {
		t.Errorf("subintervals.csv starts:\n%s\n%s", lines[0], lines[1])
	}
	if err := res.writeSubSVG(&svg); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"key w1-k0, the first of its 5 keys", "w1-k0's limit per 100 ms", "w1-k0 admitted", "unlimited class: no limit"} {
		if !strings.Contains(svg.String(), want) {
			t.Errorf("subintervals.svg lacks %q", want)
		}
	}
}
