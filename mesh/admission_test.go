package mesh

import (
	"context"
	crand "crypto/rand"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	pb "github.com/libp2p/go-libp2p-pubsub/pb"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/ratemesh/ratemesh/crdt"
	"github.com/ratemesh/ratemesh/internal/testutil"
)

// dial connects from to to and reports the error, bounded.
func dial(from, to *Mesh) error {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	ctx = network.WithForceDirectDial(ctx, "test") // past the swarm's dial backoff
	return from.Host().Connect(ctx, peer.AddrInfo{ID: to.Host().ID(), Addrs: to.Host().Addrs()})
}

// refusesInbound dials a from c until a has counted one more not_member
// refusal and neither holds a connection to the other. The dialer's own
// handshake may complete before a's gater closes the connection, so
// Connect itself may succeed.
func refusesInbound(t *testing.T, a, c *Mesh) {
	t.Helper()
	before := a.Stats().RefusedConns[ConnNotMember]
	testutil.Eventually(t, 10*time.Second, func() (bool, string) {
		_ = dial(c, a) // again: under load one dial may fail before a's gater sees it
		got := a.Stats().RefusedConns[ConnNotMember]
		return got > before && !connected(c, a) && !connected(a, c),
			fmt.Sprintf("refusals %d (before %d), connected %v/%v", got, before, connected(c, a), connected(a, c))
	})
}

// TestAllowlistGater: with an allowlist, a listed peer connects and is
// announced; a peer not listed — holding the private network key or not
// — cannot connect in either direction (the gater refuses it after the
// handshake, or before dialling it), and each refusal is counted as
// not_member. Without the allowlist (the finding at 821b92d) the outsider
// connects and the first check fails.
func TestAllowlistGater(t *testing.T) {
	t.Parallel()
	psk := make([]byte, 32)
	if _, err := crand.Read(psk); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		psk  []byte
	}{{"no PSK", nil}, {"PSK", psk}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			conf := func() Config {
				c := testConfig(t)
				if tc.psk != nil {
					c = pskConfig(t, tc.psk)
				}
				return c
			}
			cfgB, cfgC := conf(), conf()
			idB, _ := peer.IDFromPrivateKey(cfgB.PrivKey)
			cfgA := conf()
			cfgA.AllowPeers = []string{idB.String()}
			a, ra := startMesh(t, cfgA)
			b, _ := startMesh(t, cfgB)
			c, _ := startMesh(t, cfgC)

			refusesInbound(t, a, c)
			before := a.Stats().RefusedConns[ConnNotMember]
			if err := dial(a, c); err == nil {
				t.Errorf("A dialled a peer not on the allowlist")
			}
			if got := a.Stats().RefusedConns[ConnNotMember]; got != before+1 {
				t.Errorf("outbound refusal: RefusedConns[not_member] %d, want %d", got, before+1)
			}
			if err := dial(b, a); err != nil {
				t.Fatalf("a listed peer cannot connect: %v", err)
			}
			testutil.Eventually(t, 5*time.Second, func() (bool, string) {
				return slices.Contains(ra.connections(), b.PeerID()), "the listed peer is announced"
			})
			if slices.Contains(ra.connections(), c.PeerID()) {
				t.Error("the outsider was announced")
			}
			st := a.Stats()
			if st.Refused != st.RefusedConns[ConnBlocked]+st.RefusedConns[ConnNotMember] {
				t.Errorf("Refused %d is not the sum of %v", st.Refused, st.RefusedConns)
			}
		})
	}
}

// configMapDir lays out dir as Kubernetes mounts a ConfigMap: the file
// name is a symlink into ..data, itself a symlink to a versioned
// directory, and an update swaps ..data atomically. It returns the file's
// path and a function that publishes a new content.
func configMapDir(t *testing.T, name, content string) (string, func(string)) {
	t.Helper()
	dir := t.TempDir()
	version := 0
	publish := func(content string) {
		t.Helper()
		version++
		v := fmt.Sprintf("..v%d", version)
		if err := os.Mkdir(filepath.Join(dir, v), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, v, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		tmp := filepath.Join(dir, "..data_tmp")
		if err := os.Symlink(v, tmp); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
			t.Fatal(err)
		}
	}
	publish(content)
	if err := os.Symlink(filepath.Join("..data", name), filepath.Join(dir, name)); err != nil {
		t.Fatal(err)
	}
	return filepath.Join(dir, name), publish
}

