package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// rawCodec passes encoded messages through, for grpc-go's server in the
// tests and its client in the benchmark. Its name is "proto", so servers
// decode them as the protobuf messages they are.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) {
	b, ok := v.(*[]byte)
	if !ok {
		return nil, fmt.Errorf("rawCodec: marshal %T, want *[]byte", v)
	}
	return *b, nil
}

func (rawCodec) Unmarshal(data []byte, v any) error {
	b, ok := v.(*[]byte)
	if !ok {
		return fmt.Errorf("rawCodec: unmarshal into %T, want *[]byte", v)
	}
	*b = append((*b)[:0], data...)
	return nil
}

func (rawCodec) Name() string { return "proto" }

// The methods of the test server (any service name would do).
const (
	echoMethod = "/t.T/Echo" // answers the request
	failMethod = "/t.T/Fail" // grpc-status RESOURCE_EXHAUSTED, failMessage
	bigMethod  = "/t.T/Big"  // answers bigAnswer(n), n the request's first 4 bytes
	hangMethod = "/t.T/Hang" // answers when released, or ends with the call
)

const failMessage = "no more: 100% used"

// bigAnswer is n bytes that tell their positions apart.
func bigAnswer(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7 + i>>13)
	}
	return b
}

// testServer is grpc-go's server on 127.0.0.1, every method handled by
// one unary handler through rawCodec, behind a listener that keeps the
// connections it accepted.
type testServer struct {
	addr    string
	release chan struct{} // closed by the test's cleanup: hangMethod answers
	mu      sync.Mutex
	conns   []net.Conn
}

type trackingListener struct {
	net.Listener
	s *testServer
}

func (l trackingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.s.mu.Lock()
		l.s.conns = append(l.s.conns, c)
		l.s.mu.Unlock()
	}
	return c, err
}

// accepted is the number of connections accepted so far.
func (s *testServer) accepted() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.conns)
}

// cut closes the server's side of every connection.
func (s *testServer) cut() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.conns {
		_ = c.Close()
	}
}

func handleTestCall(release <-chan struct{}) grpc.StreamHandler {
	return func(_ any, ss grpc.ServerStream) error {
		method, _ := grpc.MethodFromServerStream(ss)
		var req []byte
		if err := ss.RecvMsg(&req); err != nil {
			return err
		}
		var resp []byte
		switch method {
		case echoMethod:
			resp = req
		case failMethod:
			return status.Error(codes.ResourceExhausted, failMessage)
		case bigMethod:
			if len(req) < 4 {
				return status.Error(codes.InvalidArgument, "want a 4-byte size")
			}
			resp = bigAnswer(int(binary.BigEndian.Uint32(req)))
		case hangMethod:
			select {
			case <-release:
			case <-ss.Context().Done():
				return ss.Context().Err()
			}
		default:
			return status.Errorf(codes.Unimplemented, "no %s", method)
		}
		return ss.SendMsg(&resp)
	}
}

func startTestServer(t *testing.T) *testServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &testServer{addr: ln.Addr().String(), release: make(chan struct{})}
	srv := grpc.NewServer(grpc.ForceServerCodec(rawCodec{}), grpc.UnknownServiceHandler(handleTestCall(s.release)))
	go func() { _ = srv.Serve(trackingListener{ln, s}) }()
	t.Cleanup(func() {
		close(s.release)
		srv.Stop()
	})
	return s
}

func callOK(t *testing.T, g *grpcConn, path string, req []byte) []byte {
	t.Helper()
	var resp bytes.Buffer
	if err := g.call(context.Background(), path, req, &resp, 10*time.Second); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return resp.Bytes()
}

// TestGRPCConnRoundTrip: the answers' bytes come back on one connection,
// call after call, past the first calls' header blocks (literals, then
// indexed), with another method between.
func TestGRPCConnRoundTrip(t *testing.T) {
	s := startTestServer(t)
	g := &grpcConn{addr: s.addr}
	defer g.close()
	for i := range 20 {
		req := guberRequest(tputLimit, fmt.Sprintf("key-%d", i))
		if i == 7 {
			req = nil // an empty message
		}
		if got := callOK(t, g, echoMethod, req); !bytes.Equal(got, req) {
			t.Fatalf("call %d: answer %x, want %x", i, got, req)
		}
		if i == 2 && g.steady == nil {
			t.Fatal("after three calls to one method the header block is not kept")
		}
		if i == 12 { // another path: encoded again, then Echo's again
			n := []byte{0, 0, 0, 9}
			if got := callOK(t, g, bigMethod, n); !bytes.Equal(got, bigAnswer(9)) {
				t.Fatalf("Big(9) = %x", got)
			}
		}
	}
	if got := s.accepted(); got != 1 {
		t.Fatalf("%d connections for 21 calls, want 1", got)
	}
	if g.nextID != 1+2*21 {
		t.Fatalf("next stream %d after 21 calls, want 43", g.nextID)
	}
}

