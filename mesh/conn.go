package mesh

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	pubsub "github.com/libp2p/go-libp2p-pubsub"
	"github.com/libp2p/go-libp2p/core/control"
	"github.com/libp2p/go-libp2p/core/event"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/peerstore"
	"github.com/libp2p/go-libp2p/core/protocol"
	ma "github.com/multiformats/go-multiaddr"
	manet "github.com/multiformats/go-multiaddr/net"
)

// push queues a connection event without blocking the swarm's notifier.
func (m *Mesh) push(ev connEvent) {
	m.evMu.Lock()
	m.evq = append(m.evq, ev)
	m.evMu.Unlock()
	select {
	case m.evSig <- struct{}{}:
	default:
	}
}

// events turns connection events into PeerConnected calls and redial
// wake-ups. PeerConnected(p) fires once per spell of connectivity: when p
// has a live connection and has been identified as speaking our sync
// protocol (a ratemesh member of this namespace); the spell ends when p's
// last connection closes, which also wakes p's redial loop. One goroutine
// owns m.peers, so events apply in order.
func (m *Mesh) events() {
	defer m.wg.Done()
	for {
		select {
		case <-m.ctx.Done():
			return
		case <-m.evSig:
		}
		m.evMu.Lock()
		evs := m.evq
		m.evq = nil
		m.evMu.Unlock()
		for _, ev := range evs {
			if p, ok := m.apply(ev); ok {
				m.log.Debug("peer connected", "peer", p.String())
				m.deliverConnected(p)
			}
		}
	}
}

// apply updates m.peers with one event and reports a peer to announce.
func (m *Mesh) apply(ev connEvent) (peer.ID, bool) {
	m.peersMu.Lock()
	defer m.peersMu.Unlock()
	p := ev.p
	if ev.c != nil {
		p = ev.c.RemotePeer()
	}
	st := m.peers[p]
	switch ev.kind {
	case evUp, evIdentified:
		if ev.c.IsClosed() {
			return "", false // it closed before we saw it; its evDown follows or went by
		}
		if st == nil {
			st = &peerState{conns: make(map[network.Conn]struct{})}
			m.peers[p] = st
		}
		if _, known := st.conns[ev.c]; !known && m.halfOpen(st, ev.c) {
			m.log.Debug("a member dialled in while an older connection to it stayed open, half-open since a cut; reconnecting", "peer", p.String())
			m.reset(p)
		}
		st.conns[ev.c] = struct{}{}
		if ev.kind == evIdentified {
			return p, m.announce(p, st, ev.protos)
		}
	case evProtocols:
		if st != nil {
			return p, m.announce(p, st, ev.protos)
		}
	case evBlocked:
		if st != nil {
			st.announced = false // an attached Mesh keeps the connection
			m.unprotect(p, st)
		}
	case evUnblocked:
		if st != nil && (st.speaks || slices.Contains(ev.protos, m.syncProto)) {
			return p, m.announce(p, st, []protocol.ID{m.syncProto})
		}
	case evLeaving:
		if st != nil {
			st.leaving = true
		}
	case evDown:
		if st == nil {
			return "", false
		}
		delete(st.conns, ev.c)
		if len(st.conns) == 0 {
			m.unprotect(p, st)
			delete(m.peers, p)
			m.trace.removePeer(p)
			m.log.Debug("peer disconnected", "peer", p.String())
			m.lost(p, st.announced, st.leaving, st.addrs)
		}
	}
	return "", false
}

// halfOpen reports whether c, a new connection of the member st, shows
// that the member's older connections are half-open: c is inbound (the
// member dialled us, which it does only when it holds no connection to
// us) and another connection is older than c by DialTimeout or more
// (simultaneous dials open theirs within a dial of each other).
//
// A cut leaves a connection open on the side that did not give up on it
// first, until a retransmission or a keep-alive meets the other side's
// reset, which can take half a minute; gossipsub writes to the member on
// that connection meanwhile, and loses it (and, when the connection
// finally closes, forgets the member's subscription though its other
// connection lives, so stops publishing to it: see subscriptions).
func (m *Mesh) halfOpen(st *peerState, c network.Conn) bool {
	if !m.owned || !st.announced || c.Stat().Direction != network.DirInbound {
		return false
	}
	opened := c.Stat().Opened
	for o := range st.conns {
		// A connection already closed whose end the event loop has not
		// handled yet is no sign of a half-open one.
		if !o.IsClosed() && opened.Sub(o.Stat().Opened) >= m.cfg.DialTimeout {
			return true
		}
	}
	return false
}

