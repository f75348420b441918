package mesh

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p"
	pubsub "github.com/libp2p/go-libp2p-pubsub"
	"github.com/libp2p/go-libp2p/core/event"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	"github.com/libp2p/go-libp2p/p2p/discovery/mdns"
	"github.com/libp2p/go-libp2p/p2p/muxer/yamux"
	"github.com/libp2p/go-libp2p/p2p/security/noise"
	libp2ptls "github.com/libp2p/go-libp2p/p2p/security/tls"
	quic "github.com/libp2p/go-libp2p/p2p/transport/quic"
	"github.com/libp2p/go-libp2p/p2p/transport/tcp"
	ma "github.com/multiformats/go-multiaddr"

	"github.com/ratemesh/ratemesh/crdt"
	"github.com/ratemesh/ratemesh/node"
)

// rpcOverhead is what a pubsub RPC adds around a message's data: the
// signature, the author's key, the sequence number, the topic.
const rpcOverhead = 64 << 10

// Mesh is the libp2p Transport: a host, a gossipsub topic with a
// validating gate, the anti-entropy stream protocol, discovery and
// redialling. Create it with New (its own host and PubSub) or Attach (a
// service's), then Start it; it is safe for concurrent use. Its zero value
// is not usable.
type Mesh struct {
	// owned: New built h and ps, and Close closes them; an attached Mesh
	// (Attach) only removes what it added.
	owned     bool
	connTag   string // the connection manager tag protecting members' connections
	cfg       Config
	log       *slog.Logger
	h         host.Host
	self      peer.ID
	selfStr   string
	gater     *gater
	sugg      suggestions // the budget of dials member tables start (learnAddrs)
	allow     *allowlist
	wire      *wire
	trace     *tracer
	topicName string
	syncProto protocol.ID
	bootstrap []peer.AddrInfo

	ctx    context.Context // lives until Close
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu       sync.Mutex
	started  bool
	closed   bool
	handler  node.Handler
	ps       *pubsub.PubSub
	topic    *pubsub.Topic
	sub      *pubsub.Subscription
	disc     mdns.Service
	notifiee *network.NotifyBundle
	busSub   event.Subscription
	peersMu  sync.Mutex
	peers    map[peer.ID]*peerState // written by the event loop only
	redials  map[peer.ID]*redial    // redial loops: bootstrap peers and lost members (keep)
	// lostLoops counts the lost members' loops in redials, under mu.
	lostLoops int

	// deliver guards handler calls: Close takes it exclusively, so no
	// call is under way or starts after Close returns.
	deliver sync.RWMutex
	stopped bool

	evMu  sync.Mutex
	evq   []connEvent
	evSig chan struct{}

	closeOnce sync.Once
	closeErr  error

	logs refusalLogs
	st   counters

	// fwdHandler serves the forward stream (forward.go): the handler,
	// when it implements node.ForwardHandler. Set once by Start.
	fwdHandler node.ForwardHandler

	// probe is set while attach checks the PubSub's signing (attach.go).
	probe atomic.Pointer[probe]
	// subscribeGrace is subscribeGrace, and maxLost maxLostRedials, but
	// in tests.
	subscribeGrace time.Duration
	maxLost        int

	// inflight are the inbound sync and forward streams being served,
	// under mu; Close resets them and waits for their handlers (wg).
	inflight map[network.Stream]struct{}
}

var _ node.Transport = (*Mesh)(nil)

type evKind int

const (
	evUp         evKind = iota // a connection opened
	evDown                     // a connection closed
	evIdentified               // identify completed on a connection
	evProtocols                // a peer announced new protocols
	evBlocked                  // Block on an attached Mesh: the connection stays
	evUnblocked                // Unblock on an attached Mesh whose connection stayed
	evLeaving                  // the peer announced that it leaves (a batch with crdt.FlagLeaving)
)

type connEvent struct {
	kind   evKind
	c      network.Conn // evUp, evDown, evIdentified
	p      peer.ID      // evProtocols, evBlocked, evUnblocked, evLeaving
	protos []protocol.ID
}

