package node_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/ratemesh/ratemesh/crdt"
	"github.com/ratemesh/ratemesh/limiter"
	"github.com/ratemesh/ratemesh/node"
	"github.com/ratemesh/ratemesh/node/memnet"
)

// budgetTransport records, per (rule, key), the largest own admitted
// count a published batch has carried for the current window.
type budgetTransport struct {
	node.Transport
	mu        sync.Mutex
	published map[string]uint64 // rule + "/" + key → own Admitted published
}

func (r *budgetTransport) Publish(ctx context.Context, b *crdt.Batch) error {
	r.mu.Lock()
	for _, e := range b.Windows {
		if e.Slot == 0 {
			k := e.Rule + "/" + e.Key
			r.published[k] = max(r.published[k], e.Admitted)
		}
	}
	r.mu.Unlock()
	return r.Transport.Publish(ctx, b)
}

func (r *budgetTransport) of(rule, key string) uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.published[rule+"/"+key]
}

// TestPublishBudgetBoundsUnpublished admits 600 of 1000 on one node whose
// own batches would otherwise go out only on a 10 s tick (no leading
// edge): what a SIGKILL would lose. With the default publish budget (a
// tenth of the share: 100 credits) no Allow, Wait or AllowAll returns
// while 100 credits or more are admitted but not handed to the
// Transport; before the budget, all 600 were.
func TestPublishBudgetBoundsUnpublished(t *testing.T) {
	hub := memnet.NewHub()
	cfg := rtConfig(hub, "a", fixedRule("api", 1000, time.Hour))
	rec := &budgetTransport{Transport: cfg.Transport, published: map[string]uint64{}}
	cfg.Transport = rec
	cfg.PublishGap = -1
	cfg.SyncInterval, cfg.Heartbeat = 10*time.Second, 10*time.Second
	cfg.SuspectAfter, cfg.DeadAfter, cfg.EvictAfter = 20*time.Second, 30*time.Second, time.Minute
	n := rtStart(t, cfg)
	ctx := context.Background()
	const budget = 100 // 0.1 × 1000 / 1 member
	admitted := uint64(0)
	check := func(i int, how string) {
		t.Helper()
		if pub := rec.of("api", "k"); admitted >= pub+budget {
			t.Fatalf("%s %d returned with %d admitted, %d published: %d unpublished, not below the budget %d", how, i, admitted, pub, admitted-pub, budget)
		}
	}
	for i := range 600 {
		var ok bool
		switch i % 3 {
		case 0:
			d, err := n.Allow(ctx, "api", "k")
			if err != nil {
				t.Fatal(err)
			}
			ok = d.Allowed
		case 1:
			d, err := n.Wait(ctx, "api", "k")
			if err != nil {
				t.Fatal(err)
			}
			ok = d.Allowed
		default:
			var err error
			if ok, _, err = n.AllowAll(ctx, node.NewCheck("api", "k")); err != nil {
				t.Fatal(err)
			}
		}
		if !ok {
			t.Fatalf("request %d denied", i)
		}
		admitted++
		check(i, []string{"Allow", "Wait", "AllowAll"}[i%3])
	}
	if got := n.Stats().Decisions[limiter.ReasonAdmitted]; got != 600 {
		t.Errorf("%d admitted in the stats, want 600", got)
	}
}
