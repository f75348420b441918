package mesh

import (
	"encoding/binary"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
)

// refusalLogEvery is the least time between two log lines of one refusal
// reason; the line says how many refusals of that reason went unlogged
// since the last one.
const refusalLogEvery = 5 * time.Second

// logGate rate-limits the log lines of one reason. Safe for concurrent
// use.
type logGate struct {
	next    atomic.Int64  // unix nanos before which nothing is logged
	skipped atomic.Uint64 // refusals not logged since the last line
}

// allow reports whether to log now, and how many were skipped before.
func (g *logGate) allow(now time.Time) (bool, uint64) {
	n := now.UnixNano()
	next := g.next.Load()
	if n < next || !g.next.CompareAndSwap(next, n+int64(refusalLogEvery)) {
		g.skipped.Add(1)
		return false, 0
	}
	return true, g.skipped.Swap(0)
}

// refusalLogs are the log gates of every message and connection reason.
type refusalLogs struct {
	msg  [NumReasons]logGate
	conn [NumConnReasons]logGate
}

// logRefusal logs a refusal of reason r, at most once per refusalLogEvery
// for that reason, with the number of refusals not logged since.
func (m *Mesh) logRefusal(r Reason, msg string, args ...any) {
	if r < 0 || r >= NumReasons {
		return
	}
	ok, skipped := m.logs.msg[r].allow(time.Now())
	if !ok {
		return
	}
	m.log.Warn(msg, append([]any{"reason", r.String(), "not_logged", skipped}, args...)...)
}

// connRefusal logs a connection the gater refused, rate-limited per
// reason.
func (m *Mesh) connRefusal(r ConnReason, p peer.ID, dir network.Direction) {
	if r < 0 || r >= NumConnReasons {
		return
	}
	ok, skipped := m.logs.conn[r].allow(time.Now())
	if !ok {
		return
	}
	m.log.Warn("refused a connection", "reason", r.String(), "peer", p.String(), "direction", dir.String(), "not_logged", skipped)
}

// traceRefusal logs what the tracer saw gossipsub refuse.
func (m *Mesh) traceRefusal(r Reason, from peer.ID, why string) {
	m.logRefusal(r, "gossipsub refused a message", "forwarder", from.String(), "why", why)
}

// rpcOversize counts an RPC over gossipsub's cap, which gossipsub drops
// with the stream it came on.
func (m *Mesh) rpcOversize(from peer.ID, size uint64, max int) {
	m.st.rpcOversize.Add(1)
	m.logRefusal(ReasonOversize, "gossipsub dropped an RPC over its size cap and reset the stream", "forwarder", from.String(), "bytes", size, "cap", max)
}

// pubsubMaxMessage is the message cap of the router New builds: a batch
// at MaxMessageBytes plus pubsub's envelope (see PubSubOptions).
func pubsubMaxMessage(cfg Config) int { return cfg.MaxMessageBytes + rpcOverhead }

// sizeHost is the host New hands its gossipsub router: the host itself,
// except that the stream handlers gossipsub registers read through
// sizeStream. go-libp2p-pubsub v0.17 reads each inbound RPC with a
// length-prefixed reader capped at its max message size
// (WithMaxMessageSize); a longer RPC makes the read fail, and gossipsub
// resets the stream with a debug log and no tracer event (comm.go,
// handleNewStream). Raising the cap would only move the silent limit and
// let every peer make this member buffer larger messages (up to
// QueueSize of them in the validation queue). sizeStream instead watches
// the length prefixes as gossipsub reads them and counts every RPC over
// the cap, whatever its size, without buffering anything.
type sizeHost struct {
	host.Host
	max  int
	over func(from peer.ID, size uint64, max int)
}

func (h sizeHost) wrap(handler network.StreamHandler) network.StreamHandler {
	return func(s network.Stream) {
		handler(&sizeStream{Stream: s, max: uint64(h.max), over: h.over})
	}
}

// SetStreamHandler registers handler behind a sizeStream.
func (h sizeHost) SetStreamHandler(pid protocol.ID, handler network.StreamHandler) {
	h.Host.SetStreamHandler(pid, h.wrap(handler))
}

// SetStreamHandlerMatch registers handler behind a sizeStream.
func (h sizeHost) SetStreamHandlerMatch(pid protocol.ID, match func(protocol.ID) bool, handler network.StreamHandler) {
	h.Host.SetStreamHandlerMatch(pid, match, h.wrap(handler))
}

// sizeStream follows the uvarint length prefixes of the RPCs read through
// it. Only gossipsub's one reading goroutine calls Read.
type sizeStream struct {
	network.Stream
	max  uint64
	over func(from peer.ID, size uint64, max int)

	done   bool   // an oversize RPC was seen: gossipsub resets the stream
	hdr    uint64 // the length prefix read so far
	shift  uint
	remain uint64 // bytes of the current RPC still to come
	inBody bool
}

func (s *sizeStream) Read(p []byte) (int, error) {
	n, err := s.Stream.Read(p)
	if n > 0 && !s.done {
		if size, over := s.scan(p[:n]); over && s.over != nil {
			s.over(s.Conn().RemotePeer(), size, int(s.max))
		}
	}
	return n, err
}

// scan advances the frame parser over b and reports the length of an RPC
// over the cap, after which it stops.
func (s *sizeStream) scan(b []byte) (uint64, bool) {
	for len(b) > 0 && !s.done {
		if s.inBody {
			k := min(uint64(len(b)), s.remain)
			b = b[k:]
			s.remain -= k
			if s.remain == 0 {
				s.inBody = false
			}
			continue
		}
		c := b[0]
		b = b[1:]
		if s.shift >= 64 {
			s.done = true // not a uvarint: gossipsub's reader fails too
			return 0, false
		}
		s.hdr |= uint64(c&0x7f) << s.shift
		s.shift += 7
		if c&0x80 != 0 {
			if s.shift/7 >= binary.MaxVarintLen64 {
				s.done = true // too long a prefix: gossipsub's reader fails too
			}
			continue
		}
		size := s.hdr
		s.hdr, s.shift = 0, 0
		if size > s.max {
			s.done = true
			return size, true
		}
		s.remain, s.inBody = size, size > 0
	}
	return 0, false
}