// peerState is what the event loop knows of one connected peer.
type peerState struct {
	conns     map[network.Conn]struct{}
	announced bool // PeerConnected fired for this spell of connectivity
	protected bool // its connections carry our connection manager tag
	// speaks: identify showed the peer speaks our sync protocol in this
	// spell. Unblock re-announces from it, not from the peerstore, which
	// can lose a connected peer's protocols (seen under load on a
	// service's host between Block and Unblock).
	speaks bool
	// leaving: the peer announced that it leaves; its connections
	// closing is no loss to redial.
	leaving bool
	// since: when the peer was announced (subscriptions; under peersMu),
	// and addrs its addresses then, to redial it once lost (lost).
	since time.Time
	addrs []ma.Multiaddr
}

// redial wakes the redial loop of one peer (keep).
type redial struct {
	down chan struct{} // its last connection closed
	wake chan struct{} // Unblock: try now, with a fresh backoff
	// lost: the peer is a member whose last connection closed, not a
	// bootstrap peer. Its loop ends once the peer is blocked or off the
	// allowlist, leaves, or is the one lost longest ago when more than
	// maxLostRedials are (forgetLost).
	lost   bool
	lostAt time.Time   // when its last connection closed last, under mu
	gone   atomic.Bool // its loop ends (lost, forgetLost)
}

// New builds the host and its gossipsub router and starts listening; the
// mesh subscribes to the topic and dials out only at Start. PeerID and
// Addrs are valid at once, so the runtime can name its counter slot before
// starting. New runs on the same code as Attach, on a host and PubSub of
// its own, which Close closes.
func New(cfg Config) (*Mesh, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	self, err := peer.IDFromPrivateKey(cfg.PrivKey)
	if err != nil {
		return nil, fmt.Errorf("mesh: config PrivKey: %w", err)
	}
	m := newMember(cfg, self)
	m.owned = true
	opts := []libp2p.Option{
		libp2p.Identity(cfg.PrivKey),
		libp2p.Security(noise.ID, noise.New),
		libp2p.Security(libp2ptls.ID, libp2ptls.New),
		libp2p.Muxer(yamux.ID, yamux.DefaultTransport),
		// No SO_REUSEPORT: with it a second process binds a port this
		// one holds and advertises the same address (see listen).
		libp2p.Transport(tcp.NewTCPTransport, tcp.DisableReuseport()),
		libp2p.ConnectionGater(m.gater),
		libp2p.BandwidthReporter(m.wire),
		libp2p.WithDialTimeout(cfg.DialTimeout),
		libp2p.DisableRelay(),
		libp2p.DisableMetrics(), // the runtime exports Stats under its own names
		libp2p.UserAgent("ratemesh"),
	}
	if len(cfg.PSK) > 0 {
		opts = append(opts, libp2p.PrivateNetwork(cfg.PSK))
	} else {
		opts = append(opts, libp2p.Transport(quic.NewTransport))
	}
	opts = append(opts, libp2p.NoListenAddrs) // listen binds cfg.Listen below, every one or none
	m.h, err = libp2p.New(opts...)
	if err != nil {
		m.cancel()
		return nil, fmt.Errorf("mesh: start host: %w", err)
	}
	if err := listen(m.h, cfg.Listen); err != nil {
		m.cancel()
		_ = m.h.Close()
		return nil, err
	}
	// Gossipsub reads its inbound RPC streams through sizeHost, which
	// counts the RPCs over its message cap that it drops (ReasonOversize).
	ps, err := pubsub.NewGossipSub(m.ctx, sizeHost{Host: m.h, max: pubsubMaxMessage(cfg), over: m.rpcOversize}, append(PubSubOptions(cfg), pubsub.WithRawTracer(m.trace))...)
	if err != nil {
		m.cancel()
		_ = m.h.Close()
		return nil, fmt.Errorf("mesh: start gossipsub: %w", err)
	}
	if err := m.attach(ps); err != nil {
		m.cancel()
		_ = m.h.Close()
		return nil, err
	}
	if err := m.startAllowlist(); err != nil {
		m.cancel()
		_ = m.h.Close()
		return nil, err
	}
	if len(cfg.PSK) == 0 && !cfg.allowlistOn() && !allLoopback(cfg.Listen) {
		m.log.Warn("neither a private network key nor an allowlist: any peer that can reach this address may join the mesh", "listen", cfg.Listen)
	}
	return m, nil
}