// reset closes every connection to p, so that both sides start afresh:
// their redial loops (keep) reconnect, and gossipsub builds its state for
// the new connection on both sides. Only a Mesh built by New resets; an
// attached Mesh does not close the service's connections. The caller is
// the event loop.
func (m *Mesh) reset(p peer.ID) {
	if !m.owned {
		return
	}
	m.st.resets.Add(1)
	m.wg.Add(1) // the event loop is itself in wg: Close has not finished waiting
	go func() {
		defer m.wg.Done()
		_ = m.h.Network().ClosePeer(p)
	}()
}

// subscriptions checks, every subscriptionCheck, that gossipsub counts
// each member connected for more than subscribeGrace among the topic's
// subscribers, and resets the connections of one it does not. Gossipsub
// (v0.17) forgets a peer's subscription when the stream it writes to the
// peer dies while another connection to the peer lives — the peer sent
// its subscription once, on the stream it writes to us, and does not
// send it again — and from then on neither publishes nor relays to it.
// That happens when one of two connections to a member closes, as a
// half-open one after a cut does (halfOpen). A reset makes both sides
// start afresh. Only a Mesh built by New runs it.
func (m *Mesh) subscriptions(topic *pubsub.Topic) {
	defer m.wg.Done()
	t := time.NewTicker(min(subscriptionCheck, m.subscribeGrace))
	defer t.Stop()
	for {
		select {
		case <-m.ctx.Done():
			return
		case <-t.C:
		}
		subscribed := make(map[peer.ID]bool)
		for _, p := range topic.ListPeers() {
			subscribed[p] = true
		}
		now := time.Now()
		var missing []peer.ID
		m.peersMu.Lock()
		for p, st := range m.peers {
			if st.announced && !subscribed[p] && now.Sub(st.since) >= m.subscribeGrace {
				missing = append(missing, p)
				st.since = now // one reset per grace
			}
		}
		m.peersMu.Unlock()
		for _, p := range missing {
			m.log.Debug("gossipsub does not count a connected member as subscribed; reconnecting", "peer", p.String())
			m.st.resets.Add(1)
			_ = m.h.Network().ClosePeer(p)
		}
	}
}

// subscriptionCheck is how often subscriptions looks, and subscribeGrace
// how long a member may be connected before gossipsub must count it
// subscribed: its subscription comes in the first message of the stream
// it opens to us, a round trip after the connection.
const (
	subscriptionCheck = time.Second
	subscribeGrace    = 10 * time.Second
)

// announce reports whether a peer is to be announced now: it speaks our
// sync protocol, is not blocked and has not been announced in this spell.
// An announced member's connections are protected from the connection
// manager.
func (m *Mesh) announce(p peer.ID, st *peerState, protos []protocol.ID) bool {
	if !slices.Contains(protos, m.syncProto) {
		return false
	}
	st.speaks = true
	if st.announced || !m.gater.admits(p) {
		return false
	}
	st.announced = true
	st.since = time.Now()
	st.addrs = m.h.Peerstore().Addrs(p)
	m.protect(p, st)
	return true
}

// Peers returns the members this one is connected to (those PeerConnected
// has reported and that have not disconnected since), sorted.
func (m *Mesh) Peers() []string {
	m.peersMu.Lock()
	defer m.peersMu.Unlock()
	var out []string
	for p, st := range m.peers {
		if st.announced {
			out = append(out, p.String())
		}
	}
	slices.Sort(out)
	return out
}

// PeerAddrs returns the known addresses of peer, each ending in
// /p2p/<peer ID> (for /v1/peers); nil for an unknown or malformed ID.
func (m *Mesh) PeerAddrs(peerID string) []string {
	p, err := peer.Decode(peerID)
	if err != nil {
		return nil
	}
	if p == m.self {
		return m.Addrs()
	}
	mas, err := peer.AddrInfoToP2pAddrs(&peer.AddrInfo{ID: p, Addrs: m.h.Peerstore().Addrs(p)})
	if err != nil {
		return nil
	}
	out := make([]string, len(mas))
	for i, a := range mas {
		out[i] = a.String()
	}
	slices.Sort(out)
	return out
}

