package node_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratemesh/ratemesh/limiter"
	"github.com/ratemesh/ratemesh/node"
	"github.com/ratemesh/ratemesh/node/memnet"
)

// flakyStore fails every Flush while broken is set, like a full disk.
type flakyStore struct {
	*node.MemoryStore
	broken atomic.Bool
}

func (s *flakyStore) Flush(ctx context.Context, f node.Flush) error {
	if s.broken.Load() {
		return errors.New("write /data/000042.log: no space left on device")
	}
	return s.MemoryStore.Flush(ctx, f)
}

func (s *flakyStore) Close() error { return nil } // survives its node, like a disk

func TestFlushErrorsAreCountedAndServingGoesOn(t *testing.T) {
	store := &flakyStore{MemoryStore: &node.MemoryStore{}}
	store.broken.Store(true)
	cfg := rtConfig(memnet.NewHub(), "a", fixedRule("api", 1000, time.Hour))
	cfg.Store, cfg.FlushInterval, cfg.Clock = store, 10*time.Millisecond, midHour()
	n := rtStart(t, cfg)
	ctx := context.Background()
	for range 5 {
		if d, err := n.Allow(ctx, "api", "k"); err != nil || !d.Allowed {
			t.Fatalf("Allow on a broken disk = %+v, %v; want admitted from memory", d, err)
		}
	}
	rtEventually(t, 5*time.Second, func() (bool, string) {
		st := n.Stats()
		return st.PersistErrors >= 2, fmt.Sprintf("PersistErrors %d", st.PersistErrors)
	})
	store.broken.Store(false)
	rtEventually(t, 5*time.Second, func() (bool, string) {
		recs, err := store.LoadWindows(ctx)
		if err != nil || len(recs) != 1 {
			return false, fmt.Sprintf("records %+v, %v", recs, err)
		}
		return recs[0].Admitted == 5 && n.Stats().PersistFlushes > 0, fmt.Sprintf("record %+v, stats %+v", recs[0], n.Stats())
	})
	if d, err := n.Allow(ctx, "api", "k"); err != nil || !d.Allowed {
		t.Fatalf("Allow after the disk healed = %+v, %v", d, err)
	}
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	recs, err := store.LoadWindows(ctx)
	if err != nil || len(recs) != 1 || recs[0].Admitted != 6 {
		t.Errorf("after Close the store holds %+v, %v; want 6 admitted (Close flushes)", recs, err)
	}
}

func TestGracefulRestartKeepsLongWindowsAndLeases(t *testing.T) {
	store := &flakyStore{MemoryStore: &node.MemoryStore{}}
	hub := memnet.NewHub()
	rules := []limiter.Rule{
		fixedRule("api", 10, time.Hour),
		{Name: "cc", Algorithm: limiter.Concurrency, Limit: 3, LeaseTTL: time.Minute},
	}
	clock := midHour()
	cfg := rtConfig(hub, "a", rules...)
	cfg.Store, cfg.Clock = store, clock
	ctx := context.Background()
	n := rtStart(t, cfg)
	for range 4 {
		if d, err := n.Allow(ctx, "api", "k"); err != nil || !d.Allowed {
			t.Fatal(d, err)
		}
	}
	ls, d, err := n.Acquire(ctx, "cc", "k")
	if err != nil || !d.Allowed {
		t.Fatal(d, err)
	}
	inc := n.Incarnation()
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	cfg = rtConfig(hub, "a", rules...)
	cfg.Store, cfg.Clock = store, clock
	n2 := rtStart(t, cfg)
	if n2.Incarnation() <= inc {
		t.Errorf("incarnation %d after restart, not above %d", n2.Incarnation(), inc)
	}
	rep, err := n2.Usage("api", "k")
	if err != nil || rep.Total != 4 {
		t.Fatalf("usage after restart %+v, %v; want 4", rep, err)
	}
	admitted := 0
	for range 10 {
		if d, _ := n2.Allow(ctx, "api", "k"); d.Allowed {
			admitted++
		}
	}
	if admitted != 6 {
		t.Errorf("admitted %d after restart, want 6 (limit 10, 4 used)", admitted)
	}
	if _, err := n2.Renew(ctx, ls.ID); err != nil {
		t.Errorf("Renew of a lease owned before the restart: %v", err)
	}
	if err := n2.Release(ctx, ls.ID); err != nil {
		t.Errorf("Release of a lease owned before the restart: %v", err)
	}
}

func TestStartRefusesNegativePersistSettings(t *testing.T) {
	for _, field := range []string{"flush_interval", "persist_min_window"} {
		cfg := rtConfig(memnet.NewHub(), "a", fixedRule("api", 10, time.Hour))
		if field == "flush_interval" {
			cfg.FlushInterval = -time.Second
		} else {
			cfg.PersistMinWindow = -time.Second
		}
		n, err := node.Start(context.Background(), cfg)
		if err == nil {
			n.Close()
			t.Fatalf("%s negative: Start succeeded", field)
		}
		if !errors.Is(err, node.ErrInvalidConfig) || !strings.Contains(err.Error(), field) {
			t.Errorf("%s negative: err = %v, want ErrInvalidConfig naming it", field, err)
		}
	}
}

// midHour returns a clock running at real speed from the middle of an
// hour, so a test's hour window never ends while it runs.
func midHour() func() time.Time {
	off := 30*time.Minute - time.Duration(time.Now().UnixNano()%int64(time.Hour))
	return func() time.Time { return time.Now().Add(off) }
}