// startAllowlist loads the allowlist's static sources and starts watching
// its file; New and Attach call it last, as it starts a goroutine that
// Close ends.
func (m *Mesh) startAllowlist() error {
	if !m.allow.on {
		return nil
	}
	ids, err := decodePeers(m.cfg.AllowPeers)
	if err != nil {
		return badField("AllowPeers", "%v", err) // validated already
	}
	m.allow.replace(allowSourceConfig, ids)
	if m.cfg.AllowPeersFile != "" {
		data, ids, err := loadAllowFile(m.cfg.AllowPeersFile)
		if err != nil {
			return fmt.Errorf("mesh: config AllowPeersFile: %w", err)
		}
		m.allow.replace(allowSourceFile, ids)
		m.wg.Add(1)
		go m.watchAllowFile(data)
	}
	m.log.Info("allowlist on: only listed peers may be members", "peers", len(m.allow.list()), "file", m.cfg.AllowPeersFile, "external", m.cfg.AllowExternal)
	return nil
}

// newMember returns a Mesh for cfg (validated) and the member's peer ID,
// without a host.
func newMember(cfg Config, self peer.ID) *Mesh {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	allow := newAllowlist(self, cfg.allowlistOn())
	m := &Mesh{
		cfg:            cfg,
		log:            log.With("component", "mesh"),
		self:           self,
		selfStr:        self.String(),
		allow:          allow,
		gater:          newGater(allow),
		topicName:      "/ratemesh/1/" + cfg.Namespace,
		syncProto:      protocol.ID("/ratemesh/1/" + cfg.Namespace + "/sync"),
		connTag:        "ratemesh/" + cfg.Namespace,
		evSig:          make(chan struct{}, 1),
		peers:          make(map[peer.ID]*peerState),
		redials:        make(map[peer.ID]*redial),
		subscribeGrace: subscribeGrace,
		maxLost:        maxLostRedials,
		inflight:       make(map[network.Stream]struct{}),
	}
	m.wire = &wire{sync: m.syncProto}
	m.trace = newTracer(m.topicName)
	m.trace.onRefuse = m.traceRefusal
	m.gater.onRefuse = m.connRefusal
	m.ctx, m.cancel = context.WithCancel(context.Background())
	for _, s := range cfg.Bootstrap {
		pi, _ := peer.AddrInfoFromString(s) // validated
		if pi.ID == self {
			continue
		}
		merged := false
		for i := range m.bootstrap {
			if m.bootstrap[i].ID == pi.ID {
				m.bootstrap[i].Addrs = append(m.bootstrap[i].Addrs, pi.Addrs...)
				merged = true
			}
		}
		if !merged {
			m.bootstrap = append(m.bootstrap, *pi)
		}
	}
	return m
}

// PeerID returns this member's peer ID in text form; use it as the
// counter slot's peer (crdt.Slot.Peer).
func (m *Mesh) PeerID() string { return m.selfStr }

// Addrs returns the full multiaddrs this member listens on, each ending in
// /p2p/<peer ID>.
func (m *Mesh) Addrs() []string {
	mas, err := peer.AddrInfoToP2pAddrs(&peer.AddrInfo{ID: m.self, Addrs: m.h.Addrs()})
	if err != nil {
		return nil
	}
	out := make([]string, len(mas))
	for i, a := range mas {
		out[i] = a.String()
	}
	return out
}

// Host returns the libp2p host (the service's, for an attached Mesh), for
// tests and diagnostics.
func (m *Mesh) Host() host.Host { return m.h }

// Topic returns the gossipsub topic name, /ratemesh/1/<namespace>.
func (m *Mesh) Topic() string { return m.topicName }

// SyncProtocol returns the anti-entropy stream protocol,
// /ratemesh/1/<namespace>/sync.
func (m *Mesh) SyncProtocol() protocol.ID { return m.syncProto }

