package mesh

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	pubsub "github.com/libp2p/go-libp2p-pubsub"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"

	"github.com/ratemesh/ratemesh/crdt"
	"github.com/ratemesh/ratemesh/internal/p2ptest"
	"github.com/ratemesh/ratemesh/internal/testutil"
)

// The tests of this file run ratemesh on hosts and PubSubs a service
// owns: each service has its own gossipsub topic and its own stream
// protocol, which must work before, during and after ratemesh.

const (
	svcTopic = "/svc/chat"
	svcProto = protocol.ID("/svc/echo/1.0.0")
)

// service is a libp2p program of its own: a host on loopback TCP, a
// gossipsub router built with opts, a topic it reads and an echo protocol.
type service struct {
	h     host.Host
	ps    *pubsub.PubSub
	topic *p2ptest.Topic
}

func newService(t testing.TB, opts ...pubsub.Option) *service {
	t.Helper()
	h := p2ptest.Host(t)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	ps, err := pubsub.NewGossipSub(ctx, h, opts...)
	if err != nil {
		t.Fatal(err)
	}
	s := &service{h: h, ps: ps, topic: p2ptest.Join(t, ps, svcTopic)}
	h.SetStreamHandler(svcProto, func(st network.Stream) {
		defer st.Close()
		line, err := bufio.NewReader(st).ReadString('\n')
		if err != nil {
			_ = st.Reset()
			return
		}
		_, _ = io.WriteString(st, "echo: "+line)
	})
	return s
}

func (s *service) connect(t testing.TB, o *service) {
	t.Helper()
	p2ptest.Connect(t, s.h, o.h)
}

// echo calls o's echo protocol from s.
func (s *service) echo(o *service, msg string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := s.h.NewStream(ctx, o.h.ID(), svcProto)
	if err != nil {
		return "", err
	}
	defer st.Close()
	_ = st.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(st, msg+"\n"); err != nil {
		return "", err
	}
	if err := st.CloseWrite(); err != nil {
		return "", err
	}
	b, err := io.ReadAll(st)
	return string(b), err
}

// checkService asserts that s's topic carries a message to o and s's echo
// protocol answers o, naming when in failures.
func checkService(t *testing.T, s, o *service, when string) {
	t.Helper()
	n := 0
	testutil.Eventually(t, 10*time.Second, func() (bool, string) {
		n++
		msg := fmt.Sprintf("%s-%d", when, n)
		if err := s.topic.Publish(context.Background(), []byte(msg)); err != nil {
			t.Fatal(err)
		}
		// Gossipsub may drop what is published before its mesh forms;
		// a later message then arrives.
		for i := 1; i <= n; i++ {
			if o.topic.Received(fmt.Sprintf("%s-%d", when, i)) {
				return true, when + ": a service-topic message arrives"
			}
		}
		return false, when + ": a service-topic message arrives"
	})
	got, err := o.echo(s, when)
	if err != nil || got != "echo: "+when+"\n" {
		t.Fatalf("%s: echo answered %q, %v", when, got, err)
	}
}

// attachConfig is testConfig for Attach: no key, no listen addresses.
func attachConfig(t testing.TB) Config {
	cfg := testConfig(t)
	cfg.PrivKey, cfg.Listen = nil, nil
	return cfg
}