// busEvents forwards identify results from the host's event bus to the
// event loop.
func (m *Mesh) busEvents(sub event.Subscription) {
	defer m.wg.Done()
	for {
		select {
		case <-m.ctx.Done():
			return
		case e, ok := <-sub.Out():
			if !ok {
				return
			}
			switch e := e.(type) {
			case event.EvtPeerIdentificationCompleted:
				m.push(connEvent{kind: evIdentified, c: e.Conn, protos: e.Protocols})
			case event.EvtPeerProtocolsUpdated:
				m.push(connEvent{kind: evProtocols, p: e.Peer, protos: e.Added})
			}
		}
	}
}

// signal wakes the redial loop of p, if it has one: wake (from Unblock)
// retries at once, otherwise it reports a drop. The signal is sent under
// mu, so a lost member's loop that ends (endLost) never misses one.
func (m *Mesh) signal(p peer.ID, wake bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if r := m.redials[p]; r != nil {
		r.signal(wake)
	}
}

func (r *redial) signal(wake bool) {
	ch := r.down
	if wake {
		ch = r.wake
	}
	select {
	case ch <- struct{}{}:
	default:
	}
}

// maxLostRedials bounds the lost members redialled at once (lost): a
// member costs a parked goroutine and, while unreachable, a dial every
// RedialMax. Without an allowlist any peer that speaks our protocol is a
// member, so the bound keeps a peer that connects under many identities
// and drops them from costing more; and members that restart under a new
// identity (a data directory on no volume) leave one behind each. At the
// bound the loop of the member lost longest ago that is still not
// connected ends, so the members lost last are always redialled.
const maxLostRedials = 1024

// lost handles the end of p's last connection: a bootstrap peer's loop
// (keep) redials it; so does one started here for a member (announced
// in the spell that ended, and not leaving: it did not announce that it
// leaves) that has no loop yet. Members dial each other as they learn of
// each other (learnAddrs), but only bootstrap peers were redialled: after
// a partition healed, two members that are not each other's bootstrap
// peer stayed apart for a minute or more (a dial that failed during the
// cut is not retried for suggestRetry), and as the small topic mesh
// relays to at most GossipDhi peers, one of them could miss the other's
// batches — in TestServePartitionHeal a majority member held a minority
// member dead for 30 s after the heal. The caller is the event loop.
func (m *Mesh) lost(p peer.ID, announced, leaving bool, known []ma.Multiaddr) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if r := m.redials[p]; r != nil {
		// A spell that was never announced (a redial that reached the
		// peer as it closed, before identify) is no sign that it left.
		if r.lost && leaving {
			// A lost member came back and has now left: its loop ends.
			delete(m.redials, p)
			m.lostLoops--
			r.gone.Store(true)
			r.signal(true)
			return
		}
		r.lostAt = time.Now()
		r.signal(false)
		return
	}
	if !announced || leaving || m.closed || !m.started || !m.gater.admits(p) {
		return
	}
	addrs := m.h.Peerstore().Addrs(p)
	if len(addrs) == 0 {
		addrs = known // the addresses it had when it was announced
	}
	if len(addrs) == 0 {
		return
	}
	if m.lostLoops >= m.maxLost && !m.forgetLost() {
		m.log.Debug("lost member not redialled: too many lost members, all connected", "peer", p.String(), "max", m.maxLost)
		return
	}
	r := &redial{down: make(chan struct{}, 1), wake: make(chan struct{}, 1), lost: true, lostAt: time.Now()}
	m.redials[p] = r
	m.lostLoops++
	m.wg.Add(1) // under mu: Close marks closed under mu before it waits
	go m.keep(peer.AddrInfo{ID: p, Addrs: addrs}, r, nil)
}

// forgetLost ends the loop of the member lost longest ago among those not
// connected, and reports whether there was one. The caller holds mu.
func (m *Mesh) forgetLost() bool {
	var (
		oldest peer.ID
		or     *redial
	)
	for p, r := range m.redials {
		if r.lost && (or == nil || r.lostAt.Before(or.lostAt)) && m.h.Network().Connectedness(p) != network.Connected {
			oldest, or = p, r
		}
	}
	if or == nil {
		return false
	}
	delete(m.redials, oldest)
	m.lostLoops--
	or.gone.Store(true)
	or.signal(true)
	return true
}

