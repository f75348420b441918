package node_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ratemesh/ratemesh/crdt"
	"github.com/ratemesh/ratemesh/node"
)

func TestMemoryStore(t *testing.T) {
	ctx := context.Background()
	var s node.MemoryStore
	if inc, err := s.LoadIncarnation(ctx); err != nil || inc != 0 {
		t.Fatalf("fresh store: incarnation %d, %v; want 0, nil", inc, err)
	}
	if id, err := s.LoadIdentity(ctx); err != nil || id != nil {
		t.Fatalf("fresh store: identity %x, %v; want nil, nil", id, err)
	}
	key := []byte{1, 2, 3}
	if err := s.SaveIdentity(ctx, key); err != nil {
		t.Fatal(err)
	}
	key[0] = 9 // the store keeps its own copy
	if id, err := s.LoadIdentity(ctx); err != nil || string(id) != "\x01\x02\x03" {
		t.Errorf("identity %x, %v; want 010203", id, err)
	}
	if err := s.SaveIncarnation(ctx, 42); err != nil {
		t.Fatal(err)
	}
	if err := s.SaveIncarnation(ctx, 7); err != nil { // never goes back
		t.Fatal(err)
	}
	if inc, _ := s.LoadIncarnation(ctx); inc != 42 {
		t.Errorf("incarnation %d after saving 42 then 7, want 42", inc)
	}
	a := crdt.Slot{Peer: "a", Incarnation: 1}
	exp := time.UnixMilli(1_700_000_000_000)
	recs := []node.WindowRecord{
		{Rule: "r", Key: "k", WindowMs: 1000, Window: 5, Slot: a, Admitted: 3, Attempted: 4},
		{Rule: "r", Key: "k", WindowMs: 1000, Window: 7, Slot: a, Admitted: 1, Attempted: 1},
	}
	leases := []node.Lease{{ID: "a~1~2", Rule: "cc", Key: "k", Expires: exp}, {ID: "a~1~1", Rule: "cc", Key: "k", Expires: exp}}
	if err := s.Flush(ctx, node.Flush{Windows: recs, Leases: leases}); err != nil {
		t.Fatal(err)
	}
	// A lower value never replaces a higher one; window 5 is collected at
	// 7000 ms (it and window 6 have ended), window 7 is not.
	lower := []node.WindowRecord{{Rule: "r", Key: "k", WindowMs: 1000, Window: 7, Slot: a, Admitted: 0, Attempted: 9}}
	if err := s.Flush(ctx, node.Flush{Windows: lower, Released: []string{"a~1~2", "unknown"}, CollectBeforeMs: 7000}); err != nil {
		t.Fatal(err)
	}
	got, err := s.LoadWindows(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := node.WindowRecord{Rule: "r", Key: "k", WindowMs: 1000, Window: 7, Slot: a, Admitted: 1, Attempted: 9}
	if len(got) != 1 || got[0] != want {
		t.Errorf("LoadWindows = %+v, want [%+v]", got, want)
	}
	// Window 7 is collected at 9000 ms, not before (the store walks its
	// records only once the least CollectAt is due).
	for _, at := range []int64{8999, 9000} {
		if err := s.Flush(ctx, node.Flush{CollectBeforeMs: at}); err != nil {
			t.Fatal(err)
		}
		if got, _ := s.LoadWindows(ctx); len(got) != map[int64]int{8999: 1, 9000: 0}[at] {
			t.Errorf("after a flush collecting before %d: %d records", at, len(got))
		}
	}
	gotLs, err := s.LoadLeases(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(gotLs) != 1 || gotLs[0].ID != "a~1~1" || !gotLs[0].Expires.Equal(exp) {
		t.Errorf("LoadLeases = %+v, want only a~1~1 expiring %v", gotLs, exp)
	}
	if n := s.Flushes(); n != 4 {
		t.Errorf("Flushes = %d, want 4", n)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.LoadIncarnation(ctx); !errors.Is(err, node.ErrStoreClosed) {
		t.Errorf("after Close: %v, want ErrStoreClosed", err)
	}
	if err := s.Flush(ctx, node.Flush{}); !errors.Is(err, node.ErrStoreClosed) {
		t.Errorf("Flush after Close: %v, want ErrStoreClosed", err)
	}
}
