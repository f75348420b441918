package node_test

import (
	"context"
	"errors"
	"testing"

	"github.com/ratemesh/ratemesh/crdt"
	"github.com/ratemesh/ratemesh/node"
)

func TestMemoryStore(t *testing.T) {
	ctx := context.Background()
	var s node.MemoryStore
	if inc, err := s.LoadIncarnation(ctx); err != nil || inc != 0 {
		t.Fatalf("fresh store: incarnation %d, %v; want 0, nil", inc, err)
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
	recs := []node.WindowRecord{
		{Rule: "r", Key: "k", WindowMs: 1000, Window: 5, Slot: a, Admitted: 3, Attempted: 4},
		{Rule: "r", Key: "k", WindowMs: 1000, Window: 7, Slot: a, Admitted: 1, Attempted: 1},
	}
	if err := s.SaveWindows(ctx, recs, 0); err != nil {
		t.Fatal(err)
	}
	// A lower value never replaces a higher one; window 5 is collected at
	// 7000 ms (it and window 6 have ended), window 7 is not.
	lower := []node.WindowRecord{{Rule: "r", Key: "k", WindowMs: 1000, Window: 7, Slot: a, Admitted: 0, Attempted: 9}}
	if err := s.SaveWindows(ctx, lower, 7000); err != nil {
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
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.LoadIncarnation(ctx); !errors.Is(err, node.ErrStoreClosed) {
		t.Errorf("after Close: %v, want ErrStoreClosed", err)
	}
}
