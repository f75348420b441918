package node

import (
	"slices"
	"testing"
	"time"

	"github.com/ratemesh/ratemesh/crdt"
	"github.com/ratemesh/ratemesh/limiter"
)

// TestRepairTagsNeedEveryMember serves a nack of our batch: tagged as its
// repair while every live member reads tags, untagged when, between the
// nack and the next batch, a member that cannot read them turned up (it
// would refuse the whole batch).
func TestRepairTagsNeedEveryMember(t *testing.T) {
	for _, readable := range []bool{true, false} {
		cfg := DefaultCoreConfig()
		cfg.Peer, cfg.Incarnation = "a", NextIncarnation(0, tIn)
		cfg.Rules = []limiter.Rule{{Name: "api", Algorithm: limiter.FixedWindow, Limit: 100, Window: time.Hour}}
		c, err := NewCore(cfg, tIn)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Allow(tIn, "api", "k", limiter.Request{}); err != nil {
			t.Fatal(err)
		}
		first := c.flush(tIn, 0)
		if len(first) != 1 || len(first[0].Windows) != 1 {
			t.Fatalf("first batches %+v, want one with one window entry", first)
		}
		c.clock.repairOK = true
		c.nacked(first[0].Seq)
		c.clock.repairOK = readable
		out := c.flush(tIn.Add(cfg.SyncInterval), 0)
		if len(out) != 1 || len(out[0].Windows) != 1 || out[0].Windows[0].Key != "k" {
			t.Fatalf("readable %v: batches %+v, want one carrying k again", readable, out)
		}
		want := []crdt.Repair{{Seq: first[0].Seq, N: 1}}
		if !readable {
			want = nil
		}
		if got := out[0].Repairs; !slices.Equal(got, want) {
			t.Errorf("readable %v: repairs %v, want %v", readable, got, want)
		}
		if err := out[0].Validate(); err != nil {
			t.Errorf("readable %v: %v", readable, err)
		}
	}
}
