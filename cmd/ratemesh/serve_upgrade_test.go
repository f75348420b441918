package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// copyDir copies the tree at src into dst.
func copyDir(t *testing.T, src, dst string) {
	t.Helper()
	err := filepath.WalkDir(src, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		if d.IsDir() {
			return os.MkdirAll(filepath.Join(dst, rel), 0o700)
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dst, rel), data, 0o600)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestServeUpgradesAnOldStore: a data directory fdd4fa5 wrote (format 1,
// no members recorded) is refused without --bootstrap, the error naming
// the store and both ways out; with --upgrade-alone the node migrates it
// as it is, keeps its peer ID and serves.
func TestServeUpgradesAnOldStore(t *testing.T) {
	bin := buildBinary(t)
	dir := filepath.Join(t.TempDir(), "data")
	copyDir(t, filepath.Join("..", "..", "persistence", "testdata", "fdd4fa5-datadir"), dir)
	args := []string{"serve", "--data-dir", dir, "--api", "127.0.0.1:0", "--listen", "/ip4/127.0.0.1/tcp/0"}
	out, err := exec.Command(bin, args...).CombinedOutput()
	if code := exitCode(err); code != 1 {
		t.Fatalf("serve on fdd4fa5's store: exit %d (%v), want 1\n%s", code, err, out)
	}
	for _, want := range []string{filepath.Join(dir, "store"), "--bootstrap", "--upgrade-alone", "ratemesh-store-1"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("the refusal does not name %q:\n%s", want, out)
		}
	}
	p := startServe(t, bin, append(args[1:], "--upgrade-alone")...)
	if !p.logged("migrated the store", 5*time.Second) {
		t.Errorf("no migration logged:\n%s", p.stderr.String())
	}
	stop(t, p, syscall.SIGTERM)
	// Migrated: it now starts without the flag.
	q := startServe(t, bin, args[1:]...)
	if q.ready.PeerID != p.ready.PeerID {
		t.Errorf("peer ID %s after the migration, %s before", q.ready.PeerID, p.ready.PeerID)
	}
}

// exitCode returns a finished command's exit status (0 for none).
func exitCode(err error) int {
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode()
	}
	if err != nil {
		return -1
	}
	return 0
}