// Start subscribes to the topic, begins delivering to h, registers the
// anti-entropy and forward protocols and dials the bootstrap peers in
// parallel. It
// returns once the mesh can publish and every bootstrap peer has been
// tried once (each bounded by DialTimeout), or when ctx ends; failures are
// logged and retried in the background with backoff, so a member whose
// peers are down still starts. ctx bounds Start only; the mesh lives until
// Close. Already connected peers are reported through PeerConnected.
func (m *Mesh) Start(ctx context.Context, h node.Handler) error {
	if h == nil {
		return errors.New("mesh: Start: nil handler")
	}
	first, err := m.start(h)
	if err != nil {
		return err
	}
	done := make(chan struct{})
	go func() { first.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
	}
	return nil
}

func (m *Mesh) start(h node.Handler) (*sync.WaitGroup, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	switch {
	case m.closed:
		return nil, ErrClosed
	case m.started:
		return nil, errors.New("mesh: already started")
	}
	if err := m.protocolsFree(); err != nil {
		return nil, err
	}
	sub, err := m.topic.Subscribe(pubsub.WithBufferSize(m.cfg.QueueSize))
	if err != nil {
		return nil, fmt.Errorf("mesh: subscribe %s: %w", m.topicName, err)
	}
	m.handler, m.sub, m.started = h, sub, true
	m.h.SetStreamHandler(m.syncProto, m.serveStream(m.handleSync))
	if fh, ok := h.(node.ForwardHandler); ok {
		m.fwdHandler = fh
		m.h.SetStreamHandler(m.ForwardProtocol(), m.serveStream(m.handleForward))
	}

	// PeerConnected waits for identify, so it only fires for peers that
	// speak our sync protocol over a connection that held.
	bus, err := m.h.EventBus().Subscribe([]any{new(event.EvtPeerIdentificationCompleted), new(event.EvtPeerProtocolsUpdated)})
	if err != nil {
		return nil, fmt.Errorf("mesh: subscribe to host events: %w", err)
	}
	m.busSub = bus
	m.notifiee = &network.NotifyBundle{
		ConnectedF:    func(_ network.Network, c network.Conn) { m.push(connEvent{kind: evUp, c: c}) },
		DisconnectedF: func(_ network.Network, c network.Conn) { m.push(connEvent{kind: evDown, c: c}) },
	}
	m.h.Network().Notify(m.notifiee)
	for _, c := range m.h.Network().Conns() {
		m.push(connEvent{kind: evUp, c: c})
		if ok, _ := m.h.Peerstore().SupportsProtocols(c.RemotePeer(), m.syncProto); len(ok) > 0 {
			m.push(connEvent{kind: evIdentified, c: c, protos: ok})
		}
	}
	m.wg.Add(3)
	go m.events()
	go m.busEvents(bus)
	go m.read(sub)
	if m.owned {
		m.wg.Add(1)
		go m.subscriptions(m.topic)
	}

	if m.cfg.MDNS {
		m.disc = mdns.NewMdnsService(m.h, mdnsService(m.cfg.Namespace), mdnsNotifee{m})
		if err := m.disc.Start(); err != nil {
			m.log.Warn("mDNS discovery failed to start; bootstrap peers only", "err", err)
			m.disc = nil
		}
	}

	first := new(sync.WaitGroup)
	for _, pi := range m.bootstrap {
		r := &redial{down: make(chan struct{}, 1), wake: make(chan struct{}, 1)}
		m.redials[pi.ID] = r
		first.Add(1)
		m.wg.Add(1)
		go m.keep(pi, r, first)
	}
	m.log.Info("mesh started", "peer_id", m.selfStr, "addrs", m.Addrs(), "topic", m.topicName,
		"bootstrap", len(m.bootstrap), "mdns", m.cfg.MDNS, "psk", len(m.cfg.PSK) > 0)
	return first, nil
}

