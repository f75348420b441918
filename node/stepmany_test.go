package node_test

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/ratemesh/ratemesh/crdt"
	"github.com/ratemesh/ratemesh/limiter"
	"github.com/ratemesh/ratemesh/node"
)

// TestStepManyMatchesStep feeds the same batches to two twin receivers,
// one Step at a time and through StepMany in runs of random length (some
// holding back more than it raises at once), and requires the same view,
// stats and decisions of both after every run.
func TestStepManyMatchesStep(t *testing.T) {
	rules := []limiter.Rule{
		{Name: "sw", Algorithm: limiter.SlidingWindow, Limit: 400, Window: time.Second},
		{Name: "fw", Algorithm: limiter.FixedWindow, Limit: 300, Window: 200 * time.Millisecond},
	}
	keys := make([]string, 60)
	for i := range keys {
		keys[i] = fmt.Sprintf("k%02d", i)
	}
	for seed := uint64(1); seed <= 3; seed++ {
		t.Run(fmt.Sprintf("seed_%d", seed), func(t *testing.T) {
			reportSeed(t, seed)
			r := rand.New(rand.NewPCG(seed, seed))
			now := tMid
			senders := make([]*node.Core, 4)
			for i := range senders {
				senders[i] = newCore(t, fmt.Sprintf("s%d", i), now, rules, nil)
			}
			one := newCore(t, "r", now, rules, nil)
			many := newCore(t, "r", now, rules, nil)
			type delivery struct {
				at time.Time
				b  *crdt.Batch
			}
			var pending []delivery
			for _, s := range senders {
				for _, b := range fullState(t, s, now, "r") {
					pending = append(pending, delivery{now, b})
				}
			}
			for round := range 300 {
				now = now.Add(time.Duration(1+r.IntN(9)) * time.Millisecond)
				for _, s := range senders {
					for range r.IntN(40) {
						rule := rules[r.IntN(len(rules))].Name
						if _, err := s.Allow(now, rule, keys[r.IntN(len(keys))], limiter.Request{}); err != nil {
							t.Fatal(err)
						}
					}
					for _, b := range tick(s, now).Messages {
						pending = append(pending, delivery{now.Add(time.Duration(r.IntN(5)) * time.Millisecond), b})
					}
				}
				if r.IntN(4) != 0 {
					continue
				}
				for _, d := range pending {
					if err := one.Step(d.at, d.b); err != nil {
						t.Fatal(err)
					}
				}
				if i, err := many.StepMany(len(pending), func(i int) (time.Time, time.Time, *crdt.Batch) { return pending[i].at, pending[i].at, pending[i].b }); err != nil || i != len(pending) {
					t.Fatalf("StepMany = %d, %v; want %d, nil", i, err, len(pending))
				}
				pending = pending[:0]
				if d := diffViews(viewOf(t, one, now, keys), viewOf(t, many, now, keys)); d != "" {
					t.Fatalf("round %d: Step and StepMany differ:\n%s", round, d)
				}
				if a, b := one.Stats(), many.Stats(); a != b {
					t.Fatalf("round %d: stats differ:\nStep     %+v\nStepMany %+v", round, a, b)
				}
				for range 5 {
					rule, key := rules[r.IntN(len(rules))].Name, keys[r.IntN(len(keys))]
					a, err := one.Allow(now, rule, key, limiter.Request{})
					if err != nil {
						t.Fatal(err)
					}
					b, _ := many.Allow(now, rule, key, limiter.Request{})
					if a != b {
						t.Fatalf("round %d: %s/%s decided %+v after Step, %+v after StepMany", round, rule, key, a, b)
					}
				}
				tick(one, now)
				tick(many, now)
			}
			if st := many.Stats(); st.EntriesMerged == 0 {
				t.Fatal("nothing merged: the test tests nothing")
			}
		})
	}
}

// TestStepManyStopsAtError steps the batches before a failing one, merges
// their entries, and reports the failing one's index.
func TestStepManyStopsAtError(t *testing.T) {
	rules := []limiter.Rule{{Name: "sw", Algorithm: limiter.SlidingWindow, Limit: 100, Window: time.Second}}
	now := tMid
	s := newCore(t, "s", now, rules, nil)
	r := newCore(t, "r", now, rules, nil)
	if _, err := s.Allow(now, "sw", "k", limiter.Request{}); err != nil {
		t.Fatal(err)
	}
	good := tick(s, now).Messages
	if len(good) == 0 {
		t.Fatal("no batch to step")
	}
	// A batch claiming the receiver's own peer ID with a newer incarnation fails.
	bad := &crdt.Batch{From: crdt.Slot{Peer: "r", Incarnation: r.Self().Incarnation + 1}}
	// Past StepMany's first look-ahead: the good batches again and again
	// (a duplicate merges nothing new).
	var bs []*crdt.Batch
	for len(bs) < node.StepAhead+3 {
		bs = append(bs, good...)
	}
	before := len(bs)
	bs = append(bs, bad, good[0])
	i, err := r.StepMany(len(bs), func(i int) (time.Time, time.Time, *crdt.Batch) { return now, now, bs[i] })
	if err == nil || i != before {
		t.Fatalf("StepMany = %d, %v; want %d and an error", i, err, before)
	}
	if got := total(t, r, now, "sw", "k"); got != 1 {
		t.Fatalf("after the failed StepMany the receiver counts %d admitted, want the 1 stepped before the failure", got)
	}
}
