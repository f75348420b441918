package mesh

// Wire-cost experiments for issue 17 ("Wire cost"): what gossipsub puts
// on the wire per byte of ratemesh payload under a 3000 decisions/s load
// on five in-process members, what those bytes consist of, which router
// parameters, sync intervals and encodings pay, and how much of a delta's
// propagation p99 is the wait for the sync tick. Findings are in
// docs/wire-cost-notes.md. The experiments are skipped unless
// RATEMESH_EXPERIMENT=1; RATEMESH_VARIANTS (comma-separated names) picks
// variants, RATEMESH_SECONDS the seconds of load. The variant "default" is
// mesh.New's router (GossipSubParams) and the runtime's defaults (the
// leading edge); "legacy" is the default before issue 17, and the
// variants of the notes' tables change it. Run without -race, a few
// variants per process:
//
//	RATEMESH_EXPERIMENT=1 RATEMESH_SECONDS=2 RATEMESH_VARIANTS=default,legacy go test -run 'TestWireExperiment$' -v -count=1 ./mesh/
//	RATEMESH_EXPERIMENT=1 go test -run TestWireEncoding -v -count=1 ./mesh/

import (
	"context"
	"crypto/sha256"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fxamacker/cbor/v2"
	"github.com/libp2p/go-libp2p"
	pubsub "github.com/libp2p/go-libp2p-pubsub"
	pb "github.com/libp2p/go-libp2p-pubsub/pb"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	"github.com/libp2p/go-libp2p/p2p/muxer/yamux"
	"github.com/libp2p/go-libp2p/p2p/security/noise"
	"github.com/libp2p/go-libp2p/p2p/transport/tcp"
	"google.golang.org/protobuf/proto"

	"github.com/ratemesh/ratemesh/crdt"
	"github.com/ratemesh/ratemesh/internal/testutil"
	"github.com/ratemesh/ratemesh/limiter"
	"github.com/ratemesh/ratemesh/node"
)

func experimentOn(t *testing.T) {
	if os.Getenv("RATEMESH_EXPERIMENT") != "1" {
		t.Skip("experiment: set RATEMESH_EXPERIMENT=1")
	}
}

// wireVariant is one configuration of the router and the runtime.
type wireVariant struct {
	name      string
	namespace string // "" = "default" (topic /ratemesh/1/default)
	sync      time.Duration
	// gap is the runtime's node.Config.PublishGap: 0 its default (the
	// leading edge, sync/2), -1 publishing on the sync tick alone.
	gap   time.Duration
	flood bool
	// libp2p starts the router from go-libp2p-pubsub's own parameters
	// (D 6, Dlo 5, Dhi 12, Dout 2, gossip to 6 peers or a quarter) instead
	// of GossipSubParams, as mesh.New did before issue 17; params then
	// changes what it names.
	libp2p  bool
	params  func(p *pubsub.GossipSubParams)
	shortID bool // message ID = 12 bytes of sha256(from‖seqno)
}

// defaultVariant is mesh.New's router and the runtime's defaults.
func defaultVariant() wireVariant {
	return wireVariant{name: "default", sync: 20 * time.Millisecond, flood: true}
}

// legacyVariant is the default before issue 17: libp2p's parameters, and
// changes published on the 20 ms sync tick alone. The variants measured
// in docs/wire-cost-notes.md, sections 2 and 3, change it.
func legacyVariant() wireVariant {
	return wireVariant{name: "legacy", sync: 20 * time.Millisecond, gap: -1, flood: true, libp2p: true}
}

// d sets a small mesh degree; validate wants Dout < Dlo and Dout < D/2.
func d(dd, lo, hi, out int) func(p *pubsub.GossipSubParams) {
	return func(p *pubsub.GossipSubParams) {
		p.D, p.Dlo, p.Dhi, p.Dout = dd, lo, hi, out
		p.Dscore = min(p.Dscore, hi)
	}
}

func chain(fs ...func(p *pubsub.GossipSubParams)) func(p *pubsub.GossipSubParams) {
	return func(p *pubsub.GossipSubParams) {
		for _, f := range fs {
			if f != nil {
				f(p)
			}
		}
	}
}

func noGossip(p *pubsub.GossipSubParams) { p.Dlazy, p.GossipFactor = 0, 0 }
func idontwantAll(p *pubsub.GossipSubParams) {
	p.IDontWantMessageThreshold = 1 // send IDONTWANT for every message
}