// Publish broadcasts b on the topic. It encodes b at once and does not
// retain it. A batch naming another author, or over the size cap, is
// refused with an error; the rest of what a receiver checks (validate)
// it checks on receipt, and our own validator accepts our own messages
// unread.
//
// While the host has no connection at all, a batch goes no further than
// the encoding (its size checked): gossipsub would sign it, validate and
// decode our own copy and send it to nobody, the larger part of a lone
// member's CPU under load. A peer that connects later gets our whole view
// then (anti-entropy), and the first batch it hears starts its sequence.
// A connected peer that has not subscribed yet does not make us alone:
// gossipsub's message cache offers it what we publish meanwhile once it
// subscribes. Stats.PublishedAlone counts the batches not handed over.
func (m *Mesh) Publish(ctx context.Context, b *crdt.Batch) error {
	topic, err := m.liveTopic()
	if err != nil {
		return err
	}
	data, err := b.Encode()
	if err != nil {
		return fmt.Errorf("mesh: publish: %w", err)
	}
	if len(data) > m.cfg.MaxMessageBytes {
		return fmt.Errorf("%w: %d bytes, cap %d", ErrTooLarge, len(data), m.cfg.MaxMessageBytes)
	}
	if b.From.Peer != m.selfStr {
		return fmt.Errorf("mesh: publish: the batch names %q as its author, not this member %s", b.From.Peer, m.selfStr)
	}
	if !b.Has(crdt.FlagLeaving) && len(m.h.Network().Peers()) == 0 {
		m.st.publishedAlone.Add(1)
		return nil
	}
	if err := topic.Publish(ctx, data); err != nil {
		return fmt.Errorf("mesh: publish: %w", err)
	}
	m.st.published.Add(1)
	m.st.publishedBytes.Add(uint64(len(data)))
	if b.Has(crdt.FlagLeaving) {
		m.sendLeave(ctx, b)
	}
	return nil
}

// sendLeave also hands a leave announcement to every connected peer over
// the sync stream, and returns once each has read it or ctx ends.
// Gossipsub queues a publish and sends it later, and a member that leaves
// closes its host right after publishing: the gossip copy is mostly lost
// with the connections, and the others would see the member go silent
// (suspect, then dead or evicted) instead of leaving. The direct copy is
// read before Close goes on; a receiver merges whichever copy comes second
// as a duplicate.
func (m *Mesh) sendLeave(ctx context.Context, b *crdt.Batch) {
	var wg sync.WaitGroup
	for _, p := range m.Peers() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := m.SendDirect(ctx, p, []*crdt.Batch{b}); err != nil {
				m.log.Debug("leave: direct copy not delivered", "peer", p, "err", err)
			}
		}()
	}
	wg.Wait()
}

func (m *Mesh) liveTopic() (*pubsub.Topic, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	switch {
	case m.closed:
		return nil, ErrClosed
	case !m.started:
		return nil, ErrNotStarted
	}
	return m.topic, nil
}

// read hands every accepted gossip message to the handler. It runs in its
// own goroutine so that a slow handler never stalls pubsub's loop.
func (m *Mesh) read(sub *pubsub.Subscription) {
	defer m.wg.Done()
	for {
		msg, err := sub.Next(m.ctx)
		if err != nil {
			return // Close cancelled the context or the subscription
		}
		if msg.Local || msg.GetFrom() == m.self {
			continue // our own message
		}
		b, ok := msg.ValidatorData.(*crdt.Batch)
		if !ok {
			continue // cannot happen: the validator sets it on Accept
		}
		m.st.received.Add(1)
		m.st.receivedBytes.Add(uint64(len(msg.GetData())))
		m.deliverBatch(node.Inbound{Batch: b})
	}
}

