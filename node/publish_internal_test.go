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
		if got := publishWait(c.now, c.last, gap); got != c.want {
			t.Errorf("%s: publishWait = %v, want %v", c.name, got, c.want)
		}
	}
}
