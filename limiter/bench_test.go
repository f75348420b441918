package limiter

import (
	"strconv"
	"sync"
	"testing"
	"time"

	"golang.org/x/time/rate"

	"github.com/ratemesh/ratemesh/crdt"
)

// Every benchmark decides at the same fixed instant, so none pays for
// reading a clock and all compare the same work.
var (
	benchNow   = time.UnixMilli(t0 + 123)
	benchNowMs = benchNow.UnixMilli()
)

// benchRule admits everything the benchmarks offer: the decision runs in
// full (usage read, projection, remaining) but never short-circuits on a
// denial.
func benchRule() Rule {
	return Rule{Name: "api", Algorithm: SlidingWindow, Limit: MaxLimit, Window: time.Second}
}

func newBenchLimiter(b *testing.B) *Limiter {
	b.Helper()
	l, err := New(benchRule(), crdt.NewContainer(), self)
	if err != nil {
		b.Fatal(err)
	}
	return l
}

// BenchmarkAllow is one existing hot key through the full decision:
// resolve, read the merged counters, decide with N = 5, record.
func BenchmarkAllow(b *testing.B) {
	benchHotKey(b, newBenchLimiter(b), true, nil)
}

// benchHotKey runs l.Allow on one existing hot key at benchNow, N = 5: the
// key has a previous window and another member's slot in the current one,
// as a hot key in a mesh has; prep may add to its series. With mustAllow
// every call must be admitted.
func benchHotKey(b *testing.B, l *Limiter, mustAllow bool, prep func(s *crdt.Series)) {
	b.Helper()
	env := Env{NowMs: benchNowMs, Members: 5, AckDelay: 40 * time.Millisecond}
	const key = "acct:1234567"
	if _, err := l.Allow(key, Request{}, Env{NowMs: benchNowMs - 1000, Members: 5}); err != nil {
		b.Fatal(err)
	}
	s := l.Set().Series(key)
	s.EnsureWindow(1000, floorDiv(benchNowMs, 1000)).Admitted.Raise(other, 100)
	if prep != nil {
		prep(s)
	}
	b.ReportAllocs()
	for b.Loop() {
		d, err := l.Allow(key, Request{}, env)
		if err != nil || (mustAllow && !d.Allowed) {
			b.Fatal("Allow denied:", d.Reason, err)
		}
	}
}

// shardedLimiters is how a runtime would serve Allow from many goroutines:
// a Limiter is not safe for concurrent use, so keys are spread over shards,
// each owning its own Limiter and container behind a mutex, picked by a
// cheap hash of the key. (A node runtime would also merge peers' deltas into
// each shard under the same lock.)
type shardedLimiters struct {
	shards [64]struct {
		mu sync.Mutex
		l  *Limiter
		_  [48]byte // keep shards' hot mutexes on separate cache lines
	}
}

func (s *shardedLimiters) allow(key string, env Env) (Decision, error) {
	h := uint32(2166136261)
	for i := 0; i < len(key); i++ {
		h = (h ^ uint32(key[i])) * 16777619
	}
	sh := &s.shards[h%uint32(len(s.shards))]
	sh.mu.Lock()
	d, err := sh.l.Allow(key, Request{}, env)
	sh.mu.Unlock()
	return d, err
}

// BenchmarkAllowParallel spreads 10,000 keys over GOMAXPROCS goroutines
// through 64 shards.
func BenchmarkAllowParallel(b *testing.B) {
	const nkeys = 10_000
	var s shardedLimiters
	for i := range s.shards {
		s.shards[i].l = newBenchLimiter(b)
	}
	keys := make([]string, nkeys)
	env := Env{NowMs: benchNowMs, Members: 5, AckDelay: 40 * time.Millisecond}
	for i := range keys {
		keys[i] = "acct:" + strconv.Itoa(i)
		if _, err := s.allow(keys[i], env); err != nil {
			b.Fatal(err)
		}
	}
	var next sync.Mutex
	start := 0
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		// Each goroutine walks the keys from its own offset.
		next.Lock()
		i := start
		start += nkeys / 16
		next.Unlock()
		for pb.Next() {
			d, err := s.allow(keys[i%nkeys], env)
			if err != nil || !d.Allowed {
				b.Error("Allow denied:", d.Reason, err)
				return
			}
			i++
		}
	})
}

// BenchmarkXTimeRateAllow is the keyed way people use golang.org/x/time/rate:
// a map of limiters under a mutex, AllowN(now, 1) on one existing hot key.
func BenchmarkXTimeRateAllow(b *testing.B) {
	var mu sync.Mutex
	limiters := map[string]*rate.Limiter{}
	const key = "acct:1234567"
	// A finite rate, so AllowN does its token arithmetic, with a burst the
	// fixed instant never exhausts.
	limiters[key] = rate.NewLimiter(rate.Limit(1e15), 1<<50)
	b.ReportAllocs()
	for b.Loop() {
		mu.Lock()
		l, ok := limiters[key]
		if !ok {
			l = rate.NewLimiter(10, 10)
			limiters[key] = l
		}
		mu.Unlock()
		if !l.AllowN(benchNow, 1) {
			b.Fatal("AllowN denied")
		}
	}
}

// BenchmarkAllowBucket is BenchmarkAllow on a token_bucket rule: one
// existing hot key whose epoch holds another member's slot, N = 5, a
// bucket the benchmark never drains. Compare BenchmarkXTimeRateAllow.
func BenchmarkAllowBucket(b *testing.B) {
	r := Rule{Name: "api", Algorithm: TokenBucket, Limit: MaxBucket, Refill: MaxBucket, Interval: time.Second}
	l, err := New(r, crdt.NewContainer(), self)
	if err != nil {
		b.Fatal(err)
	}
	env := Env{NowMs: benchNowMs, Members: 5, AckDelay: 40 * time.Millisecond}
	const key = "acct:1234567"
	g := r.BucketEpochMs()
	if _, err := l.Allow(key, Request{}, Env{NowMs: benchNowMs - g, Members: 5}); err != nil {
		b.Fatal(err)
	}
	w := l.Set().Ensure(key).EnsureWindow(g, floorDiv(benchNowMs, g))
	w.Admitted.Raise(other, 100)
	w.Attempted.Raise(other, 100*BurnUnit)
	b.ReportAllocs()
	for b.Loop() {
		d, err := l.Allow(key, Request{}, env)
		if err != nil || !d.Allowed {
			b.Fatal("Allow denied:", d.Reason, err)
		}
	}
}
