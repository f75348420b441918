package main

import (
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/ratemesh/ratemesh/config"
	"github.com/ratemesh/ratemesh/internal/tlstest"
)

func TestLoopbackAndExposure(t *testing.T) {
	for addr, want := range map[string]bool{
		"127.0.0.1:8080": true, "[::1]:8080": true, "localhost:8080": true, "127.1.2.3:0": true,
		"0.0.0.0:8080": false, ":8080": false, "[::]:8080": false, "10.0.0.1:8080": false, "ratemesh:8080": false, "garbage": false,
	} {
		if got := loopback(addr); got != want {
			t.Errorf("loopback(%q) = %v, want %v", addr, got, want)
		}
	}
	cfg := config.Default()
	if err := checkExposure(&cfg, false); err != nil {
		t.Errorf("the defaults are refused: %v", err)
	}
	cfg.Node.GRPC = ":8081"
	if err := checkExposure(&cfg, false); err == nil || !strings.HasPrefix(err.Error(), "node.grpc :8081 is not a loopback address") {
		t.Errorf("an open gRPC port: %v", err)
	}
	if err := checkExposure(&cfg, true); err != nil {
		t.Errorf("with RATEMESH_API_TOKENS: %v", err)
	}
	cfg.API.ClientCA = "ca.pem"
	if err := checkExposure(&cfg, false); err != nil {
		t.Errorf("with mutual TLS: %v", err)
	}
}

