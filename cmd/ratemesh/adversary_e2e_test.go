package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/ratemesh/ratemesh/crdt"
	"github.com/ratemesh/ratemesh/httpapi"
	"github.com/ratemesh/ratemesh/internal/p2ptest"
	"github.com/ratemesh/ratemesh/internal/testutil"
	"github.com/ratemesh/ratemesh/mesh"
	"github.com/ratemesh/ratemesh/node"
	"github.com/ratemesh/ratemesh/persistence"
)

// advNop is the adversary's node.Handler: it ignores what it hears.
type advNop struct{}

func (advNop) HandleBatch(node.Inbound) {}
func (advNop) PeerConnected(string)     {}

// rssKB reads a process's resident set size in kB from /proc.
func rssKB(t *testing.T, pid int) int {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Skipf("no /proc: %v", err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, err := strconv.Atoi(f[1])
			if err != nil {
				t.Fatal(err)
			}
			return kb
		}
	}
	t.Fatalf("no VmRSS in /proc/%d/status", pid)
	return 0
}

// adversaryMesh is a real libp2p transport of the test's own with key and
// psk: it speaks the protocol and sends whatever the test gives it.
func adversaryMesh(t *testing.T, key crypto.PrivKey, psk []byte) *mesh.Mesh {
	t.Helper()
	cfg := mesh.DefaultConfig()
	cfg.PrivKey, cfg.PSK = key, psk
	cfg.Listen = []string{"/ip4/127.0.0.1/tcp/0"}
	cfg.Logger = slog.New(slog.DiscardHandler)
	m, err := mesh.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := m.Start(ctx, advNop{}); err != nil {
		t.Fatal(err)
	}
	return m
}

// privateMesh is three `serve` processes that share a private network
// key and an allowlist naming them and one more peer, the adversary, whose
// identity the test holds.
type privateMesh struct {
	t       *testing.T
	cluster *cluster
	ps      []*proc
	psk     []byte
	advKey  crypto.PrivKey
	advID   peer.ID
}

