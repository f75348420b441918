package mesh

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/fxamacker/cbor/v2"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"

	"github.com/ratemesh/ratemesh/limiter"
	"github.com/ratemesh/ratemesh/node"
)

// The forward stream (/ratemesh/1/<namespace>/forward) carries one
// request a member hands to another (node.Forwarder): a lease renewed or
// released at its owner, or a lottery loser's decision. The dialer writes
// one frame — a uvarint length and that many bytes of CBOR — and closes
// its write side; the listener answers with one frame and closes the
// stream. The request is authenticated by the connection: the listener
// hands the handler the stream's remote peer, which the node serves only
// if it holds it as a live member. Both sides bound a frame at
// maxForwardFrame bytes and the exchange at the caller's context, or
// forwardTimeout at most.

const (
	// maxForwardFrame bounds one request or answer: rule names (128
	// bytes), keys and lease IDs (under 300) and a few numbers.
	maxForwardFrame = 4 << 10
	// forwardTimeout bounds one forward stream at either side: a held
	// decision waits at most limiter.MaxShareWait, the rest is slack for
	// a loaded host.
	forwardTimeout = limiter.MaxShareWait + 4*time.Second
)

var (
	_ node.Forwarder = (*Mesh)(nil)

	fwdEnc cbor.EncMode
	fwdDec cbor.DecMode
)

func init() {
	var err error
	if fwdEnc, err = (cbor.EncOptions{Sort: cbor.SortNone}).EncMode(); err != nil {
		panic(err)
	}
	fwdDec, err = cbor.DecOptions{
		DupMapKey:        cbor.DupMapKeyEnforcedAPF,
		IndefLength:      cbor.IndefLengthForbidden,
		TagsMd:           cbor.TagsForbidden,
		MaxNestedLevels:  4,
		MaxArrayElements: 16,
		MaxMapPairs:      32,
		UTF8:             cbor.UTF8RejectInvalid,
		IntDec:           cbor.IntDecConvertNone,
	}.DecMode()
	if err != nil {
		panic(err)
	}
}

// fwdRequest is node.ForwardRequest on the wire.
type fwdRequest struct {
	Op      uint8  `cbor:"1,keyasint"`
	Rule    string `cbor:"2,keyasint,omitempty"`
	Key     string `cbor:"3,keyasint,omitempty"`
	Cost    uint64 `cbor:"4,keyasint,omitempty"`
	HasCost bool   `cbor:"5,keyasint,omitempty"`
	Type    string `cbor:"6,keyasint,omitempty"`
	Units   uint64 `cbor:"7,keyasint,omitempty"`
	Class   string `cbor:"8,keyasint,omitempty"`
	LeaseID string `cbor:"9,keyasint,omitempty"`
	HoldMs  int64  `cbor:"10,keyasint,omitempty"`
}

// fwdResponse is node.ForwardResponse on the wire; durations in ms.
type fwdResponse struct {
	Status     uint8  `cbor:"1,keyasint,omitempty"`
	Msg        string `cbor:"2,keyasint,omitempty"`
	Allowed    bool   `cbor:"3,keyasint,omitempty"`
	Limit      uint64 `cbor:"4,keyasint,omitempty"`
	Remaining  uint64 `cbor:"5,keyasint,omitempty"`
	ResetMs    int64  `cbor:"6,keyasint,omitempty"`
	RetryMs    int64  `cbor:"7,keyasint,omitempty"` // −1: never
	Shadow     bool   `cbor:"8,keyasint,omitempty"`
	Reason     uint8  `cbor:"9,keyasint,omitempty"`
	LeaseID    string `cbor:"10,keyasint,omitempty"`
	TTLMs      int64  `cbor:"11,keyasint,omitempty"`
	RetryNever bool   `cbor:"12,keyasint,omitempty"`
}

func toWireRequest(r *node.ForwardRequest) fwdRequest {
	return fwdRequest{
		Op: uint8(r.Op), Rule: r.Rule, Key: r.Key, Cost: r.Request.Cost, HasCost: r.Request.HasCost,
		Type: r.Request.Type, Units: r.Request.Units, Class: r.Request.Class, LeaseID: r.LeaseID,
		HoldMs: r.Hold.Milliseconds(),
	}
}