func wireVariants() []wireVariant {
	v := func(name string, f func(*wireVariant)) wireVariant {
		x := legacyVariant()
		x.name = name
		f(&x)
		return x
	}
	cur := func(name string, f func(*wireVariant)) wireVariant {
		x := defaultVariant()
		x.name = name
		f(&x)
		return x
	}
	return []wireVariant{
		defaultVariant(),
		// Today's defaults without one of their parts.
		cur("tick", func(x *wireVariant) { x.gap = -1 }),
		cur("Dhi3", func(x *wireVariant) { x.params = func(p *pubsub.GossipSubParams) { p.Dhi, p.Dscore = 3, 3 } }),
		cur("Dhi3+tick", func(x *wireVariant) {
			x.params = func(p *pubsub.GossipSubParams) { p.Dhi, p.Dscore = 3, 3 }
			x.gap = -1
		}),
		cur("gossip", func(x *wireVariant) {
			x.params = func(p *pubsub.GossipSubParams) { p.Dlazy, p.GossipFactor = 6, 0.25 }
		}),
		cur("libp2p-router", func(x *wireVariant) { x.libp2p = true }),
		// The variants of docs/wire-cost-notes.md, from the legacy default.
		legacyVariant(),
		v("sync10ms", func(x *wireVariant) { x.sync = 10 * time.Millisecond }),
		v("sync50ms", func(x *wireVariant) { x.sync = 50 * time.Millisecond }),
		v("sync100ms", func(x *wireVariant) { x.sync = 100 * time.Millisecond }),
		v("noflood", func(x *wireVariant) { x.flood = false }),
		v("idontwant", func(x *wireVariant) { x.params = idontwantAll }),
		v("idontwant+shortid", func(x *wireVariant) { x.params = idontwantAll; x.shortID = true }),
		v("nogossip", func(x *wireVariant) { x.params = noGossip }),
		v("D2", func(x *wireVariant) { x.params = d(2, 1, 3, 0) }),
		v("D3", func(x *wireVariant) { x.params = d(3, 2, 4, 0) }),
		v("D0flood", func(x *wireVariant) { x.params = chain(d(0, 0, 0, 0), noGossip) }),
		v("D2+nogossip", func(x *wireVariant) { x.params = chain(d(2, 1, 3, 0), noGossip) }),
		v("D3+nogossip", func(x *wireVariant) { x.params = chain(d(3, 2, 4, 0), noGossip) }),
		v("D2+shortid", func(x *wireVariant) { x.params = d(2, 1, 3, 0); x.shortID = true }),
		v("shorttopic", func(x *wireVariant) { x.namespace = "r" }),
		v("D0flood+sync50ms", func(x *wireVariant) { x.params = chain(d(0, 0, 0, 0), noGossip); x.sync = 50 * time.Millisecond }),
		v("D0flood+sync10ms", func(x *wireVariant) { x.params = chain(d(0, 0, 0, 0), noGossip); x.sync = 10 * time.Millisecond }),
		v("D0flood+sync5ms", func(x *wireVariant) { x.params = chain(d(0, 0, 0, 0), noGossip); x.sync = 5 * time.Millisecond }),
		v("D2+nogossip+sync5ms", func(x *wireVariant) { x.params = chain(d(2, 1, 3, 0), noGossip); x.sync = 5 * time.Millisecond }),
		v("D2+nogossip+sync10ms", func(x *wireVariant) { x.params = chain(d(2, 1, 3, 0), noGossip); x.sync = 10 * time.Millisecond }),
	}
}

// rpcTally splits what a router sends (RawTracer.SendRPC, one call per
// RPC per peer) into parts, by protobuf size.
type rpcTally struct {
	self  peer.ID
	topic string

	firstHop, firstHopN   atomic.Int64 // own messages on our topic: bytes, copies
	forwarded, forwardedN atomic.Int64 // others' messages we relay
	dataBytes             atomic.Int64 // of which Message.Data, over all copies
	sigBytes              atomic.Int64 // Signature
	fromSeqKeyTopic       atomic.Int64 // From, Seqno, Key, Topic and field tags
	ihave, iwant          atomic.Int64
	idontwant, graftPrune atomic.Int64
	subs, otherTopic      atomic.Int64
	rpcs                  atomic.Int64
	envelope              atomic.Int64 // RPC framing around the parts
	duplicates            atomic.Int64 // DuplicateMessage at this receiver
}

var _ pubsub.RawTracer = (*rpcTally)(nil)

func (r *rpcTally) SendRPC(rpc *pubsub.RPC, _ peer.ID) {
	r.rpcs.Add(1)
	total := int64(proto.Size(&rpc.RPC)) + int64(protoVarintLen(uint64(proto.Size(&rpc.RPC))))
	parts := int64(0)
	for _, m := range rpc.GetPublish() {
		sz := int64(proto.Size(m))
		parts += sz
		if m.GetTopic() != r.topic {
			r.otherTopic.Add(sz)
			continue
		}
		r.dataBytes.Add(int64(len(m.GetData())))
		r.sigBytes.Add(int64(len(m.GetSignature())))
		r.fromSeqKeyTopic.Add(sz - int64(len(m.GetData())) - int64(len(m.GetSignature())))
		if peer.ID(m.GetFrom()) == r.self {
			r.firstHop.Add(sz)
			r.firstHopN.Add(1)
		} else {
			r.forwarded.Add(sz)
			r.forwardedN.Add(1)
		}
	}
	for _, s := range rpc.GetSubscriptions() {
		sz := int64(proto.Size(s))
		parts += sz
		r.subs.Add(sz)
	}
	if c := rpc.GetControl(); c != nil {
		add := func(dst *atomic.Int64, ms ...proto.Message) {
			for _, m := range ms {
				sz := int64(proto.Size(m))
				parts += sz
				dst.Add(sz)
			}
		}
		for _, m := range c.GetIhave() {
			add(&r.ihave, m)
		}
		for _, m := range c.GetIwant() {
			add(&r.iwant, m)
		}
		for _, m := range c.GetIdontwant() {
			add(&r.idontwant, m)
		}
		for _, m := range c.GetGraft() {
			add(&r.graftPrune, m)
		}
		for _, m := range c.GetPrune() {
			add(&r.graftPrune, m)
		}
	}
	r.envelope.Add(total - parts)
}

