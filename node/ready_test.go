package node_test

import (
	"reflect"
	"testing"
	"time"

	"github.com/ratemesh/ratemesh/limiter"
	"github.com/ratemesh/ratemesh/node"
)

// TestCoreReadyGathersAndHandsOverOnce checks the one hand-off: inputs
// return nothing, their outputs gather until Ready, which hands them over
// together and forgets them.
func TestCoreReadyGathersAndHandsOverOnce(t *testing.T) {
	start := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	sync := node.DefaultCoreConfig().SyncInterval
	c := newCore(t, "a", start, []limiter.Rule{fixedRule("api", 100, time.Hour)}, nil)
	if c.HasReady() {
		t.Fatalf("HasReady() = true before any input; Ready() = %+v", c.Ready())
	}

	c.Tick(start) // the first sync is due at once
	if !c.HasReady() {
		t.Fatal("HasReady() = false after a Tick that published")
	}
	if _, err := c.Allow(start, "api", "k", limiter.Request{}); err != nil {
		t.Fatal(err)
	}
	at := start.Add(time.Millisecond)
	c.Flush(at)                 // the decision, ahead of the sync
	c.AntiEntropy(at, "b")      // a full state for a new connection
	c.Tick(at.Add(time.Second)) // a heartbeat
	rd := c.Ready()
	if len(rd.Messages) != 3 {
		t.Fatalf("Ready after Tick, Flush, AntiEntropy, Tick: %d messages, want 3 (two ticks' and the flush's)", len(rd.Messages))
	}
	for i := 1; i < len(rd.Messages); i++ {
		if rd.Messages[i].Seq != rd.Messages[i-1].Seq+1 {
			t.Fatalf("messages out of order: seq %d after %d", rd.Messages[i].Seq, rd.Messages[i-1].Seq)
		}
	}
	if w := rd.Messages[1].Windows; len(w) != 1 || w[0].Key != "k" || w[0].Admitted != 1 {
		t.Errorf("the flush's batch carries %+v, want k admitted 1", w)
	}
	if len(rd.Direct) != 1 || !reflect.DeepEqual(rd.Direct[0].To, []string{"b"}) {
		t.Errorf("Direct = %+v, want one full state to b", rd.Direct)
	}
	if want := at.Add(time.Second).Add(sync); !rd.NextTick.Equal(want) {
		t.Errorf("NextTick = %v, want the last Tick's, %v", rd.NextTick, want)
	}

	if c.HasReady() {
		t.Fatalf("HasReady() = true after Ready; Ready() = %+v", c.Ready())
	}
	if again := c.Ready(); !reflect.DeepEqual(again, node.Ready{}) {
		t.Fatalf("a second Ready = %+v, want the zero Ready", again)
	}
	// An input that has nothing to say adds nothing.
	c.Flush(at.Add(time.Second))
	c.AntiEntropy(at)
	if c.HasReady() {
		t.Fatalf("HasReady() = true after a Flush with nothing pending and an AntiEntropy to no peer; Ready() = %+v", c.Ready())
	}
}
