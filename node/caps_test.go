package node_test

import (
	"slices"
	"testing"
	"time"

	"github.com/ratemesh/ratemesh/crdt"
	"github.com/ratemesh/ratemesh/limiter"
	"github.com/ratemesh/ratemesh/node"
)

// The capability flags of the releases a rolling upgrade mixes
// (docs/design.md, "Wire compatibility").
const (
	flagsThis    = crdt.FlagEcho | crdt.FlagRepairs | crdt.FlagSkipsUnknown // this release: skips unknown fields
	flags821b92d = crdt.FlagEcho | crdt.FlagRepairs                         // decodes Members and Repairs, relays; refuses anything newer
	flagsFdd4fa5 = crdt.FlagEcho                                            // refuses Members and Repairs, never relays
)

var capsRules = []limiter.Rule{{Name: "api", Algorithm: limiter.FixedWindow, Limit: 1000, Window: time.Minute}}

// heartbeatOf is a bare gossip batch of peer's announcing flags.
func heartbeatOf(peer string, seq uint64, now time.Time, flags uint64) *crdt.Batch {
	return &crdt.Batch{Version: crdt.Version, From: crdt.Slot{Peer: peer, Incarnation: 1}, Seq: seq,
		Sent: now.UnixMilli(), Clock: now.UnixMilli(), Flags: flags}
}

