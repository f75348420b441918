package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc/codes"
)

// grpcConn is one worker's gRPC connection: HTTP/2 over plain TCP with
// prior knowledge (h2c, as grpc-go's insecure client speaks it), framed
// by x/net/http2's Framer and its HPACK coder, one unary call at a time.
// A call is its HEADERS (a header block encoded once per connection and
// method), one DATA frame with the message and END_STREAM, and the
// answer's HEADERS, DATA and trailers. On this 2-core machine grpc-go's
// client (a reader and a writer goroutine per connection, BDP pings, a
// ClientConn's balancer and interceptors around each call) cost as much
// CPU a call as ratemesh's server; like httpConn, this costs a fraction
// of it, the same for both systems. It is not safe for concurrent use;
// its zero value with addr set dials on the first call.
//
// It sends no grpc-timeout. Envoy's rate-limit filter does (its timeout,
// 20 ms by default), and a server arms a timer for it on every call; but
// grpc-go's client, which the harness used before, sent none (a phase's
// context has no deadline), so leaving it out keeps the servers' work
// what it was and the same for both. The deadline is kept here, on the
// connection, as httpConn keeps it.
type grpcConn struct {
	addr string

	c     net.Conn
	br    *bufio.Reader
	bw    *bufio.Writer
	fr    *http2.Framer
	dec   *hpack.Decoder
	enc   *hpack.Encoder
	hbuf  bytes.Buffer // enc's output
	out   []byte       // a call's DATA payload: prefix and message
	ready bool         // the server's first SETTINGS was read

	// The header block: the last path encoded and, from its second call
	// on, its block with every field indexed (it no longer changes the
	// peer's table, so the same bytes serve every later call).
	path   string
	steady []byte

	nextID    uint32
	goaway    bool   // the server sent GOAWAY: close after this call
	sendConn  int64  // what the peer's connection window lets us send
	peerInit  int64  // the peer's SETTINGS_INITIAL_WINDOW_SIZE
	peerFrame int    // the peer's SETTINGS_MAX_FRAME_SIZE
	tableSize uint32 // our encoder's dynamic table size
	recvConn  uint32 // DATA received, not yet returned by WINDOW_UPDATE
	urgent    bool   // a WINDOW_UPDATE waits in bw: flush it before blocking

	st grpcStream // the call in progress
}

// grpcStream is the state of one call's stream.
type grpcStream struct {
	id          uint32 // 0: none open
	sendWin     int64
	recvUnacked uint32
	blocks      int  // header blocks read
	ended       bool // END_STREAM read
	httpStatus  int
	grpcStatus  int // −1 until read
	grpcMessage string
	hdrBytes    int
	hdrErr      error
	body        *bytes.Buffer
}

const (
	// grpcWindow is our receive window, stream and connection alike:
	// grpc-go's static 1 MiB option, so a small answer's WINDOW_UPDATE
	// goes out once in thousands of calls.
	grpcWindow = 1 << 20
	// grpcMaxFrame is the largest frame we read (the default
	// SETTINGS_MAX_FRAME_SIZE, which we do not raise).
	grpcMaxFrame = 16 << 10
	// grpcMaxHeaders bounds an answer's header list (as HPACK counts it).
	grpcMaxHeaders = 64 << 10
	// grpcMaxMessage bounds an answer's message.
	grpcMaxMessage = 64 << 20
	// grpcMaxStreamID is the last client stream ID; the connection is
	// replaced when it is used up.
	grpcMaxStreamID = 1<<31 - 1
	// hpackInitialTable is HPACK's default dynamic table size.
	hpackInitialTable = 4096
)

var (
	errGRPCProtocol = errors.New("grpc: protocol error")
	errGRPCReset    = errors.New("grpc: stream reset by the server")
	errGRPCGoAway   = errors.New("grpc: connection going away")
)

// grpcStatusError is a call that ended with a non-zero grpc-status.
type grpcStatusError struct {
	Code    codes.Code
	Message string
}

func (e *grpcStatusError) Error() string {
	return fmt.Sprintf("grpc-status %d (%v): %s", uint32(e.Code), e.Code, e.Message)
}