// attachStart attaches to s and starts the Mesh with a fresh recorder.
func attachStart(t testing.TB, s *service, cfg Config) (*Mesh, *recorder) {
	t.Helper()
	m, err := Attach(s.h, s.ps, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	r := &recorder{}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := m.Start(ctx, r); err != nil {
		t.Fatal(err)
	}
	return m, r
}

// TestAttachLeavesServiceRunning: two services with their own topic and
// protocol attach ratemesh, exchange ratemesh batches over the service's
// connection, and keep their topic and protocol working while attached and
// after Close; Close removes ratemesh's protocols, topic, validator and
// connection manager tags (a second Attach of the same namespace then
// succeeds) and leaves the hosts, the PubSubs and the connection up.
func TestAttachLeavesServiceRunning(t *testing.T) {
	t.Parallel()
	a, b := newService(t), newService(t)
	b.connect(t, a)
	checkService(t, a, b, "before")

	ma, ra := attachStart(t, a, attachConfig(t))
	mb, rb := attachStart(t, b, attachConfig(t))
	if ma.PeerID() != a.h.ID().String() || ma.Host() != a.h {
		t.Fatalf("attached member is %s on %p, want the host's %s on %p", ma.PeerID(), ma.Host(), a.h.ID(), a.h)
	}
	testutil.Eventually(t, 5*time.Second, func() (bool, string) {
		return ra.connectedCount(mb.PeerID()) == 1 && rb.connectedCount(ma.PeerID()) == 1, "PeerConnected over the service's connection"
	})
	if !a.h.ConnManager().IsProtected(b.h.ID(), ma.connTag) {
		t.Error("the member's connection is not protected from the service's connection manager")
	}
	seq := uint64(0)
	testutil.Eventually(t, 10*time.Second, func() (bool, string) {
		seq++
		if err := ma.Publish(context.Background(), batch(ma.PeerID(), seq, "from-a", 1)); err != nil {
			t.Fatal(err)
		}
		if err := mb.Publish(context.Background(), batch(mb.PeerID(), seq, "from-b", 1)); err != nil {
			t.Fatal(err)
		}
		return rb.has(ma.PeerID(), "from-a") && ra.has(mb.PeerID(), "from-b"), "ratemesh batches cross"
	})
	checkService(t, a, b, "attached")
	checkService(t, b, a, "attached-back")
	if got := ma.MeshPeers(); !slices.Equal(got, []string{mb.PeerID()}) {
		t.Errorf("MeshPeers() = %v, want [%s]", got, mb.PeerID())
	}

	if err := ma.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := mb.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	for _, s := range []*service{a, b} {
		for _, p := range s.h.Mux().Protocols() {
			if strings.HasPrefix(string(p), "/ratemesh/") {
				t.Errorf("%s still has a handler for %s after Close", s.h.ID(), p)
			}
		}
		if slices.Contains(s.ps.GetTopics(), ma.Topic()) {
			t.Errorf("%s still holds the topic %s after Close", s.h.ID(), ma.Topic())
		}
		if !slices.Contains(s.ps.GetTopics(), svcTopic) {
			t.Errorf("%s lost its own topic", s.h.ID())
		}
	}
	if a.h.ConnManager().IsProtected(b.h.ID(), ma.connTag) {
		t.Error("the connection manager tag outlives Close")
	}
	if !connected2(a.h, b.h) {
		t.Fatal("Close cut the service's connection")
	}
	testutil.Eventually(t, 5*time.Second, func() (bool, string) {
		return !slices.Contains(b.ps.ListPeers(ma.Topic()), a.h.ID()), "B sees A leave the ratemesh topic"
	})
	checkService(t, a, b, "after")
	checkService(t, b, a, "after-back")

	// Everything ratemesh added is gone: the same namespace attaches
	// again, and works.
	ma2, ra2 := attachStart(t, a, attachConfig(t))
	mb2, rb2 := attachStart(t, b, attachConfig(t))
	testutil.Eventually(t, 10*time.Second, func() (bool, string) {
		seq++
		if err := ma2.Publish(context.Background(), batch(ma2.PeerID(), seq, "again-a", 1)); err != nil {
			t.Fatal(err)
		}
		if err := mb2.Publish(context.Background(), batch(mb2.PeerID(), seq, "again-b", 1)); err != nil {
			t.Fatal(err)
		}
		return rb2.has(ma2.PeerID(), "again-a") && ra2.has(mb2.PeerID(), "again-b"), "ratemesh works again after a re-attach"
	})
}

func connected2(a, b host.Host) bool {
	return a.Network().Connectedness(b.ID()) == network.Connected
}

// TestAttachRefusesUnsafePubSub: a PubSub that does not sign, or signs as
// another peer than the host, is refused with ErrUnsafePubSub and advice
// naming the option to change, and left as it was (the topic and the
// validator are gone again). A LaxSign PubSub signs, and is accepted.
func TestAttachRefusesUnsafePubSub(t *testing.T) {
	t.Parallel()
	other := newKey(t)
	otherID, _ := peer.IDFromPrivateKey(other)
	for _, tc := range []struct {
		name   string
		opts   func(h host.Host) []pubsub.Option
		advice string // "" accepts
	}{
		{"StrictSign", func(host.Host) []pubsub.Option { return nil }, ""},
		{"LaxSign", func(host.Host) []pubsub.Option {
			return []pubsub.Option{pubsub.WithMessageSignaturePolicy(pubsub.LaxSign)}
		}, ""},
		{"StrictNoSign", func(host.Host) []pubsub.Option {
			return []pubsub.Option{pubsub.WithMessageSignaturePolicy(pubsub.StrictNoSign)}
		}, "pubsub.WithMessageSignaturePolicy(pubsub.StrictSign)"},
		{"LaxNoSign", func(host.Host) []pubsub.Option {
			return []pubsub.Option{pubsub.WithMessageSignaturePolicy(pubsub.LaxNoSign)}
		}, "does not sign"},
		{"NoAuthor", func(host.Host) []pubsub.Option {
			return []pubsub.Option{pubsub.WithNoAuthor()}
		}, "WithNoAuthor"},
		{"OtherAuthor", func(h host.Host) []pubsub.Option {
			if err := h.Peerstore().AddPrivKey(otherID, other); err != nil {
				t.Fatal(err)
			}
			return []pubsub.Option{pubsub.WithMessageAuthor(otherID)}
		}, "remove pubsub.WithMessageAuthor"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := p2ptest.Host(t)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			ps, err := pubsub.NewGossipSub(ctx, h, tc.opts(h)...)
			if err != nil {
				t.Fatal(err)
			}
			m, err := Attach(h, ps, attachConfig(t))
			if tc.advice == "" {
				if err != nil {
					t.Fatalf("Attach: %v", err)
				}
				if err := m.Close(); err != nil {
					t.Fatalf("Close: %v", err)
				}
				return
			}
			if !errors.Is(err, ErrUnsafePubSub) || !strings.Contains(err.Error(), tc.advice) {
				t.Fatalf("Attach = %v, want ErrUnsafePubSub saying %q", err, tc.advice)
			}
			if slices.Contains(ps.GetTopics(), "/ratemesh/1/test") {
				t.Error("the refused Attach left its topic joined")
			}
			if err := ps.RegisterTopicValidator("/ratemesh/1/test", func(context.Context, peer.ID, *pubsub.Message) bool { return true }); err != nil {
				t.Errorf("the refused Attach left its validator: %v", err)
			}
		})
	}
}