func protoVarintLen(x uint64) int {
	n := 1
	for x >= 0x80 {
		x >>= 7
		n++
	}
	return n
}

func (r *rpcTally) DuplicateMessage(m *pubsub.Message) {
	if m.GetTopic() == r.topic {
		r.duplicates.Add(1)
	}
}
func (r *rpcTally) AddPeer(peer.ID, protocol.ID)             {}
func (r *rpcTally) RemovePeer(peer.ID)                       {}
func (r *rpcTally) Join(string)                              {}
func (r *rpcTally) Leave(string)                             {}
func (r *rpcTally) Graft(peer.ID, string)                    {}
func (r *rpcTally) Prune(peer.ID, string)                    {}
func (r *rpcTally) ValidateMessage(*pubsub.Message)          {}
func (r *rpcTally) DeliverMessage(*pubsub.Message)           {}
func (r *rpcTally) RejectMessage(*pubsub.Message, string)    {}
func (r *rpcTally) ThrottlePeer(peer.ID)                     {}
func (r *rpcTally) RecvRPC(*pubsub.RPC)                      {}
func (r *rpcTally) DropRPC(*pubsub.RPC, peer.ID)             {}
func (r *rpcTally) UndeliverableMessage(*pubsub.Message)     {}
func (r *rpcTally) OnNewOutboundStream(peer.ID, protocol.ID) {}
func (r *rpcTally) OnClosedOutboundStream(peer.ID)           {}

// snapshot returns every counter, in a fixed order, to diff two moments.
func (r *rpcTally) snapshot() []int64 {
	cs := []*atomic.Int64{&r.firstHop, &r.firstHopN, &r.forwarded, &r.forwardedN, &r.dataBytes, &r.sigBytes,
		&r.fromSeqKeyTopic, &r.ihave, &r.iwant, &r.idontwant, &r.graftPrune, &r.subs, &r.otherTopic, &r.rpcs, &r.envelope, &r.duplicates}
	out := make([]int64, len(cs))
	for i, c := range cs {
		out[i] = c.Load()
	}
	return out
}

const (
	tFirstHop = iota
	tFirstHopN
	tForwarded
	tForwardedN
	tData
	tSig
	tFromSeqKeyTopic
	tIhave
	tIwant
	tIdontwant
	tGraftPrune
	tSubs
	tOtherTopic
	tRPCs
	tEnvelope
	tDuplicates
	tCount
)

// stampTransport records, for probe keys, when the runtime published
// them (the end of the sync-tick wait) and when each peer received them.
type stampTransport struct {
	*Mesh
	st *stamps
}

func (s stampTransport) Start(ctx context.Context, h node.Handler) error {
	return s.Mesh.Start(ctx, probeHandler{h, s.st.received(s.Mesh.PeerID())})
}

func (s stampTransport) Publish(ctx context.Context, b *crdt.Batch) error {
	now := time.Now()
	s.st.mu.Lock()
	for _, e := range b.Windows {
		if strings.HasPrefix(e.Key, "p-") {
			if _, ok := s.st.published[e.Key]; !ok {
				s.st.published[e.Key] = now
			}
		}
	}
	s.st.mu.Unlock()
	return s.Mesh.Publish(ctx, b)
}

type stamps struct {
	mu        sync.Mutex
	allowed   map[string]time.Time
	published map[string]time.Time
	seen      map[[2]string]bool
	// per delivery: total (Allow → peer), wait (Allow → Publish), gossip
	// (Publish → peer)
	total, wait, gossip []time.Duration
}

func newStamps() *stamps {
	return &stamps{allowed: map[string]time.Time{}, published: map[string]time.Time{}, seen: map[[2]string]bool{}}
}

func (s *stamps) received(receiver string) func(node.Inbound) {
	return func(in node.Inbound) {
		now := time.Now()
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, e := range in.Batch.Windows {
			if !strings.HasPrefix(e.Key, "p-") {
				continue
			}
			k := [2]string{receiver, e.Key}
			at, ok := s.allowed[e.Key]
			pub, ok2 := s.published[e.Key]
			if !ok || !ok2 || s.seen[k] {
				continue
			}
			s.seen[k] = true
			s.total = append(s.total, now.Sub(at))
			s.wait = append(s.wait, pub.Sub(at))
			s.gossip = append(s.gossip, now.Sub(pub))
		}
	}
}

func (s *stamps) reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.total, s.wait, s.gossip = nil, nil, nil
}

func (s *stamps) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.total)
}

func pct(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	ds = slices.Clone(ds)
	slices.Sort(ds)
	return ds[int(float64(len(ds)-1)*p)]
}

