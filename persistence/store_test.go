package persistence

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	ds "github.com/ipfs/go-datastore"

	"github.com/ratemesh/ratemesh/crdt"
	"github.com/ratemesh/ratemesh/node"
)

func mustOpen(t *testing.T, dir string) *Store {
	t.Helper()
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestStoreRoundTrip runs the same checks on pebble (reopened from disk)
// and on the in-memory map.
func TestStoreRoundTrip(t *testing.T) {
	ctx := context.Background()
	a := crdt.Slot{Peer: "12D3KooWa", Incarnation: 1_700_000_000_000}
	b := crdt.Slot{Peer: "12D3KooWb/with/slashes", Incarnation: 7}
	hour := time.Hour.Milliseconds()
	exp := time.Unix(1_700_000_100, 123)
	for _, kind := range []string{"pebble", "memory"} {
		t.Run(kind, func(t *testing.T) {
			dir := t.TempDir()
			var s *Store
			reopen := func() {
				if kind == "memory" {
					if s == nil {
						s = NewMemory()
					}
					return
				}
				if s != nil {
					if err := s.Close(); err != nil {
						t.Fatal(err)
					}
				}
				s = mustOpen(t, dir)
			}
			reopen()
			if id, err := s.LoadIdentity(ctx); err != nil || id != nil {
				t.Fatalf("fresh identity = %x, %v", id, err)
			}
			if err := s.SaveIdentity(ctx, []byte("key bytes")); err != nil {
				t.Fatal(err)
			}
			if err := s.SaveIncarnation(ctx, 99); err != nil {
				t.Fatal(err)
			}
			recs := []node.WindowRecord{
				{Rule: "hour", Key: "acct:/1", WindowMs: hour, Window: 10, Slot: a, Admitted: 5, Attempted: 6},
				{Rule: "hour", Key: "acct:/1", WindowMs: hour, Window: 10, Slot: b, Admitted: 2, Attempted: 2},
				{Rule: "hour", Key: "old", WindowMs: hour, Window: 3, Slot: b, Admitted: 1, Attempted: 1},
			}
			leases := []node.Lease{{ID: "p~x~1", Rule: "cc", Key: "k", Expires: exp}, {ID: "p~x~2", Rule: "cc", Key: "k/2", Expires: exp}}
			if err := s.Flush(ctx, node.Flush{Windows: recs, Leases: leases}); err != nil {
				t.Fatal(err)
			}
			reopen()
			if err := s.SaveIncarnation(ctx, 5); err != nil { // never lowers
				t.Fatal(err)
			}
			// Lower values never win; window 3 is collected at 5 h.
			lower := []node.WindowRecord{{Rule: "hour", Key: "acct:/1", WindowMs: hour, Window: 10, Slot: a, Admitted: 1, Attempted: 9}}
			if err := s.Flush(ctx, node.Flush{Windows: lower, Released: []string{"p~x~1"}, CollectBeforeMs: 5 * hour}); err != nil {
				t.Fatal(err)
			}
			reopen()
			if id, err := s.LoadIdentity(ctx); err != nil || string(id) != "key bytes" {
				t.Errorf("identity = %q, %v", id, err)
			}
			if inc, err := s.LoadIncarnation(ctx); err != nil || inc != 99 {
				t.Errorf("incarnation = %d, %v; want 99", inc, err)
			}
			got, err := s.LoadWindows(ctx)
			if err != nil {
				t.Fatal(err)
			}
			want := []node.WindowRecord{
				{Rule: "hour", Key: "acct:/1", WindowMs: hour, Window: 10, Slot: a, Admitted: 5, Attempted: 9},
				{Rule: "hour", Key: "acct:/1", WindowMs: hour, Window: 10, Slot: b, Admitted: 2, Attempted: 2},
			}
			if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
				t.Errorf("windows = %+v\nwant %+v", got, want)
			}
			ls, err := s.LoadLeases(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if len(ls) != 1 || ls[0].ID != "p~x~2" || ls[0].Key != "k/2" || !ls[0].Expires.Equal(exp) {
				t.Errorf("leases = %+v, want p~x~2 only", ls)
			}
			// Everything collects once its windows have ended.
			if err := s.Flush(ctx, node.Flush{CollectBeforeMs: 12 * hour}); err != nil {
				t.Fatal(err)
			}
			if got, _ := s.LoadWindows(ctx); len(got) != 0 {
				t.Errorf("after collection: %+v", got)
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			if _, err := s.LoadWindows(ctx); !errors.Is(err, ErrClosed) {
				t.Errorf("after Close: %v, want ErrClosed", err)
			}
		})
	}
}

func TestOpenRefusesALockedDirectory(t *testing.T) {
	dir := t.TempDir()
	s := mustOpen(t, dir)
	defer s.Close()
	_, err := Open(dir)
	if err == nil || !strings.Contains(err.Error(), dir) || !strings.Contains(err.Error(), "locked") {
		t.Fatalf("second Open = %v; want an error naming %s and the lock", err, dir)
	}
}

// TestOpenRefusesBadDirectories: every bad directory is a clear error
// naming the path, never a panic.
func TestOpenRefusesBadDirectories(t *testing.T) {
	// A store with one window record, then closed: pebble has an SST.
	good := t.TempDir()
	s := mustOpen(t, good)
	rec := node.WindowRecord{Rule: "r", Key: "k", WindowMs: 60000, Window: 1 << 20, Slot: crdt.Slot{Peer: "p", Incarnation: 1}, Admitted: 1, Attempted: 1}
	if err := s.Flush(context.Background(), node.Flush{Windows: []node.WindowRecord{rec}}); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	copyOf := func(t *testing.T) string {
		d := t.TempDir()
		if err := os.CopyFS(d, os.DirFS(good)); err != nil {
			t.Fatal(err)
		}
		return d
	}
	edit := func(match string, f func([]byte) []byte) func(t *testing.T, dir string) {
		return func(t *testing.T, dir string) {
			ents, _ := os.ReadDir(filepath.Join(dir, StoreDir))
			n := 0
			for _, e := range ents {
				if strings.HasPrefix(e.Name(), match) || strings.HasSuffix(e.Name(), match) {
					p := filepath.Join(dir, StoreDir, e.Name())
					b, err := os.ReadFile(p)
					if err != nil {
						t.Fatal(err)
					}
					if err := os.WriteFile(p, f(b), 0o600); err != nil {
						t.Fatal(err)
					}
					n++
				}
			}
			if n == 0 {
				t.Fatalf("no %s file in %v", match, ents)
			}
		}
	}
	garbage := func(b []byte) []byte {
		for i := range b {
			b[i] ^= 0x5a
		}
		return b
	}
	half := func(b []byte) []byte { return b[:len(b)/2] }
	cases := []struct {
		name string
		mut  func(t *testing.T, dir string)
		want string
	}{
		{"garbage MANIFEST", edit("MANIFEST-", garbage), "malformed manifest"},
		{"empty MANIFEST", edit("MANIFEST-", func([]byte) []byte { return nil }), "malformed manifest"},
		{"garbage table", edit(".sst", garbage), "000"},
		{"truncated table", edit(".sst", half), "size mismatch"},
		{"a stranger's file", func(t *testing.T, dir string) {
			os.WriteFile(filepath.Join(dir, StoreDir, "notes.txt"), []byte("hi"), 0o600)
		}, "notes.txt"},
		{"store is a file", func(t *testing.T, dir string) {
			os.RemoveAll(filepath.Join(dir, StoreDir))
			os.WriteFile(filepath.Join(dir, StoreDir), []byte("garbage"), 0o600)
		}, "not a directory"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := copyOf(t)
			tc.mut(t, dir)
			s, err := Open(dir)
			if err == nil {
				s.Close()
				t.Fatal("Open succeeded")
			}
			if !strings.Contains(err.Error(), dir) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v; want it to name %s and %q", err, dir, tc.want)
			}
		})
	}
	t.Run("data dir under a file", func(t *testing.T) {
		f := filepath.Join(t.TempDir(), "file")
		os.WriteFile(f, nil, 0o600)
		_, err := Open(filepath.Join(f, "data"))
		if err == nil || !strings.Contains(err.Error(), f) {
			t.Errorf("err = %v; want it to name %s", err, f)
		}
	})
	t.Run("permission", func(t *testing.T) {
		if os.Geteuid() == 0 {
			t.Skip("root ignores permissions")
		}
		dir := copyOf(t)
		os.Chmod(filepath.Join(dir, StoreDir), 0o500)
		defer os.Chmod(filepath.Join(dir, StoreDir), 0o700)
		_, err := Open(dir)
		if err == nil || !strings.Contains(err.Error(), dir) {
			t.Errorf("err = %v; want it to name %s", err, dir)
		}
	})
}