// TestAllowlistFileReload: the allowlist file, mounted as a ConfigMap,
// changes under a running member. Adding a peer lets it connect without a
// restart; an unreadable or invalid version keeps the last good list;
// removing the peer disconnects it and refuses its new connections.
func TestAllowlistFileReload(t *testing.T) {
	t.Parallel()
	cfgC := testConfig(t)
	idC, _ := peer.IDFromPrivateKey(cfgC.PrivKey)
	other, _ := peer.IDFromPrivateKey(newKey(t))
	path, publish := configMapDir(t, "allow", "# members\n"+other.String()+"  # another member\n")
	cfgA := testConfig(t)
	cfgA.AllowPeersFile = path
	cfgA.AllowPeersPoll = 20 * time.Millisecond
	a, ra := startMesh(t, cfgA)
	c, _ := startMesh(t, cfgC)

	refusesInbound(t, a, c)
	publish("# members\n" + other.String() + "\n\n" + idC.String() + "\n")
	testutil.Eventually(t, 5*time.Second, func() (bool, string) {
		_ = dial(c, a)
		return slices.Contains(ra.connections(), c.PeerID()), "the peer added to the file connects and is announced"
	})
	if got := a.AllowedPeers(); !slices.Equal(got, sorted(other.String(), idC.String())) {
		t.Errorf("AllowedPeers = %v", got)
	}

	// An invalid version keeps the last good list.
	publish("not-a-peer-id\n")
	published := time.Now()
	testutil.Eventually(t, 5*time.Second, func() (bool, string) {
		return time.Since(published) > 10*cfgA.AllowPeersPoll, "ten polls of the invalid file"
	})
	if !connected(a, c) || !a.Allowed(c.PeerID()) {
		t.Fatal("an invalid file dropped the last good list")
	}

	publish(other.String() + "\n")
	testutil.Eventually(t, 5*time.Second, func() (bool, string) {
		return !connected(a, c), "the peer removed from the file is disconnected"
	})
	refusesInbound(t, a, c)
	if n := ra.connectedCount(c.PeerID()); n != 1 {
		t.Errorf("the removed peer was announced %d times, want once (while listed)", n)
	}
}

func sorted(s ...string) []string { slices.Sort(s); return s }

