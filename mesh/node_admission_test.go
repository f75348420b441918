package mesh_test

import (
	"context"
	crand "crypto/rand"
	"fmt"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/ratemesh/ratemesh/crdt"
	"github.com/ratemesh/ratemesh/httpapi"
	"github.com/ratemesh/ratemesh/internal/testutil"
	"github.com/ratemesh/ratemesh/limiter"
	"github.com/ratemesh/ratemesh/mesh"
)

// allowedMembers starts count members whose allowlist names exactly
// themselves, each dialling the ones before it, with s's other settings.
func allowedMembers(t *testing.T, count int, s spec) []member {
	t.Helper()
	keys := make([]crypto.PrivKey, count)
	var ids []string
	for i := range keys {
		k, _, err := crypto.GenerateEd25519Key(crand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		id, _ := peer.IDFromPrivateKey(k)
		keys[i], ids = k, append(ids, id.String())
	}
	var ms []member
	for i := range keys {
		si := s
		si.key, si.allow, si.bootstrap = keys[i], ids, nil
		for _, o := range ms {
			si.bootstrap = append(si.bootstrap, o.m)
		}
		ms = append(ms, startMember(t, si))
	}
	waitAlive(t, ms, 10*time.Second)
	return ms
}

// TestNodesAllowlistKeepsOutsiderOut is the finding of issue 24 at
// 821b92d with an allowlist set: an outsider running plain gossipsub on
// the members' topic, configured nowhere, dials member 0 and publishes
// its own slot of the hot key at the plausibility bound. Without the
// allowlist it became a member and the key's admissions fell (to 51 of
// 100); with it, member 0's gater refuses every dial (counted as
// not_member), so nothing the outsider publishes arrives: no member holds
// it, the hot key's total stays the members' own and decisions go on.
// With the gater's allowlist check removed, the outsider connects, the
// refusals stay 0 and the test fails naming the outsider's state and the
// key's total.
func TestNodesAllowlistKeepsOutsiderOut(t *testing.T) {
	clock := testutil.AlignedClock(time.Hour, time.Minute)
	rules := []limiter.Rule{fixedRule("api", 100, time.Hour)}
	ms := allowedMembers(t, 2, spec{rules: rules, clock: clock})
	a := ms[0]
	bound, ok := mesh.PlausibleFor(rules, 0)("api")
	if !ok {
		t.Fatal("no plausibility bound for api")
	}

	ctx, h, topic := rawGossip(t, a.m.Topic())
	outsider := crdt.Slot{Peer: h.ID().String(), Incarnation: uint64(clock().UnixMilli())}
	before := a.m.Stats().RefusedConns[mesh.ConnNotMember]
	seq := uint64(0)
	testutil.Eventually(t, 5*time.Second, func() (bool, string) {
		dctx, dcancel := context.WithTimeout(network.WithForceDirectDial(ctx, "test"), time.Second)
		_ = h.Connect(dctx, peer.AddrInfo{ID: a.m.Host().ID(), Addrs: a.m.Host().Addrs()})
		dcancel()
		seq++
		data, err := entryBatch(outsider, clock, seq, "hot", bound).Encode()
		if err != nil {
			t.Fatal(err)
		}
		_ = topic.Publish(ctx, data) // to whoever it is connected to
		refused := a.m.Stats().RefusedConns[mesh.ConnNotMember] - before
		up := h.Network().Connectedness(a.m.Host().ID()) == network.Connected
		return refused >= 3 && !up, fmt.Sprintf("member 0 refused the outsider %d times (want 3), outsider connected %v, member 0 holds it %s, hot total %d",
			refused, up, stateOf(a.n, outsider.Peer), totalOf(t, a, "hot"))
	})
	for i, x := range ms {
		if s := stateOf(x.n, outsider.Peer); s != "absent" {
			t.Errorf("member %d holds the outsider %s", i, s)
		}
		if got := totalOf(t, x, "hot"); got != 0 {
			t.Errorf("member %d holds %d of the hot key, want 0", i, got)
		}
	}
	for i := range 10 {
		d, err := a.n.Allow(context.Background(), "api", "hot")
		if err != nil || !d.Allowed {
			t.Fatalf("request %d of the hot key denied: %+v, %v", i, d, err)
		}
	}
}

// TestNodesAllowlistWithPSK: members share a private network key and an
// allowlist. A node holding the key but not on the list, bootstrapping
// from two members, cannot join: its join times out, every member's gater
// counts its refusals as not_member, and no member ever holds it or its
// usage. The key is not membership.
func TestNodesAllowlistWithPSK(t *testing.T) {
	psk := make([]byte, 32)
	if _, err := crand.Read(psk); err != nil {
		t.Fatal(err)
	}
	rules := []limiter.Rule{fixedRule("api", 1000, time.Hour)}
	ms := allowedMembers(t, 3, spec{rules: rules, psk: psk})
	start := time.Now()
	out := startMember(t, spec{rules: rules, psk: psk, bootstrap: []*mesh.Mesh{ms[0].m, ms[1].m}, joinTimeout: 1500 * time.Millisecond})
	if el := time.Since(start); el < 1500*time.Millisecond {
		t.Errorf("Start returned after %v, before the join timeout: it joined somebody", el)
	}
	testutil.Eventually(t, 10*time.Second, func() (bool, string) {
		a, b := ms[0].m.Stats().RefusedConns[mesh.ConnNotMember], ms[1].m.Stats().RefusedConns[mesh.ConnNotMember]
		return a >= 1 && b >= 1, fmt.Sprintf("not_member refusals: member 0 %d, member 1 %d", a, b)
	})
	if _, err := out.n.Allow(context.Background(), "api", "k"); err != nil {
		t.Fatal(err)
	}
	if c := out.m.Peers(); len(c) != 0 {
		t.Errorf("the keyed outsider is connected to %v", c)
	}
	for i, x := range ms {
		if s := stateOf(x.n, out.m.PeerID()); s != "absent" {
			t.Errorf("member %d holds the keyed outsider %s", i, s)
		}
		if got := totalOf(t, x, "k"); got != 0 {
			t.Errorf("member %d merged the keyed outsider's usage: %d", i, got)
		}
		if c := x.m.Peers(); len(c) != len(ms)-1 {
			t.Errorf("member %d is connected to %v", i, c)
		}
	}
	// The refusals are in member 0's Prometheus exposition, every reason
	// of both metrics present.
	api, err := httpapi.New(httpapi.Config{Node: ms[0].n, Transport: ms[0].m})
	if err != nil {
		t.Fatal(err)
	}
	// The outsider keeps dialling, so the count may grow while the
	// exposition is built: it must lie between the counts before and
	// after.
	before := ms[0].m.Stats().RefusedConns[mesh.ConnNotMember]
	rec := httptest.NewRecorder()
	api.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	after := ms[0].m.Stats().RefusedConns[mesh.ConnNotMember]
	body := rec.Body.String()
	var got uint64
	m := regexp.MustCompile(`ratemesh_connections_refused_total\{reason="not_member"\} (\d+)`).FindStringSubmatch(body)
	if m != nil {
		got, _ = strconv.ParseUint(m[1], 10, 64)
	}
	if m == nil || got < before || got > after {
		t.Errorf("/metrics has not_member refusals %q, want a count from %d to %d", m, before, after)
	}
	for r := mesh.Reason(0); r < mesh.NumReasons; r++ {
		if l := fmt.Sprintf("ratemesh_messages_refused_total{reason=%q}", r.String()); !strings.Contains(body, l) {
			t.Errorf("/metrics lacks %s", l)
		}
	}
}