// TestAttachConfig: Attach names the field that cannot apply to a host it
// does not own, and refuses a second member of the same namespace on one
// host; another namespace attaches beside it.
func TestAttachConfig(t *testing.T) {
	t.Parallel()
	s := newService(t)
	hostKey := s.h.Peerstore().PrivKey(s.h.ID())
	for _, tc := range []struct {
		name, want string
		edit       func(*Config)
	}{
		{"Listen", "config Listen", func(c *Config) { c.Listen = []string{"/ip4/127.0.0.1/tcp/0"} }},
		{"PSK", "config PSK", func(c *Config) { c.PSK = make([]byte, 32) }},
		{"PrivKey", "config PrivKey: belongs to", func(c *Config) { c.PrivKey = newKey(t) }},
		{"Namespace", "config Namespace", func(c *Config) { c.Namespace = "a/b" }},
		{"QueueSize", "config QueueSize", func(c *Config) { c.QueueSize = 0 }},
	} {
		cfg := attachConfig(t)
		tc.edit(&cfg)
		if _, err := Attach(s.h, s.ps, cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: Attach = %v, want an error naming %q", tc.name, err, tc.want)
		}
	}
	if _, err := Attach(nil, s.ps, attachConfig(t)); err == nil {
		t.Error("Attach took a nil host")
	}
	if _, err := Attach(s.h, nil, attachConfig(t)); err == nil {
		t.Error("Attach took a nil PubSub")
	}

	cfg := attachConfig(t)
	cfg.PrivKey = hostKey // the host's own key is fine
	m, _ := attachStart(t, s, cfg)
	if _, err := Attach(s.h, s.ps, attachConfig(t)); err == nil || !strings.Contains(err.Error(), "another Mesh of namespace") {
		t.Errorf("a second Attach of the same namespace = %v", err)
	}
	other := attachConfig(t)
	other.Namespace = "other"
	m2, _ := attachStart(t, s, other)
	if m2.Topic() == m.Topic() || m2.SyncProtocol() == m.SyncProtocol() {
		t.Fatalf("namespaces share %s, %s", m.Topic(), m.SyncProtocol())
	}
	if err := m2.Close(); err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(s.h.Mux().Protocols(), m.SyncProtocol()) {
		t.Error("closing one namespace removed the other's protocol")
	}
}

// TestAttachedRejectsUnsigned: a member attached to a LaxSign PubSub (which
// lets unsigned messages in) still rejects an unsigned batch, counted as a
// bad signature, and takes a signed one.
func TestAttachedRejectsUnsigned(t *testing.T) {
	t.Parallel()
	a := newService(t, pubsub.WithMessageSignaturePolicy(pubsub.LaxSign))
	ma, ra := attachStart(t, a, attachConfig(t))
	// The forger signs nothing and forwards at once to every subscriber.
	forger := newService(t, pubsub.WithMessageSignaturePolicy(pubsub.LaxNoSign), pubsub.WithFloodPublish(true))
	forger.connect(t, a)
	raw, err := forger.ps.Join(ma.Topic())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := raw.Subscribe(); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 5*time.Second, func() (bool, string) {
		return slices.Contains(raw.ListPeers(), a.h.ID()), "the forger sees the member subscribed"
	})
	fid := forger.h.ID().String()
	seq := uint64(0)
	testutil.Eventually(t, 5*time.Second, func() (bool, string) {
		seq++
		if err := raw.Publish(context.Background(), encode(t, batch(fid, seq, "unsigned", 1))); err != nil {
			t.Fatal(err)
		}
		return ma.Stats().BadSignature > 0, "an unsigned batch is rejected"
	})
	if ra.has(fid, "unsigned") {
		t.Fatal("an unsigned batch was delivered")
	}

	// A signed member's batches pass the same validator.
	b := newService(t)
	b.connect(t, a)
	mb, _ := attachStart(t, b, attachConfig(t))
	testutil.Eventually(t, 10*time.Second, func() (bool, string) {
		seq++
		if err := mb.Publish(context.Background(), batch(mb.PeerID(), seq, "signed", 1)); err != nil {
			t.Fatal(err)
		}
		return ra.has(mb.PeerID(), "signed"), "a signed batch arrives"
	})
}

