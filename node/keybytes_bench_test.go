package node_test

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ratemesh/ratemesh/limiter"
	"github.com/ratemesh/ratemesh/node"
	"github.com/ratemesh/ratemesh/node/nodetest"
)

// BenchmarkKeyBytesMesh measures what a key costs a member of a 3-member
// mesh (issue 28): keys keys of a fixed-window rule of 10 minutes (the
// side-by-side harness's) decided once each at member 0, 40 a
// millisecond, with the batches delivered, merged and acknowledged on
// virtual time, and then a second more. It reports the Go heap each core
// holds after a GC, per key: the deciding member's (writer-B/key) and a
// member that merged the keys from gossip (merger-B/key); the crdt
// package's BenchmarkKeyBytes breaks a container's share down by
// structure, and the difference is the node's own state.
//
//	go test -run='^$' -bench=KeyBytesMesh -benchtime=1x ./node/
func BenchmarkKeyBytesMesh(b *testing.B) {
	const keys, perMs = 200_000, 40
	for range b.N {
		base := heapLive()
		start := time.UnixMilli(1_700_000_400_000) // the start of a 10-minute window
		rules := []limiter.Rule{{Name: "api", Algorithm: limiter.FixedWindow, Limit: 1000, Window: 10 * time.Minute, MaxKeys: 2 * keys}}
		net := nodetest.New(1, start)
		for i := range 3 {
			cfg := node.DefaultCoreConfig()
			cfg.Peer, cfg.Incarnation, cfg.Rules = fmt.Sprintf("n%02d", i), uint64(i+1), rules
			c, err := node.NewCore(cfg, start)
			if err != nil {
				b.Fatal(err)
			}
			net.Add(c)
		}
		if err := net.Run(time.Second, nil); err != nil { // joined, every member alive
			b.Fatal(err)
		}
		writer, merger := net.Core(0), net.Core(1)
		next := 0
		err := net.Run(keys/perMs*time.Millisecond+time.Second, func(now time.Time) {
			for range min(perMs, keys-next) {
				if d, err := writer.Allow(now, "api", fmt.Sprintf("acct:%d", next), limiter.Request{}); err != nil || !d.Allowed {
					b.Fatalf("Allow = %+v, %v", d, err)
				}
				next++
			}
		})
		if err != nil {
			b.Fatal(err)
		}
		for i, c := range []*node.Core{writer, merger} {
			if got := c.Container().Lookup("api").Len(); got != keys {
				b.Fatalf("member %d holds %d keys, want %d", i, got, keys)
			}
		}
		mesh := heapLive() - base
		runtime.KeepAlive(net) // then the third member and the network go
		both := heapLive() - base
		runtime.KeepAlive(writer) // then the writer goes
		alone := heapLive() - base
		runtime.KeepAlive(merger)
		b.ReportMetric(float64(mesh)/keys/3, "mesh-B/key/member")
		b.ReportMetric(float64(both-alone)/keys, "writer-B/key")
		b.ReportMetric(float64(alone)/keys, "merger-B/key")
	}
}

// heapLive returns the heap's live bytes after a full collection.
func heapLive() uint64 {
	var ms runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// BenchmarkKeyCapFlood floods a lone member with flood new keys of one
// rule whose own max_keys is above the flood, so the member's cap on keys
// (node.max_keys, DefaultMaxKeys) is what bounds it (issue 28: "10M keys
// on one node"). It checks that exactly the cap's keys were admitted and
// the rest denied key_cap, and reports the live heap after a GC per key
// held and the process's peak RSS (VmHWM), which the cap bounds. The
// keys are decided 10,000 a millisecond of virtual time, in one 10-minute
// window, with a Tick (publishing them) every 20 ms.
//
//	go test -run='^$' -bench=KeyCapFlood -benchtime=1x ./node/
func BenchmarkKeyCapFlood(b *testing.B) {
	const flood, perTick = 10_000_000, 200_000
	for range b.N {
		base := heapLive()
		now := time.UnixMilli(1_700_000_400_000)
		cfg := node.DefaultCoreConfig()
		cfg.Peer, cfg.Incarnation = "n0", 1
		cfg.Rules = []limiter.Rule{{Name: "api", Algorithm: limiter.FixedWindow, Limit: 1000, Window: 10 * time.Minute, MaxKeys: 2 * flood}}
		c, err := node.NewCore(cfg, now)
		if err != nil {
			b.Fatal(err)
		}
		admitted, denied := 0, 0
		for i := range flood {
			if i%perTick == 0 {
				now = now.Add(20 * time.Millisecond)
				c.Tick(now)
				c.Ready()
			}
			d, err := c.Allow(now, "api", fmt.Sprintf("acct:%d", i), limiter.Request{})
			switch {
			case err != nil:
				b.Fatal(err)
			case d.Allowed:
				admitted++
			case d.Reason == limiter.ReasonKeyCap:
				denied++
			default:
				b.Fatalf("key %d: %+v, want admitted or key_cap", i, d)
			}
		}
		if admitted != node.DefaultMaxKeys || denied != flood-node.DefaultMaxKeys {
			b.Fatalf("admitted %d, denied %d; want %d and %d", admitted, denied, node.DefaultMaxKeys, flood-node.DefaultMaxKeys)
		}
		live := heapLive() - base
		runtime.KeepAlive(c)
		b.ReportMetric(float64(live)/float64(admitted), "heap-B/key")
		b.ReportMetric(float64(peakRSS())/(1<<20), "peak-RSS-MiB")
	}
}

// peakRSS returns the process's peak resident set (VmHWM) in bytes, 0
// where /proc does not say.
func peakRSS() uint64 {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, _ := strconv.ParseUint(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			return kb << 10
		}
	}
	return 0
}