// validate is the topic validator: signature, size cap, strict decoding,
// author, own-slot-only and plausibility checks. The decoded batch travels
// to read through ValidatorData.
//
// A message without a signature is rejected whatever the PubSub's signing
// policy: go-libp2p-pubsub v0.17 verifies every signature a message
// carries, under any policy, before it runs topic validators
// (validation.go, validate), so a signed message that reaches this
// validator has a verified author. The check costs nothing under
// StrictSign (pubsub already refused unsigned messages) and keeps an
// attached Mesh strict on a service's PubSub whose policy is LaxSign.
func (m *Mesh) validate(_ context.Context, from peer.ID, msg *pubsub.Message) pubsub.ValidationResult {
	if from == m.self {
		if pr := m.probe.Load(); pr != nil && pr.is(msg) {
			return pubsub.ValidationReject // attach's probe: never sent
		}
		// Our own batch, just published: Publish checked its author and
		// size, the core built it, and read drops our own copy unread, so
		// decoding it again here (a tenth of a lone member's CPU per
		// decision under a flood) would check nothing the receivers do
		// not check again.
		return pubsub.ValidationAccept
	}
	if msg.Signature == nil || len(msg.From) == 0 {
		m.st.unsigned.Add(1)
		m.logRefusal(ReasonBadSignature, "refused an unsigned gossip message", "forwarder", from.String())
		return pubsub.ValidationReject
	}
	if m.gater.isBlocked(from) {
		// Only an attached Mesh hears a blocked peer (it cannot cut the
		// service's connection): drop what that peer forwards, as a cut
		// link would.
		return pubsub.ValidationIgnore
	}
	author := msg.GetFrom() // verified against the signature
	if !m.allow.allowed(author) {
		m.reject(false, ReasonNotMember, author, fmt.Errorf("author not on the allowlist (forwarded by %s)", from))
		return pubsub.ValidationReject
	}
	data := msg.GetData()
	if len(data) > m.cfg.MaxMessageBytes {
		m.reject(false, ReasonOversize, author, fmt.Errorf("%d bytes, cap %d", len(data), m.cfg.MaxMessageBytes))
		return pubsub.ValidationReject
	}
	b, err := crdt.DecodeBatch(data)
	if err != nil {
		m.reject(false, ReasonMalformed, author, err)
		return pubsub.ValidationReject
	}
	if reason, err := checkBatch(b, author.String(), m.cfg.Plausible, false); err != nil {
		m.reject(false, reason, author, err)
		return pubsub.ValidationReject
	}
	msg.ValidatorData = b
	return pubsub.ValidationAccept
}

// reject counts a refused batch and logs it, rate-limited per reason.
func (m *Mesh) reject(direct bool, r Reason, author peer.ID, err error) {
	channel := "gossip"
	if direct {
		m.st.rejectedDirect[r].Add(1)
		channel = "sync"
	} else {
		m.st.rejectedGossip[r].Add(1)
	}
	m.logRefusal(r, "refused a batch", "author", author.String(), "channel", channel, "err", err)
}

func (m *Mesh) deliverBatch(in node.Inbound) {
	m.deliver.RLock()
	defer m.deliver.RUnlock()
	if m.stopped {
		return
	}
	if in.Direct && len(in.Batch.Members) > 0 {
		m.learnAddrs(in.Batch.Members)
	}
	if in.Batch.Has(crdt.FlagLeaving) {
		if p, err := peer.Decode(in.Batch.From.Peer); err == nil {
			m.push(connEvent{kind: evLeaving, p: p})
		}
	}
	m.handler.HandleBatch(in)
}

func (m *Mesh) deliverConnected(p peer.ID) {
	m.deliver.RLock()
	defer m.deliver.RUnlock()
	if m.stopped {
		return
	}
	m.st.peerConnected.Add(1)
	m.handler.PeerConnected(p.String())
}

// Close leaves the topic and stops delivering. A Mesh built by New also
// closes its host; an attached Mesh (Attach) removes only what it added —
// its subscription and topic handle, its validator, its stream handlers,
// its notifiee, event subscription and connection manager tags, mDNS — and
// ends its goroutines and the streams it was serving, leaving the host,
// the PubSub and the service's own topics and protocols running. No
// handler call is under way or starts once Close returns; the handler
// must not call Close from inside a callback. Close is idempotent.
func (m *Mesh) Close() error {
	m.closeOnce.Do(func() {
		m.mu.Lock()
		m.closed = true
		sub, disc, nb, bus, handlers := m.sub, m.disc, m.notifiee, m.busSub, m.started
		streams := make([]network.Stream, 0, len(m.inflight))
		for s := range m.inflight {
			streams = append(streams, s)
		}
		m.mu.Unlock()

		m.deliver.Lock()
		m.stopped = true
		m.deliver.Unlock()

		var errs []error
		if handlers {
			m.h.RemoveStreamHandler(m.syncProto)
			if m.fwdHandler != nil {
				m.h.RemoveStreamHandler(m.ForwardProtocol())
			}
		}
		if nb != nil {
			m.h.Network().StopNotify(nb)
		}
		if bus != nil {
			bus.Close()
		}
		if disc != nil {
			disc.Close()
		}
		for _, s := range streams {
			_ = s.Reset()
		}
		errs = append(errs, m.detach(sub))
		m.cancel()
		if m.owned {
			errs = append(errs, m.h.Close())
		}
		m.wg.Wait()
		if !m.owned {
			m.unprotectAll() // the event loop, which protects, has stopped
		}
		m.closeErr = errors.Join(errs...)
	})
	return m.closeErr
}

