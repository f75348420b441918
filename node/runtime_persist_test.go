package node_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratemesh/ratemesh/internal/testutil"
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
	testutil.Eventually(t, 5*time.Second, func() (bool, string) {
		st := n.Stats()
		return st.PersistErrors >= 2, fmt.Sprintf("PersistErrors %d", st.PersistErrors)
	})
	store.broken.Store(false)
	testutil.Eventually(t, 5*time.Second, func() (bool, string) {
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

// TestRepeatedFlushFailuresAreLoggedOnce: flushes that keep failing are
// logged once per node.ErrorLogInterval, not once each; the first success
// after them says how many failed.
func TestRepeatedFlushFailuresAreLoggedOnce(t *testing.T) {
	store := &flakyStore{MemoryStore: &node.MemoryStore{}}
	store.broken.Store(true)
	var log lockedLog
	cfg := rtConfig(memnet.NewHub(), "a", fixedRule("api", 1000, time.Hour))
	cfg.Store, cfg.FlushInterval, cfg.Clock = store, 5*time.Millisecond, midHour()
	cfg.Logger = slog.New(slog.NewTextHandler(&log, nil))
	n := rtStart(t, cfg)
	ctx := context.Background()
	testutil.Eventually(t, 10*time.Second, func() (bool, string) {
		// Every flush has something to write: a decision in between.
		if _, err := n.Allow(ctx, "api", "k"); err != nil {
			return false, err.Error()
		}
		return n.Stats().PersistErrors >= 50, fmt.Sprintf("PersistErrors %d", n.Stats().PersistErrors)
	})
	store.broken.Store(false)
	testutil.Eventually(t, 5*time.Second, func() (bool, string) {
		return strings.Contains(log.String(), "flush succeeded again"), log.String()
	})
	failed := strings.Count(log.String(), "persist: flush failed")
	if failed != 1 || !strings.Contains(log.String(), "no space left on device") {
		t.Fatalf("%d failed flushes logged in %d lines, want 1 naming the error:\n%s", n.Stats().PersistErrors, failed, log.String())
	}
	if !strings.Contains(log.String(), fmt.Sprintf("failed_flushes=%d", n.Stats().PersistErrors)) {
		t.Fatalf("the recovery line does not count %d failed flushes:\n%s", n.Stats().PersistErrors, log.String())
	}
}

// lockedLog is a log destination safe for the node's goroutines.
type lockedLog struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *lockedLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *lockedLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// hangStore never returns from the calls named in hang, like a disk that
// no longer answers, until the test ends.
type hangStore struct {
	*node.MemoryStore
	hangFlush, hangClose atomic.Bool
	hanging              atomic.Int64 // Flush calls that hang
	release              chan struct{}
}

func (s *hangStore) Flush(ctx context.Context, f node.Flush) error {
	if s.hangFlush.Load() {
		s.hanging.Add(1)
		<-s.release
		return errors.New("released")
	}
	return s.MemoryStore.Flush(ctx, f)
}

func (s *hangStore) Close() error {
	if s.hangClose.Load() {
		<-s.release
	}
	return nil
}

// TestCloseIsBoundedWhenTheStoreHangs: Close returns within StoreTimeout
// whatever the store does — a periodic flush that never returns, a last
// flush that never returns, a close that never returns — with an error
// wrapping ErrPersist that says which; a last flush that fails is
// reported the same way.
func TestCloseIsBoundedWhenTheStoreHangs(t *testing.T) {
	const storeTimeout = 300 * time.Millisecond
	for _, tc := range []struct {
		name     string
		periodic bool // the periodic flush hangs (short FlushInterval)
		flush    bool
		close    bool
		fail     bool
		want     string
	}{
		{name: "periodic flush hangs", periodic: true, flush: true, want: "a periodic flush did not finish within 300ms (store_timeout)"},
		{name: "last flush hangs", flush: true, want: "the last flush did not finish within 300ms"},
		{name: "close hangs", close: true, want: "closing the store did not finish within 300ms"},
		{name: "last flush fails", fail: true, want: "node: persistence failed: last flush of 1 window records and 0 leases: write /data/000042.log: no space left on device"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hs := &hangStore{MemoryStore: &node.MemoryStore{}, release: make(chan struct{})}
			t.Cleanup(func() { close(hs.release) })
			fs := &flakyStore{MemoryStore: &node.MemoryStore{}}
			cfg := rtConfig(memnet.NewHub(), "a", fixedRule("api", 1000, time.Hour))
			cfg.Store, cfg.FlushInterval, cfg.Clock, cfg.StoreTimeout = hs, time.Hour, midHour(), storeTimeout
			if tc.periodic {
				cfg.FlushInterval = 5 * time.Millisecond
			}
			if tc.fail {
				cfg.Store = fs
			}
			n := rtStart(t, cfg)
			if _, err := n.Allow(context.Background(), "api", "k"); err != nil {
				t.Fatal(err)
			}
			hs.hangFlush.Store(tc.flush)
			hs.hangClose.Store(tc.close)
			fs.broken.Store(tc.fail)
			if tc.periodic {
				// Wait until a periodic flush is stuck: one more decision to
				// write, and a flush that takes it and never comes back.
				if _, err := n.Allow(context.Background(), "api", "k"); err != nil {
					t.Fatal(err)
				}
				testutil.Eventually(t, 5*time.Second, func() (bool, string) {
					return hs.hanging.Load() == 1, fmt.Sprintf("%d flushes hang", hs.hanging.Load())
				})
			}
			start := time.Now()
			err := n.Close()
			took := time.Since(start)
			if !errors.Is(err, node.ErrPersist) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Close: %v; want ErrPersist saying %q", err, tc.want)
			}
			// The leave goes out at once over memnet: Close takes the store
			// deadline and little else.
			if took > storeTimeout+time.Second {
				t.Fatalf("Close took %v, over store_timeout %v + 1 s", took, storeTimeout)
			}
			t.Logf("Close took %v: %v", took, err)
		})
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
	for _, field := range []string{"flush_interval", "persist_min_window", "store_timeout"} {
		cfg := rtConfig(memnet.NewHub(), "a", fixedRule("api", 10, time.Hour))
		switch field {
		case "flush_interval":
			cfg.FlushInterval = -time.Second
		case "persist_min_window":
			cfg.PersistMinWindow = -time.Second
		default:
			cfg.StoreTimeout = -time.Second
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
