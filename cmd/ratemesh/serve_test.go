package main

import (
	"testing"

	"github.com/ratemesh/ratemesh/limiter"
)

func TestRoutable(t *testing.T) {
	for addr, want := range map[string]bool{
		"/ip4/127.0.0.1/tcp/4001":     false,
		"/ip6/::1/tcp/4001":           false,
		"/ip4/0.0.0.0/tcp/4001":       true,
		"/ip4/10.1.2.3/udp/1/quic-v1": true,
		"/ip6/::/tcp/4001":            true,
		"not a multiaddr":             false, // mesh.New names it
	} {
		if got := routable(addr); got != want {
			t.Errorf("routable(%q) = %v, want %v", addr, got, want)
		}
	}
}

func TestPlausibility(t *testing.T) {
	var p plausibility
	p.update([]limiter.Rule{
		{Name: "a", Limit: 100, Classes: map[string]limiter.Class{"x": {Multiplier: 3}}, Overrides: map[string]uint64{"big": 200}},
		{Name: "u", Limit: 100, Classes: map[string]limiter.Class{"node": {Unlimited: true}}},
		{Name: "s", Limit: 100, Shadow: true},
	})
	if b, ok := p.get("a"); !ok || b != 200*3*plausibleFactor {
		t.Fatalf("a: %d %v, want %d", b, ok, 200*3*plausibleFactor)
	}
	for _, name := range []string{"u", "s", "unknown"} {
		if _, ok := p.get(name); ok {
			t.Errorf("%s: bounded, want no bound", name)
		}
	}
	// A reload that lowers a limit keeps the larger bound, so peers on the
	// older version are not rejected; a raise takes effect.
	p.update([]limiter.Rule{{Name: "a", Limit: 10}})
	if b, _ := p.get("a"); b != 200*3*plausibleFactor {
		t.Fatalf("a after a lower limit: %d", b)
	}
	p.update([]limiter.Rule{{Name: "a", Limit: 10_000}})
	if b, _ := p.get("a"); b != 10_000*plausibleFactor {
		t.Fatalf("a after a higher limit: %d", b)
	}
}