// TestAttachedAllowlist: an attached member has no gater on the service's
// host, so an outsider connects to the service; the validator then
// rejects, as not_member, a batch the outsider signs for its own slot at
// the plausibility bound, and its sync stream is reset and counted. Once
// a run-time source lists the outsider, its next batch is delivered: the
// refusal was the allowlist's, not the connection's. Removed again, it is
// refused again while the service's connection stays.
func TestAttachedAllowlist(t *testing.T) {
	t.Parallel()
	svc := newService(t)
	cfg := attachConfig(t)
	cfg.AllowExternal = true
	cfg.Plausible = func(string) (uint64, bool) { return 100, true }
	ma, ra := attachStart(t, svc, cfg)

	raw := newRawPeer(t, ma.Topic())
	if _, err := raw.topic.Subscribe(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := raw.h.Connect(ctx, peer.AddrInfo{ID: svc.h.ID(), Addrs: svc.h.Addrs()}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 5*time.Second, func() (bool, string) {
		return slices.Contains(raw.topic.ListPeers(), svc.h.ID()), "the outsider sees the member subscribed"
	})
	rawID := raw.h.ID().String()
	seq := uint64(0)
	testutil.Eventually(t, 5*time.Second, func() (bool, string) {
		seq++
		if err := raw.topic.Publish(context.Background(), encode(t, batch(rawID, seq, "at-cap", 100))); err != nil {
			t.Fatal(err)
		}
		return ma.Stats().RejectedGossip[ReasonNotMember] > 0, "the outsider's batch is rejected as not_member"
	})
	if ra.has(rawID, "at-cap") {
		t.Fatal("the outsider's batch was delivered")
	}
	if st := ma.Stats(); st.RefusedMessages[ReasonNotMember] != st.RejectedGossip[ReasonNotMember] {
		t.Errorf("RefusedMessages[not_member] %d, RejectedGossip %d", st.RefusedMessages[ReasonNotMember], st.RejectedGossip[ReasonNotMember])
	}
	sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer scancel()
	s, err := raw.h.NewStream(sctx, svc.h.ID(), ma.SyncProtocol())
	if err == nil {
		_ = writeFrames(s, [][]byte{encode(t, batch(rawID, 0, "direct", 1))})
		_ = s.CloseWrite()
		var one [1]byte
		if _, err := s.Read(one[:]); err == nil {
			t.Error("the outsider's sync stream was not reset")
		}
	}
	testutil.Eventually(t, 5*time.Second, func() (bool, string) {
		return ma.Stats().RejectedDirect[ReasonNotMember] == 1, "the outsider's sync stream counted"
	})
	if slices.Contains(ra.connections(), rawID) || slices.Contains(ma.Peers(), rawID) {
		t.Error("the outsider was announced")
	}

	if err := ma.SetAllowedPeers("dns", []string{rawID}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 5*time.Second, func() (bool, string) {
		seq++
		if err := raw.topic.Publish(context.Background(), encode(t, batch(rawID, seq, "listed", 100))); err != nil {
			t.Fatal(err)
		}
		return ra.has(rawID, "listed"), "a listed peer's batch is delivered"
	})
	// Removed again, it is refused again, though the service keeps its
	// connection.
	if err := ma.SetAllowedPeers("dns", nil); err != nil {
		t.Fatal(err)
	}
	before := ma.Stats().RejectedGossip[ReasonNotMember]
	testutil.Eventually(t, 5*time.Second, func() (bool, string) {
		seq++
		if err := raw.topic.Publish(context.Background(), encode(t, batch(rawID, seq, "removed", 100))); err != nil {
			t.Fatal(err)
		}
		return ma.Stats().RejectedGossip[ReasonNotMember] > before, "the removed peer's batch is rejected"
	})
	if ra.has(rawID, "removed") || !connected2(svc.h, raw.h) {
		t.Error("the removed peer's batch was delivered, or the service's connection was cut")
	}
	if err := ma.SetAllowedPeers("dns", []string{"nonsense"}); err == nil || !strings.Contains(err.Error(), "nonsense") {
		t.Errorf("a bad peer ID: %v", err)
	}
	if err := ma.SetAllowedPeers("file", nil); err == nil {
		t.Error("a reserved source was accepted")
	}
}

// TestRefusalsCounted: an adversary writes gossipsub RPCs by hand to a
// member: one 3 MiB RPC, and 40 malformed messages — 10 signed whose data
// is not a batch, 10 unsigned, 10 with a signature that does not verify,
// and 10 claiming to be the member's own messages. Every one is counted in
// RefusedMessages under its reason. At 821b92d neither the 3 MiB RPC
// (gossipsub drops it in its RPC reader, before any hook) nor the 10
// self-originated messages (pubsub's RejectSelfOrigin, ignored by the
// tracer) appeared in any counter.
func TestRefusalsCounted(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	a, ra := startMesh(t, cfg)
	raw := newRawPeer(t, a.Topic())
	raw.connect(t, a)
	raw.quiet()
	self := raw.h.ID()

	// 3 MiB in one RPC: over gossipsub's cap of MaxMessageBytes + 64 KiB.
	big := rpcOf(t, raw.sign(t, rawMsg(a.Topic(), 1, self, make([]byte, 3<<20))))
	_ = raw.sendRPC(t, a, big) // a resets the stream mid-write
	testutil.Eventually(t, 5*time.Second, func() (bool, string) {
		return a.Stats().RefusedMessages[ReasonOversize] == 1, fmt.Sprintf("oversize counted: %v", a.Stats().RefusedMessages)
	})

	var msgs []*pb.Message
	seq := uint64(100)
	for i := range 10 {
		seq++
		msgs = append(msgs, raw.sign(t, rawMsg(a.Topic(), seq, self, []byte(fmt.Sprintf("\xffnot cbor %d", i)))))
		seq++
		msgs = append(msgs, rawMsg(a.Topic(), seq, self, encode(t, batch(self.String(), seq, "unsigned", 1))))
		seq++
		bad := raw.sign(t, rawMsg(a.Topic(), seq, self, encode(t, batch(self.String(), seq, "bad-sig", 1))))
		bad.Signature[0] ^= 0xff
		msgs = append(msgs, bad)
		seq++
		forged := rawMsg(a.Topic(), seq, a.Host().ID(), encode(t, batch(a.PeerID(), seq, "self-origin", 1)))
		forged.Signature = make([]byte, 64)
		msgs = append(msgs, forged)
	}
	if err := raw.sendRPC(t, a, rpcOf(t, msgs...)); err != nil {
		t.Fatal(err)
	}
	want := map[Reason]uint64{ReasonOversize: 1, ReasonMalformed: 10, ReasonBadSignature: 20, ReasonAuthor: 10}
	testutil.Eventually(t, 5*time.Second, func() (bool, string) {
		got := a.Stats().RefusedMessages
		for r := range NumReasons {
			if got[r] != want[r] {
				return false, fmt.Sprintf("refused %v, want %v", got, want)
			}
		}
		return true, ""
	})
	for _, key := range []string{"unsigned", "bad-sig", "self-origin"} {
		if _, ok := ra.find(key); ok {
			t.Errorf("a %s message was delivered", key)
		}
	}
	// The adversary is not cut off by the counting: a batch it signs
	// properly still arrives.
	seq++
	ok := raw.sign(t, rawMsg(a.Topic(), seq, self, encode(t, batch(self.String(), seq, "honest", 1))))
	if err := raw.sendRPC(t, a, rpcOf(t, ok)); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 5*time.Second, func() (bool, string) { return ra.has(self.String(), "honest"), "the honest batch arrives" })
}