// TestServeRefusesAnOpenAPI: serve refuses to listen beyond loopback
// without credentials, naming the setting and the ways out; it starts
// with --insecure-api, and with a token file. The secured node answers
// the CLI clients over mutual TLS by scope (peers: admin; check:
// decide), plain HTTP clients and clients without a certificate not at
// all, and gRPC with a decide token.
func TestServeRefusesAnOpenAPI(t *testing.T) {
	bin := buildBinary(t)
	dir := t.TempDir()
	listen := "/ip4/127.0.0.1/tcp/0"
	for _, args := range [][]string{
		{"--api", "0.0.0.0:0"},
		{"--api", "127.0.0.1:0", "--grpc", "0.0.0.0:0"},
	} {
		code, out, errOut := runServeToExit(t, bin, append(args, "--listen", listen, "--data-dir", filepath.Join(dir, "refused"))...)
		key := "node.api"
		if len(args) > 2 {
			key = "node.grpc"
		}
		if code != 1 || out != "" || !strings.Contains(errOut, key+" 0.0.0.0:0 is not a loopback address") ||
			!strings.Contains(errOut, "--token-file") || !strings.Contains(errOut, "--insecure-api") {
			t.Errorf("serve %v: exit %d, stdout %q, stderr %q", args, code, out, errOut)
		}
	}
	p := startServe(t, bin, "--api", "0.0.0.0:0", "--insecure-api", "--listen", listen, "--data-dir", filepath.Join(dir, "insecure"))
	if !p.logged("no authentication (api.insecure)", 5*time.Second) {
		t.Errorf("--insecure-api without a warning:\n%s", p.stderr.String())
	}

	ca := tlstest.NewCA(t, dir, "api")
	cert, key := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	ca.Server(t, "node").Write(t, cert, key)
	client := ca.Client(t, "ops")
	clientCert, clientKey := filepath.Join(dir, "client.pem"), filepath.Join(dir, "client-key.pem")
	client.Write(t, clientCert, clientKey)
	tokens := filepath.Join(dir, "tokens")
	const admin, decide = "serve-admin-token-0123456789", "serve-decide-token-0123456789"
	tlstest.WriteFile(t, tokens, []byte("admin "+admin+"\ndecide "+decide+"\n"))
	desc := filepath.Join(dir, "desc.yaml")
	tlstest.WriteFile(t, desc, []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1000}\n"))
	s := startServe(t, bin, "--api", "0.0.0.0:0", "--grpc", "0.0.0.0:0", "--token-file", tokens, "--envoy-config", desc,
		"--tls-cert", cert, "--tls-key", key, "--client-ca", ca.File, "--listen", listen, "--data-dir", filepath.Join(dir, "secured"))
	_, port, _ := net.SplitHostPort(s.ready.API)
	api := net.JoinHostPort("127.0.0.1", port)
	tlsArgs := []string{"--api", api, "--ca", ca.File, "--tls-cert", clientCert, "--tls-key", clientKey}

	if code, out, errOut := runCLI(append([]string{"peers", "--token", admin}, tlsArgs...)...); code != 0 || !strings.Contains(out, "1 members: 1 alive") {
		t.Errorf("peers with an admin token: %d %q %q", code, out, errOut)
	}
	if code, _, errOut := runCLI(append([]string{"peers", "--token", decide}, tlsArgs...)...); code != 1 || !strings.Contains(errOut, "HTTP 403") {
		t.Errorf("peers with a decide token: %d %q, want 1 and 403", code, errOut)
	}
	if code, _, errOut := runCLI(append([]string{"peers"}, tlsArgs...)...); code != 1 || !strings.Contains(errOut, "HTTP 401") {
		t.Errorf("peers without a token: %d %q, want 1 and 401", code, errOut)
	}
	t.Setenv(envToken, decide)
	if code, out, errOut := runCLI(append([]string{"check", "--rule", "default", "--key", "k"}, tlsArgs...)...); code != 0 || !strings.HasPrefix(out, "allowed") {
		t.Errorf("check with RATEMESH_TOKEN: %d %q %q", code, out, errOut)
	}
	noCert := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.Pool()}}}
	if resp, err := noCert.Get("https://" + api + "/healthz"); err == nil {
		resp.Body.Close()
		t.Errorf("a client without a certificate was answered %d", resp.StatusCode)
	}
	if code, _, _ := runCLI("check", "--api", api, "--rule", "default", "--key", "k"); code != 1 {
		t.Errorf("plain HTTP check against a TLS node: exit %d", code)
	}

	_, gport, _ := net.SplitHostPort(s.ready.GRPC)
	creds := credentials.NewTLS(&tls.Config{RootCAs: ca.Pool(), Certificates: []tls.Certificate{client.TLS}})
	conn, err := grpc.NewClient(net.JoinHostPort("127.0.0.1", gport), grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rls := rlspb.NewRateLimitServiceClient(conn)
	rq := &rlspb.RateLimitRequest{Domain: "d", Descriptors: []*rlcommon.RateLimitDescriptor{{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "k", Value: "v"}}}}}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := rls.ShouldRateLimit(ctx, rq); status.Code(err) != codes.Unauthenticated {
		t.Errorf("gRPC without a token: %v", err)
	}
	if resp, err := rls.ShouldRateLimit(metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+decide), rq); err != nil || resp.GetOverallCode() != rlspb.RateLimitResponse_OK {
		t.Errorf("gRPC with a decide token: %v %v", resp, err)
	}

	// bench reads /v1/usage (admin) and asks both APIs with the token.
	gAPI := net.JoinHostPort("127.0.0.1", gport)
	if code, out, errOut := runCLI(append([]string{"bench", "--token", admin, "--rule", "default", "--keys", "3", "--concurrency", "2",
		"--duration", "200ms", "--baseline", "0", "--grpc", gAPI, "--domain", "d", "--descriptor-key", "k"}, tlsArgs...)...); code != 0 || !strings.Contains(out, "gRPC:") {
		t.Errorf("bench over mutual TLS with an admin token: %d %q %q", code, out, errOut)
	}
	if code, _, errOut := runCLI(append([]string{"bench", "--token", decide, "--rule", "default", "--duration", "200ms"}, tlsArgs...)...); code != 1 || !strings.Contains(errOut, "HTTP 403") {
		t.Errorf("bench with a decide token: %d %q, want 403 from /v1/usage", code, errOut)
	}

	// RATEMESH_API_TOKENS alone secures a node too.
	t.Setenv(envAPITokens, "decide "+decide)
	startServe(t, bin, "--api", "0.0.0.0:0", "--listen", listen, "--data-dir", filepath.Join(dir, "env"))
}
