package simulator

import (
	"math"
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
