package node

import (
	"fmt"
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
		c := newRepairCore(t)
		if _, err := c.Allow(tIn, "api", "k", limiter.Request{}); err != nil {
			t.Fatal(err)
		}
		first := c.flush(tIn, 0)
		if len(first) != 1 || len(first[0].Windows) != 1 {
			t.Fatalf("first batches %+v, want one with one window entry", first)
		}
		c.nacked(first[0].Seq, 7)
		c.clock.common = 0
		if readable {
			c.clock.common = capRepairs
		}
		out := c.flush(tIn.Add(c.cfg.SyncInterval), 0)
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

// newRepairCore is a core of peer a with one hour-long fixed window rule
// "api", reading repair tags.
func newRepairCore(t *testing.T) *Core {
	t.Helper()
	cfg := DefaultCoreConfig()
	cfg.Peer, cfg.Incarnation = "a", NextIncarnation(0, tIn)
	cfg.Rules = []limiter.Rule{{Name: "api", Algorithm: limiter.FixedWindow, Limit: 1 << 40, Window: time.Hour}}
	c, err := NewCore(cfg, tIn)
	if err != nil {
		t.Fatal(err)
	}
	c.clock.common = capRepairs
	return c
}

// TestRepairGroupNeverSplit: a nacked batch of 1500 entries, repaired
// with 1000 fresh entries, goes out whole in a batch of its own: a
// receiver that merged half a group would take the batch for merged and
// skip the other half.
func TestRepairGroupNeverSplit(t *testing.T) {
	c := newRepairCore(t)
	allow := func(from, to int) {
		for i := from; i < to; i++ {
			if _, err := c.Allow(tIn, "api", fmt.Sprint("k", i), limiter.Request{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	allow(0, 1500)
	x := c.flush(tIn, 0)
	if len(x) != 1 || len(x[0].Windows) != 1500 {
		t.Fatalf("first flush: %d batches, want one of 1500 entries", len(x))
	}
	c.nacked(x[0].Seq, 7)
	allow(1500, 2500)
	out := c.flush(tIn.Add(time.Second), 0)
	tagged := 0
	for i, b := range out {
		if err := b.Validate(); err != nil {
			t.Fatalf("batch %d: %v", i, err)
		}
		for _, r := range b.Repairs {
			if r.Seq != x[0].Seq || r.N != 1500 {
				t.Errorf("batch %d repairs %d entries of batch %d, want all 1500 of %d", i, r.N, r.Seq, x[0].Seq)
			}
			tagged += int(r.N)
		}
	}
	if len(out) != 2 || tagged != 1500 || out[0].Fresh() != 1000 {
		t.Errorf("%d batches with %d tagged entries, the first with %d fresh; want 2, 1500, 1000", len(out), tagged, out[0].Fresh())
	}
}

// TestRepairAcknowledgesTheRepairedValue: a repeat carries the current
// value, but counts as acknowledged only up to the value the repaired
// batch carried. A member that merged that batch skips the repeat, and
// may have lost the later batch that raised the value.
func TestRepairAcknowledgesTheRepairedValue(t *testing.T) {
	c := newRepairCore(t)
	for i := range 2 {
		if _, err := c.Allow(tIn, "api", "k", limiter.Request{}); err != nil {
			t.Fatal(err)
		}
		if out := c.flush(tIn.Add(time.Duration(i)*time.Second), 0); len(out) != 1 || out[0].Windows[0].Admitted != uint64(i+1) {
			t.Fatalf("flush %d: %+v, want k at %d", i, out, i+1)
		}
	}
	c.nacked(1, 7) // batch 1 carried k = 1; batch 2 k = 2
	out := c.flush(tIn.Add(2*time.Second), 0)
	if len(out) != 1 || len(out[0].Repairs) != 1 || out[0].Windows[0].Admitted != 2 {
		t.Fatalf("repair batches %+v, want one carrying k = 2 tagged", out)
	}
	sb := c.out.ring[len(c.out.ring)-1]
	if sb.seq != out[0].Seq || len(sb.copies) != 1 || len(sb.copies[0].wins) != 1 || sb.copies[0].wins[0].v != 1 {
		t.Errorf("the repair is remembered as %+v, want k acknowledged up to 1", sb)
	}
}

// TestRepairRepeatsOnlyForItsMembers: a repair goes out again only when a
// member that nacked the repaired batch loses the batch carrying the
// repair too, and again tagged as the repair of the first batch. A
// member that merged the first batch skips the repair, so its loss costs
// nothing: repeating it for any nack made every repair last as long as
// someone lost each copy, for ever at 1 % loss over a thousand members.
func TestRepairRepeatsOnlyForItsMembers(t *testing.T) {
	const x, y = crdt.SlotID(7), crdt.SlotID(8)
	c := newRepairCore(t)
	if _, err := c.Allow(tIn, "api", "k", limiter.Request{}); err != nil {
		t.Fatal(err)
	}
	first := c.flush(tIn, 0)
	c.nacked(first[0].Seq, x)
	at := tIn
	next := func() []*crdt.Batch {
		at = at.Add(c.cfg.SyncInterval)
		return c.flush(at, 0)
	}
	rep := next()
	if len(rep) != 1 || !slices.Equal(rep[0].Repairs, []crdt.Repair{{Seq: first[0].Seq, N: 1}}) {
		t.Fatalf("repair batches %+v, want one repairing batch %d", rep, first[0].Seq)
	}
	c.nacked(rep[0].Seq, y) // y merged the first batch: it needs nothing
	for _, b := range next() {
		if len(b.Repairs) > 0 {
			t.Fatalf("y's nack of the repair published %v again; y merged batch %d", b.Repairs, first[0].Seq)
		}
	}
	c.nacked(rep[0].Seq, x) // x lost both
	c.nacked(rep[0].Seq, x) // a repeat of x's nack
	again := next()
	if len(again) != 1 || !slices.Equal(again[0].Repairs, []crdt.Repair{{Seq: first[0].Seq, N: 1}}) {
		t.Fatalf("after x's nack of the repair: %+v, want one batch repairing batch %d once", again, first[0].Seq)
	}
	w := c.out.ring[0].wins[0].w
	c.out.acked(rep[0].Sent, rep[0].Sent)
	if w.Acked != 0 {
		t.Errorf("k acknowledged up to %d through a repair x lost, want 0", w.Acked)
	}
	c.out.acked(again[0].Sent, again[0].Sent)
	if w.Acked != 1 {
		t.Errorf("k acknowledged up to %d through the repair's second copy, want 1", w.Acked)
	}
}

// TestRepairEndsAtExpiry: a nacked batch's windows are not published
// again once expired: every member has collected them or drops them.
func TestRepairEndsAtExpiry(t *testing.T) {
	c := newRepairCore(t)
	if _, err := c.Allow(tIn, "api", "k", limiter.Request{}); err != nil {
		t.Fatal(err)
	}
	first := c.flush(tIn, 0)
	c.nacked(first[0].Seq, 7)
	late := tIn.Add(3 * time.Hour) // the rule's window is an hour
	for _, b := range c.flush(late, 0) {
		if len(b.Windows) > 0 || len(b.Repairs) > 0 {
			t.Errorf("batch %d at expiry carries %d window entries, repairs %v; want none", b.Seq, len(b.Windows), b.Repairs)
		}
	}
}
