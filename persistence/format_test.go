package persistence

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ratemesh/ratemesh/node"
)

// copyDataDir copies testdata's data directory name into a temporary
// directory: opening a store writes into it.
func copyDataDir(t *testing.T, name string) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.CopyFS(dir, os.DirFS(filepath.Join("testdata", name))); err != nil {
		t.Fatal(err)
	}
	return dir
}

func formatOf(t *testing.T, s *Store) string {
	t.Helper()
	v, err := s.d.Get(context.Background(), keyFormat)
	if err != nil {
		t.Fatal(err)
	}
	return string(v)
}

// TestOpenFdd4fa5DataDir opens the data directory a node built from
// fdd4fa5 wrote (testdata/fdd4fa5-datadir/README.md): a store that does
// not record the members its node knew. Open refuses it, naming the path
// and what to do, and leaves it as it was; with UpgradeUnknownMembers (a
// node that joins through --bootstrap) it reads every record and migrates
// the store, which then opens without the option.
func TestOpenFdd4fa5DataDir(t *testing.T) {
	ctx := context.Background()
	dir := copyDataDir(t, "fdd4fa5-datadir")
	path := filepath.Join(dir, StoreDir)
	for range 2 { // the refusal changes nothing: the second is the same
		s, err := Open(dir)
		if err == nil {
			peers, _ := s.LoadPeers(ctx)
			s.Close()
			t.Fatalf("Open took fdd4fa5's store as a store whose node knew no members (peers %v)", peers)
		}
		for _, want := range []string{path, `"ratemesh-store-1"`, "--bootstrap", "--upgrade-alone"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("err = %v; want it to say %q", err, want)
			}
		}
		if !errors.Is(err, ErrOldStore) {
			t.Errorf("err = %v; want ErrOldStore", err)
		}
	}

	s, err := Open(dir, UpgradeUnknownMembers(), WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	if err != nil {
		t.Fatalf("Open with UpgradeUnknownMembers: %v", err)
	}
	const peer = "12D3KooWMYL4jJ3PApxdTEWowwtePQBzKdBrWU2TWcHBMXM28BmW"
	const inc = 0x000001a21cd620a9
	if got := formatOf(t, s); got != format {
		t.Errorf("format %q after the migration, want %q", got, format)
	}
	if n, err := s.LoadIncarnation(ctx); err != nil || n != inc {
		t.Errorf("incarnation %d, %v; want %d", n, err, uint64(inc))
	}
	ws, err := s.LoadWindows(ctx)
	if err != nil {
		t.Fatal(err)
	}
	counts := map[string][2]uint64{}
	for _, w := range ws {
		if w.Rule != "api" || w.WindowMs != 60000 || w.Slot.Peer != peer || w.Slot.Incarnation != inc {
			t.Errorf("window record %+v: want rule api, 1 min windows, slot %s/%d", w, peer, uint64(inc))
		}
		counts[w.Key] = [2]uint64{w.Admitted, w.Attempted}
	}
	if want := map[string][2]uint64{"user:1": {5, 5}, "user:2": {3, 3}}; len(counts) != 2 || counts["user:1"] != want["user:1"] || counts["user:2"] != want["user:2"] {
		t.Errorf("window counts %v, want %v", counts, want)
	}
	ls, err := s.LoadLeases(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(ls) != 1 || ls[0].Rule != "conns" || ls[0].Key != "db" || !strings.HasPrefix(ls[0].ID, peer+"~") {
		t.Errorf("leases %+v, want one of conns/db owned by %s", ls, peer)
	}
	if peers, err := s.LoadPeers(ctx); err != nil || peers != nil {
		t.Errorf("peers %v, %v; want none", peers, err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = mustOpen(t, dir) // migrated: no option needed now
	if got := formatOf(t, s); got != format {
		t.Errorf("format %q on reopening, want %q", got, format)
	}
	s.Close()
}

// TestOpenFormats covers the other markers: a format 1 store that saved
// its members migrates at once; a store of a newer format, or of none
// known, is refused naming the path.
func TestOpenFormats(t *testing.T) {
	ctx := context.Background()
	write := func(t *testing.T, marker string, peers bool) string {
		t.Helper()
		dir := t.TempDir()
		s := mustOpen(t, dir)
		if peers {
			if err := s.SavePeers(ctx, []node.KnownPeer{{Peer: "12D3KooWBeta", Addrs: []string{"/ip4/10.0.0.2/tcp/4001"}}}); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.d.Put(ctx, keyFormat, []byte(marker)); err != nil {
			t.Fatal(err)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	t.Run("format 1 with members", func(t *testing.T) {
		dir := write(t, formatV1, true)
		s, err := Open(dir, WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if got := formatOf(t, s); got != format {
			t.Errorf("format %q, want %q", got, format)
		}
		if peers, err := s.LoadPeers(ctx); err != nil || len(peers) != 1 || peers[0].Peer != "12D3KooWBeta" {
			t.Errorf("peers %v, %v", peers, err)
		}
	})
	t.Run("format 2 without members", func(t *testing.T) {
		dir := write(t, format, false)
		s := mustOpen(t, dir) // a node that knew no member: nothing to refuse
		s.Close()
	})
	for _, tc := range []struct{ marker, want string }{
		{"ratemesh-store-3", "newer ratemesh"},
		{"something-else", `format "something-else"`},
	} {
		t.Run(tc.marker, func(t *testing.T) {
			dir := write(t, tc.marker, false)
			s, err := Open(dir, UpgradeUnknownMembers())
			if err == nil {
				s.Close()
				t.Fatal("Open succeeded")
			}
			if !errors.Is(err, ErrNotStore) || !strings.Contains(err.Error(), filepath.Join(dir, StoreDir)) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v; want ErrNotStore naming the path and %q", err, tc.want)
			}
		})
	}
	t.Run("new store", func(t *testing.T) {
		s := mustOpen(t, t.TempDir())
		defer s.Close()
		if got := formatOf(t, s); got != format {
			t.Errorf("format %q, want %q", got, format)
		}
		if v, err := NewMemory().d.Get(ctx, keyFormat); err != nil || string(v) != format {
			t.Errorf("memory store's format %q, %v", v, err)
		}
	})
}
