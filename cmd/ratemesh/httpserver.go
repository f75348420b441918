package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"golang.org/x/net/netutil"

	"github.com/ratemesh/ratemesh/config"
	"github.com/ratemesh/ratemesh/httpapi"
)

// maxWait is the longest /v1/wait holds a request (httpapi.Config.MaxWait):
// its write deadline leaves room for it.
const maxWait = 30 * time.Second

// newAPIServer returns the API's HTTP server with the bounds of node.http:
// requests are read within ReadTimeout (headers and body), answered within
// WriteTimeout (plus the wait of /v1/wait), idle keep-alive connections
// close after IdleTimeout, headers are capped at MaxHeaderBytes. Serve it
// on limitConns(ln, cfg).
func newAPIServer(cfg config.HTTP, h http.Handler, log *slog.Logger) *http.Server {
	return &http.Server{
		Handler:        bounded{h: h, write: cfg.WriteTimeout},
		ReadTimeout:    cfg.ReadTimeout, // ReadHeaderTimeout 0: headers count against ReadTimeout
		IdleTimeout:    cfg.IdleTimeout,
		MaxHeaderBytes: cfg.MaxHeaderBytes,
		ErrorLog:       slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
}

// limitConns bounds the connections ln hands out at once to
// cfg.MaxConns: further ones wait in the listen backlog until one closes.
func limitConns(ln net.Listener, cfg config.HTTP) net.Listener {
	return netutil.LimitListener(ln, cfg.MaxConns)
}

// bounded reads a request's whole body under the server's read deadline
// before h sees it, then sets the time h has to answer.
//
// Reading first matters: net/http cancels a request's context when the
// connection's read deadline passes while its handler runs, which would
// cut every /v1/wait at ReadTimeout. Once the body is in, the read
// deadline is lifted and the write deadline (WriteTimeout, plus maxWait
// on /v1/wait) bounds the rest; a client too slow to send its body gets
// 408 and its connection closed.
//
// The body goes to h as a wholeBody from a pool, which the API decodes in
// place (httpapi reads a body with a Bytes method without copying it),
// and the request's own body, read to its end, is closed, so that
// net/http has nothing left to discard after the answer.
type bounded struct {
	h     http.Handler
	write time.Duration
}

// wholeBody is a request body read whole: its Bytes are what is left
// unread. h must not keep it past its return: it goes back to the pool.
type wholeBody struct {
	bytes.Buffer
	lr io.LimitedReader // reads the request's body, here not to allocate one per request
}

func (*wholeBody) Close() error { return nil }

// maxPooledBody is the largest body buffer kept for the next request: a
// body near the API's cap is rare, and keeping its buffer would hold the
// memory.
const maxPooledBody = 16 << 10

var wholeBodies = sync.Pool{New: func() any { return new(wholeBody) }}

// release puts b back in the pool, unless its buffer grew past
// maxPooledBody.
func (b *wholeBody) release() {
	if b.Cap() <= maxPooledBody {
		wholeBodies.Put(b)
	}
}

func (b bounded) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rc := http.NewResponseController(w)
	whole := true
	if r.Body != nil && r.Body != http.NoBody {
		if len(r.Header["Expect"]) > 0 {
			// net/http writes 100 Continue as the body is read: under
			// this request's write deadline, not the one before's.
			_ = rc.SetWriteDeadline(time.Now().Add(b.write))
		}
		orig := r.Body
		wb := wholeBodies.Get().(*wholeBody)
		wb.Reset()
		// One byte over the API's cap, so that it still refuses the body
		// as too large (400) rather than reading a truncated one.
		wb.lr = io.LimitedReader{R: orig, N: httpapi.MaxBodyBytes + 1}
		_, err := wb.ReadFrom(&wb.lr)
		wb.lr.R = nil
		if err != nil {
			wb.release()
			_ = rc.SetWriteDeadline(time.Now().Add(b.write))
			w.Header().Set("Connection", "close")
			status, msg := http.StatusBadRequest, "body: "+err.Error()
			if ne, ok := errors.AsType[net.Error](err); ok && ne.Timeout() {
				status, msg = http.StatusRequestTimeout, "body: not received within node.http.read_timeout"
			}
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(status)
			_ = json.NewEncoder(w).Encode(httpapi.ErrorResponse{Error: msg})
			return
		}
		whole = wb.Len() <= httpapi.MaxBodyBytes
		if whole {
			// Read to its end: closing it tells net/http so.
			_ = orig.Close()
		}
		r.Body = wb
		defer func() {
			r.Body = orig // net/http looks at it once h has returned
			wb.release()
		}()
	}
	if whole {
		// The request is in. (Over the cap, the read deadline stays: the
		// server discards the rest of the body under it.)
		_ = rc.SetReadDeadline(time.Time{})
	}
	d := b.write
	if r.URL.Path == "/v1/wait" {
		d += maxWait + time.Second // the API's own margin past max_wait_ms
	}
	_ = rc.SetWriteDeadline(time.Now().Add(d))
	b.h.ServeHTTP(w, r)
}
