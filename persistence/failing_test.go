package persistence

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/ratemesh/ratemesh/crdt"
	"github.com/ratemesh/ratemesh/node"
)

// syncBuffer is a log destination safe for pebble's goroutines.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) lines() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return strings.Split(strings.TrimSpace(b.buf.String()), "\n")
}

// failFS refuses to create tables while fail is set, as a disk that went
// away would: pebble's flush of a memtable then fails and is retried in a
// loop.
// With wal set it refuses new WAL files as missing, which pebble treats
// as fatal.
type failFS struct {
	vfs.FS
	fail    atomic.Bool
	wal     atomic.Bool
	refused atomic.Int64
}

func (f *failFS) Create(name string, cat vfs.DiskWriteCategory) (vfs.File, error) {
	if f.fail.Load() && strings.HasSuffix(name, ".sst") {
		f.refused.Add(1)
		return nil, errors.New("injected: no space left on the disk")
	}
	if f.wal.Load() && strings.HasSuffix(name, ".log") {
		f.refused.Add(1)
		return nil, &os.PathError{Op: "open", Path: name, Err: os.ErrNotExist}
	}
	return f.FS.Create(name, cat)
}

func testFlush(i int) node.Flush {
	return node.Flush{Windows: []node.WindowRecord{{Rule: "r", Key: "k", WindowMs: 3_600_000, Window: 1 << 20,
		Slot: crdt.Slot{Peer: "p", Incarnation: 1}, Admitted: uint64(i), Attempted: uint64(i)}}}
}

// closeWithin closes s and fails the test unless Close returns within d.
func closeWithin(t *testing.T, s *Store, d time.Duration) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- s.Close() }()
	select {
	case err := <-done:
		return err
	case <-time.After(d):
		t.Fatalf("Close still running after %v", d)
		return nil
	}
}

// TestPebbleErrorsAreRateLimited: a memtable flush that fails is retried
// by pebble in a tight loop (thousands of background errors a second);
// the store logs the first and holds the rest back, counting them.
func TestPebbleErrorsAreRateLimited(t *testing.T) {
	ctx := context.Background()
	fs := &failFS{FS: vfs.Default}
	var out syncBuffer
	s, err := Open(t.TempDir(), WithLogger(slog.New(slog.NewTextHandler(&out, nil))), func(o *options) { o.fs = fs })
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Flush(ctx, testFlush(1)); err != nil {
		t.Fatal(err)
	}
	fs.fail.Store(true)
	// Close flushes the memtable: it fails, and pebble retries until a
	// table can be created again.
	done := make(chan error, 1)
	go func() { done <- s.Close() }()
	deadline := time.Now().Add(20 * time.Second)
	for fs.refused.Load() < 500 {
		if time.Now().After(deadline) {
			t.Fatalf("pebble retried the flush %d times in 20 s", fs.refused.Load())
		}
		time.Sleep(5 * time.Millisecond) // polling interval
	}
	lines := out.lines()
	fs.fail.Store(false) // the disk is back: the flush and Close complete
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Close after the disk came back: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Close did not return once tables could be created again")
	}
	if len(lines) != 1 || !strings.Contains(lines[0], "background error") || !strings.Contains(lines[0], "injected") || !strings.Contains(lines[0], s.Path()) {
		t.Fatalf("after %d failed flushes the log holds %d lines, want the first alone naming the store:\n%s", fs.refused.Load(), len(lines), strings.Join(lines, "\n"))
	}
	all := out.lines()
	if len(all) != 2 || !strings.Contains(all[1], "held_back=") || !strings.Contains(all[1], "more errors were not logged") {
		t.Fatalf("Close logs the count held back; log:\n%s", strings.Join(all, "\n"))
	}
	t.Logf("%d failed table creations, %d log lines", fs.refused.Load(), len(all))
}

// TestStoreDirectoryRemoved: once the data directory is removed, a flush
// fails with ErrGone naming the path instead of writing into unlinked
// files; Close returns, with an error naming the path, and never panics.
func TestStoreDirectoryRemoved(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name    string
		replace bool
	}{{"removed", false}, {"replaced", true}} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			var out syncBuffer
			s, err := Open(dir, WithLogger(slog.New(slog.NewTextHandler(&out, nil))))
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Flush(ctx, testFlush(1)); err != nil {
				t.Fatal(err)
			}
			if err := os.RemoveAll(dir); err != nil {
				t.Fatal(err)
			}
			if tc.replace {
				if err := os.MkdirAll(filepath.Join(dir, StoreDir), 0o700); err != nil {
					t.Fatal(err)
				}
			}
			for _, op := range []struct {
				name string
				call func() error
			}{
				{"flush", func() error { return s.Flush(ctx, testFlush(2)) }},
				{"save incarnation", func() error { return s.SaveIncarnation(ctx, 7) }},
			} {
				err := op.call()
				if !errors.Is(err, ErrGone) || !strings.Contains(err.Error(), s.Path()) || !strings.Contains(err.Error(), op.name) {
					t.Fatalf("%s after the directory went: %v; want ErrGone naming %s", op.name, err, s.Path())
				}
			}
			// An empty flush touches nothing and so still succeeds.
			if err := s.Flush(ctx, node.Flush{}); err != nil {
				t.Fatalf("empty flush: %v", err)
			}
			err = closeWithin(t, s, 10*time.Second)
			if err != nil && !strings.Contains(err.Error(), s.Path()) {
				t.Fatalf("Close: %v; want nil or an error naming %s", err, s.Path())
			}
			if err := s.Flush(ctx, testFlush(3)); !errors.Is(err, ErrClosed) {
				t.Fatalf("flush after Close: %v, want ErrClosed", err)
			}
			if n := len(out.lines()); n > 3 {
				t.Fatalf("%d log lines:\n%s", n, strings.Join(out.lines(), "\n"))
			}
			t.Logf("Close: %v; log: %q", err, out.lines())
		})
	}
}

// TestPebbleFatalDoesNotCrash: when pebble meets a condition it treats as
// fatal after Open (here: its new WAL file "does not exist", as when the
// data directory is removed under it), the store logs it once and parks
// the call instead of unwinding through pebble, which would crash the
// process with an unrecoverable unlock of an unlocked mutex. The call
// does not return (node.Close bounds it); the process lives on.
func TestPebbleFatalDoesNotCrash(t *testing.T) {
	ctx := context.Background()
	fs := &failFS{FS: vfs.Default}
	var out syncBuffer
	s, err := Open(t.TempDir(), WithLogger(slog.New(slog.NewTextHandler(&out, nil))), func(o *options) { o.fs = fs })
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Flush(ctx, testFlush(1)); err != nil {
		t.Fatal(err)
	}
	fs.wal.Store(true)
	done := make(chan error, 1)
	go func() { done <- s.Close() }() // pebble rotates its WAL to flush the memtable
	deadline := time.Now().Add(20 * time.Second)
	for s.errs.fatal.Load() == nil {
		if time.Now().After(deadline) {
			t.Fatalf("no fatal error within 20 s; log:\n%s", strings.Join(out.lines(), "\n"))
		}
		time.Sleep(5 * time.Millisecond) // polling interval
	}
	select {
	case err := <-done:
		t.Fatalf("Close returned %v through a fatal pebble error", err)
	default:
	}
	lines := out.lines()
	if len(lines) != 1 || !strings.Contains(lines[0], "fatal") || !strings.Contains(lines[0], "the store is broken") || !strings.Contains(lines[0], s.Path()) {
		t.Fatalf("log:\n%s\nwant one line naming the store and the fatal error", strings.Join(lines, "\n"))
	}
}