func TestLoadRefusesCorruptRecords(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct{ key, val, want string }{
		{"/w/zz/abc", "x", "window key"},
		{"/w/0000000000000001/!!", "\x01\x00\x00", "base64"},
		{"/w/0000000000000001/" + b64.EncodeToString([]byte{200}), "\x01\x00\x00", "malformed identity"},
		{"/l/" + b64.EncodeToString([]byte("id")), "\x07", "unknown version"},
	} {
		s := NewMemory()
		if err := s.d.Put(ctx, ds.RawKey(tc.key), []byte(tc.val)); err != nil {
			t.Fatal(err)
		}
		_, err1 := s.LoadWindows(ctx)
		_, err2 := s.LoadLeases(ctx)
		err := errors.Join(err1, err2)
		if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v; want ErrCorrupt saying %q", tc.key, err, tc.want)
		}
	}
	// A window record whose counts are garbage fails the next flush too,
	// naming the key, rather than being overwritten blindly.
	s := NewMemory()
	rec := node.WindowRecord{Rule: "r", Key: "k", WindowMs: 60000, Window: 1 << 20, Slot: crdt.Slot{Peer: "p", Incarnation: 1}}
	s.d.Put(ctx, windowKey(rec), []byte{9, 9})
	if err := s.Flush(ctx, node.Flush{Windows: []node.WindowRecord{rec}}); !errors.Is(err, ErrCorrupt) {
		t.Errorf("flush over a corrupt record: %v, want ErrCorrupt", err)
	}
}