// TestSizeStreamScan follows length prefixes split across reads and
// reports the first one over the cap, then stops.
func TestSizeStreamScan(t *testing.T) {
	s := &sizeStream{max: 300}
	frame := func(n int) []byte {
		return append(binary.AppendUvarint(nil, uint64(n)), make([]byte, n)...)
	}
	var stream []byte
	for _, n := range []int{0, 1, 127, 128, 300} {
		stream = append(stream, frame(n)...)
	}
	stream = append(stream, frame(301)...)
	stream = append(stream, frame(5000)...)
	var over []uint64
	for len(stream) > 0 { // three bytes a read
		k := min(3, len(stream))
		if size, ok := s.scan(stream[:k]); ok {
			over = append(over, size)
		}
		stream = stream[k:]
	}
	if !slices.Equal(over, []uint64{301}) || !s.done {
		t.Fatalf("reported %v, want [301] and then nothing", over)
	}
}

// TestParseAllowList: the file format and its errors.
func TestParseAllowList(t *testing.T) {
	id1, _ := peer.IDFromPrivateKey(newKey(t))
	id2, _ := peer.IDFromPrivateKey(newKey(t))
	for _, tc := range []struct {
		name, in string
		want     []peer.ID
		err      string
	}{
		{"empty", "", nil, ""},
		{"comments and blanks", "# a\n\n  " + id1.String() + "  # first\n\t" + id2.String() + "\n#" + id1.String() + "\n", []peer.ID{id1, id2}, ""},
		{"bad line", id1.String() + "\nfoo\n", nil, "line 2: \"foo\""},
		{"CRLF", id1.String() + "\r\n", []peer.ID{id1}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseAllowList(strings.NewReader(tc.in))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil || !slices.Equal(got, tc.want) {
				t.Fatalf("got %v, %v; want %v", got, err, tc.want)
			}
		})
	}
}

// TestAllowlistConfig: New refuses a bad peer ID or an unreadable file,
// naming the field; this member is always allowed; off means everyone.
func TestAllowlistConfig(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	cfg.AllowPeers = []string{"nope"}
	if _, err := New(cfg); err == nil || !strings.Contains(err.Error(), "AllowPeers") {
		t.Errorf("bad peer ID: %v", err)
	}
	cfg = testConfig(t)
	cfg.AllowPeersFile = filepath.Join(t.TempDir(), "missing")
	if _, err := New(cfg); err == nil || !strings.Contains(err.Error(), "AllowPeersFile") {
		t.Errorf("missing file: %v", err)
	}
	cfg = testConfig(t)
	cfg.AllowExternal = true
	m := newMesh(t, cfg)
	other, _ := peer.IDFromPrivateKey(newKey(t))
	if !m.AllowlistOn() || !m.Allowed(m.PeerID()) || m.Allowed(other.String()) || m.Allowed("junk") {
		t.Error("an empty external allowlist must admit this member only")
	}
	off := newMesh(t, testConfig(t))
	if off.AllowlistOn() || !off.Allowed(other.String()) || off.AllowedPeers() != nil {
		t.Error("without an allowlist every peer is allowed")
	}
	if err := off.SetAllowedPeers("dns", []string{other.String()}); err != ErrAllowlistOff {
		t.Errorf("SetAllowedPeers on a Mesh without an allowlist: %v", err)
	}
}