// endLost ends the loop r of a lost member, unless a drop was signalled
// to it meanwhile; it reports whether the loop is to return.
func (m *Mesh) endLost(p peer.ID, r *redial) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(r.down) > 0 {
		return false
	}
	delete(m.redials, p)
	m.lostLoops--
	return true
}

// keep keeps this member connected to the peer pi, a bootstrap peer or a
// lost member (r.lost): it dials at once, and again with exponential
// backoff whenever the connection is down, until Close — a lost member's
// loop also ends once the peer is blocked or leaves the allowlist. first,
// if not nil, is marked done after the first attempt. A connection that
// drops before it has held for RedialMax (a peer that refuses us right
// after the handshake) backs off like a failed dial, so a refusing peer
// is never redialled in a tight loop.
func (m *Mesh) keep(pi peer.AddrInfo, r *redial, first *sync.WaitGroup) {
	defer m.wg.Done()
	var once sync.Once
	firstDone := func() {
		if first != nil {
			once.Do(first.Done)
		}
	}
	defer firstDone()
	m.h.Peerstore().AddAddrs(pi.ID, pi.Addrs, peerstore.PermanentAddrTTL)
	addr := addrString(pi)
	attempt := 0
	var upSince time.Time
	warn, msg := m.log.Warn, "cannot reach bootstrap peer; retrying"
	if r.lost {
		// A member lost to a partition is redialled every RedialMax
		// for as long as the partition lasts: a warning each time would
		// bury the fence's one error line.
		warn, msg = m.log.Debug, "cannot reach a lost member; retrying"
	}
	// pause waits d, or until Unblock wakes the loop (which also resets
	// the backoff); false means Close.
	pause := func(d time.Duration) bool {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
		case <-r.wake:
			attempt = 0
		case <-m.ctx.Done():
			return false
		}
		return true
	}
	for m.ctx.Err() == nil && !r.gone.Load() {
		up := m.h.Network().Connectedness(pi.ID) == network.Connected
		if r.lost && !up && !m.gater.admits(pi.ID) && m.endLost(pi.ID, r) {
			return // Unblock dials a blocked peer itself
		}
		if up || !m.gater.admits(pi.ID) { // a peer that joins the allowlist wakes the loop (setAllowed)
			firstDone()
			if up && upSince.IsZero() {
				upSince = time.Now() // the peer dialled us
			}
			select {
			case <-r.down:
			case <-r.wake:
				attempt, upSince = 0, time.Time{}
			case <-m.ctx.Done():
				return
			}
			continue
		}
		if !upSince.IsZero() {
			held := time.Since(upSince) >= m.cfg.RedialMax
			upSince = time.Time{}
			if held {
				attempt = 0
			} else {
				d := backoff(attempt, m.cfg.RedialMin, m.cfg.RedialMax, rand.Float64())
				attempt++
				m.log.Debug("connection to bootstrap peer dropped at once; backing off", "peer", pi.ID.String(), "retry_in", d.Round(time.Millisecond))
				if !pause(d) {
					return
				}
				continue
			}
		}
		err := m.connect(m.ctx, pi, addr)
		firstDone()
		if err == nil {
			upSince = time.Now()
			continue
		}
		if m.ctx.Err() != nil {
			return
		}
		d := backoff(attempt, m.cfg.RedialMin, m.cfg.RedialMax, rand.Float64())
		attempt++
		warn(msg, "peer", pi.ID.String(), "err", err, "retry_in", d.Round(time.Millisecond))
		if !pause(d) {
			return
		}
	}
}

// backoff returns the wait before redial attempt n (0-based): lo·2ⁿ
// capped at hi, scaled by a jitter factor in [0.5, 1.0) drawn from u in
// [0, 1), so peers that lost the same bootstrap node do not redial in
// step.
func backoff(n int, lo, hi time.Duration, u float64) time.Duration {
	d := lo
	for i := 0; i < n && d < hi; i++ {
		d *= 2
	}
	d = time.Duration(float64(min(d, hi)) * (0.5 + u/2))
	return d
}

// Connect dials addr, a full multiaddr ending in /p2p/<peer ID>, bounded
// by DialTimeout. Under a PSK, a peer holding another key (or none) makes
// the handshake stall; the error then wraps ErrKeyMismatchOrUnreachable
// and names addr. Without a PSK a failure wraps ErrUnreachable.
func (m *Mesh) Connect(ctx context.Context, addr string) error {
	pi, err := peer.AddrInfoFromString(addr)
	if err != nil {
		return fmt.Errorf("mesh: connect %q: want a multiaddr ending in /p2p/<peer ID>: %w", addr, err)
	}
	if pi.ID == m.self {
		return fmt.Errorf("mesh: connect %s: that is this member", addr)
	}
	return m.connect(ctx, *pi, addr)
}

