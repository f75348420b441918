package node

import (
	"testing"
	"time"

	"github.com/ratemesh/ratemesh/crdt"
	"github.com/ratemesh/ratemesh/limiter"
)

// TestCommonCaps: what gossip may carry is what every live member
// announced. A member of an older release (no FlagSkipsUnknown) lowers
// it at once, and it rises again once that member has left.
func TestCommonCaps(t *testing.T) {
	cfg := DefaultCoreConfig()
	cfg.Peer, cfg.Incarnation = "a", NextIncarnation(0, tIn)
	cfg.Rules = []limiter.Rule{{Name: "api", Algorithm: limiter.FixedWindow, Limit: 100, Window: time.Second}}
	c, err := NewCore(cfg, tIn)
	if err != nil {
		t.Fatal(err)
	}
	now := tIn
	step := func(peer string, flags uint64) {
		t.Helper()
		b := &crdt.Batch{Version: crdt.Version, From: crdt.Slot{Peer: peer, Incarnation: 1}, Seq: 1, Sent: now.UnixMilli(), Clock: now.UnixMilli(), Flags: flags}
		if err := c.Step(now, b); err != nil {
			t.Fatal(err)
		}
	}
	step("b", announced)
	tick(c, now)
	if !c.clock.all(capsOf(announced)) {
		t.Fatalf("common %#x with every member of this release, want %#x", c.clock.common, capsOf(announced))
	}
	step("old", crdt.FlagEcho|crdt.FlagRepairs)
	if c.clock.all(capSkips) || !c.clock.all(capEcho|capRepairs) {
		t.Errorf("common %#x after a batch of 821b92d's, want echo and repairs without skips", c.clock.common)
	}
	now = now.Add(cfg.Heartbeat)
	tick(c, now)
	if c.clock.all(capSkips) {
		t.Errorf("common %#x a heartbeat later, want no skips while the old member is live", c.clock.common)
	}
	step("old", crdt.FlagEcho|crdt.FlagRepairs|crdt.FlagLeaving)
	now = now.Add(cfg.Heartbeat)
	tick(c, now)
	if !c.clock.all(capSkips) {
		t.Errorf("common %#x once the old member left, want skips again", c.clock.common)
	}
}