type wireResult struct {
	v                         wireVariant
	decisions                 int
	published, pubBytes       uint64
	wireOut                   uint64
	tally                     [tCount]int64
	dur                       time.Duration
	p50, p99                  time.Duration // Allow → peer runtime
	waitP50, waitP99          time.Duration
	gossipP50, gossipP99      time.Duration
	rawP50, rawP99            time.Duration
	deltaP99Load, rawP99Load  time.Duration
	deliveries, rawDeliveries int
}

// perDelivered is gossipsub wire bytes per byte of payload delivered:
// payload = encoded batches, each delivered to n-1 receivers.
func (r wireResult) perDelivered(n int) float64 {
	return float64(r.wireOut) / float64(r.pubBytes*uint64(n-1))
}

func (r wireResult) perPublished() float64 { return float64(r.wireOut) / float64(r.pubBytes) }

// TestWireExperiment runs every variant (or those in RATEMESH_VARIANTS)
// on a fresh mesh of five members under 600 decisions/s per member over
// 1000 shared keys, and logs a table.
func TestWireExperiment(t *testing.T) {
	experimentOn(t)
	var pick map[string]bool
	if s := os.Getenv("RATEMESH_VARIANTS"); s != "" {
		pick = map[string]bool{}
		for _, n := range strings.Split(s, ",") {
			pick[n] = true
		}
	}
	dur := 3 * time.Second
	if s := os.Getenv("RATEMESH_SECONDS"); s != "" {
		d, err := time.ParseDuration(s + "s")
		if err != nil {
			t.Fatal(err)
		}
		dur = d
	}
	const n = 5
	var res []wireResult
	for _, v := range wireVariants() {
		if pick != nil && !pick[v.name] {
			continue
		}
		t.Run(v.name, func(t *testing.T) {
			r := runWireVariant(t, v, n, dur)
			res = append(res, r)
			logWireResult(t, r, n)
		})
	}
	t.Logf("%-22s %8s %7s %6s %8s %8s %8s %7s %7s %7s %7s %7s %7s", "variant", "decis/s", "batch/s", "B/bat",
		"wire/pub", "wire/dlv", "B/dlvdec", "p50", "p99", "waitp99", "gspp99", "rawp99", "ratio")
	for _, r := range res {
		t.Logf("%-22s %8.0f %7.0f %6.0f %8.2f %8.2f %8.0f %7v %7v %7v %7v %7v %7.2f", r.v.name,
			float64(r.decisions)/r.dur.Seconds(), float64(r.published)/r.dur.Seconds(), float64(r.pubBytes)/float64(r.published),
			r.perPublished(), r.perDelivered(n), float64(r.wireOut)/float64(r.decisions*(n-1)),
			r.p50.Round(100*time.Microsecond), r.p99.Round(100*time.Microsecond), r.waitP99.Round(100*time.Microsecond),
			r.gossipP99.Round(100*time.Microsecond), r.rawP99.Round(100*time.Microsecond), float64(r.deltaP99Load)/float64(max(r.rawP99Load, 1)))
	}
}

func logWireResult(t *testing.T, r wireResult, n int) {
	tl := r.tally
	wire := float64(r.wireOut)
	share := func(x int64) string { return fmt.Sprintf("%d (%.1f%%)", x, 100*float64(x)/wire) }
	t.Logf("%s: %d decisions in %v (%.0f/s), %d batches (%.0f B each), gossip wire out %d B: %.2f × published, %.2f × delivered payload",
		r.v.name, r.decisions, r.dur.Round(time.Millisecond), float64(r.decisions)/r.dur.Seconds(), r.published,
		float64(r.pubBytes)/float64(max(r.published, 1)), r.wireOut, r.perPublished(), r.perDelivered(n))
	t.Logf("  first-hop copies %d: %s; forwarded copies %d: %s; duplicates received %d",
		tl[tFirstHopN], share(tl[tFirstHop]), tl[tForwardedN], share(tl[tForwarded]), tl[tDuplicates])
	t.Logf("  inside message copies: data %s, signature %s, from/seqno/key/topic/tags %s",
		share(tl[tData]), share(tl[tSig]), share(tl[tFromSeqKeyTopic]))
	t.Logf("  control: IHAVE %s, IWANT %s, IDONTWANT %s, GRAFT/PRUNE %s, subscriptions %s; other topics %s; RPC envelopes/length prefixes %s in %d RPCs",
		share(tl[tIhave]), share(tl[tIwant]), share(tl[tIdontwant]), share(tl[tGraftPrune]), share(tl[tSubs]), share(tl[tOtherTopic]), share(tl[tEnvelope]), tl[tRPCs])
	accounted := tl[tFirstHop] + tl[tForwarded] + tl[tIhave] + tl[tIwant] + tl[tIdontwant] + tl[tGraftPrune] + tl[tSubs] + tl[tOtherTopic] + tl[tEnvelope]
	t.Logf("  accounted by the tracer %s (the rest: stream framing, identify-time hellos)", share(accounted))
	t.Logf("  propagation under load (%d deliveries): Allow→peer p50 %v p99 %v; of which sync wait p50 %v p99 %v, Publish→peer p50 %v p99 %v",
		r.deliveries, r.p50.Round(10*time.Microsecond), r.p99.Round(10*time.Microsecond), r.waitP50.Round(10*time.Microsecond), r.waitP99.Round(10*time.Microsecond),
		r.gossipP50.Round(10*time.Microsecond), r.gossipP99.Round(10*time.Microsecond))
	t.Logf("  with raw gossipsub alongside: delta p99 %v, raw p50 %v p99 %v (%d deliveries): delta/raw p99 %.2f",
		r.deltaP99Load.Round(10*time.Microsecond), r.rawP50.Round(10*time.Microsecond), r.rawP99.Round(10*time.Microsecond), r.rawDeliveries,
		float64(r.deltaP99Load)/float64(max(r.rawP99Load, 1)))
}