// call sends req, an encoded protobuf message, to the method at path
// ("/package.Service/Method") and leaves the answer's message in resp
// (reset first). An answer with a non-zero grpc-status is a
// *grpcStatusError and leaves the connection open; any other failure
// (a reset stream, GOAWAY before the call was taken, a malformed frame,
// a network error) closes it, and the next call dials again.
//
// When ctx ends, or timeout passes, the exchange in progress fails at
// once with ctx's error or a timeout.
func (g *grpcConn) call(ctx context.Context, path string, req []byte, resp *bytes.Buffer, timeout time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if g.c != nil && g.nextID > grpcMaxStreamID {
		g.close()
	}
	if g.c == nil {
		var dl net.Dialer
		c, err := dl.DialContext(ctx, "tcp", g.addr)
		if err != nil {
			return err
		}
		g.reset(c)
	}
	c := g.c
	_ = c.SetDeadline(time.Now().Add(timeout))
	// ctx's end cuts the exchange (not a deadline of its own on c, which
	// could fire before ctx reports its error).
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Unix(1, 0)) })
	keep, err := g.exchange(path, req, resp)
	stop()
	if err != nil && ctx.Err() != nil {
		err = fmt.Errorf("%w (%v)", ctx.Err(), err)
	}
	if !keep || g.goaway {
		g.close()
	}
	return err
}

// close closes the connection; the next call dials again.
func (g *grpcConn) close() {
	if g.c != nil {
		_ = g.c.Close()
		g.c = nil
	}
}

// reset starts the state of a new connection c.
func (g *grpcConn) reset(c net.Conn) {
	g.c = c
	if g.br == nil {
		g.br = bufio.NewReaderSize(c, 32<<10)
		g.bw = bufio.NewWriterSize(c, 16<<10)
	} else {
		g.br.Reset(c)
		g.bw.Reset(c)
	}
	g.fr = http2.NewFramer(g.bw, g.br)
	g.fr.SetReuseFrames()
	g.fr.SetMaxReadFrameSize(grpcMaxFrame)
	g.dec = hpack.NewDecoder(hpackInitialTable, g.onField)
	g.dec.SetMaxStringLength(grpcMaxHeaders)
	g.hbuf.Reset()
	g.enc = hpack.NewEncoder(&g.hbuf)
	g.ready, g.path, g.steady, g.goaway, g.urgent = false, "", nil, false, false
	g.nextID, g.sendConn, g.peerInit, g.peerFrame = 1, 65535, 65535, 16384
	g.tableSize, g.recvConn = hpackInitialTable, 0
	g.st = grpcStream{}
}

// handshake sends the client preface (the magic, our SETTINGS and our
// connection window) and reads the server's SETTINGS, which must come
// first: the header block is encoded under the table size they set.
func (g *grpcConn) handshake() error {
	_, _ = g.bw.WriteString(http2.ClientPreface)
	_ = g.fr.WriteSettings(
		http2.Setting{ID: http2.SettingEnablePush, Val: 0},
		http2.Setting{ID: http2.SettingInitialWindowSize, Val: grpcWindow},
	)
	_ = g.fr.WriteWindowUpdate(0, grpcWindow-65535)
	if err := g.bw.Flush(); err != nil {
		return err
	}
	f, err := g.fr.ReadFrame()
	if err != nil {
		return g.frameErr(err)
	}
	if s, ok := f.(*http2.SettingsFrame); !ok || s.IsAck() {
		return fmt.Errorf("%w: the server's first frame is %v, not SETTINGS", errGRPCProtocol, f.Header())
	}
	if err := g.handle(f); err != nil {
		return err
	}
	g.ready = true
	return nil
}

