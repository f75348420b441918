package envoy_test

import (
	"context"
	"testing"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/ratemesh/ratemesh/envoy"
)

// BenchmarkShouldRateLimit is one ShouldRateLimit call over loopback gRPC
// from 16 concurrent clients, client and server in this process: a
// whitelisted descriptor (no decision) and a counted one (a decision
// that admits). Compare runs, not absolute figures: the client's share
// of the CPU is in them.
func BenchmarkShouldRateLimit(b *testing.B) {
	desc, err := envoy.Parse(envoy.File{Name: "bench.yaml", Data: []byte("domain: bench\ndescriptors:\n  - key: white\n  - key: counted\n    rate_limit: {unit: hour, requests_per_unit: 4000000000}\n")})
	if err != nil {
		b.Fatal(err)
	}
	f := start(b, desc)
	for _, key := range []string{"white", "counted"} {
		b.Run(key, func(b *testing.B) {
			r := req("bench", [][][2]string{{{key, "v"}}}, 0)
			b.ReportAllocs()
			b.SetParallelism(8)
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := f.rls.ShouldRateLimit(context.Background(), r); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

// BenchmarkLookup is one descriptor's match, as in the harness: one entry
// whose value is the counter key.
func BenchmarkLookup(b *testing.B) {
	desc, err := envoy.Parse(envoy.File{Name: "bench.yaml", Data: []byte("domain: bench\ndescriptors:\n  - key: key\n    rate_limit: {unit: second, requests_per_unit: 1000}\n")})
	if err != nil {
		b.Fatal(err)
	}
	entries := []*rlcommon.RateLimitDescriptor_Entry{{Key: "key", Value: "k4242"}}
	b.ReportAllocs()
	for b.Loop() {
		if m, ok := desc.Lookup("bench", entries); !ok || m.Key != "k4242" || m.StatKey != "bench.key" {
			b.Fatalf("%+v %v", m, ok)
		}
	}
}
