package main

import (
	"bufio"
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

func TestReadResponse(t *testing.T) {
	for _, c := range []struct {
		name, raw, body string
		code            int
		keep            bool
	}{
		{"length", "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Type: application/json\r\n\r\nhello", "hello", 200, true},
		{"chunked", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3;x=y\r\nhel\r\n2\r\nlo\r\n0\r\nTrailer: t\r\n\r\n", "hello", 200, true},
		{"close", "HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nContent-Length: 2\r\n\r\nno", "no", 503, false},
		{"to the end", "HTTP/1.1 200 OK\r\n\r\nall of it", "all of it", 200, false},
	} {
		var body bytes.Buffer
		code, keep, err := readResponse(bufio.NewReader(strings.NewReader(c.raw)), &body)
		if err != nil || code != c.code || keep != c.keep || body.String() != c.body {
			t.Errorf("%s: %d %v %q %v; want %d %v %q", c.name, code, keep, body.String(), err, c.code, c.keep, c.body)
		}
	}
	for _, bad := range []string{"", "HTTP/1.1 2x0 OK\r\n\r\n", "SIP/2.0 200 OK\r\n\r\n", "HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
		"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nshort", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"} {
		var body bytes.Buffer
		if _, _, err := readResponse(bufio.NewReader(strings.NewReader(bad)), &body); err == nil {
			t.Errorf("readResponse(%q): no error", bad)
		}
	}
}

// TestHTTPConnAgainstNetHTTP runs the hand-written client against Go's
// server: keep-alive, a closed connection redialled, a POST's body, and
// an exchange cut short when its context ends.
func TestHTTPConnAgainstNetHTTP(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/echo":
			var b bytes.Buffer
			_, _ = b.ReadFrom(r.Body)
			_, _ = w.Write(b.Bytes())
		case "/close":
			w.Header().Set("Connection", "close")
			_, _ = w.Write([]byte("bye"))
		case "/big":
			w.Header().Set("Content-Type", "text/plain")
			for range 100 { // chunked: no Content-Length, flushed
				_, _ = w.Write(bytes.Repeat([]byte("x"), 1000))
				w.(http.Flusher).Flush()
			}
		case "/hang":
			<-release
		}
	}))
	defer srv.Close()
	defer close(release)
	h := &httpConn{addr: strings.TrimPrefix(srv.URL, "http://")}
	defer h.close()
	var body bytes.Buffer
	ctx := context.Background()
	roundTrip := func(req []byte) (int, string) {
		t.Helper()
		code, err := h.roundTrip(ctx, req, &body, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		return code, body.String()
	}
	if code, got := roundTrip(httpRequest("POST", "/echo", []byte(`{"a":1}`))); code != 200 || got != `{"a":1}` {
		t.Fatalf("echo: %d %q", code, got)
	}
	first := h.c
	if code, got := roundTrip(httpRequest("GET", "/close", nil)); code != 200 || got != "bye" || h.c != nil {
		t.Fatalf("close: %d %q, conn %v", code, got, h.c)
	}
	if code, got := roundTrip(httpRequest("GET", "/big", nil)); code != 200 || len(got) != 100_000 {
		t.Fatalf("big: %d, %d bytes", code, len(got))
	}
	if h.c == nil || h.c == first {
		t.Fatal("no new keep-alive connection after the close")
	}
	cctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := h.roundTrip(cctx, httpRequest("GET", "/hang", nil), &body, 10*time.Second)
	if err == nil || time.Since(start) > 3*time.Second {
		t.Fatalf("hang: %v after %v, want an error as the context ends", err, time.Since(start))
	}
	if h.c != nil {
		t.Fatal("the cut connection is still kept")
	}
}
