// Package apitest starts a real node on an in-memory network
// (node/memnet) and serves the real HTTP API (httpapi) over it on an
// httptest server: the setup of every test that talks to the API over
// HTTP (package httpapi's, the CLI's clients'). It is imported only by
// _test.go files. (It cannot live in internal/testutil: node's own tests
// import testutil, and testutil importing node would be a cycle.)
package apitest

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/ratemesh/ratemesh/httpapi"
	"github.com/ratemesh/ratemesh/limiter"
	"github.com/ratemesh/ratemesh/node"
	"github.com/ratemesh/ratemesh/node/memnet"
)

// Member is a started node and the API serving it.
type Member struct {
	Node   *node.Node
	API    *httpapi.Server
	Server *httptest.Server
}

// URL returns the API's base URL, http://HOST:PORT.
func (m *Member) URL() string { return m.Server.URL }

// Addr returns the API's HOST:PORT.
func (m *Member) Addr() string { return strings.TrimPrefix(m.Server.URL, "http://") }

// Start starts peer on hub (nil: a hub of its own) with rules, from
// node.DefaultConfig adjusted by configure (Join, timings, …), and serves
// its API. Both stop when the test ends.
func Start(t testing.TB, hub *memnet.Hub, peer string, rules []limiter.Rule, configure ...func(*node.Config)) *Member {
	t.Helper()
	if hub == nil {
		hub = memnet.NewHub()
	}
	cfg := node.DefaultConfig()
	cfg.Peer, cfg.Rules, cfg.Transport = peer, rules, hub.Transport(peer)
	for _, f := range configure {
		f(&cfg)
	}
	n, err := node.Start(context.Background(), cfg)
	if err != nil {
		t.Fatalf("apitest: start %s: %v", peer, err)
	}
	t.Cleanup(func() { _ = n.Close() })
	api, err := httpapi.New(httpapi.Config{Node: n})
	if err != nil {
		t.Fatalf("apitest: %v", err)
	}
	ts := httptest.NewServer(api)
	t.Cleanup(ts.Close)
	return &Member{Node: n, API: api, Server: ts}
}

// Join sets node.Config.Join: the member waits for its first
// anti-entropy exchange before it is ready.
func Join(c *node.Config) { c.Join = true }
