package mesh

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/peerstore"
	ma "github.com/multiformats/go-multiaddr"

	"github.com/ratemesh/ratemesh/crdt"
	"github.com/ratemesh/ratemesh/node"
)

// The anti-entropy stream (/ratemesh/1/<namespace>/sync) carries, from the
// dialer to the listener only, a sequence of frames: a uvarint length and
// that many bytes of one CBOR batch. The dialer then closes its write side;
// the listener closes the stream once it has read and delivered every
// batch, and the dialer takes that end of stream as the receipt. The
// listener resets the stream at the first frame it refuses (see
// handleSync), so the dialer's SendDirect fails.

// SendDirect sends bs, in order, to peer alone over the anti-entropy
// stream, dialling it if needed. It returns once the peer has read and
// accepted every batch, or fails: ctx (or SyncTimeout, whichever is
// sooner) bounds the whole exchange. It does not retain bs.
func (m *Mesh) SendDirect(ctx context.Context, peerID string, bs []*crdt.Batch) error {
	if _, err := m.liveTopic(); err != nil {
		return err
	}
	p, err := peer.Decode(peerID)
	if err != nil {
		return fmt.Errorf("mesh: send to %q: bad peer ID: %w", peerID, err)
	}
	if m.gater.isBlocked(p) {
		return fmt.Errorf("%w: send to %s: blocked", ErrUnreachable, peerID)
	}
	if !m.allow.allowed(p) {
		return fmt.Errorf("%w: send to %s: not on the allowlist", ErrNotMember, peerID)
	}
	frames := make([][]byte, 0, len(bs))
	var total int
	for i, b := range bs {
		if len(b.Members) > 0 {
			c := *b
			c.Members = m.withAddrs(b.Members)
			b = &c
		}
		data, err := b.Encode()
		if err != nil {
			return fmt.Errorf("mesh: send to %s: batch %d: %w", peerID, i, err)
		}
		if len(data) > m.cfg.MaxMessageBytes {
			return fmt.Errorf("mesh: send to %s: batch %d: %w: %d bytes, cap %d", peerID, i, ErrTooLarge, len(data), m.cfg.MaxMessageBytes)
		}
		frames = append(frames, data)
		total += len(data)
	}
	if len(frames) > m.cfg.MaxSyncBatches {
		return fmt.Errorf("mesh: send to %s: %d batches, over the cap of %d", peerID, len(frames), m.cfg.MaxSyncBatches)
	}
	ctx, cancel := context.WithTimeout(ctx, m.cfg.SyncTimeout)
	defer cancel()
	s, err := m.h.NewStream(ctx, p, m.syncProto)
	if err != nil {
		return fmt.Errorf("mesh: send to %s: open %s: %w", peerID, m.syncProto, err)
	}
	stop := context.AfterFunc(ctx, func() { s.Reset() })
	defer stop()
	if dl, ok := ctx.Deadline(); ok {
		_ = s.SetDeadline(dl)
	}
	if err := writeFrames(s, frames); err != nil {
		s.Reset()
		return fmt.Errorf("mesh: send to %s: %w", peerID, err)
	}
	if err := s.CloseWrite(); err != nil {
		s.Reset()
		return fmt.Errorf("mesh: send to %s: %w", peerID, err)
	}
	var one [1]byte
	n, err := s.Read(one[:])
	switch {
	case n > 0:
		s.Reset()
		return fmt.Errorf("mesh: send to %s: peer wrote on the sync stream", peerID)
	case errors.Is(err, io.EOF):
		s.Close()
	case ctx.Err() != nil:
		return fmt.Errorf("mesh: send to %s: %w", peerID, ctx.Err())
	default:
		s.Reset()
		return fmt.Errorf("mesh: send to %s: peer refused the batches or dropped the stream: %w", peerID, err)
	}
	m.st.directSent.Add(uint64(len(frames)))
	m.st.directSentBytes.Add(uint64(total))
	return nil
}

func writeFrames(w io.Writer, frames [][]byte) error {
	bw := bufio.NewWriter(w)
	var hdr [binary.MaxVarintLen64]byte
	for _, f := range frames {
		n := binary.PutUvarint(hdr[:], uint64(len(f)))
		if _, err := bw.Write(hdr[:n]); err != nil {
			return err
		}
		if _, err := bw.Write(f); err != nil {
			return err
		}
	}
	return bw.Flush()
}

