package node

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/ratemesh/ratemesh/crdt"
)

func TestLeaseTable(t *testing.T) {
	tab := newLeaseTable()
	self := crdt.Slot{Peer: "p", Incarnation: 36}
	a := tab.grant(self, "conc", "k", tIn.Add(2*time.Second))
	b := tab.grant(self, "conc", "k", tIn.Add(time.Second))
	if a.id != "p~10~1" || b.id != "p~10~2" {
		t.Fatalf("IDs %q %q, want p~10~1 p~10~2 (incarnation and sequence in base 36)", a.id, b.id)
	}
	if owner, inc, seq, err := ParseLeaseID(b.id); err != nil || owner != "p" || inc != 36 || seq != 2 {
		t.Errorf("ParseLeaseID(%q) = %q %d %d %v", b.id, owner, inc, seq, err)
	}
	if ls, expired, err := tab.lookup(tIn, a.id, "p"); ls != a || expired || err != nil {
		t.Errorf("lookup live = %v %v %v", ls, expired, err)
	}
	if ls, expired, err := tab.lookup(tIn.Add(time.Second), b.id, "p"); ls != b || !expired || err != nil {
		t.Errorf("lookup at expiry = %v %v %v, want b, expired", ls, expired, err)
	}
	var owner *NotOwnerError
	if _, _, err := tab.lookup(tIn, "q~1~1", "p"); !errors.As(err, &owner) || owner.Owner != "q" {
		t.Errorf("lookup of q's lease = %v, want NotOwnerError naming q", err)
	}
	if _, _, err := tab.lookup(tIn, "p~1~9", "p"); !errors.Is(err, ErrUnknownLease) {
		t.Errorf("lookup of an unknown own lease = %v, want ErrUnknownLease", err)
	}
	if got := tab.expired(tIn.Add(2 * time.Second)); len(got) != 2 || got[0] != a || got[1] != b {
		t.Errorf("expired = %v, want both, sorted by ID", got)
	}
	ids := func(ls []Lease) []string {
		out := make([]string, len(ls))
		for i, l := range ls {
			out[i] = l.ID
		}
		return out
	}
	if got := ids(tab.list()); !slices.Equal(got, []string{"p~10~1", "p~10~2"}) {
		t.Errorf("list = %v", got)
	}
}
