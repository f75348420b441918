package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
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
type bounded struct {
	h     http.Handler
	write time.Duration
}

func (b bounded) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rc := http.NewResponseController(w)
	_ = rc.SetWriteDeadline(time.Now().Add(b.write))
	whole := true
	if r.Body != nil && r.Body != http.NoBody {
		// One byte over the API's cap, so that it still refuses the body
		// as too large (400) rather than reading a truncated one.
		body, err := io.ReadAll(io.LimitReader(r.Body, httpapi.MaxBodyBytes+1))
		if err != nil {
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
		whole = len(body) <= httpapi.MaxBodyBytes
		r.Body = io.NopCloser(bytes.NewReader(body))
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