func (w *fwdRequest) toNode() *node.ForwardRequest {
	return &node.ForwardRequest{
		Op: node.ForwardOp(w.Op), Rule: w.Rule, Key: w.Key, LeaseID: w.LeaseID,
		Request: limiter.Request{Cost: w.Cost, HasCost: w.HasCost, Type: w.Type, Units: w.Units, Class: w.Class},
		Hold:    time.Duration(max(w.HoldMs, 0)) * time.Millisecond,
	}
}

func toWireResponse(r *node.ForwardResponse) fwdResponse {
	d := r.Decision
	w := fwdResponse{
		Status: uint8(r.Status), Msg: r.Msg, Allowed: d.Allowed, Limit: d.Limit, Remaining: d.Remaining,
		ResetMs: d.ResetAfter.Milliseconds(), Shadow: d.Shadow, Reason: uint8(d.Reason),
		LeaseID: r.LeaseID, TTLMs: r.TTL.Milliseconds(),
	}
	if d.RetryAfter == node.Never {
		w.RetryNever = true
	} else {
		w.RetryMs = ceilMs(d.RetryAfter)
	}
	return w
}

func (w *fwdResponse) toNode() (*node.ForwardResponse, error) {
	if w.Status > uint8(node.ForwardNotMember) || int(w.Reason) >= limiter.NumReasons {
		return nil, fmt.Errorf("status %d or reason %d unknown", w.Status, w.Reason)
	}
	if w.ResetMs < 0 || w.RetryMs < 0 || w.TTLMs < 0 {
		return nil, errors.New("a negative duration")
	}
	d := node.Decision{
		Allowed: w.Allowed, Limit: w.Limit, Remaining: w.Remaining, Shadow: w.Shadow, Reason: limiter.Reason(w.Reason),
		ResetAfter: time.Duration(w.ResetMs) * time.Millisecond, RetryAfter: time.Duration(w.RetryMs) * time.Millisecond,
	}
	if w.RetryNever {
		d.RetryAfter = node.Never
	}
	return &node.ForwardResponse{
		Status: node.ForwardStatus(w.Status), Msg: w.Msg, Decision: d,
		LeaseID: w.LeaseID, TTL: time.Duration(w.TTLMs) * time.Millisecond,
	}, nil
}

func ceilMs(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}

// ForwardProtocol returns the forward stream protocol,
// /ratemesh/1/<namespace>/forward.
func (m *Mesh) ForwardProtocol() protocol.ID {
	return protocol.ID("/ratemesh/1/" + m.cfg.Namespace + "/forward")
}

// CheckPeer implements node.Forwarder: id must decode as a libp2p peer
// ID.
func (m *Mesh) CheckPeer(id string) error {
	if _, err := peer.Decode(id); err != nil {
		return fmt.Errorf("%w: %q: %v", node.ErrBadPeer, id, err)
	}
	return nil
}