// TestGRPCConnStatusError: a non-zero grpc-status fails the call with an
// error that names it and carries the message; the connection stays.
func TestGRPCConnStatusError(t *testing.T) {
	s := startTestServer(t)
	g := &grpcConn{addr: s.addr}
	defer g.close()
	var resp bytes.Buffer
	err := g.call(context.Background(), failMethod, []byte("x"), &resp, 10*time.Second)
	var se *grpcStatusError
	if !errors.As(err, &se) || se.Code != codes.ResourceExhausted || se.Message != failMessage {
		t.Fatalf("Fail: %v (%#v), want RESOURCE_EXHAUSTED %q", err, se, failMessage)
	}
	if !strings.Contains(err.Error(), "grpc-status 8 (ResourceExhausted)") {
		t.Fatalf("the error %q does not name the status", err)
	}
	if got := callOK(t, g, echoMethod, []byte("after")); string(got) != "after" {
		t.Fatalf("Echo after the failure = %q", got)
	}
	if got := s.accepted(); got != 1 {
		t.Fatalf("%d connections, want the first one kept", got)
	}
}

// TestGRPCConnFlowControl: a request larger than the server's initial
// window waits for its WINDOW_UPDATEs, and answers larger than ours are
// read to the end, time after time, on one connection.
func TestGRPCConnFlowControl(t *testing.T) {
	s := startTestServer(t)
	g := &grpcConn{addr: s.addr}
	defer g.close()
	big := bigAnswer(3 << 20) // under grpc-go's 4 MiB receive limit, 48 × its 64 KiB window
	if got := callOK(t, g, echoMethod, big); !bytes.Equal(got, big) {
		t.Fatalf("Echo of 3 MiB: %d bytes back, or different ones", len(got))
	}
	for _, n := range []int{5 << 20, grpcWindow + 1, 7 << 20} { // 12 MiB over a 1 MiB connection window
		req := binary.BigEndian.AppendUint32(nil, uint32(n))
		if got := callOK(t, g, bigMethod, req); !bytes.Equal(got, bigAnswer(n)) {
			t.Fatalf("Big(%d): %d bytes back, or different ones", n, len(got))
		}
	}
	if got := s.accepted(); got != 1 {
		t.Fatalf("%d connections, want 1", got)
	}
}

// TestGRPCConnRedials: the server closes the connection; the call that
// finds it closed fails, and the next dials again.
func TestGRPCConnRedials(t *testing.T) {
	s := startTestServer(t)
	g := &grpcConn{addr: s.addr}
	defer g.close()
	callOK(t, g, echoMethod, []byte("one"))
	s.cut()
	var resp bytes.Buffer
	if err := g.call(context.Background(), echoMethod, []byte("two"), &resp, 10*time.Second); err == nil {
		t.Fatal("a call on a connection the server closed succeeded")
	}
	if g.c != nil {
		t.Fatal("the failed connection is still kept")
	}
	if got := callOK(t, g, echoMethod, []byte("three")); string(got) != "three" {
		t.Fatalf("after the redial: %q", got)
	}
	if got := s.accepted(); got != 2 {
		t.Fatalf("%d connections accepted, want 2", got)
	}
}

// TestGRPCConnDeadline: the context's deadline cuts a call the server
// does not answer, and the connection goes.
func TestGRPCConnDeadline(t *testing.T) {
	s := startTestServer(t)
	g := &grpcConn{addr: s.addr}
	defer g.close()
	callOK(t, g, echoMethod, []byte("warm"))
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	var resp bytes.Buffer
	start := time.Now()
	err := g.call(ctx, hangMethod, nil, &resp, 10*time.Second)
	if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 3*time.Second {
		t.Fatalf("Hang: %v after %v, want the deadline's error at once", err, time.Since(start))
	}
	if g.c != nil {
		t.Fatal("the cut connection is still kept")
	}
	// The timeout argument does the same without a deadline in ctx.
	start = time.Now()
	err = g.call(context.Background(), hangMethod, nil, &resp, 100*time.Millisecond)
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() || time.Since(start) > 3*time.Second {
		t.Fatalf("Hang with a timeout: %v after %v, want a timeout", err, time.Since(start))
	}
}

// fakeH2Server accepts HTTP/2 connections, answers the preface with
// empty SETTINGS and, for every request (HEADERS, then DATA with
// END_STREAM), calls answer with a header encoder of its own.
func fakeH2Server(t *testing.T, answer func(fr *http2.Framer, hdr func(kv ...string) []byte, id uint32)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				if _, err := io.ReadFull(br, make([]byte, len(http2.ClientPreface))); err != nil {
					return
				}
				fr := http2.NewFramer(c, br)
				fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
				var hb bytes.Buffer
				enc := hpack.NewEncoder(&hb)
				hdr := func(kv ...string) []byte {
					hb.Reset()
					for i := 0; i+1 < len(kv); i += 2 {
						_ = enc.WriteField(hpack.HeaderField{Name: kv[i], Value: kv[i+1]})
					}
					return bytes.Clone(hb.Bytes())
				}
				if fr.WriteSettings() != nil {
					return
				}
				for {
					f, err := fr.ReadFrame()
					if err != nil {
						return
					}
					if d, ok := f.(*http2.DataFrame); ok && d.StreamEnded() {
						answer(fr, hdr, d.StreamID)
					}
				}
			}()
		}
	}()
	return ln.Addr().String()
}

