package limiter

import (
	"testing"
	"time"

	"github.com/ratemesh/ratemesh/crdt"
)

// BenchmarkAllowDenied is BenchmarkAllow on a hot key whose requests are
// all denied, as a flooded key's are: over the limit (the merged usage
// is past it), or over this member's share (the limit has room, the
// member's unacknowledged usage has taken its share of it). Compare
// BenchmarkAllow, the admission.
func BenchmarkAllowDenied(b *testing.B) {
	for _, bc := range []struct {
		name   string
		merged uint64 // another member's admitted credits in the current window
		want   Reason
	}{
		{"limit", 2000, ReasonLimit},
		{"share", 500, ReasonShare},
	} {
		b.Run(bc.name, func(b *testing.B) {
			l, err := New(Rule{Name: "api", Algorithm: SlidingWindow, Limit: 1000, Window: time.Second}, crdt.NewContainer(), self)
			if err != nil {
				b.Fatal(err)
			}
			env := Env{NowMs: benchNowMs, Members: 5, AckDelay: 40 * time.Millisecond}
			const key = "acct:1234567"
			if _, err := l.Allow(key, Request{}, Env{NowMs: benchNowMs - 1000, Members: 5}); err != nil {
				b.Fatal(err)
			}
			w := l.Set().Series(key).EnsureWindow(1000, floorDiv(benchNowMs, 1000))
			w.Admitted.Raise(other, bc.merged)
			w.Admitted.Raise(self, 300) // none of it acknowledged
			b.ReportAllocs()
			for b.Loop() {
				d, err := l.Allow(key, Request{}, env)
				if err != nil || d.Allowed || d.Reason != bc.want {
					b.Fatal("want a denial for", bc.want, "got", d.Reason, d.Allowed, err)
				}
			}
		})
	}
}