// handleSync receives one anti-entropy stream. Every batch is decoded
// strictly and must come from the stream's authenticated remote peer; a
// full state may relay other slots' values and the sender's member table
// (checkBatch), whose addresses this member dials (learnAddrs). A malformed,
// oversized, foreign or misattributed batch resets the stream (the rest is
// not read); an implausible one is dropped and reading goes on, since it
// may only mean the peers' rules differ for a while, and so is a full
// state that relays a peer this member's allowlist refuses (the
// members' allowlists may differ for a while). Reads are bounded by
// SyncTimeout, MaxMessageBytes and MaxSyncBatches.
func (m *Mesh) handleSync(s network.Stream) {
	remote := s.Conn().RemotePeer()
	author := remote.String()
	_ = s.SetDeadline(time.Now().Add(m.cfg.SyncTimeout))
	r := bufio.NewReader(s)
	for n := 0; ; n++ {
		size, err := binary.ReadUvarint(r)
		if errors.Is(err, io.EOF) {
			break // the sender closed its side after a whole frame
		}
		if err != nil {
			m.log.Debug("sync stream broke", "peer", author, "err", err)
			s.Reset()
			return
		}
		if n >= m.cfg.MaxSyncBatches {
			m.reject(true, ReasonOversize, remote, fmt.Errorf("more than %d batches on one stream", m.cfg.MaxSyncBatches))
			s.Reset()
			return
		}
		if size > uint64(m.cfg.MaxMessageBytes) {
			m.reject(true, ReasonOversize, remote, fmt.Errorf("%d bytes, cap %d", size, m.cfg.MaxMessageBytes))
			s.Reset()
			return
		}
		data := make([]byte, size)
		if _, err := io.ReadFull(r, data); err != nil {
			m.log.Debug("sync stream broke", "peer", author, "err", err)
			s.Reset()
			return
		}
		b, err := crdt.DecodeBatch(data)
		if err != nil {
			m.reject(true, ReasonMalformed, remote, err)
			s.Reset()
			return
		}
		if reason, err := checkBatch(b, author, m.cfg.Plausible, b.Has(crdt.FlagFull)); err != nil {
			m.reject(true, reason, remote, err)
			if reason == ReasonImplausible {
				continue
			}
			s.Reset()
			return
		}
		if m.allow.on {
			// A member whose allowlist differs from ours (a rolling
			// change) may relay a peer we do not admit: drop that batch,
			// read on, as for an implausible value.
			if p, bad := relaysNonMember(b, m.Allowed); bad {
				m.reject(true, ReasonNotMember, remote, fmt.Errorf("a full state relays %s, not on the allowlist", p))
				continue
			}
		}
		m.st.directReceived.Add(1)
		m.st.directReceivedBytes.Add(uint64(len(data)))
		m.deliverBatch(node.Inbound{Batch: b, Direct: true})
	}
	s.Close()
}

// withAddrs returns a copy of ms with each member's addresses as this
// host's peerstore knows them, so the receiver can dial the members it
// learns of.
func (m *Mesh) withAddrs(ms []crdt.MemberEntry) []crdt.MemberEntry {
	out := slices.Clone(ms)
	for i := range out {
		p, err := peer.Decode(out[i].Peer)
		if err != nil {
			continue
		}
		out[i].Addrs = nil
		for _, a := range m.h.Peerstore().Addrs(p) {
			if s := a.String(); len(s) <= crdt.MaxAddrLen && len(out[i].Addrs) < crdt.MaxAddrs {
				out[i].Addrs = append(out[i].Addrs, s)
			}
		}
	}
	return out
}

// learnAddrs records the addresses of the live members of a full state's
// member table and dials those this host is not connected to, in the
// background: a member that joined through one seed reaches every member
// directly, and exchanges state with each.
//
// The caller holds m.deliver for reading, with m.stopped false, so no dial
// starts once Close has begun waiting for them.
func (m *Mesh) learnAddrs(ms []crdt.MemberEntry) {
	for _, e := range ms {
		if e.State != crdt.MemberAlive && e.State != crdt.MemberSuspect {
			continue
		}
		p, err := peer.Decode(e.Peer)
		if err != nil || p == m.self || !m.gater.admits(p) {
			continue
		}
		var addrs []ma.Multiaddr
		for _, a := range e.Addrs {
			if x, err := ma.NewMultiaddr(a); err == nil {
				addrs = append(addrs, x)
			}
		}
		if len(addrs) == 0 {
			continue
		}
		m.h.Peerstore().AddAddrs(p, addrs, peerstore.TempAddrTTL)
		if m.h.Network().Connectedness(p) == network.Connected {
			continue
		}
		pi := peer.AddrInfo{ID: p, Addrs: addrs}
		m.wg.Add(1)
		go func() {
			defer m.wg.Done()
			if err := m.connect(m.ctx, pi, addrString(pi)); err != nil && m.ctx.Err() == nil {
				m.log.Debug("dial a member learned from a full state", "peer", pi.ID, "err", err)
			}
		}()
	}
}

// KnownAddrs returns the full multiaddrs (ending in /p2p/<peer ID>) this
// host knows for peerID, for persisting the members a restarted node dials
// (node.AddrBook).
func (m *Mesh) KnownAddrs(peerID string) []string {
	p, err := peer.Decode(peerID)
	if err != nil {
		return nil
	}
	pi := peer.AddrInfo{ID: p, Addrs: m.h.Peerstore().Addrs(p)}
	mas, err := peer.AddrInfoToP2pAddrs(&pi)
	if err != nil {
		return nil
	}
	out := make([]string, 0, len(mas))
	for _, a := range mas {
		out = append(out, a.String())
	}
	return out
}
