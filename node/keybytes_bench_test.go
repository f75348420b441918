package node_test

import (
	"fmt"
	"runtime"
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
