package discovery_test

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"net"
	"net/http"
	"strconv"
	"sync"
	"testing"

	"github.com/ratemesh/ratemesh/discovery"
	"github.com/ratemesh/ratemesh/internal/tlstest"
)

// TestDNSDiscoverySecuredAPI: discovery asks a peer's API over TLS,
// verifying its certificate against the name it resolved (not the
// address), presenting its own certificate and the token; a peer that
// refuses the token is not dialled.
func TestDNSDiscoverySecuredAPI(t *testing.T) {
	dir := t.TempDir()
	ca := tlstest.NewCA(t, dir, "mesh")
	const token = "discovery-admin-token-0123456789"
	const peerID = "12D3KooWDpJ7As7BWAwRMfu1VU2WCqNjvq387JEYKDBj4kx6nXTN"
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get("Authorization") != "Bearer "+token || len(r.TLS.PeerCertificates) == 0 {
				w.WriteHeader(http.StatusUnauthorized)
				return
			}
			_ = json.NewEncoder(w).Encode(map[string]any{"peers": []map[string]any{{"peer_id": peerID, "self": true, "addrs": []string{"/ip4/127.0.0.1/tcp/4001/p2p/" + peerID}}}})
		}),
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{ca.Server(t, "peer", "ratemesh.test").TLS}, ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: ca.Pool()},
	}
	go func() { _ = srv.ServeTLS(ln, "", "") }()
	t.Cleanup(func() { _ = srv.Close() })
	port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	dns := startDNS(t, "ratemesh.test", "127.0.0.1")
	client := ca.Client(t, "node")

	var mu sync.Mutex
	var dialled []string
	round := func(tok string) int {
		d, err := discovery.New(discovery.Config{
			Targets: []string{"ratemesh.test:" + port}, Self: "self", Resolver: dns.resolver(),
			Connect: func(_ context.Context, addr string) error {
				mu.Lock()
				dialled = append(dialled, addr)
				mu.Unlock()
				return nil
			},
			Token: func() string { return tok },
			TLS:   &tls.Config{RootCAs: ca.Pool(), Certificates: []tls.Certificate{client.TLS}},
		})
		if err != nil {
			t.Fatal(err)
		}
		return d.Round(context.Background())
	}
	if n := round("wrong-token-0123456789"); n != 0 || len(dialled) != 0 {
		t.Fatalf("a refused token: %d peers, dialled %v", n, dialled)
	}
	if n := round(token); n != 1 || len(dialled) != 1 || dialled[0] != "/ip4/127.0.0.1/tcp/4001/p2p/"+peerID {
		t.Fatalf("with the token: %d peers, dialled %v", n, dialled)
	}
}
