package mesh_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ratemesh/ratemesh/internal/testutil"
	"github.com/ratemesh/ratemesh/limiter"
	"github.com/ratemesh/ratemesh/node"
)

// The front door on real libp2p hosts: share denials held until
// acknowledgements return (share_wait), lottery losers and leases
// forwarded over the forward stream.

// latencies summarises request durations.
type latencies []time.Duration

func (l latencies) quantile(q float64) time.Duration {
	s := slices.Clone(l)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	return s[min(int(q*float64(len(s))), len(s)-1)]
}

// TestFrontBurst is the burst: 900 requests in about 170 ms,
// round-robin over 3 members, against a limit of 1000 per 20 s. Decided
// at once, the members' shares ran out while their own admissions awaited
// acknowledgement (866–872 admitted in a probe at the previous commit);
// held for their share, all 900 are admitted, none slower than 250 ms on
// a quiet host (the default hold, 200 ms there, stretches to at most
// limiter.MaxShareWait as acknowledgements slow on a loaded one).
func TestFrontBurst(t *testing.T) {
	win := 20 * time.Second
	clock := testutil.AlignedClock(win, time.Second)
	ms := startMembers(t, 3, spec{rules: []limiter.Rule{fixedRule("api", 1000, win)}, clock: clock})
	ctx := context.Background()
	const n = 900
	lat := make(latencies, n)
	ok := make([]bool, n)
	var wg sync.WaitGroup
	start := time.Now()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for i := 0; i < n; {
		// As many as are due: 900 over 170 ms.
		for due := min(int(time.Since(start)*n/(170*time.Millisecond)), n); i < due; i++ {
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				t0 := time.Now()
				d, err := ms[i%3].n.Allow(ctx, "api", "burst")
				lat[i] = time.Since(t0)
				if err != nil {
					t.Error(err)
				}
				ok[i] = d.Allowed
			}(i)
		}
		<-tick.C
	}
	wg.Wait()
	sent := time.Since(start)
	admitted := 0
	for _, a := range ok {
		if a {
			admitted++
		}
	}
	var held, heldOK uint64
	for _, m := range ms {
		st := m.n.HoldStats()
		held, heldOK = held+st.Held, heldOK+st.HeldAdmitted
	}
	t.Logf("%d of %d admitted within %v; latency p50 %v p99 %v max %v; %d held, %d of them admitted",
		admitted, n, sent, lat.quantile(0.5), lat.quantile(0.99), lat.quantile(1), held, heldOK)
	// Under the race detector on a loaded 2-core machine an
	// acknowledgement can come later than share_wait (200 ms), and a held
	// request is refused when its hold expires (899 of 900 once in CI):
	// there the test allows 1 % of them; without it, none.
	want := n
	if raceEnabled {
		want = n - n/100
	}
	if admitted < want {
		t.Errorf("%d of %d admitted under a limit of 1000, want at least %d", admitted, n, want)
	}
	slowest := 250 * time.Millisecond
	if raceEnabled {
		slowest = limiter.MaxShareWait + 500*time.Millisecond // the longest hold, and the race detector's scheduling
	}
	if mx := lat.quantile(1); mx > slowest {
		t.Errorf("slowest request took %v, over %v", mx, slowest)
	}
}

// TestFrontFlood: three members flooded on one key for 5 windows of 1 s
// under a limit of 1000: 8 clients each, each sending a request every
// millisecond (24,000 a second, 24 × the limit). The limit holds per
// window (at most 1.02 × 1000, measured from the decisions) and a held
// request waits at most share_wait (200 ms) plus a scheduling slack.
func TestFrontFlood(t *testing.T) {
	win := time.Second
	clock := testutil.AlignedClock(win, 900*time.Millisecond)
	ms := startMembers(t, 3, spec{rules: []limiter.Rule{fixedRule("api", 1000, win)}, clock: clock})
	ctx := context.Background()
	tl := newTally(win)
	var mu sync.Mutex
	var all, slow latencies
	stop := make(chan struct{})
	var wg sync.WaitGroup
	start := clock()
	for _, m := range ms {
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var mine latencies
				defer func() { mu.Lock(); all = append(all, mine...); mu.Unlock() }()
				tick := time.NewTicker(time.Millisecond)
				defer tick.Stop()
				for {
					select {
					case <-stop:
						return
					case <-tick.C:
					}
					t0 := time.Now()
					d, err := m.n.Allow(ctx, "api", "flood")
					took := time.Since(t0)
					if err != nil {
						t.Error(err)
						return
					}
					tl.addDecision(clock(), d)
					mine = append(mine, took)
					if took > time.Millisecond {
						mu.Lock()
						slow = append(slow, took)
						mu.Unlock()
					}
				}
			}()
		}
	}
	time.Sleep(5200 * time.Millisecond) // the flood itself, not a wait for a condition
	close(stop)
	wg.Wait()
	idx, admitted := tl.windows(start, clock())
	var held, heldOK uint64
	for _, m := range ms {
		st := m.n.HoldStats()
		held, heldOK = held+st.Held, heldOK+st.HeldAdmitted
	}
	t.Logf("admitted per window %v (windows %v); %d requests, latency p50 %v p99 %v max %v; %d held (%d admitted), those over 1 ms: p50 %v p99 %v",
		admitted, idx, len(all), all.quantile(0.5), all.quantile(0.99), all.quantile(1), held, heldOK, slow.quantile(0.5), slow.quantile(0.99))
	if len(admitted) < 4 {
		t.Fatalf("only %d full windows", len(admitted))
	}
	// The clients are scheduled to offer 24,000 a window; a window offered
	// under 8,000 means this machine could not run them, and tests no
	// utilisation or latency of the limiter's.
	keptUp := true
	for i, a := range admitted {
		if float64(a) > 1.02*1000 {
			t.Errorf("window %d: %d admitted, over 1.02 × 1000", idx[i], a)
		}
		tl.mu.Lock()
		offered := tl.offered[idx[i]]
		tl.mu.Unlock()
		if offered < 8000 {
			t.Logf("window %d: only %d offered, the load generator fell behind", idx[i], offered)
			keptUp = false
			continue
		}
		if a < 900 && !raceEnabled {
			t.Errorf("window %d: %d admitted, want at least 900 of 1000 under a flood", idx[i], a)
		}
	}
	if !keptUp {
		t.Skip("the load generator fell behind (this machine is too busy to flood three members); the upper bound held, utilisation and latency are not checked")
	}
	// The race detector slows everything 5–10× on a loaded host; the
	// latency bound is checked without it.
	if mx := all.quantile(1); mx > 300*time.Millisecond && !raceEnabled {
		t.Errorf("slowest request took %v, over share_wait 200 ms + 100 ms of scheduling", mx)
	}
}