// startPrivateMesh writes a private network key and an allowlist of three
// members and an adversary into a new cluster with config, starts the
// three members (1 and 2 bootstrapped to 0), and returns once each sees
// all three alive. The adversary is not started.
func startPrivateMesh(t *testing.T, bin, config string) *privateMesh {
	t.Helper()
	c := newCluster(t, bin, config)
	var pskBytes [32]byte
	if _, err := rand.Read(pskBytes[:]); err != nil {
		t.Fatal(err)
	}
	pskFile := filepath.Join(c.dir, "swarm.key")
	if err := os.WriteFile(pskFile, []byte("/key/swarm/psk/1.0.0/\n/base16/\n"+hex.EncodeToString(pskBytes[:])+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	psk, err := mesh.LoadPSK(pskFile)
	if err != nil {
		t.Fatal(err)
	}
	// The members' identities exist before they start, so the allowlist
	// can name them.
	var allow []string
	for i := range 3 {
		nd := filepath.Join(c.dir, fmt.Sprintf("n%d", i))
		if err := os.MkdirAll(nd, 0o700); err != nil {
			t.Fatal(err)
		}
		key, err := mesh.LoadOrCreateKey(filepath.Join(nd, "identity.key"))
		if err != nil {
			t.Fatal(err)
		}
		id, _ := peer.IDFromPrivateKey(key)
		allow = append(allow, id.String())
	}
	advKey, _, _ := crypto.GenerateEd25519Key(nil)
	advID, _ := peer.IDFromPrivateKey(advKey)
	allowFile := filepath.Join(c.dir, "allow")
	if err := os.WriteFile(allowFile, []byte(strings.Join(append(allow, advID.String()), "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	flags := []string{"--psk-file", pskFile, "--allow-peers-file", allowFile}
	ps := []*proc{c.start(0, "", "", flags...)}
	for i := 1; i < 3; i++ {
		ps = append(ps, c.start(i, "", "", append(flags, "--bootstrap", ps[0].ready.Addrs[0])...))
	}
	c.waitAlive(ps, 20*time.Second)
	return &privateMesh{t: t, cluster: c, ps: ps, psk: psk, advKey: advKey, advID: advID}
}

// adversary starts the listed adversary's transport (adversaryMesh) and
// connects it to every member.
func (pm *privateMesh) adversary(ctx context.Context) *mesh.Mesh {
	pm.t.Helper()
	adv := adversaryMesh(pm.t, pm.advKey, pm.psk)
	for _, p := range pm.ps {
		if err := adv.Connect(ctx, p.ready.Addrs[0]); err != nil {
			pm.t.Fatalf("the listed adversary cannot connect: %v", err)
		}
	}
	return adv
}

// TestServeAllowlistedAdversary is issue 24's hardest case on real
// processes: three `serve` nodes share a private network key and an
// allowlist that names them and one adversary, a real libp2p peer of the
// test's own that holds the key, is listed, and lies. While the hot key is
// flooded at 5 × its limit and member 0 holds 9 of 10 leases, the
// adversary sends members 1 and 2 relays lowering member 0's leases to 0,
// sends member 0 ten full states listing 1,000 invented members each
// (10,000, with addresses), and batches claiming members' slots. Every
// whole window stays within 1.02 × the limit, the mesh grants at most the
// one lease left, no node fences, member 0's resident memory grows by
// under 10 MB, and nothing invented reaches its disk. A peer that holds
// the key but is not listed cannot connect at all.
func TestServeAllowlistedAdversary(t *testing.T) {
	// The attack's memory is measured under Go's default collector: serve's
	// GC headroom (gc.go) lets a small heap grow by 64 MiB by design, which
	// GOGC in the environment turns off.
	t.Setenv("GOGC", "100")
	bin := buildBinary(t)
	const (
		limit  = 100
		leases = 10
	)
	pm := startPrivateMesh(t, bin, fmt.Sprintf("rules:\n  - {name: hot, algorithm: fixed_window, limit: %d, window: 1s}\n  - {name: cc, algorithm: concurrency, limit: %d, lease_ttl: 1m}\n", limit, leases))
	c, ps, psk, advID := pm.cluster, pm.ps, pm.psk, pm.advID

	// A peer with the key that is not listed cannot connect.
	outsiderKey, _, _ := crypto.GenerateEd25519Key(nil)
	outsider := adversaryMesh(t, outsiderKey, psk)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	if err := outsider.Connect(ctx, ps[0].ready.Addrs[0]); err == nil {
		testutil.Eventually(t, 5*time.Second, func() (bool, string) {
			return len(outsider.Peers()) == 0, fmt.Sprintf("the unlisted peer holding the key is connected to %v", outsider.Peers())
		})
	}
	testutil.Eventually(t, 5*time.Second, func() (bool, string) {
		resp, err := ps[0].client.Get(ps[0].url("/metrics"))
		if err != nil {
			return false, err.Error()
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		for _, line := range strings.Split(string(body), "\n") {
			if strings.HasPrefix(line, `ratemesh_connections_refused_total{reason="not_member"} `) && !strings.HasSuffix(line, " 0") {
				return true, ""
			}
		}
		return false, "member 0 counts no connection refused as not_member"
	})

	// Member 0 holds 9 leases (a share denial is retried as its
	// acquisitions are acknowledged).
	var held int
	retry := time.NewTicker(10 * time.Millisecond)
	defer retry.Stop()
	for deadline := time.Now().Add(10 * time.Second); held < leases-1; <-retry.C {
		if time.Now().After(deadline) {
			t.Fatalf("member 0 acquired %d of %d leases in 10 s", held, leases-1)
		}
		var ar httpapi.AcquireResponse
		if status, err := ps[0].post("/v1/acquire", `{"rule":"cc","key":"k"}`, &ar); err != nil || status != 200 {
			t.Fatalf("acquire at member 0: %d %v", status, err)
		}
		if ar.Allowed {
			held++
		}
	}
	testutil.Eventually(t, 10*time.Second, func() (bool, string) {
		for i, p := range ps {
			if u, err := p.usage("cc", "k"); err != nil || u.Total != uint64(held) {
				return false, fmt.Sprintf("member %d counts %d leases (%v), want %d", i, u.Total, err, held)
			}
		}
		return true, ""
	})

	l := startLoad(t, "hot", "k", 1000, ps, 5*limit, 6)
	from := time.Now()
	time.Sleep(3 * time.Second) // the flood before the attack, not a wait for a condition
	rssBefore := rssKB(t, ps[0].cmd.Process.Pid)

	adv := pm.adversary(ctx)
	self := crdt.Slot{Peer: advID.String(), Incarnation: uint64(time.Now().UnixMilli())}
	var victim crdt.Slot
	for _, pj := range peersOf(t, ps[1]) {
		if pj.PeerID == ps[0].ready.PeerID {
			victim = crdt.Slot{Peer: pj.PeerID, Incarnation: pj.Incarnation}
		}
	}
	var wg sync.WaitGroup
	attackErr := make(chan error, 3)
	wg.Add(3)
	go func() { // lease-lowering relays to members 1 and 2
		defer wg.Done()
		for k := range 20 {
			now := time.Now().UnixMilli()
			b := &crdt.Batch{Version: crdt.Version, From: self, Seq: uint64(k + 1), Sent: now, Clock: now,
				Flags: crdt.FlagFull | crdt.FlagRelay | crdt.FlagLast, Slots: []crdt.Slot{victim},
				Leases: []crdt.LeaseEntry{{Slot: 1, Rule: "cc", Key: "k", Acquired: 1 << 40, Released: 1 << 40}}}
			for _, p := range ps[1:] {
				if err := adv.SendDirect(ctx, p.ready.PeerID, []*crdt.Batch{b}); err != nil {
					attackErr <- fmt.Errorf("relay: %w", err)
					return
				}
			}
		}
	}()
	go func() { // 10,000 invented members, with addresses, to member 0
		defer wg.Done()
		pid, _ := peer.Decode(ps[0].ready.PeerID)
		for k := range 10 {
			now := time.Now().UnixMilli()
			b := &crdt.Batch{Version: crdt.Version, From: self, Seq: uint64(100 + k), Sent: now, Clock: now, Flags: crdt.FlagFull | crdt.FlagLast}
			for range 1000 {
				_, pub, _ := crypto.GenerateEd25519Key(nil)
				id, _ := peer.IDFromPublicKey(pub)
				b.Members = append(b.Members, crdt.MemberEntry{Peer: id.String(), Incarnation: 1, State: crdt.MemberAlive,
					Addrs: []string{"/ip4/127.0.0.1/tcp/9/p2p/" + id.String()}})
			}
			if err := p2ptest.SendRawSync(ctx, adv.Host(), pid, adv.SyncProtocol(), b); err != nil {
				attackErr <- fmt.Errorf("member table: %w", err)
				return
			}
		}
	}()
	go func() { // batches claiming member 1's slot, which must be refused
		defer wg.Done()
		forged := crdt.Slot{Peer: ps[1].ready.PeerID, Incarnation: victim.Incarnation}
		for k := range 10 {
			now := time.Now().UnixMilli()
			b := &crdt.Batch{Version: crdt.Version, From: forged, Seq: uint64(1000 + k), Sent: now, Clock: now, Flags: crdt.FlagFull | crdt.FlagLast,
				Windows: []crdt.WindowEntry{{Rule: "hot", Key: "k", WindowMs: 1000, Window: now / 1000, Admitted: 0, Attempted: 0}}}
			if err := adv.SendDirect(ctx, ps[2].ready.PeerID, []*crdt.Batch{b}); err == nil {
				attackErr <- fmt.Errorf("a batch claiming member 1's slot was accepted by member 2")
				return
			}
		}
	}()
	// Members 1 and 2 take leases as clients would, and no node fences.
	granted := 0
	staleSeen := make([]int, len(ps))
	defer func() { t.Logf("health polls that found a node stale during the attack, by node: %v", staleSeen) }()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for end := time.Now().Add(4 * time.Second); time.Now().Before(end); <-tick.C {
		for i, p := range ps {
			var h httpapi.HealthResponse
			status, err := p.get("/healthz", &h)
			switch {
			case err == nil && status == 503 && h.State == "stale":
				// Not fenced, but its batches go unacknowledged while the
				// slot-claiming batches flood in: it denies as stale (the
				// windows below show it). Counted, not failed: a finding
				// for the trust work, see the issue 26 note.
				staleSeen[i]++
			case err != nil || status != 200:
				t.Errorf("node %d is %q (%d, %v) during the attack", i, h.State, status, err)
			}
			if i == 0 {
				continue
			}
			var ar httpapi.AcquireResponse
			if status, err := p.post("/v1/acquire", `{"rule":"cc","key":"k"}`, &ar); err == nil && status == 200 && ar.Allowed {
				granted++
			}
		}
		if t.Failed() {
			break
		}
	}
	wg.Wait()
	close(attackErr)
	for err := range attackErr {
		t.Error(err)
	}
	time.Sleep(2 * time.Second) // the flood after the attack
	rssAfter := rssKB(t, ps[0].cmd.Process.Pid)
	to := time.Now()
	outs, sent, failed := l.finish()

	windows, admitted := admittedPerWindow(outs, from, to)
	t.Logf("%d requests, %d failed; admitted per whole window %v; member 0's RSS %d → %d kB; %d leases granted beside member 0's %d",
		sent, failed, ordered(windows, admitted), rssBefore, rssAfter, granted, held)
	for _, w := range windows {
		if a := admitted[w]; float64(a) > 1.02*limit {
			t.Errorf("window %d: %d admitted, over 1.02 × %d", w, a, limit)
		}
	}
	if held+granted > leases {
		t.Errorf("%d live leases under a limit of %d", held+granted, leases)
	}
	if grew := rssAfter - rssBefore; grew > 10*1024 {
		t.Errorf("member 0's resident memory grew by %d kB during the attack, over 10 MB", grew)
	}

	// Nothing invented reached member 0's disk.
	stop(t, ps[0], syscall.SIGTERM)
	st, err := persistence.Open(filepath.Join(c.dir, "n0"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	saved, err := st.LoadPeers(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	known := map[string]bool{advID.String(): true}
	for _, p := range ps {
		known[p.ready.PeerID] = true
	}
	for _, kp := range saved {
		if !known[kp.Peer] {
			t.Errorf("member 0 saved an invented peer %s (of %d saved)", kp.Peer, len(saved))
			break
		}
	}
	t.Logf("member 0 saved %d peers", len(saved))
}

// peersOf reads p's /v1/peers.
func peersOf(t *testing.T, p *proc) []httpapi.PeerJSON {
	t.Helper()
	var pr httpapi.PeersResponse
	if status, err := p.get("/v1/peers", &pr); err != nil || status != 200 {
		t.Fatalf("peers: %d %v", status, err)
	}
	return pr.Peers
}
