package simulator

import "testing"

// TestClockSkewMeshTime runs clock-skew (nodes within ±150 ms, one at
// +400 ms, mesh time on) beside clock-skew-uncorrected (the same with
// mesh.local_clock: true) for three seeds: mesh time lowers every rule's
// overshoot_max on true time, and keeps it within 0.12 (issue 7 §6 aims
// at 0.02; see the report for what is left: the first window, and the
// offset estimates' one-way latency).
func TestClockSkewMeshTime(t *testing.T) {
	if raceEnabled || testing.Short() {
		t.Skip("scenario runs skip under -race and -short")
	}
	for _, seed := range []uint64{1, 2, 3} {
		corr := runLibrary(t, "clock-skew", &seed)
		unc := runLibrary(t, "clock-skew-uncorrected", &seed)
		for i, rs := range corr.Summary.Rules {
			u := unc.Summary.Rules[i]
			if rs.OvershootMax >= u.OvershootMax {
				t.Errorf("seed %d, rule %s: overshoot_max %v with mesh time, %v without", seed, rs.Name, rs.OvershootMax, u.OvershootMax)
			}
			if rs.OvershootMax > 0.12 {
				t.Errorf("seed %d, rule %s: overshoot_max %v > 0.12 with mesh time", seed, rs.Name, rs.OvershootMax)
			}
		}
	}
}
