package node_test

import (
	"errors"
	"testing"
	"time"

	"github.com/ratemesh/ratemesh/limiter"
	"github.com/ratemesh/ratemesh/node"
)

func TestSetRulesKeepsCountersOfUnchangedWindow(t *testing.T) {
	start := time.UnixMilli(1_700_000_000_000)
	c := newCore(t, "n0", start, []limiter.Rule{
		{Name: "api", Algorithm: limiter.FixedWindow, Limit: 10, Window: time.Second},
		{Name: "other", Algorithm: limiter.FixedWindow, Limit: 5, Window: time.Second},
	}, nil)
	for range 4 {
		if d, err := c.Allow(start, "api", "k", limiter.Request{}); err != nil || !d.Allowed {
			t.Fatalf("allow: %+v %v", d, err)
		}
	}
	hash := c.RulesHash()
	// api's limit changes, its window does not: the 4 admitted stay.
	err := c.SetRules([]limiter.Rule{
		{Name: "api", Algorithm: limiter.FixedWindow, Limit: 6, Window: time.Second},
		{Name: "other", Algorithm: limiter.FixedWindow, Limit: 5, Window: time.Second},
	})
	if err != nil {
		t.Fatal(err)
	}
	if c.RulesHash() == hash {
		t.Fatal("rules hash unchanged after a changed rule")
	}
	admitted := 0
	for range 5 {
		d, err := c.Allow(start, "api", "k", limiter.Request{})
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed {
			admitted++
		}
		if d.Limit != 6 {
			t.Fatalf("limit %d after reload, want 6", d.Limit)
		}
	}
	if admitted != 2 {
		t.Fatalf("admitted %d more after the limit became 6 with 4 used, want 2", admitted)
	}
	// Now the window changes: the counter starts fresh.
	if err := c.SetRules([]limiter.Rule{{Name: "api", Algorithm: limiter.FixedWindow, Limit: 6, Window: 2 * time.Second}}); err != nil {
		t.Fatal(err)
	}
	rep, err := c.Usage(start, "api", "k")
	if err != nil {
		t.Fatal(err)
	}
	if rep.Total != 0 || rep.WindowMs != 2000 {
		t.Fatalf("usage after window change: total %d window_ms %d, want 0 and 2000", rep.Total, rep.WindowMs)
	}
	if _, err := c.Allow(start, "other", "k", limiter.Request{}); !errors.Is(err, node.ErrUnknownRule) {
		t.Fatalf("removed rule: err %v, want ErrUnknownRule", err)
	}
	if got := c.RuleNames(); len(got) != 1 || got[0] != "api" {
		t.Fatalf("rule names %v", got)
	}
}

func TestSetRulesAllOrNothing(t *testing.T) {
	start := time.UnixMilli(1_700_000_000_000)
	rules := []limiter.Rule{{Name: "api", Algorithm: limiter.FixedWindow, Limit: 10, Window: time.Second}}
	c := newCore(t, "n0", start, rules, nil)
	hash := c.RulesHash()
	for name, bad := range map[string][]limiter.Rule{
		"invalid": {{Name: "api", Algorithm: limiter.FixedWindow, Limit: 20, Window: time.Second}, {Name: "b", Algorithm: limiter.FixedWindow, Limit: 0, Window: time.Second}},
		"dup":     {{Name: "api", Algorithm: limiter.FixedWindow, Limit: 20, Window: time.Second}, {Name: "api", Algorithm: limiter.FixedWindow, Limit: 1, Window: time.Second}},
	} {
		if err := c.SetRules(bad); err == nil {
			t.Fatalf("%s: SetRules accepted it", name)
		}
		if c.RulesHash() != hash {
			t.Fatalf("%s: a refused SetRules changed the rules hash", name)
		}
		d, err := c.Allow(start, "api", "k", limiter.Request{Cost: 0, HasCost: true})
		if err != nil || d.Limit != 10 {
			t.Fatalf("%s: after a refused SetRules: %+v %v, want limit 10", name, d, err)
		}
	}
	// Same rules again: same hash.
	if err := c.SetRules(rules); err != nil || c.RulesHash() != hash {
		t.Fatalf("same rules: err %v, hash changed %v", err, c.RulesHash() != hash)
	}
}

func TestSetRulesReleasesLeasesOfRemovedRule(t *testing.T) {
	start := time.UnixMilli(1_700_000_000_000)
	c := newCore(t, "n0", start, []limiter.Rule{
		{Name: "conc", Algorithm: limiter.Concurrency, Limit: 2},
		{Name: "api", Algorithm: limiter.FixedWindow, Limit: 10, Window: time.Second},
	}, nil)
	ls, d, err := c.Acquire(start, "conc", "k", "")
	if err != nil || !d.Allowed {
		t.Fatalf("acquire: %+v %v", d, err)
	}
	if err := c.SetRules([]limiter.Rule{{Name: "api", Algorithm: limiter.FixedWindow, Limit: 10, Window: time.Second}}); err != nil {
		t.Fatal(err)
	}
	if n := len(c.Leases()); n != 0 {
		t.Fatalf("%d leases left after their rule was removed", n)
	}
	if _, err := c.Renew(start, ls.ID); !errors.Is(err, node.ErrUnknownLease) {
		t.Fatalf("renew of a removed rule's lease: %v, want ErrUnknownLease", err)
	}
}