// wireHost returns a host on loopback TCP for key whose streams' bytes w
// counts, closed when the test ends.
func wireHost(t testing.TB, key crypto.PrivKey, w *wire) host.Host {
	t.Helper()
	h, err := libp2p.New(
		libp2p.Identity(key),
		libp2p.Security(noise.ID, noise.New),
		libp2p.Muxer(yamux.ID, yamux.DefaultTransport),
		libp2p.Transport(tcp.NewTCPTransport, tcp.DisableReuseport()),
		libp2p.ListenAddrStrings("/ip4/127.0.0.1/tcp/0"),
		libp2p.BandwidthReporter(w),
		libp2p.DisableRelay(),
		libp2p.DisableMetrics(),
	)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return h
}

func runWireVariant(t *testing.T, v wireVariant, n int, dur time.Duration) wireResult {
	ns := v.namespace
	if ns == "" {
		ns = "default"
	}
	rules := []limiter.Rule{{Name: "api", Algorithm: limiter.FixedWindow, Limit: 1 << 40, Window: time.Second}}
	st := newStamps()
	ms := make([]*Mesh, n)
	nodes := make([]*node.Node, n)
	wires := make([]*wire, n)
	tallies := make([]*rpcTally, n)
	for i := range n {
		key := newKey(t)
		self, err := peer.IDFromPrivateKey(key)
		if err != nil {
			t.Fatal(err)
		}
		w := &wire{sync: protocol.ID("/ratemesh/1/" + ns + "/sync")}
		h := wireHost(t, key, w)
		ctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(cancel)
		params := GossipSubParams(100 * time.Millisecond)
		if v.libp2p {
			params = pubsub.DefaultGossipSubParams()
			params.HeartbeatInterval = 100 * time.Millisecond
			params.HeartbeatInitialDelay = 100 * time.Millisecond
		}
		if v.params != nil {
			v.params(&params)
		}
		tl := &rpcTally{self: self, topic: "/ratemesh/1/" + ns}
		opts := []pubsub.Option{
			pubsub.WithGossipSubParams(params),
			pubsub.WithFloodPublish(v.flood),
			pubsub.WithMessageSignaturePolicy(pubsub.StrictSign),
			pubsub.WithPeerOutboundQueueSize(1024),
			pubsub.WithValidateQueueSize(1024),
			pubsub.WithMaxMessageSize(crdt.MaxBatchBytes + rpcOverhead),
			pubsub.WithRawTracer(tl),
		}
		if v.shortID {
			opts = append(opts, pubsub.WithMessageIdFn(func(m *pb.Message) string {
				h := sha256.New()
				h.Write(m.GetFrom())
				h.Write(m.GetSeqno())
				return string(h.Sum(nil)[:12])
			}))
		}
		ps, err := pubsub.NewGossipSub(ctx, h, opts...)
		if err != nil {
			t.Fatalf("%s: %v", v.name, err)
		}
		cfg := testConfig(t)
		cfg.Namespace = ns
		cfg.Listen = nil
		cfg.PrivKey = key
		cfg.Plausible = PlausibleFor(rules, 0)
		for _, o := range ms[:i] {
			cfg.Bootstrap = append(cfg.Bootstrap, tcpAddr(t, o))
		}
		m, err := Attach(h, ps, cfg)
		if err != nil {
			t.Fatal(err)
		}
		ms[i], wires[i], tallies[i] = m, w, tl
		ncfg := node.DefaultConfig()
		ncfg.Peer, ncfg.Rules, ncfg.Join = m.PeerID(), rules, i > 0
		ncfg.SyncInterval = v.sync
		ncfg.PublishGap = v.gap
		ncfg.Transport = stampTransport{m, st}
		sctx, scancel := context.WithTimeout(context.Background(), 20*time.Second)
		nd, err := node.Start(sctx, ncfg)
		scancel()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { nd.Close() })
		nodes[i] = nd
	}
	ctx := context.Background()
	allow := func(i int, key string) {
		if strings.HasPrefix(key, "p-") {
			st.mu.Lock()
			st.allowed[key] = time.Now()
			st.mu.Unlock()
		}
		if d, err := nodes[i].Allow(ctx, "api", key); err != nil || !d.Allowed {
			t.Errorf("Allow(%s) = %+v, %v", key, d, err)
		}
	}
	// Warm up: every member's probe reaches every other member.
	round := 0
	testutil.Eventually(t, 15*time.Second, func() (bool, string) {
		round++
		for i := range nodes {
			allow(i, fmt.Sprintf("p-warm-%d-%d", i, round))
		}
		st.mu.Lock()
		defer st.mu.Unlock()
	rounds:
		for r := max(1, round-50); r < round; r++ {
			for i := range nodes {
				for j := range nodes {
					if i != j && !st.seen[[2]string{ms[j].PeerID(), fmt.Sprintf("p-warm-%d-%d", i, r)}] {
						continue rounds
					}
				}
			}
			return true, ""
		}
		return false, "some round's changes reached every other member"
	})
	// Let the meshes settle (grafts, subscriptions) before counting.
	settle := time.Now().Add(300 * time.Millisecond)
	testutil.Eventually(t, time.Second, func() (bool, string) { return time.Now().After(settle), "settled" })

	// load runs 600 decisions/s per member over 1000 shared keys (3 per
	// 5 ms tick), plus a probe change on a fresh key every 17 ms, and
	// raw publishes alongside the probes if raw is set.
	var decisions atomic.Int64
	load := func(phase string, d time.Duration, raw []*pubsub.Topic) {
		var wg sync.WaitGroup
		stop := time.Now().Add(d)
		for i := range n {
			wg.Add(2)
			go func() {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(uint64(i), 17))
				tick := time.NewTicker(5 * time.Millisecond)
				defer tick.Stop()
				start := time.Now()
				done := 0
				for now := range tick.C {
					if now.After(stop) {
						return
					}
					// Catch up if the loaded machine delayed ticks: 0.6
					// decisions per ms since start.
					due := int(now.Sub(start).Milliseconds() * 600 / 1000)
					for ; done < due; done++ {
						allow(i, fmt.Sprintf("acct:%06d", rng.IntN(1000)))
						decisions.Add(1)
					}
				}
			}()
			go func() {
				defer wg.Done()
				tick := time.NewTicker(17 * time.Millisecond)
				defer tick.Stop()
				for k := 0; ; k++ {
					now := <-tick.C
					if now.After(stop) {
						return
					}
					key := fmt.Sprintf("p-%s-%d-%d", phase, i, k)
					if raw != nil && k%2 == 0 {
						_ = raw[i].Publish(ctx, rawMsgAt(key))
					}
					allow(i, key)
					if raw != nil && k%2 == 1 {
						_ = raw[i].Publish(ctx, rawMsgAt(key))
					}
				}
			}()
		}
		wg.Wait()
	}

	// Phase 1: bytes and the latency decomposition, our topic only.
	st.reset()
	var before, pubBefore, pubBytesBefore uint64
	var tBefore [tCount]int64
	for i := range n {
		before += uint64(wires[i].gossipOut.Load())
		s := ms[i].Stats()
		pubBefore += s.Published
		pubBytesBefore += s.PublishedBytes
		for k, x := range tallies[i].snapshot() {
			tBefore[k] += x
		}
	}
	start := time.Now()
	load("a", dur, nil)
	elapsed := time.Since(start)
	r := wireResult{v: v, dur: elapsed, decisions: int(decisions.Load())}
	for i := range n {
		r.wireOut += uint64(wires[i].gossipOut.Load())
		s := ms[i].Stats()
		r.published += s.Published
		r.pubBytes += s.PublishedBytes
		for k, x := range tallies[i].snapshot() {
			r.tally[k] += x
		}
	}
	r.wireOut -= before
	r.published -= pubBefore
	r.pubBytes -= pubBytesBefore
	for k := range r.tally {
		r.tally[k] -= tBefore[k]
	}
	// Wait for the last probes to land, then read the decomposition.
	testutil.Eventually(t, 5*time.Second, func() (bool, string) {
		st.mu.Lock()
		defer st.mu.Unlock()
		want := 0
		for k := range st.allowed {
			if strings.HasPrefix(k, "p-a-") {
				want++
			}
		}
		return len(st.total) >= want*(n-1), "phase-1 probes delivered"
	})
	st.mu.Lock()
	r.deliveries = len(st.total)
	r.p50, r.p99 = pct(st.total, 0.5), pct(st.total, 0.99)
	r.waitP50, r.waitP99 = pct(st.wait, 0.5), pct(st.wait, 0.99)
	r.gossipP50, r.gossipP99 = pct(st.gossip, 0.5), pct(st.gossip, 0.99)
	st.mu.Unlock()

	// Phase 2: the same load with raw gossipsub messages alongside the
	// probes, on a second topic of the same routers: the reference.
	rawLat, rawTopics := joinRaw(t, ms, func(key string) bool { return !strings.HasPrefix(key, "p-b-") })
	rr := 0
	testutil.Eventually(t, 10*time.Second, func() (bool, string) {
		rr++
		for i := range n {
			_ = rawTopics[i].Publish(ctx, rawMsgAt(fmt.Sprintf("w-%d-%d", i, rr)))
		}
		// joinRaw skips w- keys; wait on the raw topic's peers instead.
		for i := range n {
			if len(rawTopics[i].ListPeers()) < n-1 {
				return false, "raw topic peers"
			}
		}
		return rr > 5, "raw topic peers"
	})
	st.reset()
	load("b", dur/2, rawTopics)
	testutil.Eventually(t, 5*time.Second, func() (bool, string) {
		st.mu.Lock()
		want := 0
		for k := range st.allowed {
			if strings.HasPrefix(k, "p-b-") {
				want++
			}
		}
		got := len(st.total)
		st.mu.Unlock()
		return got >= want*(n-1) && rawLat.count("") >= 0, "phase-2 probes delivered"
	})
	// Raw deliveries: let stragglers land.
	lastRaw := -1
	testutil.Eventually(t, 5*time.Second, func() (bool, string) {
		c, _, _, _ := rawLat.summary()
		stable := c == lastRaw
		lastRaw = c
		return stable, "raw deliveries settled"
	})
	st.mu.Lock()
	r.deltaP99Load = pct(st.total, 0.99)
	st.mu.Unlock()
	r.rawDeliveries, r.rawP50, r.rawP99, _ = rawLat.summary()
	r.rawP99Load = r.rawP99
	return r
}