// exchange runs one call; keep says whether the connection may serve
// the next one.
func (g *grpcConn) exchange(path string, req []byte, resp *bytes.Buffer) (keep bool, err error) {
	if !g.ready {
		if err := g.handshake(); err != nil {
			return false, err
		}
	}
	resp.Reset()
	g.st = grpcStream{id: g.nextID, sendWin: g.peerInit, grpcStatus: -1, body: resp}
	g.nextID += 2
	defer func() { g.st.id = 0 }()

	block := g.headerBlock(path)
	if len(block) > g.peerFrame {
		return false, fmt.Errorf("grpc: a header block of %d bytes, over the peer's frame size %d", len(block), g.peerFrame)
	}
	if err := g.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: g.st.id, BlockFragment: block, EndHeaders: true}); err != nil {
		return false, err
	}
	g.out = append(g.out[:0], 0, 0, 0, 0, 0) // uncompressed, then the length
	binary.BigEndian.PutUint32(g.out[1:5], uint32(len(req)))
	g.out = append(g.out, req...)
	rest := g.out
	for len(rest) > 0 && !g.st.ended {
		n := min(int64(len(rest)), int64(g.peerFrame), g.sendConn, g.st.sendWin)
		if n <= 0 { // wait for the peer's WINDOW_UPDATE
			if err := g.bw.Flush(); err != nil {
				return false, err
			}
			if err := g.readFrame(); err != nil {
				return false, err
			}
			continue
		}
		if err := g.fr.WriteData(g.st.id, int(n) == len(rest), rest[:n]); err != nil {
			return false, err
		}
		rest = rest[n:]
		g.sendConn -= n
		g.st.sendWin -= n
	}
	if err := g.bw.Flush(); err != nil {
		return false, err
	}
	g.urgent = false
	for !g.st.ended {
		if err := g.readFrame(); err != nil {
			return false, err
		}
	}
	// Our half is still open when the server ended the stream before
	// reading all of the request: the connection goes.
	keep = len(rest) == 0
	st := &g.st
	if st.httpStatus != 200 {
		return false, fmt.Errorf("grpc: HTTP status %d", st.httpStatus)
	}
	switch {
	case st.grpcStatus < 0:
		return false, fmt.Errorf("%w: no grpc-status in the trailers", errGRPCProtocol)
	case st.grpcStatus != 0:
		msg, err := url.PathUnescape(st.grpcMessage)
		if err != nil {
			msg = st.grpcMessage
		}
		return keep, &grpcStatusError{Code: codes.Code(st.grpcStatus), Message: msg}
	}
	b := resp.Bytes()
	if len(b) < 5 {
		return false, fmt.Errorf("%w: an answer of %d bytes, no message", errGRPCProtocol, len(b))
	}
	if b[0] != 0 {
		return false, fmt.Errorf("%w: a compressed answer (flag %d), none asked for", errGRPCProtocol, b[0])
	}
	if n := binary.BigEndian.Uint32(b[1:5]); int64(n) != int64(len(b)-5) {
		return false, fmt.Errorf("%w: a message of %d bytes in %d bytes of DATA (one message per answer)", errGRPCProtocol, n, len(b)-5)
	}
	resp.Next(5)
	return keep, nil
}

// headerBlock returns the HPACK block of a call to path. The first call
// to a path inserts its fields into the peer's dynamic table (literals
// with incremental indexing, as grpc-go's and Envoy's clients send
// them); the second refers to them by index, and since that changes no
// table its bytes are kept for every later call, unless the fields do
// not fit in the table.
func (g *grpcConn) headerBlock(path string) []byte {
	if path == g.path && g.steady != nil {
		return g.steady
	}
	fields := [...]hpack.HeaderField{
		{Name: ":method", Value: "POST"},
		{Name: ":scheme", Value: "http"},
		{Name: ":path", Value: path},
		{Name: ":authority", Value: g.addr},
		{Name: "content-type", Value: "application/grpc"},
		{Name: "te", Value: "trailers"},
	}
	g.hbuf.Reset()
	size := uint32(0)
	for _, f := range fields {
		_ = g.enc.WriteField(f) // into a bytes.Buffer: no error
		size += f.Size()
	}
	if path == g.path && size <= g.tableSize {
		g.steady = bytes.Clone(g.hbuf.Bytes())
		return g.steady
	}
	g.path, g.steady = path, nil
	return g.hbuf.Bytes()
}

