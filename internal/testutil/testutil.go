// Package testutil holds the helpers that tests across ratemesh share:
// polling for a condition with a deadline, and clocks aligned to window
// boundaries. It is imported only by _test.go files.
package testutil

import (
	"time"
)

// TB is the part of testing.TB that Eventually needs.
type TB interface {
	Helper()
	Fatalf(format string, args ...any)
}

// PollInterval is how often Eventually checks its condition.
const PollInterval = 5 * time.Millisecond

// Eventually polls cond every PollInterval until it reports true, or fails
// the test with cond's last explanation once d has passed. It never sleeps
// longer than needed: a condition that holds at once returns at once.
func Eventually(t TB, d time.Duration, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(d)
	tick := time.NewTicker(PollInterval)
	defer tick.Stop()
	for {
		ok, why := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", d, why)
		}
		<-tick.C
	}
}

// AlignedClock returns a clock that runs at real speed, shifted so that it
// reads into past the start of a window of length w right now: every
// member given it opens windows together, and a test knows where it
// stands in a long window without waiting for a boundary.
func AlignedClock(w, into time.Duration) func() time.Time {
	now := time.Now()
	wn := w.Nanoseconds()
	off := time.Duration(wn - now.UnixNano()%wn + into.Nanoseconds())
	return func() time.Time { return time.Now().Add(off) }
}
