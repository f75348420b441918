package mesh

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	pubsub "github.com/libp2p/go-libp2p-pubsub"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
)

// ErrUnsafePubSub wraps Attach's refusal of a PubSub that cannot carry
// ratemesh safely; the message says what to change.
var ErrUnsafePubSub = errors.New("mesh: the PubSub cannot carry ratemesh safely")

// probeTimeout bounds Attach's check of the PubSub's signing: one local
// publish, validated synchronously.
const probeTimeout = 5 * time.Second

// Attach makes a ratemesh member on a libp2p host and PubSub that a
// service owns, instead of a host of its own (New): the member's peer ID
// is the host's, and ratemesh's gossip, anti-entropy and forward traffic
// share the service's connections. Attach registers ratemesh's topic
// validator and joins its topic (/ratemesh/1/<Namespace>) at once; Start
// subscribes, registers the sync and forward stream protocols and dials
// cfg.Bootstrap through the host. Close removes only what the Mesh added
// and leaves the host, the PubSub and the service's own topics and
// protocols running.
//
// cfg is validated as for New, except that PrivKey may be nil (or must be
// the host's key), and Listen and PSK must be empty: an attached member
// listens where the host listens, and a private network is the host's
// option (libp2p.PrivateNetwork). GossipHeartbeat is not used: the
// PubSub's parameters are the service's. QueueSize sizes ratemesh's
// subscription only; the PubSub's own outbound and validation queues are
// the service's (see docs/p2p.md for the settings ratemesh wants).
//
// Attach refuses, wrapping ErrUnsafePubSub, a PubSub whose messages a
// peer could forge: one that does not sign what it publishes
// (pubsub.StrictNoSign, LaxNoSign, WithNoAuthor) or signs as a peer other
// than the host (WithMessageAuthor). go-libp2p-pubsub does not expose its
// signing policy, so Attach finds out by publishing a probe on ratemesh's
// topic, which its own validator inspects and rejects (a rejected local
// publish is sent to nobody). Whether the PubSub insists on signatures
// from others cannot be seen that way; the validator does it instead: it
// rejects every message without a signature, and pubsub v0.17 verifies
// every signature a message carries before any validator runs. It also
// refuses a host on which ratemesh's protocols of this namespace already
// have handlers, or a PubSub with this namespace's topic already joined —
// another Mesh attached with the same Namespace.
func Attach(h host.Host, ps *pubsub.PubSub, cfg Config) (*Mesh, error) {
	if h == nil {
		return nil, errors.New("mesh: Attach: nil host")
	}
	if ps == nil {
		return nil, errors.New("mesh: Attach: nil PubSub")
	}
	if err := cfg.validateAttach(h.ID()); err != nil {
		return nil, err
	}
	m := newMember(cfg, h.ID())
	m.h = h
	if err := m.attach(ps); err != nil {
		m.cancel()
		return nil, err
	}
	if err := m.startAllowlist(); err != nil {
		_ = m.detach(nil)
		m.cancel()
		return nil, err
	}
	m.log.Info("attached to the service's host", "peer_id", m.selfStr, "topic", m.topicName)
	return m, nil
}

// validateAttach checks cfg for Attach to a host whose peer ID is self.
func (c *Config) validateAttach(self peer.ID) error {
	if err := c.validateNamespace(); err != nil {
		return err
	}
	if c.PrivKey != nil {
		id, err := peer.IDFromPrivateKey(c.PrivKey)
		if err != nil {
			return badField("PrivKey", "%v", err)
		}
		if id != self {
			return badField("PrivKey", "belongs to %s, not to the host %s: leave it nil, an attached member is the host's peer", id, self)
		}
	}
	if len(c.Listen) > 0 {
		return badField("Listen", "%q: an attached member listens where the host does; set Listen to nil and give the host its addresses (libp2p.ListenAddrStrings)", c.Listen)
	}
	if len(c.PSK) > 0 {
		return badField("PSK", "an attached member cannot key the host's connections; build the host with libp2p.PrivateNetwork(psk) and leave PSK nil")
	}
	return c.validateRest()
}

// attach registers the validator on ps, joins the topic and checks that
// ps signs as the host; New and Attach share it.
func (m *Mesh) attach(ps *pubsub.PubSub) error {
	if err := m.protocolsFree(); err != nil {
		return err
	}
	if err := ps.RegisterTopicValidator(m.topicName, pubsub.ValidatorEx(m.validate), pubsub.WithValidatorInline(true)); err != nil {
		return fmt.Errorf("mesh: register the validator of %s (is another Mesh of namespace %q attached to this PubSub?): %w", m.topicName, m.cfg.Namespace, err)
	}
	topic, err := ps.Join(m.topicName)
	if err != nil {
		_ = ps.UnregisterTopicValidator(m.topicName)
		return fmt.Errorf("mesh: join %s (is another Mesh of namespace %q attached to this PubSub?): %w", m.topicName, m.cfg.Namespace, err)
	}
	m.ps, m.topic = ps, topic
	if err := m.checkSigning(); err != nil {
		_ = topic.Close()
		_ = ps.UnregisterTopicValidator(m.topicName)
		return err
	}
	return nil
}

// protocolsFree fails when the host already serves this namespace's sync
// or forward protocol: SetStreamHandler would silently replace the
// handler of another member.
func (m *Mesh) protocolsFree() error {
	have := m.h.Mux().Protocols()
	for _, p := range []protocol.ID{m.syncProto, m.ForwardProtocol()} {
		if slices.Contains(have, p) {
			return fmt.Errorf("mesh: the host already has a handler for %s (is another Mesh of namespace %q attached to it?)", p, m.cfg.Namespace)
		}
	}
	return nil
}