func rawMsgAt(key string) []byte {
	var hdr [8]byte
	ns := uint64(time.Now().UnixNano())
	for i := range 8 {
		hdr[i] = byte(ns >> (56 - 8*i))
	}
	return append(hdr[:], key...)
}

// TestWireEncoding compares the encoded size of a batch shaped like the
// load's (12 changed entries of one rule over 1000 account keys, one
// window) with compacter encodings that carry the same information.
func TestWireEncoding(t *testing.T) {
	experimentOn(t)
	peerID := "12D3KooWGzxzKZYveHXtpG6AsrUJBcWxHBFS2HsEoGTxrMLvKXtf"
	now := int64(1_763_780_000_000)
	em, err := cbor.CoreDetEncOptions().EncMode()
	if err != nil {
		t.Fatal(err)
	}
	size := func(v any) int {
		b, err := em.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return len(b)
	}
	for _, entries := range []int{1, 4, 12, 30, 100} {
		b := &crdt.Batch{
			Version: crdt.Version, From: crdt.Slot{Peer: peerID, Incarnation: uint64(now)},
			Seq: 123456, Sent: now, Clock: now + 3, RulesHash: 0x9e3779b97f4a7c15, Ack: now - 20,
		}
		rng := rand.New(rand.NewPCG(1, 2))
		seen := map[string]bool{}
		for len(b.Windows) < entries {
			key := fmt.Sprintf("acct:%06d", rng.IntN(1000))
			if seen[key] {
				continue
			}
			seen[key] = true
			adm := uint64(1 + rng.IntN(3))
			b.Windows = append(b.Windows, crdt.WindowEntry{
				Rule: "api", Key: key, WindowMs: 1000, Window: now / 1000, Admitted: adm, Attempted: adm + uint64(rng.IntN(2)),
			})
		}
		cur, err := b.Encode()
		if err != nil {
			t.Fatal(err)
		}

		// (a) entries as arrays instead of keyed maps.
		type entA struct {
			_         struct{} `cbor:",toarray"`
			Slot      uint32
			Rule      string
			Key       string
			WindowMs  int64
			Window    int64
			Admitted  uint64
			Attempted uint64
		}
		type hdr struct {
			Version   uint64 `cbor:"0,keyasint"`
			From      any    `cbor:"1,keyasint"`
			Seq       uint64 `cbor:"2,keyasint"`
			Sent      int64  `cbor:"3,keyasint"`
			Clock     int64  `cbor:"4,keyasint"`
			RulesHash uint64 `cbor:"5,keyasint,omitempty"`
			Ack       int64  `cbor:"6,keyasint,omitempty"`
			Rules     []any  `cbor:"9,keyasint,omitempty"`
			Windows   any    `cbor:"10,keyasint,omitempty"`
		}
		var as []entA
		for _, e := range b.Windows {
			as = append(as, entA{Rule: e.Rule, Key: e.Key, WindowMs: e.WindowMs, Window: e.Window, Admitted: e.Admitted, Attempted: e.Attempted})
		}
		h := hdr{Version: b.Version, From: b.From, Seq: b.Seq, Sent: b.Sent, Clock: b.Clock, RulesHash: b.RulesHash, Ack: b.Ack}
		h.Windows = as
		arrays := size(h)

		// (b) arrays, plus (rule, window_ms, window) interned once per
		// batch: entries name a group index, key, admitted, attempted.
		type group struct {
			_        struct{} `cbor:",toarray"`
			Rule     string
			WindowMs int64
			Window   int64
			Entries  []any // flat: key, admitted, attempted, key, …
		}
		groups := map[[3]any]*group{}
		var order []*group
		for _, e := range b.Windows {
			k := [3]any{e.Rule, e.WindowMs, e.Window}
			g := groups[k]
			if g == nil {
				g = &group{Rule: e.Rule, WindowMs: e.WindowMs, Window: e.Window}
				groups[k] = g
				order = append(order, g)
			}
			g.Entries = append(g.Entries, e.Key, e.Admitted, e.Attempted)
		}
		h.Windows = order
		grouped := size(h)

		// (c) grouped, and the header without what the signed pubsub
		// envelope already carries (the author's peer ID: only the
		// incarnation stays) and with Clock as a delta from Sent.
		type slotInc struct {
			_           struct{} `cbor:",toarray"`
			Incarnation uint64
		}
		h2 := h
		h2.From = slotInc{Incarnation: b.From.Incarnation}
		h2.Clock = b.Clock - b.Sent
		h2.Ack = b.Sent - b.Ack
		noPeer := size(h2)

		t.Logf("%3d entries: current %5d B (%5.1f/entry); entries as arrays %5d (%.2f×); grouped by (rule, window) %5d (%.2f×); and no peer ID in the header, deltas for Clock/Ack %5d (%.2f×, %5.1f/entry)",
			entries, len(cur), float64(len(cur))/float64(entries), arrays, float64(arrays)/float64(len(cur)),
			grouped, float64(grouped)/float64(len(cur)), noPeer, float64(noPeer)/float64(len(cur)), float64(noPeer)/float64(entries))
	}
	// The per-message overhead pubsub adds to every copy (StrictSign,
	// Ed25519): from 38+2, seqno 8+2, signature 64+2, key 0 (inlined in
	// the peer ID), topic len+2, the data's tag and length 2–3.
	for _, topic := range []string{"/ratemesh/1/default", "/ratemesh/1/r"} {
		m := &pb.Message{From: make([]byte, 38), Seqno: make([]byte, 8), Signature: make([]byte, 64), Topic: &topic, Data: make([]byte, 500)}
		t.Logf("pubsub message overhead around 500 B of data, topic %q: %d B", topic, proto.Size(m)-500)
	}
}