// Stats counts what the mesh has done; every field only grows.
type Stats struct {
	// Published counts batches this member published, PublishedBytes
	// their encoded size (not counting gossipsub's copies to each peer).
	Published, PublishedBytes uint64
	// PublishedAlone counts batches not handed to gossipsub because the
	// host had no connection (Publish); they are not in Published.
	PublishedAlone uint64
	// Received counts gossip batches from others delivered to the
	// handler, ReceivedBytes their encoded size.
	Received, ReceivedBytes uint64
	// DirectSent and DirectReceived count anti-entropy batches (and their
	// bytes) sent through SendDirect and delivered from peers.
	DirectSent, DirectSentBytes         uint64
	DirectReceived, DirectReceivedBytes uint64
	// RejectedGossip and RejectedDirect count gossip messages and sync
	// stream batches refused, by Reason: by our checks, and on gossip
	// also the RPCs over the router's cap that gossipsub drops
	// (ReasonOversize) and the messages gossipsub refuses for their
	// signature (ReasonBadSignature; BadSignature is the same count). An
	// attached Mesh sees neither of gossipsub's own refusals: it counts
	// only the unsigned messages its validator refuses.
	RejectedGossip, RejectedDirect [NumReasons]uint64
	BadSignature                   uint64
	// RejectedForward counts forward stream requests refused, by Reason
	// (ReasonNotMember: the requester is not on the allowlist).
	RejectedForward [NumReasons]uint64
	// RefusedMessages is every refusal by Reason: RejectedGossip +
	// RejectedDirect + RejectedForward + what AddRefused reported (the
	// node core's reasons). It is ratemesh_messages_refused_total.
	RefusedMessages [NumReasons]uint64
	// Silent drops inside gossipsub: outbound messages dropped at a full
	// per-peer queue, inbound ones dropped at a full validation queue,
	// and messages our subscription could not take (handler too slow).
	// Any of them growing means QueueSize is too small. Only a Mesh built
	// by New traces its PubSub: they stay 0 for an attached one.
	DroppedOutbound, DroppedValidation, DroppedSubscriber uint64
	// PeerConnected counts PeerConnected calls; DialFailures failed dials;
	// Refused connections and dials the gater refused, RefusedConns the
	// same by reason (Block, or the allowlist). Only a Mesh built by New
	// has a gater: they stay 0 for an attached one.
	PeerConnected, DialFailures, Refused uint64
	RefusedConns                         [NumConnReasons]uint64
	// Resets counts members whose connections were all closed to start
	// afresh: a member that dialled in while an older connection to it
	// stayed open (half-open since a cut), or one that gossipsub stopped
	// counting as subscribed (see Mesh.subscriptions). Only a Mesh built
	// by New resets: it stays 0 for an attached one.
	Resets uint64
	// Wire bytes carried by libp2p streams (after multiplexing, before
	// encryption and transport framing): in total, over gossipsub, and
	// over the sync protocol. Only a Mesh built by New counts them (a
	// host option): they stay 0 for an attached one.
	WireIn, WireOut             uint64
	GossipWireIn, GossipWireOut uint64
	SyncWireIn, SyncWireOut     uint64
}

type counters struct {
	published, publishedBytes           atomic.Uint64
	publishedAlone                      atomic.Uint64
	received, receivedBytes             atomic.Uint64
	directSent, directSentBytes         atomic.Uint64
	directReceived, directReceivedBytes atomic.Uint64
	rejectedGossip, rejectedDirect      [NumReasons]atomic.Uint64
	rejectedForward, external           [NumReasons]atomic.Uint64
	peerConnected, dialFailures, resets atomic.Uint64
	unsigned, rpcOversize               atomic.Uint64
}