// TestAttachedBlock: Block on an attached member leaves the service's
// connection up but ignores the peer: it leaves Peers(), its gossip is not
// delivered and SendDirect to it fails; Unblock announces it again.
func TestAttachedBlock(t *testing.T) {
	t.Parallel()
	a, b := newService(t), newService(t)
	b.connect(t, a)
	ma, ra := attachStart(t, a, attachConfig(t))
	mb, _ := attachStart(t, b, attachConfig(t))
	testutil.Eventually(t, 5*time.Second, func() (bool, string) { return ra.connectedCount(mb.PeerID()) == 1, "A announces B" })
	if err := ma.Block(mb.PeerID()); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 2*time.Second, func() (bool, string) { return len(ma.Peers()) == 0, "B leaves A's Peers()" })
	if !connected2(a.h, b.h) {
		t.Fatal("Block cut the service's connection")
	}
	if a.h.ConnManager().IsProtected(b.h.ID(), ma.connTag) {
		t.Error("a blocked peer's connection stays protected")
	}
	// B's gossip reaches A's PubSub but not A's handler.
	for i := range 20 {
		if err := mb.Publish(context.Background(), batch(mb.PeerID(), uint64(i+1), "blocked", 1)); err != nil {
			t.Fatal(err)
		}
	}
	checkService(t, b, a, "during-block") // by then the batches above went by
	if ra.has(mb.PeerID(), "blocked") {
		t.Error("a blocked peer's batch was delivered")
	}
	if err := ma.SendDirect(context.Background(), mb.PeerID(), nil); !errors.Is(err, ErrUnreachable) {
		t.Errorf("SendDirect to a blocked peer = %v", err)
	}
	if err := ma.Unblock(mb.PeerID()); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 5*time.Second, func() (bool, string) { return ra.connectedCount(mb.PeerID()) == 2, "A announces B again" })
}

// TestAttachCloseEndsGoroutines: once Close returns, no goroutine the
// attached Mesh started, and no stream handler of its, is left on the
// service's host. Not parallel: it reads every goroutine's stack, and the
// package's parallel tests have not started yet.
func TestAttachCloseEndsGoroutines(t *testing.T) {
	a, b := newService(t), newService(t)
	b.connect(t, a)
	cfg := attachConfig(t)
	cfg.SyncTimeout = 30 * time.Second // what Close would wait for, were it not to reset the stream
	ma, ra := attachStart(t, a, cfg)
	mb, _ := attachStart(t, b, attachConfig(t))
	testutil.Eventually(t, 5*time.Second, func() (bool, string) { return ra.connectedCount(mb.PeerID()) == 1, "A announces B" })
	if err := mb.SendDirect(context.Background(), ma.PeerID(), []*crdt.Batch{batch(mb.PeerID(), 1, "direct", 1)}); err != nil {
		t.Fatal(err)
	}
	// A sync stream in progress when Close comes: half a frame, which
	// A's handler waits on for up to SyncTimeout (30 s).
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := b.h.NewStream(ctx, a.h.ID(), ma.SyncProtocol())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Reset()
	if _, err := st.Write([]byte{10, 1, 2}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 5*time.Second, func() (bool, string) {
		for _, g := range ours() {
			if strings.Contains(g, "serveStream") {
				return true, "A serves the stream"
			}
		}
		return false, "A serves the stream"
	})
	if n := len(ours()); n < 6 {
		t.Fatalf("only %d goroutines of the attached meshes found", n)
	}
	start := time.Now()
	if err := ma.Close(); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("Close took %v: it waited for the stream (SyncTimeout 30 s) instead of resetting it", took)
	}
	if err := mb.Close(); err != nil {
		t.Fatal(err)
	}
	if left := ours(); len(left) > 0 {
		t.Fatalf("%d goroutines of the closed meshes are left:\n%s", len(left), strings.Join(left, "\n\n"))
	}
	checkService(t, a, b, "after")
}

// ours returns the stacks of the goroutines that package mesh started, or
// that run one of its stream handlers.
func ours() []string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	var out []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "created by github.com/ratemesh/ratemesh/mesh.(*Mesh)") ||
			strings.Contains(g, "(*Mesh).serveStream") {
			out = append(out, g)
		}
	}
	return out
}