// TestEveryBatchAnnouncesCapabilities: gossip, a full state, a relay and a
// leave all carry FlagSkipsUnknown beside FlagEcho and FlagRepairs, and
// Peers reports them for self.
func TestEveryBatchAnnouncesCapabilities(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	c := newCore(t, "a", now, capsRules, nil)
	if err := c.Step(now, heartbeatOf("b", 1, now, flagsThis|crdt.FlagFull|crdt.FlagWant|crdt.FlagLast)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Allow(now, "api", "k", limiter.Request{}); err != nil {
		t.Fatal(err)
	}
	var all []*crdt.Batch
	all = append(all, fullState(t, c, now, "b")...)
	rd := tick(c, now.Add(time.Second))
	all = append(all, rd.Messages...)
	for _, d := range rd.Direct {
		all = append(all, d.Batches...)
	}
	all = append(all, leave(c, now.Add(2*time.Second)).Messages...)
	var relays, leaves, gossip int
	for _, b := range all {
		if b.Flags&flagsThis != flagsThis {
			t.Errorf("batch seq %d flags %#x: want %#x set", b.Seq, b.Flags, flagsThis)
		}
		switch {
		case b.Has(crdt.FlagRelay):
			relays++
		case b.Has(crdt.FlagLeaving):
			leaves++
		case !b.Has(crdt.FlagFull):
			gossip++
		}
	}
	if relays == 0 || leaves == 0 || gossip == 0 {
		t.Errorf("%d relays, %d leaves, %d other gossip batches: want each", relays, leaves, gossip)
	}
	for _, p := range c.Peers(now) {
		if p.Self && p.Flags != flagsThis {
			t.Errorf("self's flags %#x, want %#x", p.Flags, flagsThis)
		}
	}
}

// TestMemberTableOnlyToPeersThatDecodeIt: a full state carries the member
// table to the peers whose batches announced FlagRepairs or
// FlagSkipsUnknown (this release, 821b92d), and leaves it out for a peer
// of fdd4fa5 (FlagEcho alone: it refuses the table as an unknown field)
// and a peer not heard from yet, in a Direct of their own. A relay goes
// to the peers that asked, each with the table only if it decodes it.
func TestMemberTableOnlyToPeersThatDecodeIt(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	c := newCore(t, "a", now, capsRules, nil)
	for _, p := range []struct {
		peer  string
		flags uint64
	}{{"this", flagsThis}, {"old", flags821b92d}, {"older", flagsFdd4fa5}} {
		if err := c.Step(now, heartbeatOf(p.peer, 1, now, p.flags)); err != nil {
			t.Fatal(err)
		}
	}
	tables := func(ds []node.Direct) map[string]int {
		got := map[string]int{}
		for _, d := range ds {
			n := 0
			for _, b := range d.Batches {
				n += len(b.Members)
				if err := b.Validate(); err != nil {
					t.Errorf("to %v: %v", d.To, err)
				}
			}
			for _, p := range d.To {
				if _, dup := got[p]; dup {
					t.Errorf("%s gets two full states", p)
				}
				got[p] = n
			}
		}
		return got
	}
	rd := antiEntropy(c, now, "this", "old", "older", "unheard")
	want := map[string]int{"this": 3, "old": 3, "older": 0, "unheard": 0}
	if got := tables(rd.Direct); !mapsEqual(got, want) {
		t.Errorf("member table entries per peer: %v, want %v", got, want)
	}
	if len(rd.Direct) != 2 || !slices.Equal(rd.Direct[0].To, []string{"this", "old"}) {
		t.Errorf("Directs to %v, want [this old] then [older unheard]", directsTo(rd.Direct))
	}
	// Each asks for a relay; the relay follows the same split.
	for _, p := range []struct {
		peer  string
		flags uint64
	}{{"this", flagsThis}, {"old", flags821b92d}, {"older", flagsFdd4fa5}} {
		if err := c.Step(now, heartbeatOf(p.peer, 0, now, p.flags|crdt.FlagFull|crdt.FlagWant|crdt.FlagLast)); err != nil {
			t.Fatal(err)
		}
	}
	want = map[string]int{"this": 3, "old": 3, "older": 0}
	if got := tables(tick(c, now.Add(20*time.Millisecond)).Direct); !mapsEqual(got, want) {
		t.Errorf("relay: member table entries per peer: %v, want %v", got, want)
	}
	flags := map[string]uint64{}
	for _, p := range c.Peers(now) {
		flags[p.Peer] = p.Flags
	}
	if flags["this"] != flagsThis || flags["old"] != flags821b92d || flags["older"] != flagsFdd4fa5 {
		t.Errorf("Peers' flags %v", flags)
	}
}

func mapsEqual(a, b map[string]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

func directsTo(ds []node.Direct) [][]string {
	var out [][]string
	for _, d := range ds {
		out = append(out, d.To)
	}
	return out
}

// TestJoinerWaitsForARelay: a joiner is ready once the relay of each peer
// it connected to has arrived, whatever the peer's release; a peer of a
// release that never relays (fdd4fa5: FlagEcho alone) costs it its
// join_timeout. Taking that peer's plain full state as its answer instead
// made joins among fdd4fa5 nodes immediate, and their restart windows
// admit 1.15–1.27 × the limit in the starvation harness: the full state
// holds the peer's own slots only, not the joiner's earlier incarnation's
// last admissions nor the dead slots, which a relay would carry. Waiting
// out join_timeout kept every 1 s window within the bound.
func TestJoinerWaitsForARelay(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	full := func(peer string, flags uint64) *crdt.Batch {
		b := heartbeatOf(peer, 1, now, flags|crdt.FlagFull|crdt.FlagLast)
		b.Windows = []crdt.WindowEntry{{Rule: "api", Key: "k", WindowMs: time.Minute.Milliseconds(),
			Window: now.UnixMilli() / time.Minute.Milliseconds(), Admitted: 40, Attempted: 40}}
		return b
	}
	for _, tt := range []struct {
		name  string
		flags uint64
		relay bool // the peer's release relays
	}{
		{"fdd4fa5", flagsFdd4fa5, false},
		{"821b92d", flags821b92d, true},
		{"this release", flagsThis, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			j := newCore(t, "j", now, capsRules, func(c *node.CoreConfig) { c.Join = true })
			j.ExpectState("p")
			if err := j.Step(now, full("p", tt.flags)); err != nil {
				t.Fatal(err)
			}
			if j.Joined() {
				t.Fatal("ready on the peer's plain full state")
			}
			if got := total(t, j, now, "api", "k"); got != 40 {
				t.Errorf("the joiner counts %d, want the peer's 40", got)
			}
			at := now.Add(time.Millisecond)
			if tt.relay {
				r := full("p", tt.flags)
				r.Flags |= crdt.FlagRelay
				if err := j.Step(at, r); err != nil {
					t.Fatal(err)
				}
			} else {
				at = now.Add(node.DefaultCoreConfig().JoinTimeout)
				if tick(j, at.Add(-time.Millisecond)); j.Joined() {
					t.Fatal("ready before join_timeout without a relay")
				}
			}
			if rd := tick(j, at); !j.Joined() || rd.JoinTimedOut == tt.relay {
				t.Errorf("after the relay or join_timeout: ready %v, timed out %v; want ready, timed out %v", j.Joined(), rd.JoinTimedOut, !tt.relay)
			}
		})
	}
}
