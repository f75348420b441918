package envoy_test

import (
	"context"
	"crypto/tls"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/ratemesh/ratemesh/apiauth"
	"github.com/ratemesh/ratemesh/envoy"
	"github.com/ratemesh/ratemesh/internal/testutil"
	"github.com/ratemesh/ratemesh/internal/tlstest"
	"github.com/ratemesh/ratemesh/node"
	"github.com/ratemesh/ratemesh/node/memnet"
)

const (
	adminToken  = "admin-grpc-token-0123456789"
	decideToken = "decide-grpc-token-0123456789"
)

// serveSecured serves a node's rate limit service on 127.0.0.1 with
// tokens and tlsCfg (nil: plaintext) and returns its address.
func serveSecured(t *testing.T, toks *apiauth.Tokens, tlsCfg *tls.Config) (string, *prometheus.Registry) {
	t.Helper()
	desc := load(t, "basic_config.yaml")
	hub := memnet.NewHub()
	cfg := node.DefaultConfig()
	cfg.Peer, cfg.Transport, cfg.Rules = "p1", hub.Transport("p1"), desc.Rules()
	n, err := node.Start(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Close() })
	reg := prometheus.NewRegistry()
	srv, err := envoy.New(envoy.Config{Node: n, Descriptors: desc, Tokens: toks, TLS: tlsCfg, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	srv.SetServing(true)
	return serveLoopback(t, srv), reg
}

func dial(t *testing.T, addr string, creds credentials.TransportCredentials) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// withToken is a context carrying "authorization: Bearer tok", as Envoy
// sends it from grpc_service.initial_metadata.
func withToken(t *testing.T, tok string) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	t.Cleanup(cancel)
	if tok == "" {
		return ctx
	}
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+tok)
}

var basicReq = req("test-domain", [][][2]string{{{"key1", "value1"}, {"subkey1", "x"}}}, 1)

// TestAuthShouldRateLimit: with tokens, ShouldRateLimit without a token
// or with an unknown one is Unauthenticated, with a decide (or admin)
// token it decides; the health service stays open.
func TestAuthShouldRateLimit(t *testing.T) {
	toks, err := apiauth.NewTokens(apiauth.TokensConfig{Env: "admin " + adminToken + ",decide " + decideToken})
	if err != nil {
		t.Fatal(err)
	}
	addr, reg := serveSecured(t, toks, nil)
	conn := dial(t, addr, insecure.NewCredentials())
	rls := rlspb.NewRateLimitServiceClient(conn)
	for _, c := range []struct {
		tok  string
		want codes.Code
	}{{"", codes.Unauthenticated}, {"unknown-token-0123456789", codes.Unauthenticated}, {decideToken, codes.OK}, {adminToken, codes.OK}} {
		resp, err := rls.ShouldRateLimit(withToken(t, c.tok), basicReq)
		if status.Code(err) != c.want {
			t.Errorf("token %q: %v, want %v", c.tok, err, c.want)
		}
		if c.want == codes.OK && (resp.GetOverallCode() != rlspb.RateLimitResponse_OK || resp.GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit() != 5) {
			t.Errorf("token %q: %v", c.tok, resp)
		}
	}
	if err := promtest.GatherAndCompare(reg, strings.NewReader(`
# HELP ratemesh_envoy_refused_total gRPC calls refused by authorization, by reason: missing (no bearer token), invalid (a token the node does not hold), scope (too low a scope).
# TYPE ratemesh_envoy_refused_total counter
ratemesh_envoy_refused_total{reason="invalid"} 1
ratemesh_envoy_refused_total{reason="missing"} 1
ratemesh_envoy_refused_total{reason="scope"} 0
`), "ratemesh_envoy_refused_total"); err != nil {
		t.Error(err)
	}
	h, err := healthpb.NewHealthClient(conn).Check(withToken(t, ""), &healthpb.HealthCheckRequest{Service: envoy.ServiceName})
	if err != nil || h.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("health without a token: %v %v", h, err)
	}
}

// TestAuthGRPCMutualTLS: over TLS with a client CA, a client with a
// certificate and a decide token decides, one without a certificate is
// refused; a rotated server certificate serves new connections without
// a restart.
func TestAuthGRPCMutualTLS(t *testing.T) {
	dir := t.TempDir()
	ca := tlstest.NewCA(t, dir, "grpc")
	certFile, keyFile := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	ca.Server(t, "first").Write(t, certFile, keyFile)
	certs, err := apiauth.NewCerts(apiauth.CertsConfig{CertFile: certFile, KeyFile: keyFile, ClientCA: ca.File, CheckEvery: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	toks, err := apiauth.NewTokens(apiauth.TokensConfig{Env: "decide " + decideToken})
	if err != nil {
		t.Fatal(err)
	}
	addr, _ := serveSecured(t, toks, certs.ServerConfig("h2"))
	client := ca.Client(t, "envoy")
	mtls := func() credentials.TransportCredentials {
		return credentials.NewTLS(&tls.Config{RootCAs: ca.Pool(), Certificates: []tls.Certificate{client.TLS}})
	}
	served := func() (string, error) {
		var p peer.Peer
		_, err := rlspb.NewRateLimitServiceClient(dial(t, addr, mtls())).ShouldRateLimit(withToken(t, decideToken), basicReq, grpc.Peer(&p))
		if err != nil {
			return "", err
		}
		return p.AuthInfo.(credentials.TLSInfo).State.PeerCertificates[0].Subject.CommonName, nil
	}
	if cn, err := served(); err != nil || cn != "first" {
		t.Fatalf("mTLS with a decide token: %q %v", cn, err)
	}
	if _, err := rlspb.NewRateLimitServiceClient(dial(t, addr, mtls())).ShouldRateLimit(withToken(t, ""), basicReq); status.Code(err) != codes.Unauthenticated {
		t.Errorf("mTLS without a token: %v", err)
	}
	noCert := credentials.NewTLS(&tls.Config{RootCAs: ca.Pool()})
	if _, err := rlspb.NewRateLimitServiceClient(dial(t, addr, noCert)).ShouldRateLimit(withToken(t, decideToken), basicReq); err == nil {
		t.Error("a client without a certificate was answered")
	}
	if _, err := rlspb.NewRateLimitServiceClient(dial(t, addr, insecure.NewCredentials())).ShouldRateLimit(withToken(t, decideToken), basicReq); err == nil {
		t.Error("a plaintext client was answered")
	}
	ca.Server(t, "second").Write(t, certFile, keyFile)
	testutil.Eventually(t, 5*time.Second, func() (bool, string) {
		cn, err := served()
		return cn == "second", "served " + cn + ", " + errText(err)
	})
}

func errText(err error) string {
	if err == nil {
		return "no error"
	}
	return err.Error()
}
