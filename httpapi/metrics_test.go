package httpapi

import (
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ratemesh/ratemesh/limiter"
	"github.com/ratemesh/ratemesh/node"
)

// TestDecidedCounters: decisions counted from several goroutines at once
// through the cached counters land on the vector's counter of their rule
// and result: a reason's name, "shadowed" for a shadow rule's, "unknown"
// past the names.
func TestDecidedCounters(t *testing.T) {
	m := newMetrics(prometheus.NewRegistry(), Config{})
	rules := []string{"a", "b", "c"}
	ds := []node.Decision{
		{Allowed: true, Reason: limiter.ReasonAdmitted},
		{Reason: limiter.ReasonLimit},
		{Allowed: true, Shadow: true, Reason: limiter.ReasonLimit},
		{Reason: limiter.Reason(limiter.NumReasons + 3)},
	}
	const workers, each = 4, 250
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				for r, rule := range rules {
					for j, d := range ds {
						if (i+w+r+j)%(r+1) == 0 { // rule a every time, b every other, c every third
							m.decided(rule, d)
						}
					}
				}
			}
		})
	}
	wg.Wait()
	for r, rule := range rules {
		for j, result := range []string{"admitted", "limit", "shadowed", "unknown"} {
			want := 0
			for w := range workers {
				for i := range each {
					if (i+w+r+j)%(r+1) == 0 {
						want++
					}
				}
			}
			if got := testutil.ToFloat64(m.decisions.WithLabelValues(rule, result)); got != float64(want) {
				t.Errorf("%s %s: %v, want %d", rule, result, got, want)
			}
		}
	}
	if n := testutil.CollectAndCount(m.decisions); n != len(rules)*4 {
		t.Errorf("%d series, want %d", n, len(rules)*4)
	}
}
