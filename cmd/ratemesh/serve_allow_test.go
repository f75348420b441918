package main

import (
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/ratemesh/ratemesh/internal/testutil"
	"github.com/ratemesh/ratemesh/mesh"
)

// metric returns the value of one sample of p's /metrics, -1 when absent.
func (p *proc) metric(t *testing.T, sample string) float64 {
	t.Helper()
	resp, err := p.client.Get(p.url("/metrics"))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?m)^" + regexp.QuoteMeta(sample) + " (\\S+)$").FindSubmatch(body)
	if m == nil {
		return -1
	}
	v, err := strconv.ParseFloat(string(m[1]), 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestServeAllowlistFile: two serve processes; the first admits the
// members its --allow-peers-file lists, which at first is nobody. The
// second, bootstrapping from it, is refused (counted in the first's
// ratemesh_connections_refused_total{reason="not_member"}) and serves
// alone after its join timeout. Once its peer ID is added to the file,
// it joins without a restart: each sees the other alive.
func TestServeAllowlistFile(t *testing.T) {
	bin := buildBinary(t)
	dir := t.TempDir()
	allow := filepath.Join(dir, "members")
	if err := os.WriteFile(allow, []byte("# members of the test mesh\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// B's identity, made before it starts, so its peer ID is known.
	dirB := filepath.Join(dir, "b")
	if err := os.MkdirAll(dirB, 0o700); err != nil {
		t.Fatal(err)
	}
	keyB, err := mesh.LoadOrCreateKey(filepath.Join(dirB, "identity.key"))
	if err != nil {
		t.Fatal(err)
	}
	idB, _ := peer.IDFromPrivateKey(keyB)

	a := startServe(t, bin, "--api", "127.0.0.1:0", "--listen", "/ip4/127.0.0.1/tcp/0", "--data-dir", filepath.Join(dir, "a"), "--allow-peers-file", allow)
	b := startServe(t, bin, "--api", "127.0.0.1:0", "--listen", "/ip4/127.0.0.1/tcp/0", "--data-dir", dirB, "--bootstrap", a.ready.Addrs[0])
	if b.ready.PeerID != idB.String() {
		t.Fatalf("B serves as %s, not the identity made for it %s", b.ready.PeerID, idB)
	}
	const refused = `ratemesh_connections_refused_total{reason="not_member"}`
	testutil.Eventually(t, 10*time.Second, func() (bool, string) {
		return a.metric(t, refused) >= 1, "A counts B's refused connections"
	})
	if s := a.states(t)[idB.String()]; s != "" {
		t.Fatalf("A holds the unlisted B as %s", s)
	}
	if !a.logged("refused a connection", 5*time.Second) {
		t.Error("A did not log the refusal")
	}

	if err := os.WriteFile(allow, []byte("# members of the test mesh\n"+idB.String()+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// B redials A with a backoff that doubles from 250 ms after every
	// refused connection (up to 30 s): on a loaded machine its next try
	// may come half a minute later (26–30 s measured with both cores
	// busy).
	testutil.Eventually(t, 90*time.Second, func() (bool, string) {
		sa, sb := a.states(t)[idB.String()], b.states(t)[a.ready.PeerID]
		return sa == "alive" && sb == "alive", "A sees B " + sa + ", B sees A " + sb
	})
}
