package testutil

import (
	"fmt"
	"testing"
	"time"
)

type fakeT struct {
	failed string
}

func (f *fakeT) Helper() {}
func (f *fakeT) Fatalf(format string, args ...any) {
	f.failed = fmt.Sprintf(format, args...)
	panic(f)
}

func TestEventuallyReturnsOnceTrue(t *testing.T) {
	n := 0
	Eventually(t, time.Second, func() (bool, string) {
		n++
		return n == 3, fmt.Sprint(n)
	})
	if n != 3 {
		t.Fatalf("cond called %d times, want 3", n)
	}
}

func TestEventuallyFailsWithLastExplanation(t *testing.T) {
	f := &fakeT{}
	func() {
		defer func() {
			if r := recover(); r != f {
				t.Fatalf("recovered %v, want the fake's failure", r)
			}
		}()
		Eventually(f, 20*time.Millisecond, func() (bool, string) { return false, "still 7" })
	}()
	if want := "not within 20ms: still 7"; f.failed != want {
		t.Fatalf("failure %q, want %q", f.failed, want)
	}
}

func TestAlignedClock(t *testing.T) {
	w := 10 * time.Second
	into := 1500 * time.Millisecond
	c := AlignedClock(w, into)
	pos := time.Duration(c().UnixNano() % w.Nanoseconds())
	if pos < into || pos > into+time.Second {
		t.Fatalf("clock stands %v into its window, want about %v", pos, into)
	}
}
