package node_test

import (
	"errors"
	"testing"
	"time"

	"github.com/ratemesh/ratemesh/limiter"
	"github.com/ratemesh/ratemesh/node"
)

func persistRules() []limiter.Rule {
	return []limiter.Rule{
		{Name: "hour", Algorithm: limiter.FixedWindow, Limit: 10, Window: time.Hour},
		{Name: "sec", Algorithm: limiter.FixedWindow, Limit: 10, Window: time.Second},
		{Name: "cc", Algorithm: limiter.Concurrency, Limit: 5, LeaseTTL: time.Minute},
	}
}

func mustAllow(t *testing.T, c *node.Core, now time.Time, rule, key string, n int) (admitted int) {
	t.Helper()
	for range n {
		d, err := c.Allow(now, rule, key, limiter.Request{})
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed {
			admitted++
		}
	}
	return admitted
}

// exchange publishes from's due batches to to.
func exchange(t *testing.T, from, to *node.Core, now time.Time) {
	t.Helper()
	for _, b := range tick(from, now).Messages {
		if err := to.Step(now, b); err != nil {
			t.Fatal(err)
		}
	}
}

func TestPersisterExportRestore(t *testing.T) {
	now := t0.Add(10 * time.Minute)
	a := newCore(t, "a", now, persistRules(), nil)
	b := newCore(t, "b", now, persistRules(), nil)
	node.NewPersister(a, time.Minute)
	mustAllow(t, a, now, "hour", "k", 4)
	mustAllow(t, a, now, "sec", "k", 4) // too short to persist
	mustAllow(t, b, now, "hour", "k", 3)
	exchange(t, b, a, now)

	f := persistOf(a, now)
	if f.CollectBeforeMs != now.UnixMilli() {
		t.Errorf("CollectBeforeMs = %d, want %d", f.CollectBeforeMs, now.UnixMilli())
	}
	node.SortWindowRecords(f.Windows)
	win := now.UnixMilli() / time.Hour.Milliseconds()
	want := []node.WindowRecord{
		{Rule: "hour", Key: "k", WindowMs: time.Hour.Milliseconds(), Window: win, Slot: a.Self(), Admitted: 4, Attempted: 4},
		{Rule: "hour", Key: "k", WindowMs: time.Hour.Milliseconds(), Window: win, Slot: b.Self(), Admitted: 3, Attempted: 3},
	}
	if len(f.Windows) != 2 || f.Windows[0] != want[0] || f.Windows[1] != want[1] {
		t.Fatalf("Export windows = %+v, want %+v", f.Windows, want)
	}
	a.Persisted(&f, nil)
	if f2 := persistOf(a, now.Add(time.Second)); !f2.Empty() {
		t.Errorf("second Export without changes = %+v, want empty", f2)
	}
	if st := a.Stats(); st.PersistFlushes != 1 || st.PersistEntries != 2 || st.PersistErrors != 0 {
		t.Errorf("stats flushes %d entries %d errors %d, want 1 2 0", st.PersistFlushes, st.PersistEntries, st.PersistErrors)
	}

	// A restart: a new incarnation, the merged state back, no double
	// counting, and the limit of 10 holds across it.
	later := now.Add(2 * time.Second)
	a2 := newCore(t, "a", later, persistRules(), func(cfg *node.CoreConfig) {
		cfg.Incarnation = node.NextIncarnation(a.Self().Incarnation, later)
	})
	p2 := node.NewPersister(a2, time.Minute)
	st := p2.Restore(later, f.Windows, nil)
	if st.Windows != 2 || st.SkippedWindows != 0 {
		t.Errorf("Restore = %+v, want 2 windows", st)
	}
	rep, err := a2.Usage(later, "hour", "k")
	if err != nil {
		t.Fatal(err)
	}
	if rep.Total != 7 || len(rep.Slots) != 2 {
		t.Errorf("usage after restore: total %d slots %+v, want 7 over a's old slot and b's", rep.Total, rep.Slots)
	}
	if got := mustAllow(t, a2, later, "hour", "k", 10); got != 3 {
		t.Errorf("after restore admitted %d more, want 3 (limit 10, 7 used)", got)
	}
	if rep, _ := a2.Usage(later, "sec", "k"); rep.Total != 0 {
		t.Errorf("a 1 s window was restored: %+v", rep)
	}
	// Restored values are on disk already: only what changed is exported.
	f3 := persistOf(a2, later)
	if len(f3.Windows) != 3 {
		t.Errorf("export after restore and 3 admissions: %+v, want the window's 3 slots", f3.Windows)
	}

	// Records that no longer apply are skipped: a changed window, an
	// unknown rule, an ended window, this member's own current slot.
	bad := []node.WindowRecord{
		{Rule: "hour", Key: "k", WindowMs: 1000, Window: later.UnixMilli() / 1000, Slot: b.Self(), Admitted: 1},
		{Rule: "gone", Key: "k", WindowMs: 3600000, Window: win, Slot: b.Self(), Admitted: 1},
		{Rule: "hour", Key: "k", WindowMs: 3600000, Window: win - 2, Slot: b.Self(), Admitted: 1},
		{Rule: "hour", Key: "k", WindowMs: 3600000, Window: win, Slot: a2.Self(), Admitted: 1},
	}
	a3 := newCore(t, "a", later, persistRules(), func(cfg *node.CoreConfig) { cfg.Incarnation = a2.Self().Incarnation })
	if st := node.NewPersister(a3, time.Minute).Restore(later, bad, nil); st.Windows != 0 || st.SkippedWindows != 4 {
		t.Errorf("Restore of records that no longer apply = %+v, want 4 skipped", st)
	}
}