// TestGRPCConnFailures: a server's misbehaviour fails the call and
// closes the connection; a GOAWAY that leaves the call in lets it end.
func TestGRPCConnFailures(t *testing.T) {
	msg := []byte{0, 0, 0, 0, 2, 'o', 'k'}
	okHeaders := []string{":status", "200", "content-type", "application/grpc"}
	for _, c := range []struct {
		name   string
		answer func(fr *http2.Framer, hdr func(kv ...string) []byte, id uint32)
		want   error  // errors.Is, or nil
		text   string // in the error
		ok     bool   // the call succeeds (and the connection closes after it)
	}{
		{name: "reset", want: errGRPCReset, text: "REFUSED_STREAM", answer: func(fr *http2.Framer, _ func(...string) []byte, id uint32) {
			_ = fr.WriteRSTStream(id, http2.ErrCodeRefusedStream)
		}},
		{name: "goaway before the call", want: errGRPCGoAway, text: "ENHANCE_YOUR_CALM", answer: func(fr *http2.Framer, _ func(...string) []byte, id uint32) {
			_ = fr.WriteGoAway(0, http2.ErrCodeEnhanceYourCalm, []byte("slow down"))
		}},
		{name: "goaway after the call", ok: true, answer: func(fr *http2.Framer, hdr func(...string) []byte, id uint32) {
			_ = fr.WriteGoAway(id, http2.ErrCodeNo, nil)
			_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: hdr(okHeaders...), EndHeaders: true})
			_ = fr.WriteData(id, false, msg)
			_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: hdr("grpc-status", "0"), EndHeaders: true, EndStream: true})
		}},
		{name: "DATA on stream 0", want: errGRPCProtocol, answer: func(fr *http2.Framer, _ func(...string) []byte, _ uint32) {
			fr.AllowIllegalWrites = true
			_ = fr.WriteData(0, false, []byte("x"))
		}},
		{name: "DATA before HEADERS", want: errGRPCProtocol, answer: func(fr *http2.Framer, _ func(...string) []byte, id uint32) {
			_ = fr.WriteData(id, true, msg)
		}},
		{name: "bad HPACK", want: errGRPCProtocol, text: "HPACK", answer: func(fr *http2.Framer, _ func(...string) []byte, id uint32) {
			_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, EndHeaders: true})
		}},
		{name: "no grpc-status", want: errGRPCProtocol, text: "no grpc-status", answer: func(fr *http2.Framer, hdr func(...string) []byte, id uint32) {
			_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: hdr(okHeaders...), EndHeaders: true})
			_ = fr.WriteData(id, false, msg)
			_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: hdr("x-other", "1"), EndHeaders: true, EndStream: true})
		}},
		{name: "HTTP 503", text: "HTTP status 503", answer: func(fr *http2.Framer, hdr func(...string) []byte, id uint32) {
			_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: hdr(":status", "503"), EndHeaders: true, EndStream: true})
		}},
		{name: "not gRPC", want: errGRPCProtocol, text: "text/html", answer: func(fr *http2.Framer, hdr func(...string) []byte, id uint32) {
			_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: hdr(":status", "200", "content-type", "text/html"), EndHeaders: true, EndStream: true})
		}},
		{name: "a message cut short", want: errGRPCProtocol, text: "a message of 9 bytes", answer: func(fr *http2.Framer, hdr func(...string) []byte, id uint32) {
			_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: hdr(okHeaders...), EndHeaders: true})
			_ = fr.WriteData(id, false, []byte{0, 0, 0, 0, 9, 'o', 'k'})
			_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: hdr("grpc-status", "0"), EndHeaders: true, EndStream: true})
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			g := &grpcConn{addr: fakeH2Server(t, c.answer)}
			defer g.close()
			var resp bytes.Buffer
			err := g.call(context.Background(), echoMethod, []byte("hi"), &resp, 5*time.Second)
			switch {
			case c.ok:
				if err != nil || resp.String() != "ok" {
					t.Fatalf("answer %q, %v; want \"ok\"", resp.String(), err)
				}
			case err == nil:
				t.Fatalf("no error (answer %q)", resp.String())
			case c.want != nil && !errors.Is(err, c.want):
				t.Fatalf("error %v, want %v", err, c.want)
			case !strings.Contains(err.Error(), c.text):
				t.Fatalf("error %q does not say %q", err, c.text)
			}
			if g.c != nil {
				t.Fatal("the connection is kept")
			}
		})
	}
}

func TestIsGRPCContentType(t *testing.T) {
	for v, want := range map[string]bool{
		"application/grpc": true, "application/grpc+proto": true, "application/grpc;x=1": true,
		"application/grpcx": false, "application/json": false, "": false,
	} {
		if got := isGRPCContentType(v); got != want {
			t.Errorf("isGRPCContentType(%q) = %v, want %v", v, got, want)
		}
	}
}
