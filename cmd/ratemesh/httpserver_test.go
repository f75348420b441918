package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ratemesh/ratemesh/config"
	"github.com/ratemesh/ratemesh/httpapi"
	"github.com/ratemesh/ratemesh/internal/apitest"
	"github.com/ratemesh/ratemesh/limiter"
)

// seen is what a handler behind bounded saw of one request's body.
type seen struct {
	whole bool   // the body had Bytes
	body  string // its bytes
	err   error  // a read of it failed
}

// boundedServer serves bounded over a recording handler on loopback with
// the default node.http settings, and returns its URL and what the
// handler saw, request by request.
func boundedServer(t *testing.T) (string, func() []seen) {
	t.Helper()
	var mu sync.Mutex
	var got []seen
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var s seen
		if wb, ok := r.Body.(interface{ Bytes() []byte }); ok {
			s.whole, s.body = true, string(wb.Bytes())
		} else {
			b, err := io.ReadAll(r.Body)
			s.body, s.err = string(b), err
		}
		mu.Lock()
		got = append(got, s)
		mu.Unlock()
		_, _ = io.WriteString(w, "ok")
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg := config.Default().Node.HTTP
	srv := newAPIServer(cfg, h, slog.New(slog.DiscardHandler))
	go func() { _ = srv.Serve(limitConns(ln, cfg)) }()
	t.Cleanup(func() { _ = srv.Close() })
	return "http://" + ln.Addr().String(), func() []seen {
		mu.Lock()
		defer mu.Unlock()
		return append([]seen(nil), got...)
	}
}

// TestBoundedBodies: bounded hands the handler every body whole, as a
// body with Bytes, over one keep-alive connection (closing the request's
// own body once read leaves net/http nothing to discard, and the
// connection is reused); with Expect: 100-continue too; a body over the
// API's cap comes with one byte more than the cap, and the rest is
// discarded by net/http (the connection goes on).
func TestBoundedBodies(t *testing.T) {
	url, got := boundedServer(t)
	var reused []bool
	ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{
		GotConn: func(i httptrace.GotConnInfo) { reused = append(reused, i.Reused) },
	})
	client := &http.Client{Transport: &http.Transport{MaxConnsPerHost: 1, ExpectContinueTimeout: 5 * time.Second}}
	defer client.CloseIdleConnections()
	bodies := []string{`{"rule":"a","key":"1"}`, "", strings.Repeat("x", httpapi.MaxBodyBytes), `{"rule":"a","key":"2"}`}
	for i, b := range bodies {
		req, err := http.NewRequestWithContext(ctx, "POST", url+"/v1/allow", strings.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		if i == 3 {
			req.Header.Set("Expect", "100-continue")
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("body %d: %v", i, err)
		}
		answer, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || string(answer) != "ok" {
			t.Fatalf("body %d: %d %q", i, resp.StatusCode, answer)
		}
	}
	want := []bool{false, true, true, true}
	if fmt.Sprint(reused) != fmt.Sprint(want) {
		t.Errorf("connections reused %v, want %v (one keep-alive connection)", reused, want)
	}
	s := got()
	if len(s) != len(bodies) {
		t.Fatalf("handler saw %d requests, want %d", len(s), len(bodies))
	}
	for i, b := range bodies {
		if i == 1 {
			// An empty body is http.NoBody, which bounded leaves be.
			if s[i].whole || s[i].body != "" || s[i].err != nil {
				t.Errorf("empty body: %+v", s[i])
			}
			continue
		}
		if !s[i].whole || s[i].body != b {
			t.Errorf("body %d: whole %v, %d bytes, want whole %d bytes", i, s[i].whole, len(s[i].body), len(b))
		}
	}

	// Over the cap: the handler gets the cap and a byte, and the rest of
	// the body is not read as a request.
	reused = nil
	big := strings.Repeat("y", httpapi.MaxBodyBytes+100)
	req, _ := http.NewRequestWithContext(ctx, "POST", url+"/v1/allow", strings.NewReader(big))
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	s = got()
	if last := s[len(s)-1]; !last.whole || last.body != big[:httpapi.MaxBodyBytes+1] {
		t.Errorf("over the cap: whole %v, %d bytes, want %d", last.whole, len(last.body), httpapi.MaxBodyBytes+1)
	}
	req, _ = http.NewRequestWithContext(ctx, "POST", url+"/v1/allow", strings.NewReader("{}"))
	if resp, err = client.Do(req); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	// This handler does not refuse it (the API's does, and closes the
	// connection): net/http discards the rest, and the connection goes on.
	if fmt.Sprint(reused) != "[true true]" {
		t.Errorf("connections reused %v, want [true true]", reused)
	}
}

