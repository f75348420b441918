package httpapi_test

import (
	"bytes"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/ratemesh/ratemesh/internal/apitest"
	"github.com/ratemesh/ratemesh/limiter"
)

// discard is a ResponseWriter that keeps only the status, reused across
// a benchmark's iterations so that it measures the handler, not the
// recorder.
type discard struct {
	h      http.Header
	status int
}

func (d *discard) Header() http.Header         { return d.h }
func (d *discard) Write(p []byte) (int, error) { return len(p), nil }
func (d *discard) WriteHeader(status int)      { d.status = status }

// whole is a body read whole before the API sees it, as cmd/ratemesh's
// server hands every body over: the API decodes its Bytes in place.
type whole struct{ bytes.Buffer }

func (*whole) Close() error { return nil }

// benchServe serves method path with body b.N times through the API's
// handler, over a real node on memnet, under a limit no key reaches; with
// asWhole, the body comes as cmd/ratemesh's server gives it.
func benchServe(b *testing.B, method, path, body string, asWhole bool) {
	rules := []limiter.Rule{{Name: "bench", Algorithm: limiter.FixedWindow, Limit: limiter.MaxLimit, Window: time.Hour}}
	api := apitest.Start(b, nil, "a", rules).API
	rd, wb := strings.NewReader(body), new(whole)
	var rc io.ReadCloser = io.NopCloser(rd)
	if asWhole {
		rc = wb
	}
	if body == "" {
		rc = http.NoBody
	}
	req, err := http.NewRequest(method, path, rc)
	if err != nil {
		b.Fatal(err)
	}
	w := &discard{h: http.Header{}}
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		rd.Reset(body)
		wb.Reset()
		wb.WriteString(body)
		clear(w.h)
		api.ServeHTTP(w, req)
		if w.status != http.StatusOK {
			b.Fatalf("status %d", w.status)
		}
	}
}

// BenchmarkHTTPAllow is one decision of /v1/allow's single form from
// the request to its answer, the network aside, its body read from a
// reader (httptest, an embedding's server); WholeBody as cmd/ratemesh
// serves it.
func BenchmarkHTTPAllow(b *testing.B) {
	body := `{"rule":"bench","key":"user-1234","cost":1}`
	b.Run("Reader", func(b *testing.B) { benchServe(b, "POST", "/v1/allow", body, false) })
	b.Run("WholeBody", func(b *testing.B) { benchServe(b, "POST", "/v1/allow", body, true) })
}

// BenchmarkHTTPAllowChecks is the all-or-nothing form with four checks.
func BenchmarkHTTPAllowChecks(b *testing.B) {
	benchServe(b, "POST", "/v1/allow", `{"checks":[{"rule":"bench","key":"a"},{"rule":"bench","key":"b","cost":2},{"rule":"bench","key":"c"},{"rule":"bench","key":"d"}],"max_wait_ms":50}`, true)
}

// BenchmarkHTTPHealthz is GET /healthz, the API's cheapest answer: the
// reference /v1/allow is judged against (the harness's decisions ÷
// health).
func BenchmarkHTTPHealthz(b *testing.B) {
	benchServe(b, "GET", "/healthz", "", false)
}
