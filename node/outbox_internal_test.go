package node

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ratemesh/ratemesh/crdt"
	"github.com/ratemesh/ratemesh/limiter"
)

// tIn is the start of the internal tests' virtual time.
var tIn = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// windows returns n windows of rule "r", keys k0…k(n-1), in one container.
func windows(n int) []*crdt.Window {
	set := crdt.NewContainer().Rule("r")
	out := make([]*crdt.Window, n)
	for i := range out {
		out[i] = set.Ensure(string(rune('a'+i))).EnsureWindow(1000, 5)
	}
	return out
}

func TestOutboxNackedServesOnceAndRemembers(t *testing.T) {
	o := newOutbox(tIn, time.Second)
	for seq := uint64(1); seq <= 3; seq++ {
		o.remember(sentBatch{seq: seq, sent: int64(seq * 10)})
	}
	steps := []struct {
		seq       uint64
		wantFresh bool
		wantBatch uint64 // seq of the batch served; 0 for none
		wantAll   bool   // resendAll afterwards
	}{
		{2, true, 2, false},  // served
		{2, false, 0, false}, // a repeat of the same nack: ignored
		{9, true, 0, true},   // never sent (or forgotten): send everything
		{0, true, 0, true},   // seq 0 asks for everything
	}
	for i, s := range steps {
		o.resendAll = false
		nb, _, fresh := o.nacked(s.seq)
		var got uint64
		if nb != nil && fresh {
			got = nb.seq
		}
		if fresh != s.wantFresh || got != s.wantBatch || o.resendAll != s.wantAll {
			t.Fatalf("step %d: nacked(%d) = batch %d, fresh %v, resendAll %v; want %d, %v, %v", i, s.seq, got, fresh, o.resendAll, s.wantBatch, s.wantFresh, s.wantAll)
		}
	}
	// Once acknowledged and forgotten, a repeat of the nack of 2 is still
	// known as served, not taken for a batch we no longer hold.
	o.acked(100, 100)
	if len(o.ring) != 0 {
		t.Fatalf("ring holds %d after everything was acknowledged", len(o.ring))
	}
	o.resendAll = false
	if nb, _, fresh := o.nacked(2); fresh || nb == nil || o.resendAll {
		t.Errorf("a repeated nack of a forgotten batch was served again (fresh %v, resendAll %v)", fresh, o.resendAll)
	}
}

func TestOutboxNackedMemoryIsBounded(t *testing.T) {
	o := newOutbox(tIn, time.Second)
	for seq := uint64(1); seq <= nackedMemory+10; seq++ {
		o.remember(sentBatch{seq: seq})
		if _, _, fresh := o.nacked(seq); !fresh {
			t.Fatalf("first nack of %d not served", seq)
		}
	}
	if len(o.nackedSeqs) != nackedMemory || o.nackedSeqs[0].seq != 11 {
		t.Errorf("nackedSeqs holds %d from %d, want %d from 11", len(o.nackedSeqs), o.nackedSeqs[0].seq, nackedMemory)
	}
}

func TestOutboxRingIsBounded(t *testing.T) {
	o := newOutbox(tIn, time.Second)
	for seq := uint64(1); seq <= ringCap+5; seq++ {
		o.remember(sentBatch{seq: seq})
	}
	if len(o.ring) != ringCap || o.ring[0].seq != 6 || o.ring[len(o.ring)-1].seq != ringCap+5 {
		t.Errorf("ring holds %d, seqs %d…%d; want %d, 6…%d", len(o.ring), o.ring[0].seq, o.ring[len(o.ring)-1].seq, ringCap, ringCap+5)
	}
}

