package simulator

import (
	"math"
	"slices"
	"testing"
)

// meshAgreement returns the spread (max − min) of the running nodes' mesh
// clocks against true time at the end of a run, and the median of the
// nodes' skews: the clock mesh time converges on.
func meshAgreement(t *testing.T, res *Result) (spreadMs int64, medianSkewMs float64) {
	t.Helper()
	if len(res.Clocks) == 0 {
		t.Fatal("no clock rows")
	}
	lo, hi := res.Clocks[0].MeshMinusTrueMs, res.Clocks[0].MeshMinusTrueMs
	var skews []float64
	for _, c := range res.Clocks {
		lo, hi = min(lo, c.MeshMinusTrueMs), max(hi, c.MeshMinusTrueMs)
		skews = append(skews, c.SkewMs)
	}
	slices.Sort(skews)
	n := len(skews)
	medianSkewMs = skews[n/2]
	if n%2 == 0 {
		medianSkewMs = (skews[n/2-1] + skews[n/2]) / 2
	}
	return hi - lo, medianSkewMs
}

// TestClockSkewMeshTime runs clock-skew (nodes within ±150 ms, one at
// +400 ms, mesh time on) beside clock-skew-uncorrected (the same with
// mesh.local_clock: true) for three seeds. Mesh time makes the nodes agree
// — their mesh clocks within 2 ms of each other and of the median clock —
// and lowers every rule's overshoot_max on true time. What it cannot do is
// find true time: the median clock of this scenario is tens of
// milliseconds off it, and the first window, where traffic starts, then
// takes the head of the next mesh window too — about offered rate × |m| /
// limit (2 × |m| / 1000 here) above the limit. That model bounds the
// overshoot; clock-skew-centred (TestClockSkewCentred) is the run whose
// median clock is true time.
func TestClockSkewMeshTime(t *testing.T) {
	if raceEnabled || testing.Short() {
		t.Skip("scenario runs skip under -race and -short")
	}
	for _, seed := range []uint64{1, 2, 3} {
		corr := runLibrary(t, "clock-skew", &seed)
		unc := runLibrary(t, "clock-skew-uncorrected", &seed)
		spread, m := meshAgreement(t, corr)
		if spread > 2 {
			t.Errorf("seed %d: the nodes' mesh clocks spread over %d ms, want within 2", seed, spread)
		}
		if d := float64(corr.Clocks[0].MeshMinusTrueMs) - m; math.Abs(d) > 2 {
			t.Errorf("seed %d: mesh time is %v ms from the median clock, want within 2", seed, d)
		}
		bound := 2*math.Abs(m)/1000 + 0.02
		for i, rs := range corr.Summary.Rules {
			u := unc.Summary.Rules[i]
			if rs.OvershootMax >= u.OvershootMax {
				t.Errorf("seed %d, rule %s: overshoot_max %v with mesh time, %v without", seed, rs.Name, rs.OvershootMax, u.OvershootMax)
			}
			if rs.OvershootMax > bound {
				t.Errorf("seed %d, rule %s: overshoot_max %v with mesh time, over %.3f (median clock %v ms from true time)", seed, rs.Name, rs.OvershootMax, bound, m)
			}
		}
	}
}

// TestClockSkewCentred is issue 7 §6's bound where it can hold: the
// nodes' clocks are off by up to 150 ms and one by 400 ms, but their
// median is true time, so windows measured on true time are the mesh's
// windows. With mesh time every rule stays within 0.02 of its limit on
// every seed; on local clocks overshoot_max passes 0.05.
func TestClockSkewCentred(t *testing.T) {
	if raceEnabled || testing.Short() {
		t.Skip("scenario runs skip under -race and -short")
	}
	for _, seed := range []uint64{1, 2, 3, 4} {
		corr := runLibrary(t, "clock-skew-centred", &seed)
		unc := runLibrary(t, "clock-skew-centred-uncorrected", &seed)
		if spread, m := meshAgreement(t, corr); spread > 2 || m != 0 {
			t.Errorf("seed %d: mesh clocks spread %d ms, median skew %v ms; want within 2 and 0", seed, spread, m)
		}
		for i, rs := range corr.Summary.Rules {
			u := unc.Summary.Rules[i]
			if rs.OvershootMax > 0.02 {
				t.Errorf("seed %d, rule %s: overshoot_max %v > 0.02 with mesh time", seed, rs.Name, rs.OvershootMax)
			}
			if u.OvershootMax < 0.05 {
				t.Errorf("seed %d, rule %s: overshoot_max %v on local clocks, want over 0.05 (is the skew applied?)", seed, rs.Name, u.OvershootMax)
			}
		}
	}
}
