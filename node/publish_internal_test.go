package node

import (
	"testing"
	"time"
)

func TestPublishWait(t *testing.T) {
	const gap = 10 * time.Millisecond
	for _, c := range []struct {
		name string
		now  time.Time
		last time.Time
		want time.Duration
	}{
		{"no batch yet", tIn, time.Time{}, 0},
		{"the last batch just now", tIn, tIn, gap},
		{"within the gap", tIn.Add(4 * time.Millisecond), tIn, 6 * time.Millisecond},
		{"exactly the gap", tIn.Add(gap), tIn, 0},
		{"long after", tIn.Add(time.Hour), tIn, 0},
		{"the clock stepped back", tIn.Add(-time.Minute), tIn, gap},
	} {
		if got := PublishWait(c.now, c.last, gap); got != c.want {
			t.Errorf("%s: PublishWait = %v, want %v", c.name, got, c.want)
		}
	}
}

// TestPublishGap: an explicit gap is kept; the default is half the sync
// interval until the others' leading edges would bring a member more than
// EdgeInbound batches a second, then grows with the mesh up to the whole
// interval.
func TestPublishGap(t *testing.T) {
	const ms = time.Millisecond
	for _, c := range []struct {
		gap, sync time.Duration
		members   int
		want      time.Duration
	}{
		{10 * ms, 100 * ms, 1000, 10 * ms}, // set: kept, whatever the mesh
		{-1, 100 * ms, 1000, -1},           // no leading edge
		{0, 20 * ms, 1, 10 * ms},           // alone
		{0, 20 * ms, 0, 10 * ms},           // before the core counts itself
		{0, 20 * ms, 96, 10 * ms},          // 95 others every 10 ms: 9,500 a second
		{0, 20 * ms, 151, 15 * ms},         // 150 every 15 ms: 10,000
		{0, 20 * ms, 5000, 20 * ms},        // never past the interval
		{0, 100 * ms, 501, 50 * ms},        // 500 every 50 ms
		{0, 100 * ms, 801, 80 * ms},
		{0, 100 * ms, 1000, 99900 * time.Microsecond},
	} {
		if got := PublishGap(c.gap, c.sync, c.members); got != c.want {
			t.Errorf("PublishGap(%v, %v, %d) = %v, want %v", c.gap, c.sync, c.members, got, c.want)
		}
	}
}