func TestHeldAndKeysCollected(t *testing.T) {
	start := time.UnixMilli(1_700_000_000_000)
	c := newCore(t, "n0", start, []limiter.Rule{{Name: "api", Algorithm: limiter.FixedWindow, Limit: 10, Window: time.Second, MaxKeys: 3}}, nil)
	for _, k := range []string{"a", "b", "c"} {
		if d, err := c.Allow(start, "api", k, limiter.Request{}); err != nil || !d.Allowed {
			t.Fatalf("allow %s: %+v %v", k, d, err)
		}
	}
	d, err := c.Allow(start, "api", "d", limiter.Request{})
	if err != nil || d.Allowed || d.Reason != limiter.ReasonKeyCap {
		t.Fatalf("a 4th key at max_keys 3: %+v %v, want denied key_cap", d, err)
	}
	if h := c.Keys(); len(h) != 1 || h[0].Keys != 3 || h[0].Windows != 3 {
		t.Fatalf("held %+v, want 3 keys, 3 windows", h)
	}
	later := start.Add(3 * time.Second)
	tick(c, start)
	tick(c, later)
	if got := c.Stats().KeysCollected; got != 3 {
		t.Fatalf("keys collected %d, want 3", got)
	}
	if d, err := c.Allow(later, "api", "d", limiter.Request{}); err != nil || !d.Allowed {
		t.Fatalf("a new key once idle keys were collected: %+v %v", d, err)
	}
}

// TestNodeMaxKeys checks the member's cap on keys over every rule
// (node.max_keys): at the cap a new key of any rule is denied key_cap,
// keys held are still decided, a peer's keys are merged past the cap
// (refusing them would lose counts), and keys come back once windows
// expire.
func TestNodeMaxKeys(t *testing.T) {
	start := time.UnixMilli(1_700_000_000_000)
	rules := []limiter.Rule{
		{Name: "a", Algorithm: limiter.FixedWindow, Limit: 10, Window: time.Second},
		{Name: "b", Algorithm: limiter.FixedWindow, Limit: 10, Window: time.Second},
		{Name: "c", Algorithm: limiter.Concurrency, Limit: 10},
	}
	capped := func(cfg *node.CoreConfig) { cfg.MaxKeys = 3 }
	c := newCore(t, "n0", start, rules, capped)
	peer := newCore(t, "n1", start, rules, nil)
	for _, rk := range [][2]string{{"a", "k1"}, {"a", "k2"}, {"b", "k1"}} {
		if d, err := c.Allow(start, rk[0], rk[1], limiter.Request{}); err != nil || !d.Allowed {
			t.Fatalf("allow %s/%s under the cap: %+v %v", rk[0], rk[1], d, err)
		}
	}
	for _, rk := range [][2]string{{"a", "k3"}, {"b", "k2"}} {
		if d, err := c.Allow(start, rk[0], rk[1], limiter.Request{}); err != nil || d.Allowed || d.Reason != limiter.ReasonKeyCap {
			t.Fatalf("a 4th key (%s/%s) at node max_keys 3: %+v %v, want denied key_cap", rk[0], rk[1], d, err)
		}
	}
	if _, d, err := c.Acquire(start, "c", "k1", ""); err != nil || d.Allowed || d.Reason != limiter.ReasonKeyCap {
		t.Fatalf("a lease of a new key at the cap: %+v %v, want denied key_cap", d, err)
	}
	if d, err := c.Allow(start, "a", "k1", limiter.Request{}); err != nil || !d.Allowed {
		t.Fatalf("a key held, at the cap: %+v %v, want allowed", d, err)
	}
	if got := c.Stats().Decisions[limiter.ReasonKeyCap]; got != 3 {
		t.Fatalf("key_cap decisions counted %d, want 3", got)
	}
	// The peer's two keys are merged although they pass the cap.
	for _, k := range []string{"p1", "p2"} {
		if d, err := peer.Allow(start, "b", k, limiter.Request{}); err != nil || !d.Allowed {
			t.Fatalf("peer allow %s: %+v %v", k, d, err)
		}
	}
	for _, b := range tick(peer, start).Messages {
		if err := c.Step(start, b); err != nil {
			t.Fatal(err)
		}
	}
	if got := total(t, c, start, "b", "p2"); got != 1 {
		t.Fatalf("the peer's key past the cap counts %d, want 1", got)
	}
	keys := 0
	for _, h := range c.Keys() {
		keys += h.Keys
	}
	if keys != 5 {
		t.Fatalf("keys held %d, want 5 (3 own, 2 merged past the cap)", keys)
	}
	later := start.Add(3 * time.Second)
	tick(c, start.Add(time.Second))
	tick(c, later)
	if d, err := c.Allow(later, "a", "k3", limiter.Request{}); err != nil || !d.Allowed {
		t.Fatalf("a new key once the windows expired: %+v %v, want allowed", d, err)
	}
}