// TestOutboxAckedMarksAcknowledged checks acked: the batches sent by the
// frontier count as acknowledged, except a nacked one, and a later batch
// waits; Acked never goes down.
func TestOutboxAckedMarksAcknowledged(t *testing.T) {
	ws := windows(3)
	ws[2].Acked = 9
	series := ws[0].Series()
	o := newOutbox(tIn, time.Second)
	o.remember(sentBatch{seq: 1, sent: 100, wins: []sentWin{{ws[0], 4}, {ws[2], 5}}, leases: []sentLease{{series, 2}}})
	o.remember(sentBatch{seq: 2, sent: 110, wins: []sentWin{{ws[1], 7}}})
	o.remember(sentBatch{seq: 3, sent: 120, wins: []sentWin{{ws[0], 6}}})
	if _, _, fresh := o.nacked(2); !fresh {
		t.Fatal("nack of 2 not served")
	}
	o.acked(110, 110)
	if got := []uint64{ws[0].Acked, ws[1].Acked, ws[2].Acked}; !slices.Equal(got, []uint64{4, 0, 9}) {
		t.Errorf("Acked after frontier 110 = %v, want [4 0 9] (2 was nacked; 9 never lowers)", got)
	}
	if series.Leases().Acked != 2 {
		t.Errorf("Leases().Acked = %d, want 2", series.Leases().Acked)
	}
	if len(o.ring) != 1 || o.ring[0].seq != 3 {
		t.Fatalf("ring after frontier 110 holds %v, want batch 3 only", o.ring)
	}
	o.acked(120, 120)
	if ws[0].Acked != 6 || len(o.ring) != 0 {
		t.Errorf("after frontier 120: Acked %d, ring %d; want 6, 0", ws[0].Acked, len(o.ring))
	}
}

// TestOutboxRepairSet checks the repair set: what was published since the
// last repair and is not in this batch anyway (dirty), sorted, then nothing.
func TestOutboxRepairSet(t *testing.T) {
	c := crdt.NewContainer()
	set := c.Rule("r")
	var ws []*crdt.Window
	for i := range 4 {
		ws = append(ws, set.Ensure(string(rune('a'+i))).EnsureWindow(1000, 5))
	}
	o := newOutbox(tIn, time.Second)
	o.published([]*crdt.Window{ws[3], ws[1], ws[0], ws[1]}, []*crdt.Series{ws[2].Series()})
	if len(o.changed) != 3 {
		t.Fatalf("published a window twice: changed holds %d, want 3", len(o.changed))
	}
	c.MarkDirty(ws[1]) // this flush's own
	o.startRepair(time.Second, 100*time.Millisecond)
	if wins := o.takeRepair(nil, 0, 0); !slices.Equal(wins, []*crdt.Window{ws[0], ws[3]}) {
		t.Errorf("repair windows = %v, want a, d (b goes out fresh)", keysOf(wins))
	}
	if ls := o.repairLeases(nil); len(ls) != 1 || ls[0] != ws[2].Series() {
		t.Errorf("repair lease counters = %d, want c's", len(ls))
	}
	c.TakeDirty()
	o.published([]*crdt.Window{ws[1]}, nil) // the repair cleared b's mark: it queues again
	o.startRepair(time.Second, 100*time.Millisecond)
	if wins := o.takeRepair(nil, 0, 0); !slices.Equal(wins, []*crdt.Window{ws[1]}) {
		t.Errorf("second repair = %v, want b", keysOf(wins))
	}
	o.startRepair(time.Second, 100*time.Millisecond)
	if wins, ls := o.takeRepair(nil, 0, 0), o.repairLeases(nil); len(wins)+len(ls) != 0 {
		t.Errorf("a third repair with nothing published repeats %d values", len(wins)+len(ls))
	}
}

// TestOutboxRepairLeavesExpired: a window expired by the time the repair
// goes out is left out of it (every member has collected it or drops it),
// so what a repair repeats does not pile up over a run.
func TestOutboxRepairLeavesExpired(t *testing.T) {
	set := crdt.NewContainer().Rule("r")
	old, cur := set.Ensure("a").EnsureWindow(1000, 5), set.Ensure("b").EnsureWindow(1000, 6)
	o := newOutbox(tIn, time.Second)
	o.published([]*crdt.Window{old, cur}, nil)
	o.startRepair(time.Second, 100*time.Millisecond)
	if wins := o.takeRepair(nil, 0, old.CollectAt()); !slices.Equal(wins, []*crdt.Window{cur}) {
		t.Errorf("repair at a's expiry = %v, want b only", keysOf(wins))
	}
}

