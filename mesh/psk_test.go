package mesh

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/ratemesh/ratemesh/internal/testutil"
)

// writeSwarmKey writes a fresh swarm.key in the libp2p/IPFS format.
func writeSwarmKey(t *testing.T) string {
	t.Helper()
	k := make([]byte, 32)
	if _, err := rand.Read(k); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "swarm.key")
	body := "/key/swarm/psk/1.0.0/\n/base16/\n" + hex.EncodeToString(k) + "\n"
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func pskConfig(t *testing.T, psk []byte) Config {
	cfg := testConfig(t)
	cfg.PSK = psk
	cfg.Listen = []string{"/ip4/127.0.0.1/tcp/0"}
	cfg.DialTimeout = time.Second
	return cfg
}

// TestPrivateNetwork: members holding the same key connect and exchange;
// one holding another key, or none, fails to connect within DialTimeout
// with an error that says what is likely wrong and names the address.
func TestPrivateNetwork(t *testing.T) {
	t.Parallel()
	keyPath := writeSwarmKey(t)
	psk, err := LoadPSK(keyPath)
	if err != nil {
		t.Fatal(err)
	}
	other, err := LoadPSK(writeSwarmKey(t))
	if err != nil {
		t.Fatal(err)
	}
	a, ra := startMesh(t, pskConfig(t, psk))
	cfgB := pskConfig(t, psk)
	cfgB.Bootstrap = []string{tcpAddr(t, a)}
	b, _ := startMesh(t, cfgB)
	if !connected(a, b) {
		t.Fatal("members with the same key did not connect")
	}
	ctx := context.Background()
	testutil.Eventually(t, 5*time.Second, func() (bool, string) {
		if err := b.Publish(ctx, batch(b.PeerID(), 1, "private", 1)); err != nil {
			t.Fatal(err)
		}
		return ra.has(b.PeerID(), "private"), "A hears B over the private network"
	})

	for _, tc := range []struct {
		name     string
		psk      []byte
		sentinel error
		text     string
	}{
		{"another key", other, ErrKeyMismatchOrUnreachable, "private network key mismatch or peer unreachable: "},
		{"no key", nil, ErrUnreachable, "peer unreachable: "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := pskConfig(t, tc.psk)
			c, rc := startMesh(t, cfg)
			addr := tcpAddr(t, a)
			start := time.Now()
			err := c.Connect(ctx, addr)
			elapsed := time.Since(start)
			if err == nil {
				t.Fatal("connected to a private network without its key")
			}
			if !errors.Is(err, tc.sentinel) || !strings.Contains(err.Error(), tc.text+addr) {
				t.Errorf("error %q: want %v naming %s", err, tc.sentinel, addr)
			}
			if elapsed > cfg.DialTimeout+time.Second {
				t.Errorf("failed after %v, want within DialTimeout %v", elapsed, cfg.DialTimeout)
			}
			t.Logf("%s: failed in %v: %v", tc.name, elapsed.Round(time.Millisecond), err)
			if connected(c, a) || connected(a, c) {
				t.Error("a connection exists after the failed dial")
			}
			// Nor can the keyed member reach the outsider.
			if err := a.Connect(ctx, tcpAddr(t, c)); !errors.Is(err, ErrKeyMismatchOrUnreachable) {
				t.Errorf("keyed member dialled the outsider: %v", err)
			}
			if got := rc.connections(); len(got) != 0 {
				t.Errorf("outsider saw PeerConnected(%v)", got)
			}
		})
	}
}

// TestPrivateNetworkSilentPeer dials, under a PSK, an address that accepts
// TCP and then never says a word — what a mismatched handshake can look
// like. The dial gives up at DialTimeout with the PSK error.
func TestPrivateNetworkSilentPeer(t *testing.T) {
	t.Parallel()
	psk, err := LoadPSK(writeSwarmKey(t))
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		var held []net.Conn
		defer func() {
			for _, c := range held {
				c.Close()
			}
		}()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			held = append(held, c) // accept, never answer
		}
	}()
	c := newMesh(t, pskConfig(t, psk))
	if err := c.Start(context.Background(), &recorder{}); err != nil {
		t.Fatal(err)
	}
	silent := newKey(t)
	id, _ := peer.IDFromPrivateKey(silent)
	addr := fmt.Sprintf("/ip4/127.0.0.1/tcp/%d/p2p/%s", ln.Addr().(*net.TCPAddr).Port, id)
	start := time.Now()
	err = c.Connect(context.Background(), addr)
	elapsed := time.Since(start)
	if !errors.Is(err, ErrKeyMismatchOrUnreachable) || !strings.Contains(err.Error(), "private network key mismatch or peer unreachable: "+addr) {
		t.Errorf("error %v: want the PSK error naming %s", err, addr)
	}
	if d := c.cfg.DialTimeout; elapsed < d/2 || elapsed > d+time.Second {
		t.Errorf("gave up after %v, want about DialTimeout %v", elapsed, d)
	}
	t.Logf("silent peer: failed in %v", elapsed.Round(time.Millisecond))
}

func TestPrivateNetworkRefusesQUIC(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	cfg.PSK = make([]byte, 32)
	_, err := New(cfg) // testConfig listens on TCP and QUIC
	if err == nil || !strings.Contains(err.Error(), "Listen[1]") || !strings.Contains(err.Error(), "only over TCP") {
		t.Fatalf("New with a PSK and a QUIC address: %v", err)
	}
}

func TestLoadPSK(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.key")
	if err := os.WriteFile(bad, []byte("/key/swarm/psk/1.0.0/\n/base16/\nnothex\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	short := filepath.Join(dir, "short.key")
	if err := os.WriteFile(short, []byte("/key/swarm/psk/1.0.0/\n/base16/\nabcd\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{bad, short, filepath.Join(dir, "missing.key")} {
		if _, err := LoadPSK(p); err == nil || !strings.Contains(err.Error(), p) {
			t.Errorf("LoadPSK(%s): %v, want an error naming the path", p, err)
		}
	}
	good := writeSwarmKey(t)
	k1, err := LoadPSK(good)
	if err != nil || len(k1) != 32 {
		t.Fatalf("LoadPSK: %v (%d bytes)", err, len(k1))
	}
}

func TestLoadOrCreateKey(t *testing.T) {
	t.Parallel()
	p := filepath.Join(t.TempDir(), "identity.key")
	k1, err := LoadOrCreateKey(p)
	if err != nil {
		t.Fatal(err)
	}
	k2, err := LoadOrCreateKey(p)
	if err != nil {
		t.Fatal(err)
	}
	if !k1.Equals(k2) {
		t.Error("a reloaded key differs: the peer ID would change across restarts")
	}
	if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("key file mode %v (%v), want 0600", fi.Mode().Perm(), err)
	}
	if err := os.WriteFile(p, []byte("junk"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadOrCreateKey(p); err == nil || !strings.Contains(err.Error(), p) {
		t.Errorf("corrupt key: %v, want an error naming the path", err)
	}
}