// TestPeersRoundTrip: the members' addresses saved survive a reopen of the
// directory; a corrupt entry is refused naming the problem.
func TestPeersRoundTrip(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := s.LoadPeers(ctx); err != nil || got != nil {
		t.Fatalf("fresh store: %v, %v; want none", got, err)
	}
	want := []node.KnownPeer{{Peer: "12D3KooWA", Addrs: []string{"/ip4/127.0.0.1/tcp/4001/p2p/12D3KooWA"}}, {Peer: "12D3KooWB", Addrs: []string{"/ip4/127.0.0.1/tcp/4002/p2p/12D3KooWB"}}}
	if err := s.SavePeers(ctx, want); err != nil {
		t.Fatal(err)
	}
	if err := s.Flush(ctx, node.Flush{}); err != nil { // syncs
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if s, err = Open(dir); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	got, err := s.LoadPeers(ctx)
	if err != nil || len(got) != 2 || got[1].Peer != "12D3KooWB" || got[1].Addrs[0] != want[1].Addrs[0] {
		t.Errorf("after reopening: %+v, %v; want %+v", got, err, want)
	}
	m := NewMemory()
	if err := m.d.Put(ctx, keyPeers, []byte(`[{"peer":""}]`)); err != nil {
		t.Fatal(err)
	}
	if _, err := m.LoadPeers(ctx); !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "peers[0]") {
		t.Errorf("corrupt peers: %v; want ErrCorrupt naming peers[0]", err)
	}
}

// TestSavedPeersSurviveAKill: the members' addresses saved while the node
// runs are on disk when SavePeers returns, with no flush after them, as a
// kill -9 would find them: a copy of the open store's files has them.
func TestSavedPeersSurviveAKill(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s := mustOpen(t, dir)
	defer s.Close()
	if err := s.Flush(ctx, node.Flush{}); err != nil { // the first flush, as the node's
		t.Fatal(err)
	}
	want := []node.KnownPeer{{Peer: "12D3KooWA", Addrs: []string{"/ip4/127.0.0.1/tcp/4001/p2p/12D3KooWA"}}}
	if err := s.SavePeers(ctx, want); err != nil {
		t.Fatal(err)
	}
	// What a kill -9 leaves: the files as the OS holds them, the
	// process's buffers lost.
	crashed := filepath.Join(t.TempDir(), "crashed")
	if err := os.CopyFS(crashed, os.DirFS(dir)); err != nil {
		t.Fatal(err)
	}
	c := mustOpen(t, crashed)
	defer c.Close()
	if got, err := c.LoadPeers(ctx); err != nil || len(got) != 1 || got[0].Peer != want[0].Peer {
		t.Errorf("after a kill: %+v, %v; want %+v", got, err, want)
	}
}
