package mesh

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
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
// accepted every batch, or fails: when ctx ends, or when a step makes no
// progress for SyncTimeout — opening the stream, writing a piece of a
// frame (which waits while the peer reads no more), or awaiting the
// receipt after the last (SyncTimeout plus the time the writes took). A
// long transfer to a slow receiver (a full state of a million
// keys to a member on a starved host) so goes on while the receiver
// reads; a receiver that stops is given up SyncTimeout later. It does
// not retain bs.
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
	dialCtx, cancel := context.WithTimeout(ctx, m.cfg.SyncTimeout)
	s, err := m.h.NewStream(dialCtx, p, m.syncProto)
	cancel()
	if err != nil {
		return fmt.Errorf("mesh: send to %s: open %s: %w", peerID, m.syncProto, err)
	}
	stop := context.AfterFunc(ctx, func() { s.Reset() })
	defer stop()
	start := time.Now()
	if err := writeFrames(idleWriter{s, m.cfg.SyncTimeout}, frames); err != nil {
		s.Reset()
		if isTimeout(err) {
			return fmt.Errorf("mesh: send to %s: %w (the peer read nothing for the sync timeout, %v)", peerID, err, m.cfg.SyncTimeout)
		}
		return fmt.Errorf("mesh: send to %s: %w", peerID, err)
	}
	_ = s.SetWriteDeadline(time.Now().Add(m.cfg.SyncTimeout))
	if err := s.CloseWrite(); err != nil {
		s.Reset()
		return fmt.Errorf("mesh: send to %s: %w", peerID, err)
	}
	// The receipt. What the peer has not read yet fits in the stream's
	// window (a write waits while it is full), but the peer reads it only
	// as fast as its node merges: it is given SyncTimeout, and as long
	// again as it took to read what came before.
	_ = s.SetReadDeadline(time.Now().Add(m.cfg.SyncTimeout + time.Since(start)))
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

// idleWriter writes to a stream in pieces of at most idleChunk bytes,
// each given the timeout from its start: a write waiting on a full window
// fails only when the reader has taken no piece for that long, however
// large the frame.
type idleWriter struct {
	s       network.Stream
	timeout time.Duration
}

const idleChunk = 64 << 10

func (w idleWriter) Write(p []byte) (int, error) {
	n := 0
	for n < len(p) {
		_ = w.s.SetWriteDeadline(time.Now().Add(w.timeout))
		k, err := w.s.Write(p[n:min(len(p), n+idleChunk)])
		n += k
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// isTimeout reports whether err is a deadline's.
func isTimeout(err error) bool {
	var ne interface{ Timeout() bool }
	return errors.As(err, &ne) && ne.Timeout()
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
// members' allowlists may differ for a while). Each frame must arrive
// within SyncTimeout of the last one's delivery (a slow node takes its
// time to merge a long transfer, a peer that stops is cut off), each is
// at most MaxMessageBytes, and a stream at most MaxSyncBatches frames.
func (m *Mesh) handleSync(s network.Stream) {
	remote := s.Conn().RemotePeer()
	author := remote.String()
	r := bufio.NewReader(s)
	for n := 0; ; n++ {
		_ = s.SetReadDeadline(time.Now().Add(m.cfg.SyncTimeout))
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

// The budget of the dials member tables start (learnAddrs). A table is its
// sender's word about others: an invented peer costs a dial, a goroutine
// and a peerstore entry, so only a table's first maxTablePeers live
// entries are considered, at most maxSuggestedDials run at once, a peer
// whose dial failed is not tried again for suggestRetry, and at most
// maxSuggestFailed such peers are remembered. Every entry left out by a
// cap counts as ReasonTableBudget. (A table never makes a member either:
// the node core counts a peer once a batch it signed arrives.)
const (
	maxTablePeers     = 256
	maxSuggestedDials = 16
	suggestRetry      = time.Minute
	maxSuggestFailed  = 4096
)

// suggestions is the state of that budget. The zero value is ready; it is
// safe for concurrent use.
type suggestions struct {
	mu       sync.Mutex
	inFlight int
	failed   map[peer.ID]time.Time // when a suggested dial to the peer failed
}

// take reports whether p may be dialled at now and if so counts the dial
// in flight (done ends it); over is true when a cap, not p's own recent
// failure, refused it.
func (s *suggestions) take(p peer.ID, now time.Time) (ok, over bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if t, failed := s.failed[p]; failed && now.Sub(t) < suggestRetry {
		return false, false
	}
	if s.inFlight >= maxSuggestedDials {
		return false, true
	}
	s.inFlight++
	return true, false
}

// done ends a dial taken at now; failed records that it failed.
func (s *suggestions) done(p peer.ID, now time.Time, failed bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.inFlight--
	if !failed {
		delete(s.failed, p)
		return
	}
	if s.failed == nil {
		s.failed = make(map[peer.ID]time.Time)
	}
	if len(s.failed) >= maxSuggestFailed {
		for q, t := range s.failed {
			if now.Sub(t) >= suggestRetry {
				delete(s.failed, q)
			}
		}
		if len(s.failed) >= maxSuggestFailed {
			return // forgotten: it may be tried again, within the dial cap
		}
	}
	s.failed[p] = now
}

// learnAddrs dials, in the background, the live members of a full state's
// member table this host is not connected to, within the suggestion budget
// above: a member that joined through one seed reaches every member
// directly, and exchanges state with each.
//
// The caller holds m.deliver for reading, with m.stopped false, so no dial
// starts once Close has begun waiting for them.
func (m *Mesh) learnAddrs(ms []crdt.MemberEntry) {
	var over uint64
	considered := 0
	for _, e := range ms {
		if e.State != crdt.MemberAlive && e.State != crdt.MemberSuspect {
			continue
		}
		p, err := peer.Decode(e.Peer)
		if err != nil || p == m.self || !m.gater.admits(p) || len(e.Addrs) == 0 {
			continue
		}
		if m.h.Network().Connectedness(p) == network.Connected {
			continue
		}
		if considered++; considered > maxTablePeers {
			over++
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
		ok, capped := m.sugg.take(p, time.Now())
		if capped {
			over++
		}
		if !ok {
			continue
		}
		m.h.Peerstore().AddAddrs(p, addrs, peerstore.TempAddrTTL)
		pi := peer.AddrInfo{ID: p, Addrs: addrs}
		m.wg.Add(1)
		go func() {
			defer m.wg.Done()
			err := m.connect(m.ctx, pi, addrString(pi))
			m.sugg.done(pi.ID, time.Now(), err != nil)
			if err != nil && m.ctx.Err() == nil {
				m.log.Debug("dial a member learned from a full state", "peer", pi.ID, "err", err)
			}
		}()
	}
	if over > 0 {
		m.AddRefused(ReasonTableBudget, over)
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