// TestLogGate: one line per refusalLogEvery, saying how many refusals
// went unlogged since the last one.
func TestLogGate(t *testing.T) {
	var g logGate
	t0 := time.Unix(1_700_000_000, 0)
	if ok, skipped := g.allow(t0); !ok || skipped != 0 {
		t.Fatalf("first refusal: %v %d", ok, skipped)
	}
	for i := range 7 {
		if ok, _ := g.allow(t0.Add(time.Duration(i) * time.Second / 2)); ok {
			t.Fatalf("refusal %d logged within %v", i, refusalLogEvery)
		}
	}
	if ok, skipped := g.allow(t0.Add(refusalLogEvery)); !ok || skipped != 7 {
		t.Fatalf("after %v: %v, %d not logged, want 7", refusalLogEvery, ok, skipped)
	}
	if ok, skipped := g.allow(t0.Add(3 * refusalLogEvery)); !ok || skipped != 0 {
		t.Fatalf("later: %v %d", ok, skipped)
	}
}

// TestAllowlistRelayedNonMember: a listed member's full state that relays
// a peer the receiver's allowlist refuses (in its slots or its member
// table) is dropped as not_member, and the rest of the stream is read.
func TestAllowlistRelayedNonMember(t *testing.T) {
	t.Parallel()
	cfgB := testConfig(t)
	idB, _ := peer.IDFromPrivateKey(cfgB.PrivKey)
	cfgA := testConfig(t)
	cfgA.AllowPeers = []string{idB.String()}
	a, ra := startMesh(t, cfgA)
	b, _ := startMesh(t, cfgB)
	outsider, _ := peer.IDFromPrivateKey(newKey(t))

	relayed := batch(b.PeerID(), 0, "relayed", 1)
	relayed.Flags = crdt.FlagFull
	relayed.Slots = []crdt.Slot{{Peer: outsider.String(), Incarnation: 1}}
	relayed.Windows[0].Slot = 1
	table := batch(b.PeerID(), 0, "table", 1)
	table.Flags = crdt.FlagFull
	table.Members = []crdt.MemberEntry{{Peer: outsider.String(), Incarnation: 1, State: crdt.MemberAlive}}
	own := batch(b.PeerID(), 0, "own", 1)
	own.Flags = crdt.FlagFull | crdt.FlagLast
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := b.Connect(ctx, tcpAddr(t, a)); err != nil {
		t.Fatal(err)
	}
	if err := b.SendDirect(ctx, a.PeerID(), []*crdt.Batch{relayed, table, own}); err != nil {
		t.Fatal(err)
	}
	if got := a.Stats().RejectedDirect[ReasonNotMember]; got != 2 {
		t.Errorf("RejectedDirect[not_member] = %d, want 2", got)
	}
	if ra.has(b.PeerID(), "relayed") || ra.has(b.PeerID(), "table") || !ra.has(b.PeerID(), "own") {
		t.Error("a relay of a non-member delivered, or the batch after it lost")
	}
}

// TestCountRefusal: a reason the node core reports reaches
// RefusedMessages through the hook, by label; an unknown label counts
// nothing.
func TestCountRefusal(t *testing.T) {
	t.Parallel()
	m := newMesh(t, testConfig(t))
	if err := m.CountRefusal("table_budget", 3); err != nil {
		t.Fatal(err)
	}
	m.AddRefused(ReasonTableBudget, 2)
	if err := m.CountRefusal("nonsense", 1); err == nil {
		t.Error("an unknown label was accepted")
	}
	got := m.Stats().RefusedMessages
	want := [NumReasons]uint64{}
	want[ReasonTableBudget] = 5
	if got != want {
		t.Errorf("RefusedMessages %v, want %v", got, want)
	}
	for r := range NumReasons {
		if p, ok := ParseReason(r.String()); !ok || p != r {
			t.Errorf("ParseReason(%q) = %v, %v", r.String(), p, ok)
		}
	}
}