// Stats returns a snapshot of the counters.
func (m *Mesh) Stats() Stats {
	s := Stats{
		Published: m.st.published.Load(), PublishedBytes: m.st.publishedBytes.Load(),
		PublishedAlone: m.st.publishedAlone.Load(),
		Received:       m.st.received.Load(), ReceivedBytes: m.st.receivedBytes.Load(),
		DirectSent: m.st.directSent.Load(), DirectSentBytes: m.st.directSentBytes.Load(),
		DirectReceived: m.st.directReceived.Load(), DirectReceivedBytes: m.st.directReceivedBytes.Load(),
		BadSignature:      m.trace.badSignature.Load() + m.st.unsigned.Load(),
		DroppedOutbound:   m.trace.droppedRPC.Load(),
		DroppedValidation: m.trace.validationDropped.Load(),
		DroppedSubscriber: m.trace.undeliverable.Load(),
		PeerConnected:     m.st.peerConnected.Load(), DialFailures: m.st.dialFailures.Load(), Resets: m.st.resets.Load(),
		WireIn: uint64(m.wire.in.Load()), WireOut: uint64(m.wire.out.Load()),
		GossipWireIn: uint64(m.wire.gossipIn.Load()), GossipWireOut: uint64(m.wire.gossipOut.Load()),
		SyncWireIn: uint64(m.wire.syncIn.Load()), SyncWireOut: uint64(m.wire.syncOut.Load()),
	}
	for r := range NumReasons {
		s.RejectedGossip[r] = m.st.rejectedGossip[r].Load()
		s.RejectedDirect[r] = m.st.rejectedDirect[r].Load()
		s.RejectedForward[r] = m.st.rejectedForward[r].Load()
	}
	s.RejectedGossip[ReasonOversize] += m.st.rpcOversize.Load()
	s.RejectedGossip[ReasonBadSignature] += s.BadSignature
	s.RejectedGossip[ReasonAuthor] += m.trace.selfOrigin.Load()
	for r := range NumReasons {
		s.RefusedMessages[r] = s.RejectedGossip[r] + s.RejectedDirect[r] + s.RejectedForward[r] + m.st.external[r].Load()
	}
	for r := range NumConnReasons {
		s.RefusedConns[r] = m.gater.refused[r].Load()
		s.Refused += s.RefusedConns[r]
	}
	return s
}

// AddRefused counts n messages refused for reason r outside the mesh's own
// checks: the node core's refusals (ReasonTableBudget), reported by the
// runtime that drives both. They show
// in Stats.RefusedMessages. It is safe for concurrent use.
func (m *Mesh) AddRefused(r Reason, n uint64) {
	if r < 0 || r >= NumReasons || n == 0 {
		return
	}
	m.st.external[r].Add(n)
	m.logRefusal(r, "refused by the node", "count", n)
}

// CountRefusal is AddRefused by the reason's label ("table_budget", …), for a caller that cannot import this package: the
// node runtime, whose Transport this is, finds it with a type assertion
// on interface{ CountRefusal(string, uint64) error }. An unknown label is
// an error and counts nothing.
func (m *Mesh) CountRefusal(reason string, n uint64) error {
	r, ok := ParseReason(reason)
	if !ok {
		return fmt.Errorf("mesh: CountRefusal: unknown reason %q", reason)
	}
	m.AddRefused(r, n)
	return nil
}

// MeshPeers returns the peers in this member's gossipsub topic mesh (the
// ones it forwards to), in text form; a freshly connected peer joins it
// at the next heartbeat. An attached Mesh cannot trace the service's
// PubSub: it returns the connected peers subscribed to the topic, of
// which the topic mesh is a part.
func (m *Mesh) MeshPeers() []string {
	if !m.owned {
		var out []string
		for _, p := range m.ps.ListPeers(m.topicName) {
			out = append(out, p.String())
		}
		slices.Sort(out)
		return out
	}
	m.trace.mu.Lock()
	defer m.trace.mu.Unlock()
	out := make([]string, 0, len(m.trace.mesh))
	for p := range m.trace.mesh {
		out = append(out, p.String())
	}
	slices.Sort(out)
	return out
}