func (m *Mesh) connect(ctx context.Context, pi peer.AddrInfo, addr string) error {
	ctx, cancel := context.WithTimeout(ctx, m.cfg.DialTimeout)
	defer cancel()
	// A fresh attempt: forget an earlier failure's dial backoff.
	ctx = network.WithForceDirectDial(ctx, "ratemesh redial")
	err := m.h.Connect(ctx, pi)
	if err == nil {
		return nil
	}
	m.st.dialFailures.Add(1)
	if len(m.cfg.PSK) > 0 {
		return fmt.Errorf("%w: %s: %w", ErrKeyMismatchOrUnreachable, addr, err)
	}
	if strings.Contains(err.Error(), "failed to negotiate security protocol") {
		// What a keyed peer looks like to a member without the key.
		return fmt.Errorf("%w: %s (does it require a private network key? set psk_file): %w", ErrUnreachable, addr, err)
	}
	return fmt.Errorf("%w: %s: %w", ErrUnreachable, addr, err)
}

func addrString(pi peer.AddrInfo) string {
	mas, err := peer.AddrInfoToP2pAddrs(&pi)
	if err != nil || len(mas) == 0 {
		return pi.ID.String()
	}
	return mas[0].String()
}

// Block cuts this member off from peer: the connection gater refuses
// every dial to it and every connection from it, and open connections are
// closed. It serves partition tests, and `ratemesh peers evict` when the
// operator wants the peer kept out: a blocked peer cannot come back to
// learn of its eviction and take a new incarnation.
//
// An attached Mesh has no gater on the service's host and does not cut
// the service's connections: as if the link were cut, it ignores the
// gossip the peer forwards (what the peer authors may still arrive
// through others, as it would around a cut link), resets the peer's sync
// and forward streams, no longer reports it as a peer and does not dial
// it. Its own gossip still reaches the peer through the service's PubSub.
func (m *Mesh) Block(peerID string) error {
	p, err := peer.Decode(peerID)
	if err != nil {
		return fmt.Errorf("mesh: block %q: %w", peerID, err)
	}
	m.gater.block(p)
	if !m.owned {
		m.push(connEvent{kind: evBlocked, p: p})
		return nil
	}
	if err := m.h.Network().ClosePeer(p); err != nil {
		return fmt.Errorf("mesh: block %s: close connections: %w", peerID, err)
	}
	return nil
}

// Unblock lifts Block and redials peer at once when its address is known
// (a bootstrap peer's redial loop wakes and starts its backoff afresh). A
// re-established connection fires PeerConnected, so the runtime runs
// anti-entropy on heal.
func (m *Mesh) Unblock(peerID string) error {
	p, err := peer.Decode(peerID)
	if err != nil {
		return fmt.Errorf("mesh: unblock %q: %w", peerID, err)
	}
	m.gater.unblock(p)
	if !m.owned && m.h.Network().Connectedness(p) == network.Connected {
		// The connection stayed up: announce the peer again, so the
		// runtime runs anti-entropy on heal. The event loop knows whether
		// it speaks our protocol (peerState.speaks); the peerstore is a
		// second source.
		ok, _ := m.h.Peerstore().SupportsProtocols(p, m.syncProto)
		m.push(connEvent{kind: evUnblocked, p: p, protos: ok})
		return nil
	}
	addrs := m.h.Peerstore().Addrs(p)
	m.mu.Lock()
	r := m.redials[p]
	dial := r == nil && m.started && !m.closed && len(addrs) > 0
	if dial {
		m.wg.Add(1) // under mu: Close marks closed under mu before it waits
	}
	m.mu.Unlock()
	if r != nil {
		m.signal(p, true)
	}
	if dial {
		pi := peer.AddrInfo{ID: p, Addrs: addrs}
		go func() {
			defer m.wg.Done()
			if err := m.connect(m.ctx, pi, addrString(pi)); err != nil && m.ctx.Err() == nil {
				m.log.Debug("redial after unblock failed; the peer may dial back", "err", err)
			}
		}()
	}
	return nil
}