// TestFrontLeaseAtAnyMember: a lease acquired at member 0 is renewed at
// member 1 and released at member 2, both forwarded to the owner over the
// forward stream; it is then free at every member. A malformed ID is
// ErrBadLease (the HTTP API's 400), and the released lease is unknown
// everywhere.
func TestFrontLeaseAtAnyMember(t *testing.T) {
	ms := startMembers(t, 3, spec{rules: []limiter.Rule{{Name: "conns", Algorithm: limiter.Concurrency, Limit: 30, LeaseTTL: time.Minute}}})
	ctx := context.Background()
	l, d, err := ms[0].n.Acquire(ctx, "conns", "k")
	if err != nil || l == nil {
		t.Fatalf("Acquire: %+v, %v", d, err)
	}
	testutil.Eventually(t, 5*time.Second, func() (bool, string) {
		rep, _ := ms[2].n.Usage("conns", "k")
		return rep.Total == 1, fmt.Sprintf("member 2 counts %d leases", rep.Total)
	})
	if ttl, err := ms[1].n.Renew(ctx, l.ID); err != nil || ttl != time.Minute {
		t.Fatalf("Renew at member 1: %v, %v; want the owner's TTL of 1m", ttl, err)
	}
	if err := ms[2].n.Release(ctx, l.ID); err != nil {
		t.Fatalf("Release at member 2: %v", err)
	}
	testutil.Eventually(t, 5*time.Second, func() (bool, string) {
		for i, m := range ms {
			if rep, _ := m.n.Usage("conns", "k"); rep.Total != 0 {
				return false, fmt.Sprintf("member %d counts %d leases", i, rep.Total)
			}
		}
		return true, ""
	})
	for i, m := range ms {
		if _, err := m.n.Renew(ctx, l.ID); !errors.Is(err, node.ErrUnknownLease) {
			t.Errorf("Renew of the released lease at member %d: %v, want ErrUnknownLease", i, err)
		}
	}
	for _, id := range []string{"garbage~x~y", "garbage", l.ID + "x~1"} {
		if _, err := ms[1].n.Renew(ctx, id); !errors.Is(err, node.ErrBadLease) {
			t.Errorf("Renew(%q) at member 1: %v, want ErrBadLease", id, err)
		}
	}
	if got := ms[1].n.HoldStats().Forwards + ms[2].n.HoldStats().Forwards; got < 2 {
		t.Errorf("%d forwards, want the renewal and the release", got)
	}
}

// TestFrontIdleKeyFirstRequest: under a limit of 2 across 3 members, the
// first request and the first lease of 30 idle keys, sent round-robin,
// are all admitted: a member whose lottery draw refuses one hands it to a
// member whose draw admits it.
func TestFrontIdleKeyFirstRequest(t *testing.T) {
	ms := startMembers(t, 3, spec{rules: []limiter.Rule{
		{Name: "conns", Algorithm: limiter.Concurrency, Limit: 2, LeaseTTL: time.Minute},
		fixedRule("api", 2, time.Hour),
	}})
	ctx := context.Background()
	var lat latencies
	for k := range 30 {
		key := fmt.Sprintf("idle%d", k)
		m := ms[k%3]
		t0 := time.Now()
		if d, err := m.n.Allow(ctx, "api", key); err != nil || !d.Allowed {
			t.Errorf("first allow of %s at member %d: %+v, %v", key, k%3, d, err)
		}
		t1 := time.Now()
		if l, d, err := m.n.Acquire(ctx, "conns", key); err != nil || l == nil {
			t.Errorf("first acquire of %s at member %d: %+v, %v", key, k%3, d, err)
		}
		lat = append(lat, t1.Sub(t0), time.Since(t1))
	}
	var fw uint64
	for _, m := range ms {
		fw += m.n.HoldStats().Forwards
	}
	t.Logf("60 first requests, %d forwarded; latency p50 %v p99 %v max %v", fw, lat.quantile(0.5), lat.quantile(0.99), lat.quantile(1))
	if fw == 0 {
		t.Error("nothing forwarded: the test's premise (a third of the draws lose) failed")
	}
}