// TestOutboxRepairSlices checks that a repair of more windows than a
// flush sends goes out in slices, each sorted, all within one repair
// interval of syncs, every window once.
func TestOutboxRepairSlices(t *testing.T) {
	set := crdt.NewContainer().Rule("r")
	const n = 10 * repairSlice
	var ws []*crdt.Window
	for i := range n {
		ws = append(ws, set.Ensure(fmt.Sprintf("k%06d", n-i)).EnsureWindow(1000, 5))
	}
	o := newOutbox(tIn, time.Second)
	o.published(ws, nil)
	o.startRepair(time.Second, 200*time.Millisecond) // 5 syncs per repair
	seen := make(map[*crdt.Window]bool)
	flushes := 0
	for len(seen) < n && flushes < 10 {
		part := o.takeRepair(nil, 0, 0)
		flushes++
		if len(part) > n/5+1 {
			t.Fatalf("flush %d sent %d windows, want at most %d", flushes, len(part), n/5+1)
		}
		if !slices.IsSortedFunc(part, func(a, b *crdt.Window) int { return strings.Compare(a.Series().Key, b.Series().Key) }) {
			t.Fatalf("flush %d's slice is not sorted", flushes)
		}
		for _, w := range part {
			if seen[w] {
				t.Fatalf("window %s repaired twice", w.Series().Key)
			}
			seen[w] = true
		}
	}
	if len(seen) != n || flushes != 5 {
		t.Errorf("repaired %d of %d windows in %d flushes, want all in 5", len(seen), n, flushes)
	}
	if o.repairing != nil {
		t.Errorf("a finished repair keeps its array (%d)", cap(o.repairing))
	}
}

func keysOf(ws []*crdt.Window) []string {
	out := make([]string, len(ws))
	for i, w := range ws {
		out[i] = w.Series().Key
	}
	return out
}

// TestOutboxAckDelay: the acknowledgement delay of batches with entries
// is believed quickly when it grows and forgotten slowly when it
// shrinks; batches without entries, acknowledged at heartbeats, do not
// count. It stretches the default hold, never a set share_wait.
func TestOutboxAckDelay(t *testing.T) {
	o := newOutbox(tIn, time.Second)
	w := windows(1)[0]
	send := func(seq uint64, sent int64, entries bool) {
		sb := sentBatch{seq: seq, sent: sent}
		if entries {
			sb.wins = []sentWin{{w: w, v: seq}}
		}
		o.remember(sb)
	}
	send(1, 1000, true)
	o.acked(1000, 1200) // 200 ms: half of it at once
	if got := o.ackDelay(); got != 100*time.Millisecond {
		t.Fatalf("after one 200 ms acknowledgement: %v, want 100ms", got)
	}
	send(2, 2000, false)
	o.acked(2000, 4000) // an idle heartbeat acknowledged late: not counted
	if got := o.ackDelay(); got != 100*time.Millisecond {
		t.Fatalf("a batch without entries moved it to %v", got)
	}
	send(3, 5000, true)
	o.acked(5000, 5020) // 20 ms: down by an eighth of the difference
	if got := o.ackDelay(); got != 90*time.Millisecond {
		t.Fatalf("after a 20 ms acknowledgement: %v, want 90ms", got)
	}

	cfg := DefaultCoreConfig()
	cfg.Peer, cfg.Incarnation = "a", NextIncarnation(0, tIn)
	cfg.Rules = []limiter.Rule{{Name: "api", Algorithm: limiter.FixedWindow, Limit: 10, Window: time.Second},
		{Name: "set", Algorithm: limiter.FixedWindow, Limit: 10, Window: time.Second, ShareWait: 50 * time.Millisecond}}
	c, err := NewCore(cfg, tIn)
	if err != nil {
		t.Fatal(err)
	}
	if got := c.ShareWait("api"); got != 200*time.Millisecond {
		t.Errorf("default hold on a quiet mesh: %v, want 200ms", got)
	}
	c.out.ackMs = 150
	if got := c.ShareWait("api"); got != 600*time.Millisecond {
		t.Errorf("default hold with acknowledgements of 150 ms: %v, want 600ms", got)
	}
	if got := c.ShareWait("set"); got != 50*time.Millisecond {
		t.Errorf("a set share_wait with acknowledgements of 150 ms: %v, want 50ms", got)
	}
}