// readFrame reads and handles one frame. A WINDOW_UPDATE we owe goes
// out first: the peer may be waiting for it.
func (g *grpcConn) readFrame() error {
	if g.urgent {
		if err := g.bw.Flush(); err != nil {
			return err
		}
		g.urgent = false
	}
	f, err := g.fr.ReadFrame()
	if err != nil {
		return g.frameErr(err)
	}
	return g.handle(f)
}

// frameErr adds the Framer's detail to a connection error it returns.
func (g *grpcConn) frameErr(err error) error {
	var ce http2.ConnectionError
	if errors.As(err, &ce) {
		if d := g.fr.ErrorDetail(); d != nil {
			return fmt.Errorf("%w: %v: %v", errGRPCProtocol, err, d)
		}
		return fmt.Errorf("%w: %v", errGRPCProtocol, err)
	}
	return err
}

// handle acts on frame f. Acknowledgements of SETTINGS and PING wait in
// bw for the next write (the next call's request, at the latest): the
// peer needs them for nothing it waits on.
func (g *grpcConn) handle(f http2.Frame) error {
	st := &g.st
	switch f := f.(type) {
	case *http2.DataFrame:
		n := f.Length // padding included: it counts against the window
		g.recvConn += n
		if g.recvConn >= grpcWindow/4 {
			_ = g.fr.WriteWindowUpdate(0, g.recvConn)
			g.recvConn, g.urgent = 0, true
		}
		if f.StreamID != st.id || st.id == 0 || st.ended || st.blocks != 1 {
			return fmt.Errorf("%w: DATA on stream %d (open: %d, header blocks read %d)", errGRPCProtocol, f.StreamID, st.id, st.blocks)
		}
		if st.body.Len()+len(f.Data()) > grpcMaxMessage+5 {
			return fmt.Errorf("grpc: an answer over %d bytes", grpcMaxMessage)
		}
		st.body.Write(f.Data())
		if f.StreamEnded() {
			st.ended = true
			return nil
		}
		st.recvUnacked += n
		if st.recvUnacked >= grpcWindow/4 {
			_ = g.fr.WriteWindowUpdate(st.id, st.recvUnacked)
			st.recvUnacked, g.urgent = 0, true
		}
	case *http2.HeadersFrame:
		if f.StreamID != st.id || st.id == 0 || st.ended || st.blocks >= 2 {
			return fmt.Errorf("%w: HEADERS on stream %d (open: %d, header blocks read %d)", errGRPCProtocol, f.StreamID, st.id, st.blocks)
		}
		if err := g.readHeaders(f); err != nil {
			return err
		}
		st.blocks++
		if f.StreamEnded() {
			st.ended = true
		} else if st.blocks == 2 {
			return fmt.Errorf("%w: trailers without END_STREAM", errGRPCProtocol)
		}
	case *http2.SettingsFrame:
		if f.IsAck() {
			return nil
		}
		err := f.ForeachSetting(func(s http2.Setting) error {
			if err := s.Valid(); err != nil {
				return fmt.Errorf("%w: %v", errGRPCProtocol, err)
			}
			switch s.ID {
			case http2.SettingInitialWindowSize:
				st.sendWin += int64(s.Val) - g.peerInit // an open stream's window moves with it
				g.peerInit = int64(s.Val)
			case http2.SettingMaxFrameSize:
				g.peerFrame = int(s.Val)
			case http2.SettingHeaderTableSize:
				g.tableSize = min(s.Val, hpackInitialTable)
				g.enc.SetMaxDynamicTableSizeLimit(s.Val)
				g.path, g.steady = "", nil
			}
			return nil
		})
		if err != nil {
			return err
		}
		_ = g.fr.WriteSettingsAck()
	case *http2.PingFrame:
		if !f.IsAck() {
			_ = g.fr.WritePing(true, f.Data)
		}
	case *http2.WindowUpdateFrame:
		switch f.StreamID {
		case 0:
			g.sendConn += int64(f.Increment)
			if g.sendConn > 1<<31-1 {
				return fmt.Errorf("%w: connection window over 2^31-1", errGRPCProtocol)
			}
		case st.id:
			st.sendWin += int64(f.Increment)
			if st.sendWin > 1<<31-1 {
				return fmt.Errorf("%w: stream window over 2^31-1", errGRPCProtocol)
			}
		} // a closed stream's: ignored
	case *http2.RSTStreamFrame:
		if f.StreamID == st.id && st.id != 0 {
			return fmt.Errorf("%w: %v", errGRPCReset, f.ErrCode)
		}
	case *http2.GoAwayFrame:
		g.goaway = true
		if st.id == 0 || st.id > f.LastStreamID {
			return fmt.Errorf("%w: GOAWAY %v before stream %d: %q", errGRPCGoAway, f.ErrCode, st.id, f.DebugData())
		}
		// The call was taken and may finish; the connection closes after it.
	case *http2.PushPromiseFrame:
		return fmt.Errorf("%w: PUSH_PROMISE, push disabled", errGRPCProtocol)
	case *http2.ContinuationFrame:
		return fmt.Errorf("%w: CONTINUATION out of a header block", errGRPCProtocol) // the Framer rejects it first
	}
	// PRIORITY and unknown frame types are ignored.
	return nil
}

