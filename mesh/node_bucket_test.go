package mesh_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratemesh/ratemesh/limiter"
)

// TestNodesBucket: five members on real libp2p hosts share one token
// bucket (max 1000, 1000 credits/s), flooded at 10× its rate for 5 s,
// spread uniformly over the members. One bucket flooded from full admits
// max + rate × the run; the mesh admits at most 1.02 × that, and at least
// 0.95 × (without the race detector). Share holds are off
// (limiter.NoShareWait): a held denial waits for the refill and is then
// admitted, so with holds a client issues no faster than the bucket
// admits and the flood never happens (every request offered was admitted,
// 6,000 of the 50,000 scheduled). The figures are logged:
//
//	go test -run TestNodesBucket -v ./mesh/
func TestNodesBucket(t *testing.T) {
	if testing.Short() {
		t.Skip("runs for seconds")
	}
	const n = 5
	rules := []limiter.Rule{{Name: "api", Algorithm: limiter.TokenBucket, Limit: 1000, Refill: 100, Interval: 100 * time.Millisecond, ShareWait: limiter.NoShareWait}}
	ms := startMembers(t, n, spec{rules: rules})
	var admitted, offered atomic.Uint64
	stop := make(chan struct{})
	errs := make(chan error, n)
	var wg sync.WaitGroup
	from := time.Now()
	for _, x := range ms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := context.Background()
			start, issued := time.Now(), 0
			tick := time.NewTicker(time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-stop:
					return
				case <-tick.C:
				}
				for due := int(time.Since(start).Seconds() * 10000 / n); issued < due; issued++ {
					// A share denial is held up to share_wait: a client
					// behind schedule must still see stop.
					select {
					case <-stop:
						return
					default:
					}
					d, err := x.n.Allow(ctx, "api", "hot")
					if err != nil {
						errs <- err
						return
					}
					offered.Add(1)
					if d.Allowed {
						admitted.Add(1)
					}
				}
			}
		}()
	}
	select {
	case err := <-errs:
		t.Fatal(err)
	case <-time.After(5 * time.Second):
	}
	close(stop)
	wg.Wait()
	span := time.Since(from)
	one := 1000 + 1000*span.Seconds()
	got := float64(admitted.Load())
	t.Logf("offered %d in %v, admitted %.0f; one bucket admits %.0f (%.4f×)", offered.Load(), span.Round(time.Millisecond), got, one, got/one)
	if got > 1.02*one {
		t.Errorf("admitted %.0f, over 1.02 × one bucket's %.0f", got, one)
	}
	if got < 0.95*one && !raceEnabled {
		t.Errorf("admitted %.0f, under 0.95 × one bucket's %.0f", got, one)
	}
	if float64(offered.Load()) < 5*one && !raceEnabled {
		t.Errorf("only %d offered; the load generator fell behind", offered.Load())
	}
}
