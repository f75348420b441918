package httpapi_test

import (
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

// benchAllow serves body to /v1/allow b.N times through the API's
// handler, over a real node on memnet, under a limit no key reaches.
func benchAllow(b *testing.B, body string) {
	rules := []limiter.Rule{{Name: "bench", Algorithm: limiter.FixedWindow, Limit: limiter.MaxLimit, Window: time.Hour}}
	api := apitest.Start(b, nil, "a", rules).API
	rd := strings.NewReader(body)
	req, err := http.NewRequest("POST", "/v1/allow", rd)
	if err != nil {
		b.Fatal(err)
	}
	w := &discard{h: http.Header{}}
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		rd.Reset(body)
		clear(w.h)
		api.ServeHTTP(w, req)
		if w.status != http.StatusOK {
			b.Fatalf("status %d", w.status)
		}
	}
}

// BenchmarkHTTPAllow is one decision of /v1/allow's single form from
// the request to its answer, the network aside.
func BenchmarkHTTPAllow(b *testing.B) {
	benchAllow(b, `{"rule":"bench","key":"user-1234","cost":1}`)
}

// BenchmarkHTTPAllowChecks is the all-or-nothing form with four checks.
func BenchmarkHTTPAllowChecks(b *testing.B) {
	benchAllow(b, `{"checks":[{"rule":"bench","key":"a"},{"rule":"bench","key":"b","cost":2},{"rule":"bench","key":"c"},{"rule":"bench","key":"d"}],"max_wait_ms":50}`)
}