func TestPersisterLeases(t *testing.T) {
	now := t0
	a := newCore(t, "a", now, persistRules(), nil)
	node.NewPersister(a, time.Minute)
	l1, d, err := a.Acquire(now, "cc", "k", "")
	if err != nil || !d.Allowed {
		t.Fatal(d, err)
	}
	l2, _, _ := a.Acquire(now, "cc", "k", "")
	f := persistOf(a, now)
	if len(f.Leases) != 2 || len(f.Released) != 0 {
		t.Fatalf("export after two acquisitions: %+v", f)
	}
	a.Persisted(&f, nil)
	if err := a.Release(now, l2.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Renew(now.Add(time.Second), l1.ID); err != nil {
		t.Fatal(err)
	}
	f = persistOf(a, now.Add(time.Second))
	if len(f.Released) != 1 || f.Released[0] != l2.ID || len(f.Leases) != 1 || !f.Leases[0].Expires.Equal(now.Add(time.Second+time.Minute)) {
		t.Fatalf("export after release and renew: %+v", f)
	}
	// A failed write is retried whole, releases included.
	a.Persisted(&f, errors.New("disk full"))
	f = persistOf(a, now.Add(2*time.Second))
	if len(f.Released) != 1 || len(f.Leases) != 1 {
		t.Errorf("export after a failed flush: %+v, want the release and the lease again", f)
	}
	if a.Stats().PersistErrors != 1 {
		t.Errorf("PersistErrors = %d, want 1", a.Stats().PersistErrors)
	}

	// A restart within the TTL owns the live lease again; the client can
	// renew it; it counts in the new slot. An expired one is dropped
	// and released from the disk at the next flush.
	later := now.Add(30 * time.Second)
	a2 := newCore(t, "a", later, persistRules(), func(cfg *node.CoreConfig) {
		cfg.Incarnation = node.NextIncarnation(a.Self().Incarnation, later)
	})
	p2 := node.NewPersister(a2, time.Minute)
	if st := p2.Restore(later, nil, []node.Lease{{ID: l1.ID, Rule: "cc", Key: "k", Expires: now.Add(time.Minute)}, {ID: "a~old~9", Rule: "cc", Key: "k", Expires: now.Add(time.Second)}}); st.Leases != 1 || st.SkippedLeases != 1 {
		t.Errorf("Restore leases = %+v, want 1 restored, 1 expired", st)
	}
	if ttl, err := a2.Renew(later, l1.ID); err != nil || ttl != time.Minute {
		t.Errorf("Renew of a restored lease = %v, %v", ttl, err)
	}
	if rep, _ := a2.Usage(later, "cc", "k"); rep.Total != 1 || len(rep.Slots) != 1 || rep.Slots[0].Incarnation != a2.Self().Incarnation {
		t.Errorf("leases after restore: %+v, want 1 in the new slot", rep)
	}
	f = persistOf(a2, later)
	if len(f.Released) != 1 || f.Released[0] != "a~old~9" || len(f.Leases) != 1 || f.Leases[0].ID != l1.ID {
		t.Errorf("first export after restore: %+v, want the expired lease released and the renewed one", f)
	}
}

// TestRestoredPeerSlotCountsItsLeases: a peer's slot restored from disk
// before the peer is heard belongs to that peer once it appears, so its
// leases count.
func TestRestoredPeerSlotCountsItsLeases(t *testing.T) {
	now := t0.Add(time.Hour / 2)
	b := newCore(t, "b", now, persistRules(), func(cfg *node.CoreConfig) { cfg.Incarnation += 5 })
	a := newCore(t, "a", now, persistRules(), nil)
	win := now.UnixMilli() / time.Hour.Milliseconds()
	node.NewPersister(a, time.Minute).Restore(now, []node.WindowRecord{
		{Rule: "hour", Key: "k", WindowMs: time.Hour.Milliseconds(), Window: win, Slot: b.Self(), Admitted: 2, Attempted: 2},
	}, nil)
	for range 2 {
		if _, d, err := b.Acquire(now, "cc", "k", ""); err != nil || !d.Allowed {
			t.Fatal(d, err)
		}
	}
	exchange(t, b, a, now)
	if rep, _ := a.Usage(now, "cc", "k"); rep.Total != 2 {
		t.Errorf("a counts %d of b's leases, want 2: %+v", rep.Total, rep)
	}
	if rep, _ := a.Usage(now, "hour", "k"); rep.Total != 2 {
		t.Errorf("hour usage %d, want b's restored 2", rep.Total)
	}
}

// persistOf has c's Persister export at now (Core.Persist) and returns
// the Flush its Ready hands over.
func persistOf(c *node.Core, now time.Time) node.Flush {
	c.Persist(now)
	return *c.Ready().Persist
}
