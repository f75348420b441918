package node_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/ratemesh/ratemesh/crdt"
	"github.com/ratemesh/ratemesh/limiter"
	"github.com/ratemesh/ratemesh/node"
)

// stepAll steps every batch into c at now and fails on an error.
func stepAll(t testing.TB, c *node.Core, now time.Time, bs []*crdt.Batch) {
	t.Helper()
	for _, b := range bs {
		if err := c.Step(now, b); err != nil {
			t.Fatal(err)
		}
	}
}

// wire round-trips b through its encoding, as a transport would.
func wire(t testing.TB, b *crdt.Batch) *crdt.Batch {
	t.Helper()
	data, err := b.Encode()
	if err != nil {
		t.Fatal(err)
	}
	d, err := crdt.DecodeBatch(data)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// TestCoreStepIsIdempotent is a property test: under random traffic on two
// authors, stepping any batch (gossip or full state) a second time leaves
// every Usage report of the receiver identical; replaying every batch
// again at the end changes nothing; and a receiver that gets the same
// batches shuffled, with duplicates, ends with the same state.
func TestCoreStepIsIdempotent(t *testing.T) {
	for seed := uint64(1); seed <= 10; seed++ {
		t.Run(fmt.Sprintf("seed_%d", seed), func(t *testing.T) {
			reportSeed(t, seed)
			rng := rand.New(rand.NewPCG(seed, 0x57e9))
			now := tMid
			authors := []*node.Core{
				newCore(t, "a", now, mixedRules(), nil),
				newCore(t, "b", now, mixedRules(), nil),
			}
			rx := newCore(t, "rx", now, mixedRules(), nil)
			shuffled := newCore(t, "sh", now, mixedRules(), nil)
			var all []*crdt.Batch
			step := func(b *crdt.Batch) {
				t.Helper()
				all = append(all, b)
				stepAll(t, rx, now, []*crdt.Batch{b})
				first := viewOf(t, rx, now, mixedKeys)
				stepAll(t, rx, now, []*crdt.Batch{b})
				if d := diffViews(first, viewOf(t, rx, now, mixedKeys)); d != "" {
					t.Fatalf("stepping batch seq %d of %v (flags %d) twice changed the state:\n%s", b.Seq, b.From, b.Flags, d)
				}
			}
			for range 300 {
				now = now.Add(time.Duration(1+rng.IntN(15)) * time.Millisecond)
				a := authors[rng.IntN(2)]
				key := mixedKeys[rng.IntN(len(mixedKeys))]
				switch rng.IntN(4) {
				case 0:
					if _, err := a.Allow(now, "fw", key, limiter.Request{Cost: 1 + rng.Uint64N(5), HasCost: true}); err != nil {
						t.Fatal(err)
					}
				case 1:
					if _, err := a.Allow(now, "sw", key, limiter.Request{}); err != nil {
						t.Fatal(err)
					}
				case 2:
					if _, _, err := a.Acquire(now, "cc", key, ""); err != nil {
						t.Fatal(err)
					}
				case 3:
					if ls := a.Leases(); len(ls) > 0 {
						if err := a.Release(now, ls[rng.IntN(len(ls))].ID); err != nil {
							t.Fatal(err)
						}
					}
				}
				for _, a := range authors {
					for _, b := range tick(a, now).Messages {
						step(wire(t, b))
					}
				}
				if rng.IntN(20) == 0 {
					for _, b := range fullState(t, authors[rng.IntN(2)], now, "rx") {
						step(wire(t, b))
					}
				}
			}
			now = now.Add(20 * time.Millisecond) // a sync interval: the last changes go out
			for _, a := range authors {
				for _, b := range tick(a, now).Messages {
					step(wire(t, b))
				}
			}
			final := viewOf(t, rx, now, mixedKeys)
			stepAll(t, rx, now, all)
			if d := diffViews(final, viewOf(t, rx, now, mixedKeys)); d != "" {
				t.Fatalf("replaying every batch changed the state:\n%s", d)
			}
			// Any order, with duplicates, gives the same state.
			mixed := append([]*crdt.Batch(nil), all...)
			for range len(all) / 3 {
				mixed = append(mixed, all[rng.IntN(len(all))])
			}
			rng.Shuffle(len(mixed), func(i, j int) { mixed[i], mixed[j] = mixed[j], mixed[i] })
			stepAll(t, shuffled, now, mixed)
			if d := diffViews(final, viewOf(t, shuffled, now, mixedKeys)); d != "" {
				t.Fatalf("the shuffled receiver differs:\n%s", d)
			}
			// The receiver holds exactly what the authors wrote.
			for _, a := range authors {
				authored := viewOf(t, a, now, mixedKeys)
				peer := a.Self().Peer
				for rk, rep := range final {
					if got, want := ownSlots(rep, peer), ownSlots(authored[rk], peer); got != want {
						t.Errorf("%v: the receiver holds %s's slot as %s, %s as %s", rk, peer, got, peer, want)
					}
				}
			}
		})
	}
}

func ownSlots(rep node.UsageReport, peer string) string {
	for _, s := range rep.Slots {
		if s.Peer == peer {
			return fmt.Sprintf("%d/%d", s.Admitted, s.Attempted)
		}
	}
	return "none"
}

// TestCoreStepRejectsOwnIdentity: a batch claiming this member's peer ID
// with a newer incarnation means two processes share one identity; an
// echo of our own (or an older incarnation's) batch is ignored.
func TestCoreStepRejectsOwnIdentity(t *testing.T) {
	c := newCore(t, "me", t0, apiRule(limiter.FixedWindow, 10), nil)
	self := c.Self()
	echo := &crdt.Batch{Version: crdt.Version, From: self, Seq: 1, Sent: t0.UnixMilli(), Clock: t0.UnixMilli(),
		Windows: []crdt.WindowEntry{{Rule: "api", Key: "k", WindowMs: 1000, Window: t0.UnixMilli() / 1000, Admitted: 9, Attempted: 9}}}
	if err := c.Step(t0, echo); err != nil {
		t.Errorf("own echo: %v", err)
	}
	if got := total(t, c, t0, "api", "k"); got != 0 {
		t.Errorf("an echo of our own slot was merged: total %d", got)
	}
	newer := *echo
	newer.From.Incarnation++
	if err := c.Step(t0, &newer); err == nil {
		t.Error("a newer incarnation of our own peer ID was accepted")
	}
	leave(c, t0)
	if err := c.Step(t0, echo); !errors.Is(err, node.ErrClosed) {
		t.Errorf("Step after Leave = %v, want ErrClosed", err)
	}
}