// TestBoundedReadError: a body whose reading fails is answered 400 with
// the error as the API's JSON and Connection: close, the handler never
// called.
func TestBoundedReadError(t *testing.T) {
	called := false
	b := bounded{h: http.HandlerFunc(func(http.ResponseWriter, *http.Request) { called = true }), write: time.Second}
	r := httptest.NewRequest("POST", "/v1/allow", io.NopCloser(io.MultiReader(strings.NewReader(`{"rule"`), errReader{errors.New("connection reset")})))
	w := httptest.NewRecorder()
	b.ServeHTTP(w, r)
	if called || w.Code != 400 || w.Header().Get("Connection") != "close" || strings.TrimSpace(w.Body.String()) != `{"error":"body: connection reset"}` {
		t.Errorf("called %v, %d %v %s", called, w.Code, w.Header(), w.Body)
	}
}

type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }

// closeRecorder is a request body that records its Close.
type closeRecorder struct {
	io.Reader
	closed bool
}

func (c *closeRecorder) Close() error { c.closed = true; return nil }

// TestBoundedRestoresBody: once the handler has returned, the request
// carries its own body again (net/http reads it then, and the whole body
// goes back to the pool), closed when it was read to its end, left open
// over the cap.
func TestBoundedRestoresBody(t *testing.T) {
	for _, n := range []int{10, httpapi.MaxBodyBytes + 10} {
		orig := &closeRecorder{Reader: bytes.NewReader(bytes.Repeat([]byte("z"), n))}
		var during io.ReadCloser
		b := bounded{h: http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) { during = r.Body }), write: time.Second}
		r := httptest.NewRequest("POST", "/v1/allow", nil)
		r.Body = orig
		b.ServeHTTP(httptest.NewRecorder(), r)
		if during == io.ReadCloser(orig) || r.Body != io.ReadCloser(orig) {
			t.Errorf("%d bytes: handler's body %T, after it %T", n, during, r.Body)
		}
		if want := n <= httpapi.MaxBodyBytes; orig.closed != want {
			t.Errorf("%d bytes: closed %v, want %v", n, orig.closed, want)
		}
	}
}

// TestBoundedAPI: the API behind bounded decides from the body it decodes
// in place, and refuses a body over its cap with 400, closing the
// connection (the rest of the body is never read as a request).
func TestBoundedAPI(t *testing.T) {
	m := apitest.Start(t, nil, "a", []limiter.Rule{{Name: "api", Algorithm: limiter.FixedWindow, Limit: 2, Window: time.Hour}})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg := config.Default().Node.HTTP
	srv := newAPIServer(cfg, m.API, slog.New(slog.DiscardHandler))
	go func() { _ = srv.Serve(limitConns(ln, cfg)) }()
	t.Cleanup(func() { _ = srv.Close() })
	url := "http://" + ln.Addr().String() + "/v1/allow"

	var reused []bool
	ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{
		GotConn: func(i httptrace.GotConnInfo) { reused = append(reused, i.Reused) },
	})
	client := &http.Client{Transport: &http.Transport{MaxConnsPerHost: 1}}
	defer client.CloseIdleConnections()
	post := func(body string) (int, bool, string) {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, "POST", url, strings.NewReader(body))
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Close, strings.TrimSpace(string(b))
	}
	for i, want := range []string{
		`{"allowed":true,"limit":2,"remaining":1,`,
		`{"allowed":true,"limit":2,"remaining":0,`,
		`{"allowed":false,"limit":2,"remaining":0,`,
	} {
		if code, _, got := post(`{"rule":"api","key":"k"}`); code != 200 || !strings.HasPrefix(got, want) {
			t.Errorf("decision %d: %d %s, want 200 %s…", i, code, got, want)
		}
	}
	code, closing, got := post(`{"rule":"api","key":"` + strings.Repeat("k", httpapi.MaxBodyBytes) + `"}`)
	if code != 400 || got != `{"error":"body: over 65536 bytes"}` || !closing {
		t.Errorf("over the cap: %d %s, Connection: close %v", code, got, closing)
	}
	if code, _, got := post(`{"rule":"api","key":"other"}`); code != 200 || !strings.HasPrefix(got, `{"allowed":true,"limit":2,"remaining":1,`) {
		t.Errorf("after the refusal: %d %s", code, got)
	}
	if fmt.Sprint(reused) != "[false true true true false]" {
		t.Errorf("connections reused %v, want [false true true true false]: one, closed after the body over the cap", reused)
	}
}