// Forward implements node.Forwarder over the forward stream, dialling the
// peer if needed; ctx (or forwardTimeout, whichever is sooner) bounds the
// whole exchange.
func (m *Mesh) Forward(ctx context.Context, peerID string, req *node.ForwardRequest) (*node.ForwardResponse, error) {
	if _, err := m.liveTopic(); err != nil {
		return nil, err
	}
	p, err := peer.Decode(peerID)
	if err != nil {
		return nil, fmt.Errorf("%w: %q: %v", node.ErrBadPeer, peerID, err)
	}
	if m.gater.isBlocked(p) {
		return nil, fmt.Errorf("%w: forward to %s: blocked", ErrUnreachable, peerID)
	}
	if !m.allow.allowed(p) {
		return nil, fmt.Errorf("%w: forward to %s: not on the allowlist", ErrNotMember, peerID)
	}
	data, err := fwdEnc.Marshal(toWireRequest(req))
	if err != nil {
		return nil, fmt.Errorf("mesh: forward to %s: %w", peerID, err)
	}
	if len(data) > maxForwardFrame {
		return nil, fmt.Errorf("mesh: forward to %s: %w: %d bytes, cap %d", peerID, ErrTooLarge, len(data), maxForwardFrame)
	}
	ctx, cancel := context.WithTimeout(ctx, forwardTimeout)
	defer cancel()
	s, err := m.h.NewStream(ctx, p, m.ForwardProtocol())
	if err != nil {
		return nil, fmt.Errorf("mesh: forward to %s: open %s: %w", peerID, m.ForwardProtocol(), err)
	}
	stop := context.AfterFunc(ctx, func() { s.Reset() })
	defer stop()
	if dl, ok := ctx.Deadline(); ok {
		_ = s.SetDeadline(dl)
	}
	if err := writeFrames(s, [][]byte{data}); err != nil {
		s.Reset()
		return nil, fmt.Errorf("mesh: forward to %s: %w", peerID, err)
	}
	if err := s.CloseWrite(); err != nil {
		s.Reset()
		return nil, fmt.Errorf("mesh: forward to %s: %w", peerID, err)
	}
	answer, err := readFrame(bufio.NewReader(s))
	if err != nil {
		s.Reset()
		if ctx.Err() != nil {
			return nil, fmt.Errorf("mesh: forward to %s: %w", peerID, ctx.Err())
		}
		return nil, fmt.Errorf("mesh: forward to %s: answer: %w", peerID, err)
	}
	_ = s.Close()
	var w fwdResponse
	if err := fwdDec.Unmarshal(answer, &w); err != nil {
		return nil, fmt.Errorf("mesh: forward to %s: malformed answer: %w", peerID, err)
	}
	resp, err := w.toNode()
	if err != nil {
		return nil, fmt.Errorf("mesh: forward to %s: malformed answer: %w", peerID, err)
	}
	return resp, nil
}

// readFrame reads one frame of at most maxForwardFrame bytes.
func readFrame(r *bufio.Reader) ([]byte, error) {
	size, err := binary.ReadUvarint(r)
	if err != nil {
		return nil, err
	}
	if size > maxForwardFrame {
		return nil, fmt.Errorf("%w: %d bytes, cap %d", ErrTooLarge, size, maxForwardFrame)
	}
	data := make([]byte, size)
	if _, err := io.ReadFull(r, data); err != nil {
		return nil, err
	}
	return data, nil
}

// handleForward serves one forward stream: it reads the request, hands it
// to the node with the stream's authenticated remote peer, and writes the
// answer. A malformed or oversized request resets the stream.
func (m *Mesh) handleForward(s network.Stream) {
	remote := s.Conn().RemotePeer()
	_ = s.SetDeadline(time.Now().Add(forwardTimeout))
	data, err := readFrame(bufio.NewReader(io.LimitReader(s, maxForwardFrame+binary.MaxVarintLen64)))
	if err != nil {
		m.log.Debug("forward stream broke", "peer", remote.String(), "err", err)
		s.Reset()
		return
	}
	var w fwdRequest
	if err := fwdDec.Unmarshal(data, &w); err != nil {
		m.log.Debug("malformed forward request", "peer", remote.String(), "err", err)
		s.Reset()
		return
	}
	ctx, cancel := context.WithTimeout(m.ctx, forwardTimeout)
	defer cancel()
	resp, ok := m.serveForward(ctx, remote.String(), w.toNode())
	if !ok {
		s.Reset()
		return
	}
	out, err := fwdEnc.Marshal(toWireResponse(resp))
	if err == nil && len(out) > maxForwardFrame {
		err = fmt.Errorf("%w: %d bytes", ErrTooLarge, len(out))
	}
	if err != nil {
		m.log.Warn("forward answer", "peer", remote.String(), "err", err)
		s.Reset()
		return
	}
	if err := writeFrames(s, [][]byte{out}); err != nil {
		s.Reset()
		return
	}
	_ = s.Close()
}

// serveForward hands one request to the node's ForwardHandler, unless the
// mesh is closing; ok is false then.
func (m *Mesh) serveForward(ctx context.Context, from string, req *node.ForwardRequest) (*node.ForwardResponse, bool) {
	m.deliver.RLock()
	defer m.deliver.RUnlock()
	if m.stopped || m.fwdHandler == nil {
		return nil, false
	}
	return m.fwdHandler.HandleForward(ctx, from, req), true
}
