package node

import "testing"

// TestClockSampleKeepsLeastDelayed checks the windowed maximum behind a
// member's clock estimate: a batch that queued long never drags the
// estimate down, and a real change of the peer's clock shows within two
// epochs.
func TestClockSampleKeepsLeastDelayed(t *testing.T) {
	const epoch = 2000
	steps := []struct {
		nowMs, sample, want int64
	}{
		{0, -5, -5},        // the first sample is the estimate
		{500, -300, -5},    // a batch that queued 300 ms: ignored
		{1000, -3, -3},     // a faster one: kept
		{2500, -250, -3},   // next epoch: the previous epoch's best still counts
		{4100, -260, -250}, // two epochs on: the old best has aged out
		{4200, 400, 400},   // the peer's clock jumped ahead: shows at once
		{9000, -100, -100}, // after a gap of epochs nothing old is kept
	}
	var m member
	for i, s := range steps {
		m.clockSample(s.sample, s.nowMs, epoch)
		if !m.hasClock || m.clockMs != s.want {
			t.Fatalf("step %d (sample %d at %d ms): estimate %d, want %d", i, s.sample, s.nowMs, m.clockMs, s.want)
		}
	}
}