// readHeaders decodes the block that starts in f, with its CONTINUATION
// frames, into g.st (by onField). Every block must be decoded, the ones
// we need nothing from included: HPACK's table is the connection's.
func (g *grpcConn) readHeaders(f *http2.HeadersFrame) error {
	g.st.hdrBytes, g.st.hdrErr = 0, nil
	if _, err := g.dec.Write(f.HeaderBlockFragment()); err != nil {
		return fmt.Errorf("%w: HPACK: %v", errGRPCProtocol, err)
	}
	for ended := f.HeadersEnded(); !ended; {
		next, err := g.fr.ReadFrame()
		if err != nil {
			return g.frameErr(err)
		}
		c, ok := next.(*http2.ContinuationFrame)
		if !ok { // the Framer allows nothing else here
			return fmt.Errorf("%w: %v inside a header block", errGRPCProtocol, next.Header())
		}
		if _, err := g.dec.Write(c.HeaderBlockFragment()); err != nil {
			return fmt.Errorf("%w: HPACK: %v", errGRPCProtocol, err)
		}
		ended = c.HeadersEnded()
	}
	if err := g.dec.Close(); err != nil {
		return fmt.Errorf("%w: HPACK: %v", errGRPCProtocol, err)
	}
	return g.st.hdrErr
}

// onField takes one decoded header field of the open stream's answer.
func (g *grpcConn) onField(f hpack.HeaderField) {
	st := &g.st
	if st.hdrErr != nil {
		return
	}
	st.hdrBytes += int(f.Size())
	if st.hdrBytes > grpcMaxHeaders {
		st.hdrErr = fmt.Errorf("grpc: a header list over %d bytes", grpcMaxHeaders)
		return
	}
	first := st.blocks == 0
	switch f.Name {
	case ":status":
		n, err := strconv.Atoi(f.Value)
		if !first || err != nil || st.httpStatus != 0 {
			st.hdrErr = fmt.Errorf("%w: :status %q in header block %d", errGRPCProtocol, f.Value, st.blocks+1)
			return
		}
		st.httpStatus = n
	case "content-type":
		if first && !isGRPCContentType(f.Value) {
			st.hdrErr = fmt.Errorf("%w: content-type %q", errGRPCProtocol, f.Value)
		}
	case "grpc-status":
		n, err := strconv.Atoi(f.Value)
		if err != nil || n < 0 {
			st.hdrErr = fmt.Errorf("%w: grpc-status %q", errGRPCProtocol, f.Value)
			return
		}
		st.grpcStatus = n
	case "grpc-message":
		st.grpcMessage = f.Value
	}
}

// isGRPCContentType reports whether v is application/grpc, alone or with
// a subtype ("application/grpc+proto").
func isGRPCContentType(v string) bool {
	const ct = "application/grpc"
	if len(v) < len(ct) || v[:len(ct)] != ct {
		return false
	}
	return len(v) == len(ct) || v[len(ct)] == '+' || v[len(ct)] == ';'
}
