package node

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/ratemesh/ratemesh/crdt"
	"github.com/ratemesh/ratemesh/limiter"
)

// TestSetUpScalesEveryDecision checks that every decision path takes its
// env from setUp, with a reclaim's scale applied: a lottery loser's
// forward (lotteryPeers) as much as a decision. A limit of 1 over two
// members gives each a share of half a request, so the lottery decides
// an idle key; kept at a scale of 0.5 the limit has no room for it, and
// no peer is asked.
func TestSetUpScalesEveryDecision(t *testing.T) {
	cfg := DefaultCoreConfig()
	cfg.Peer, cfg.Incarnation = "a", NextIncarnation(0, tIn)
	cfg.Rules = []limiter.Rule{{Name: "one", Algorithm: limiter.FixedWindow, Limit: 1, Window: time.Minute}}
	c, err := NewCore(cfg, tIn)
	if err != nil {
		t.Fatal(err)
	}
	now := tIn.Add(30 * time.Second) // well into a window that began before now
	b := &crdt.Batch{Version: crdt.Version, From: crdt.Slot{Peer: "b", Incarnation: 1}, Seq: 1, Sent: now.UnixMilli(), Clock: now.UnixMilli(), Flags: announced}
	if err := c.Step(now, b); err != nil {
		t.Fatal(err)
	}
	tick(c, now)
	if c.gated || !c.join.joined || c.members.n != 2 {
		t.Fatalf("gated %v joined %v members %d, want a joined member of two", c.gated, c.join.joined, c.members.n)
	}
	// A key whose draw here refuses it, so that the other member would
	// be asked.
	var key string
	for i := range 100 {
		k := fmt.Sprint("k", i)
		if slices.Equal(c.lotteryPeers(now, "one", k, &limiter.Request{}, false), []string{"b"}) {
			key = k
			break
		}
	}
	if key == "" {
		t.Fatal("no key among 100 whose lottery picks the other member")
	}
	c.reclaimScale.start(c.MeshMs(now), 0.5)
	var s setup
	if err := c.setUp(&s, now, "one", key, &limiter.Request{}, false); err != nil {
		t.Fatal(err)
	}
	if s.env.Scale != 0.5 {
		t.Errorf("setUp under the kept scale: scale %v, want 0.5", s.env.Scale)
	}
	if peers := c.lotteryPeers(now, "one", key, &limiter.Request{}, false); peers != nil {
		t.Errorf("lotteryPeers under the kept scale = %v, want none: the scaled limit has no room", peers)
	}
	if d, err := c.Allow(now, "one", key, limiter.Request{}); err != nil || d.Allowed || d.Reason != limiter.ReasonLimit {
		t.Errorf("Allow under the kept scale = %+v %v, want denied for the limit", d, err)
	}
}
