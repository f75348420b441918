package node_test

import (
	"errors"
	"testing"
	"time"

	"github.com/ratemesh/ratemesh/limiter"
	"github.com/ratemesh/ratemesh/node"
)

// TestCoreLeases: leases are acquired across 3 cores up to the limit and no
// further; only the owner renews or releases (another core answers
// NotOwnerError naming the owner); an expired lease is released by its
// owner, and the capacity returns on the other cores after a sync.
func TestCoreLeases(t *testing.T) {
	const (
		seed  = 51
		limit = 6
		ttl   = 10 * time.Second
	)
	reportSeed(t, seed)
	rules := []limiter.Rule{{Name: "cc", Algorithm: limiter.Concurrency, Limit: limit, LeaseTTL: ttl}}
	net := cluster(t, 3, seed, rules, nil)
	net.Delay = 5 * time.Millisecond
	run(t, net, 100*time.Millisecond, nil)
	settle := func() { run(t, net, 100*time.Millisecond, nil) }

	held := map[int][]node.Lease{}
	for round := 0; round < 10; round++ {
		for i := range 3 {
			ls, d, err := net.Core(i).Acquire(net.Local(i), "cc", "k", "")
			if err != nil {
				t.Fatal(err)
			}
			if d.Allowed {
				if ls.ID == "" || ls.Rule != "cc" || ls.Key != "k" || !ls.Expires.Equal(net.Local(i).Add(ttl)) {
					t.Errorf("member %d: lease %+v", i, ls)
				}
				held[i] = append(held[i], ls)
			} else if ls.ID != "" {
				t.Errorf("member %d: a denied Acquire returned lease %+v", i, ls)
			}
		}
		settle()
	}
	n := len(held[0]) + len(held[1]) + len(held[2])
	if n != limit {
		t.Fatalf("acquired %d leases (%d, %d, %d), want the limit %d", n, len(held[0]), len(held[1]), len(held[2]), limit)
	}
	for i := range 3 {
		if got := total(t, net.Core(i), net.Local(i), "cc", "k"); got != limit {
			t.Errorf("member %d counts %d live leases, want %d", i, got, limit)
		}
		if _, d, _ := net.Core(i).Acquire(net.Local(i), "cc", "k", ""); d.Allowed || d.Reason != limiter.ReasonLimit {
			t.Errorf("member %d at the limit: %+v, want denied by the limit", i, d)
		}
		if got := net.Core(i).Leases(); len(got) != len(held[i]) {
			t.Errorf("member %d: Leases() = %d, acquired %d", i, len(got), len(held[i]))
		}
	}
	owner, other := -1, -1
	for i := range 3 {
		if len(held[i]) >= 2 && owner < 0 {
			owner = i
		}
	}
	if owner < 0 {
		t.Fatalf("no member holds two leases: %v", held)
	}
	other = (owner + 1) % 3
	ls := held[owner][0]

	// Renew and Release go to the owner.
	run(t, net, 3*time.Second, nil)
	ownerPeer := net.Core(owner).Self().Peer
	var notOwner *node.NotOwnerError
	if _, err := net.Core(other).Renew(net.Local(other), ls.ID); !errors.As(err, &notOwner) || notOwner.Owner != ownerPeer {
		t.Errorf("Renew at a non-owner = %v, want NotOwnerError naming %s", err, ownerPeer)
	}
	if err := net.Core(other).Release(net.Local(other), ls.ID); !errors.As(err, &notOwner) || notOwner.Owner != ownerPeer {
		t.Errorf("Release at a non-owner = %v, want NotOwnerError naming %s", err, ownerPeer)
	}
	if err := net.Core(owner).Release(net.Local(owner), "no-such-lease"); !errors.Is(err, node.ErrUnknownLease) {
		t.Errorf("Release(unknown) = %v, want ErrUnknownLease", err)
	}
	ttlGot, err := net.Core(owner).Renew(net.Local(owner), ls.ID)
	if err != nil || ttlGot != ttl {
		t.Fatalf("Renew by the owner = %v, %v; want %v", ttlGot, err, ttl)
	}
	renewedUntil := net.Local(owner).Add(ttl)
	if err := net.Core(owner).Release(net.Local(owner), held[owner][1].ID); err != nil {
		t.Fatalf("Release by the owner: %v", err)
	}
	if err := net.Core(owner).Release(net.Local(owner), held[owner][1].ID); !errors.Is(err, node.ErrUnknownLease) {
		t.Errorf("a second Release = %v, want ErrUnknownLease", err)
	}
	settle()
	for i := range 3 {
		if got := total(t, net.Core(i), net.Local(i), "cc", "k"); got != limit-1 {
			t.Errorf("member %d after one release counts %d, want %d", i, got, limit-1)
		}
	}

	// Expiry: every lease but the renewed one expires at its owner; the
	// others learn of it at the next sync.
	firstExpiry := t0.Add(100*time.Millisecond + ttl)
	run(t, net, firstExpiry.Sub(net.Now())-time.Millisecond, nil)
	if got := total(t, net.Core(other), net.Local(other), "cc", "k"); got != limit-1 {
		t.Errorf("just before the TTL: member %d counts %d, want %d", other, got, limit-1)
	}
	run(t, net, 200*time.Millisecond, nil) // the last of them were acquired 100 ms after the first
	for i := range 3 {
		want := 0
		if i == owner {
			want = 1
		}
		if got := len(net.Core(i).Leases()); got != want {
			t.Errorf("member %d owns %d leases after the TTL, want %d", i, got, want)
		}
		if got := total(t, net.Core(i), net.Local(i), "cc", "k"); got != 1 {
			t.Errorf("member %d counts %d live leases after expiry, want only the renewed one", i, got)
		}
	}
	if _, err := net.Core(other).Renew(net.Local(other), held[other][0].ID); err == nil {
		t.Error("an expired lease was renewed")
	}
	// Capacity is back, on every core, up to the limit again.
	acquired := 0
	for range 10 {
		for i := range 3 {
			if _, d, _ := net.Core(i).Acquire(net.Local(i), "cc", "k", ""); d.Allowed {
				acquired++
			}
		}
		settle()
	}
	if acquired != limit-1 {
		t.Errorf("after expiry acquired %d more, want %d", acquired, limit-1)
	}
	if _, err := net.Core(owner).Renew(renewedUntil.Add(-time.Millisecond), ls.ID); err != nil {
		t.Errorf("the renewed lease is gone before its renewed TTL: %v", err)
	}
	if _, err := net.Core(owner).Renew(renewedUntil.Add(ttl-2*time.Millisecond), ls.ID); err != nil {
		t.Errorf("the renewed lease is gone before its second TTL: %v", err)
	}
	if _, err := net.Core(owner).Renew(renewedUntil.Add(3*ttl), ls.ID); !errors.Is(err, node.ErrUnknownLease) {
		t.Errorf("Renew long after the TTL = %v, want ErrUnknownLease", err)
	}
}
