package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"time"
)

// httpConn is one worker's keep-alive HTTP/1.1 connection, written and
// read by hand: requests are encoded once before a phase, and an answer
// is its status, its body and nothing else. On this 2-core machine
// net/http's client cost about as much CPU per request as the servers'
// answers (40 µs), so it, not the server, would set the pace; this costs
// a fraction of that, and the same for both systems. It is not safe for
// concurrent use.
type httpConn struct {
	addr string
	c    net.Conn
	br   *bufio.Reader
}

// httpRequest encodes a request: a POST with a JSON body, or a GET when
// body is nil. Its Host is "bench": neither server looks at it, so one
// encoding serves every node.
func httpRequest(method, path string, body []byte) []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, "%s %s HTTP/1.1\r\nHost: bench\r\n", method, path)
	if body != nil {
		fmt.Fprintf(&b, "Content-Type: application/json\r\nContent-Length: %d\r\n", len(body))
	}
	b.WriteString("\r\n")
	b.Write(body)
	return b.Bytes()
}

// roundTrip sends req and reads the answer's body into body (reset
// first); it returns the status code. A failed exchange closes the
// connection; the next call dials again.
//
// When ctx ends, the exchange in progress fails at once.
func (h *httpConn) roundTrip(ctx context.Context, req []byte, body *bytes.Buffer, timeout time.Duration) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	if h.c == nil {
		var dl net.Dialer
		c, err := dl.DialContext(ctx, "tcp", h.addr)
		if err != nil {
			return 0, err
		}
		h.c = c
		if h.br == nil {
			h.br = bufio.NewReaderSize(c, 16<<10)
		} else {
			h.br.Reset(c)
		}
	}
	c := h.c
	_ = c.SetDeadline(time.Now().Add(timeout))
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Unix(1, 0)) })
	code, keep, err := h.exchange(req, body)
	stop()
	if err != nil || !keep {
		h.close()
	}
	return code, err
}

func (h *httpConn) close() {
	if h.c != nil {
		_ = h.c.Close()
		h.c = nil
	}
}

func (h *httpConn) exchange(req []byte, body *bytes.Buffer) (code int, keep bool, err error) {
	if _, err := h.c.Write(req); err != nil {
		return 0, false, err
	}
	return readResponse(h.br, body)
}

var (
	crlf      = []byte("\r\n")
	hdrLength = []byte("content-length:")
	hdrTE     = []byte("transfer-encoding:")
	hdrConn   = []byte("connection:")
)

// readResponse reads one HTTP/1.1 response from br: the status code, the
// body into body (Content-Length or chunked), and whether the connection
// stays open.
func readResponse(br *bufio.Reader, body *bytes.Buffer) (code int, keep bool, err error) {
	line, err := readLine(br)
	if err != nil {
		return 0, false, err
	}
	// "HTTP/1.1 200 OK"
	if len(line) < 12 || !bytes.HasPrefix(line, []byte("HTTP/1.")) || line[8] != ' ' {
		return 0, false, fmt.Errorf("http: bad status line %q", line)
	}
	code, err = strconv.Atoi(string(line[9:12]))
	if err != nil {
		return 0, false, fmt.Errorf("http: bad status line %q", line)
	}
	keep = line[7] == '1' // HTTP/1.0 closes unless told otherwise; ignored: both servers speak 1.1
	length, chunked := -1, false
	for {
		line, err = readLine(br)
		if err != nil {
			return 0, false, err
		}
		if len(line) == 0 {
			break
		}
		lower := bytes.ToLower(line)
		switch {
		case bytes.HasPrefix(lower, hdrLength):
			length, err = strconv.Atoi(string(bytes.TrimSpace(line[len(hdrLength):])))
			if err != nil || length < 0 {
				return 0, false, fmt.Errorf("http: bad %q", line)
			}
		case bytes.HasPrefix(lower, hdrTE):
			chunked = bytes.Contains(lower, []byte("chunked"))
		case bytes.HasPrefix(lower, hdrConn):
			if bytes.Contains(lower, []byte("close")) {
				keep = false
			}
		}
	}
	body.Reset()
	switch {
	case chunked:
		for {
			line, err = readLine(br)
			if err != nil {
				return 0, false, err
			}
			if i := bytes.IndexByte(line, ';'); i >= 0 {
				line = line[:i]
			}
			n, err := strconv.ParseUint(string(bytes.TrimSpace(line)), 16, 31)
			if err != nil {
				return 0, false, fmt.Errorf("http: bad chunk size %q", line)
			}
			if n == 0 {
				for { // trailers, then the blank line
					line, err = readLine(br)
					if err != nil {
						return 0, false, err
					}
					if len(line) == 0 {
						return code, keep, nil
					}
				}
			}
			if _, err := io.CopyN(body, br, int64(n)); err != nil {
				return 0, false, err
			}
			if line, err = readLine(br); err != nil || len(line) != 0 {
				return 0, false, errors.New("http: no CRLF after a chunk")
			}
		}
	case length >= 0:
		if _, err := io.CopyN(body, br, int64(length)); err != nil {
			return 0, false, err
		}
	default: // the body runs to the end of the connection
		if _, err := io.Copy(body, br); err != nil {
			return 0, false, err
		}
		keep = false
	}
	return code, keep, nil
}

// readLine reads a line without its CRLF; the slice is valid until the
// next read.
func readLine(br *bufio.Reader) ([]byte, error) {
	line, err := br.ReadSlice('\n')
	if err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(line[:len(line)-1], crlf[:1]), nil
}