// TestLeadingEdgeEstimate simulates, per member, the wait from a change
// to the publish that carries it under two flush policies, for the
// arrival patterns of the measurements: the tick (today: publish every
// sync_interval, at a phase unrelated to the change) and a leading edge
// (publish at once when a token is available, else when the next one
// is; tokens refill at one per gap, up to burst). It logs the wait's p50
// and p99 and the publishes per second; the propagation p99 is about this
// wait plus the gossip p99 that TestWireExperiment measures (Publish →
// peer).
func TestLeadingEdgeEstimate(t *testing.T) {
	experimentOn(t)
	const horizon = 20 * time.Second
	type arrivals struct {
		name string
		next func(rng *rand.Rand) time.Duration
	}
	poisson := func(perSec float64) func(*rand.Rand) time.Duration {
		return func(rng *rand.Rand) time.Duration {
			return time.Duration(rng.ExpFloat64() / perSec * float64(time.Second))
		}
	}
	pats := []arrivals{
		{"600/s Poisson (the issue's load per member)", poisson(600)},
		{"every 17 ms (TestNodePropagationFigures)", func(*rand.Rand) time.Duration { return 17 * time.Millisecond }},
		{"20/s Poisson (a quiet member)", poisson(20)},
	}
	type policy struct {
		name  string
		tick  time.Duration // > 0: the tick policy
		gap   time.Duration // leading edge: one token per gap
		burst int
	}
	pols := []policy{
		{name: "tick 20ms (today)", tick: 20 * time.Millisecond},
		{name: "tick 10ms", tick: 10 * time.Millisecond},
		{name: "tick 5ms", tick: 5 * time.Millisecond},
		{name: "lead gap 20ms", gap: 20 * time.Millisecond, burst: 1},
		{name: "lead gap 20ms burst 4", gap: 20 * time.Millisecond, burst: 4},
		{name: "lead gap 10ms", gap: 10 * time.Millisecond, burst: 1},
		{name: "lead gap 5ms", gap: 5 * time.Millisecond, burst: 1},
	}
	for _, a := range pats {
		for _, p := range pols {
			rng := rand.New(rand.NewPCG(7, 11))
			var waits []time.Duration
			pubs := 0
			phase := time.Duration(rng.Int64N(int64(max(p.tick, 1))))
			tokens, lastRefill := float64(p.burst), time.Duration(0)
			pendingAt := time.Duration(-1) // the publish time of the pending batch
			for now := time.Duration(0); now < horizon; now += a.next(rng) {
				if p.tick > 0 {
					k := (now-phase)/p.tick + 1
					at := phase + k*p.tick
					if at != pendingAt {
						pendingAt = at
						pubs++ // a tick publishes only if something changed
					}
					waits = append(waits, at-now)
					continue
				}
				if pendingAt >= 0 && pendingAt >= now {
					waits = append(waits, pendingAt-now)
					continue
				}
				// refill
				tokens = min(float64(p.burst), tokens+float64(now-lastRefill)/float64(p.gap))
				lastRefill = now
				if tokens >= 1 {
					tokens--
					pendingAt = now
					pubs++
					waits = append(waits, 0)
					continue
				}
				at := now + time.Duration((1-tokens)*float64(p.gap))
				tokens, lastRefill = 0, at
				pendingAt = at
				pubs++
				waits = append(waits, at-now)
			}
			t.Logf("%-44s %-22s wait p50 %6v p99 %6v; %4.0f publishes/s", a.name, p.name,
				pct(waits, 0.5).Round(100*time.Microsecond), pct(waits, 0.99).Round(100*time.Microsecond), float64(pubs)/horizon.Seconds())
		}
	}
}
