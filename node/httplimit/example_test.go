package httplimit_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/ratemesh/ratemesh/limiter"
	"github.com/ratemesh/ratemesh/node"
	"github.com/ratemesh/ratemesh/node/httplimit"
	"github.com/ratemesh/ratemesh/node/memnet"
)

// A service embeds a node and wraps its handler. Here the node is alone on
// an in-memory transport; in production it is package mesh.
func Example() {
	cfg := node.DefaultConfig()
	cfg.Peer, cfg.Transport = "a", memnet.NewHub().Transport("a")
	cfg.Rules = []limiter.Rule{{Name: "api", Algorithm: limiter.FixedWindow, Limit: 2, Window: time.Hour}}
	n, err := node.Start(context.Background(), cfg)
	if err != nil {
		log.Fatal(err)
	}
	defer n.Close()

	lcfg := httplimit.DefaultConfig()
	lcfg.Rule = "api"
	lcfg.Key = httplimit.Header("X-API-Key")
	mw, err := httplimit.New(n, lcfg)
	if err != nil {
		log.Fatal(err)
	}
	h := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "hello")
	}))

	for i := 0; i < 3; i++ {
		r := httptest.NewRequest("GET", "/", nil)
		r.Header.Set("X-API-Key", "acct:42")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		fmt.Println(w.Code, w.Header().Get("RateLimit-Policy"), w.Header().Get("Retry-After") != "")
	}
	// Output:
	// 200 "api";q=2;w=3600 false
	// 200 "api";q=2;w=3600 false
	// 429 "api";q=2;w=3600 true
}