// probe is one check of the PubSub's signing: a local publish of nonce on
// ratemesh's topic, which validate recognises, records and rejects.
type probe struct {
	nonce []byte

	mu     sync.Mutex
	seen   bool
	signed bool
	author peer.ID
}

// is reports whether msg is the probe, recording how it was signed.
func (p *probe) is(msg *pubsub.Message) bool {
	if !bytes.Equal(msg.GetData(), p.nonce) {
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.seen = true
	p.signed = msg.Signature != nil
	if len(msg.From) > 0 {
		p.author = msg.GetFrom()
	}
	return true
}

// checkSigning publishes a probe and refuses a PubSub that leaves it
// unsigned or signs it as another peer than the host.
func (m *Mesh) checkSigning() error {
	nonce := make([]byte, 32)
	if _, err := rand.Read(nonce); err != nil {
		return fmt.Errorf("mesh: check the PubSub's signing: %w", err)
	}
	pr := &probe{nonce: append([]byte("ratemesh attach probe "), nonce...)}
	m.probe.Store(pr)
	defer m.probe.Store(nil)
	ctx, cancel := context.WithTimeout(m.ctx, probeTimeout)
	defer cancel()
	err := m.topic.Publish(ctx, pr.nonce)
	pr.mu.Lock()
	defer pr.mu.Unlock()
	switch {
	case !pr.seen && err != nil:
		return fmt.Errorf("mesh: check the PubSub's signing: the probe on %s was refused before ratemesh's validator ran (a default validator, or a closed PubSub?): %w", m.topicName, err)
	case !pr.seen:
		return fmt.Errorf("%w: a message on %s was delivered without ratemesh's validator", ErrUnsafePubSub, m.topicName)
	case !pr.signed:
		return fmt.Errorf("%w: it does not sign the messages it publishes, so a peer could write in another member's name; create it with pubsub.WithMessageSignaturePolicy(pubsub.StrictSign) (the default) and without WithNoAuthor or WithMessageSigning(false)", ErrUnsafePubSub)
	case pr.author != m.self:
		return fmt.Errorf("%w: it signs as %s, not as the host %s; remove pubsub.WithMessageAuthor", ErrUnsafePubSub, pr.author, m.self)
	}
	return nil
}

// detach cancels the subscription, closes the topic handle and removes
// the validator. An attached Mesh reports what failed; for a Mesh built by
// New, whose PubSub ends with it, failures are only logged.
func (m *Mesh) detach(sub *pubsub.Subscription) error {
	if sub != nil {
		sub.Cancel() // handled by pubsub's loop before the topic's close below
	}
	var errs []error
	if err := m.topic.Close(); err != nil && !errors.Is(err, context.Canceled) {
		errs = append(errs, fmt.Errorf("mesh: close topic %s: %w", m.topicName, err))
	}
	if err := m.ps.UnregisterTopicValidator(m.topicName); err != nil && !errors.Is(err, context.Canceled) {
		errs = append(errs, fmt.Errorf("mesh: remove the validator of %s: %w", m.topicName, err))
	}
	err := errors.Join(errs...)
	if m.owned && err != nil {
		m.log.Debug("leave the topic", "err", err)
		return nil
	}
	return err
}

// serveStream wraps an inbound stream handler of ours: the stream is
// tracked so that Close can reset it and wait for the handler, and a
// blocked peer's stream, or one arriving during Close, is reset at once.
func (m *Mesh) serveStream(f func(network.Stream)) network.StreamHandler {
	return func(s network.Stream) {
		m.mu.Lock()
		if m.closed {
			m.mu.Unlock()
			_ = s.Reset()
			return
		}
		m.inflight[s] = struct{}{}
		m.wg.Add(1) // under mu: Close marks closed under mu before it waits
		m.mu.Unlock()
		defer func() {
			m.mu.Lock()
			delete(m.inflight, s)
			m.mu.Unlock()
			m.wg.Done()
		}()
		remote := s.Conn().RemotePeer()
		if m.gater.isBlocked(remote) {
			_ = s.Reset()
			return
		}
		if !m.allow.allowed(remote) {
			// Reached only on an attached Mesh (the gater of New refuses
			// the connection), or in the moment a peer leaves the list.
			if s.Protocol() == m.syncProto {
				m.reject(true, ReasonNotMember, remote, fmt.Errorf("sync stream from a peer not on the allowlist"))
			} else {
				m.st.rejectedForward[ReasonNotMember].Add(1)
				m.logRefusal(ReasonNotMember, "refused a forward stream", "peer", remote.String())
			}
			_ = s.Reset()
			return
		}
		f(s)
	}
}

// protect tags p's connections so that the host's connection manager
// does not trim a member's connection; an attached Mesh shares a
// connection manager with the service's own peers.
func (m *Mesh) protect(p peer.ID, st *peerState) {
	if !st.protected {
		m.h.ConnManager().Protect(p, m.connTag)
		st.protected = true
	}
}

func (m *Mesh) unprotect(p peer.ID, st *peerState) {
	if st.protected {
		m.h.ConnManager().Unprotect(p, m.connTag)
		st.protected = false
	}
}

// unprotectAll removes every tag protect added; Close calls it once the
// event loop has stopped.
func (m *Mesh) unprotectAll() {
	m.peersMu.Lock()
	defer m.peersMu.Unlock()
	for p, st := range m.peers {
		m.unprotect(p, st)
	}
}