// gater is the connection gater of a Mesh built by New: it refuses the
// peers Block cut off and, when the allowlist is on, every peer not on it.
// Its methods are called concurrently by the swarm and never block.
type gater struct {
	mu      sync.RWMutex
	blocked map[peer.ID]struct{}
	allow   *allowlist
	refused [NumConnReasons]atomic.Uint64
	// onRefuse, when set, is told of every refusal (the Mesh logs them,
	// rate-limited).
	onRefuse func(ConnReason, peer.ID, network.Direction)
}

func newGater(allow *allowlist) *gater {
	return &gater{blocked: make(map[peer.ID]struct{}), allow: allow}
}

func (g *gater) block(p peer.ID) {
	g.mu.Lock()
	g.blocked[p] = struct{}{}
	g.mu.Unlock()
}

func (g *gater) unblock(p peer.ID) {
	g.mu.Lock()
	delete(g.blocked, p)
	g.mu.Unlock()
}

func (g *gater) isBlocked(p peer.ID) bool {
	g.mu.RLock()
	defer g.mu.RUnlock()
	_, ok := g.blocked[p]
	return ok
}

// admits reports whether p is neither blocked nor kept out by the
// allowlist.
func (g *gater) admits(p peer.ID) bool {
	return g.allow.allowed(p) && !g.isBlocked(p)
}

// check reports whether p may connect, counting refusals.
func (g *gater) check(p peer.ID, dir network.Direction) bool {
	r := ConnBlocked
	switch {
	case g.isBlocked(p):
	case !g.allow.allowed(p):
		r = ConnNotMember
	default:
		return true
	}
	g.refused[r].Add(1)
	if g.onRefuse != nil {
		g.onRefuse(r, p, dir)
	}
	return false
}

// InterceptPeerDial refuses to dial a blocked peer or one not on the
// allowlist.
func (g *gater) InterceptPeerDial(p peer.ID) bool { return g.check(p, network.DirOutbound) }

// InterceptAddrDial refuses a blocked peer's addresses.
func (g *gater) InterceptAddrDial(p peer.ID, _ ma.Multiaddr) bool {
	if g.isBlocked(p) {
		return g.check(p, network.DirOutbound)
	}
	return true
}

// InterceptAccept lets every connection start: the peer's ID is not known
// before the security handshake.
func (g *gater) InterceptAccept(network.ConnMultiaddrs) bool { return true }

// InterceptSecured refuses, in either direction, a blocked peer or one not
// on the allowlist, once the handshake has authenticated its peer ID.
func (g *gater) InterceptSecured(dir network.Direction, p peer.ID, _ network.ConnMultiaddrs) bool {
	return g.check(p, dir)
}

func (g *gater) InterceptUpgraded(network.Conn) (bool, control.DisconnectReason) { return true, 0 }

// mdnsNotifee dials peers that mDNS finds.
type mdnsNotifee struct{ m *Mesh }

func (n mdnsNotifee) HandlePeerFound(pi peer.AddrInfo) {
	m := n.m
	if pi.ID == m.self || m.h.Network().Connectedness(pi.ID) == network.Connected || m.ctx.Err() != nil || !m.gater.admits(pi.ID) {
		return
	}
	m.mu.Lock()
	closed := m.closed
	if !closed {
		m.wg.Add(1)
	}
	m.mu.Unlock()
	if closed {
		return
	}
	go func() {
		defer m.wg.Done()
		if err := m.connect(m.ctx, pi, addrString(pi)); err != nil && m.ctx.Err() == nil {
			m.log.Info("cannot reach a peer found by mDNS", "err", err)
		}
	}()
}

// mdnsService names the mDNS service of a namespace, so meshes of other
// namespaces on the same LAN do not dial each other. A DNS-SD service
// label holds at most 15 characters, hence the hash.
func mdnsService(namespace string) string {
	h := sha256.Sum256([]byte(namespace))
	return "_rm-" + hex.EncodeToString(h[:4]) + "._udp"
}

// allLoopback reports whether every listen address is a loopback one.
func allLoopback(listen []string) bool {
	for _, s := range listen {
		a, err := ma.NewMultiaddr(s)
		if err != nil {
			return false
		}
		ip, err := manet.ToIP(a)
		if err != nil || !ip.IsLoopback() {
			return false
		}
	}
	return true
}
