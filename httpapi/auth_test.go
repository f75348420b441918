package httpapi_test

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ratemesh/ratemesh/apiauth"
	"github.com/ratemesh/ratemesh/httpapi"
	"github.com/ratemesh/ratemesh/internal/apitest"
	"github.com/ratemesh/ratemesh/internal/testutil"
	"github.com/ratemesh/ratemesh/internal/tlstest"
	"github.com/ratemesh/ratemesh/node"
	"github.com/ratemesh/ratemesh/node/memnet"
)

const (
	adminToken  = "admin-test-token-0123456789"
	decideToken = "decide-test-token-0123456789"
)

// securedAPI starts members a and b on one hub and serves a's API with
// tokens from tokenFile on 127.0.0.1, over TLS when certs is not nil. It
// returns the base URL.
func securedAPI(t *testing.T, tokenFile string, certs *apiauth.Certs, metricsAuth bool) (string, *node.Node) {
	t.Helper()
	hub := memnet.NewHub()
	a := apitest.Start(t, hub, "a", testRules())
	apitest.Start(t, hub, "b", testRules(), apitest.Join)
	testutil.Eventually(t, 10*time.Second, func() (bool, string) {
		for _, p := range a.Node.Peers() {
			if p.Peer == "b" && p.State == node.Alive {
				return true, ""
			}
		}
		return false, "b is not alive at a"
	})
	toks, err := apiauth.NewTokens(apiauth.TokensConfig{File: tokenFile, FileKey: "api.token_file", CheckEvery: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	api, err := httpapi.New(httpapi.Config{Node: a.Node, Tokens: toks, MetricsAuth: metricsAuth})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: api}
	scheme := "http"
	if certs != nil {
		scheme = "https"
		srv.TLSConfig = certs.ServerConfig("h2", "http/1.1")
		go func() { _ = srv.ServeTLS(ln, "", "") }()
	} else {
		go func() { _ = srv.Serve(ln) }()
	}
	t.Cleanup(func() { _ = srv.Shutdown(context.Background()) })
	return scheme + "://" + ln.Addr().String(), a.Node
}

// call sends a request with token (none when empty) and returns the
// status, the WWW-Authenticate header and the error message.
func call(t *testing.T, c *http.Client, method, url, token, body string) (int, string, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	var e httpapi.ErrorResponse
	if resp.StatusCode >= 400 {
		if err := json.Unmarshal(data, &e); err != nil || e.Error == "" || resp.Header.Get("Content-Type") != "application/json" {
			t.Errorf("%s %s: %d answer is not the API's JSON error: %q", method, url, resp.StatusCode, data)
		}
	}
	return resp.StatusCode, resp.Header.Get("WWW-Authenticate"), e.Error
}

func writeTokens(t *testing.T, path string, lines ...string) {
	t.Helper()
	tlstest.WriteFile(t, path, []byte(strings.Join(lines, "\n")+"\n"))
}

// TestAuthScopes: with tokens configured, evict needs admin (401 without
// a token or with an unknown one, 403 with decide, 200 with admin);
// decisions need decide; /healthz stays open, and /metrics unless
// MetricsAuth.
func TestAuthScopes(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tokens")
	writeTokens(t, path, "admin "+adminToken, "decide "+decideToken)
	base, _ := securedAPI(t, path, nil, false)
	c := http.DefaultClient

	status, www, msg := call(t, c, "POST", base+"/v1/peers/b/evict", "", "")
	if status != 401 || www != `Bearer realm="ratemesh"` || msg != "authorization: a bearer token is required" {
		t.Errorf("evict without a token: %d %q %q", status, www, msg)
	}
	status, www, msg = call(t, c, "POST", base+"/v1/peers/b/evict", "not-a-known-token-0123", "")
	if status != 401 || !strings.Contains(www, `error="invalid_token"`) || msg != "authorization: invalid token" {
		t.Errorf("evict with an unknown token: %d %q %q", status, www, msg)
	}
	status, www, msg = call(t, c, "POST", base+"/v1/peers/b/evict", decideToken, "")
	if status != 403 || !strings.Contains(www, `error="insufficient_scope", scope="admin"`) || !strings.Contains(msg, "needs the admin scope; the token has decide") {
		t.Errorf("evict with a decide token: %d %q %q", status, www, msg)
	}
	if status, _, msg := call(t, c, "POST", base+"/v1/peers/b/evict", adminToken, ""); status != 200 {
		t.Errorf("evict with an admin token: %d %q", status, msg)
	}
	resp, err := c.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	text, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{`ratemesh_api_refused_total{reason="missing"} 1`, `ratemesh_api_refused_total{reason="invalid"} 1`, `ratemesh_api_refused_total{reason="scope"} 1`} {
		if !strings.Contains(string(text), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}

	for _, ep := range []struct {
		method, path, body string
		need               apiauth.Scope
	}{
		{"POST", "/v1/allow", `{"rule":"big","key":"k"}`, apiauth.Decide},
		{"POST", "/v1/wait", `{"rule":"big","key":"k","max_wait_ms":10}`, apiauth.Decide},
		{"POST", "/v1/acquire", `{"rule":"conc","key":"k"}`, apiauth.Decide},
		{"POST", "/v1/renew", `{"lease_id":"a~1~1"}`, apiauth.Decide},
		{"POST", "/v1/release", `{"lease_id":"a~1~1"}`, apiauth.Decide},
		{"GET", "/v1/usage?rule=big&key=k", "", apiauth.Admin},
		{"GET", "/v1/peers", "", apiauth.Admin},
		{"GET", "/healthz", "", apiauth.None},
		{"GET", "/livez", "", apiauth.None},
		{"GET", "/readyz", "", apiauth.None},
		{"GET", "/metrics", "", apiauth.None},
	} {
		status, _, _ := call(t, c, ep.method, base+ep.path, "", ep.body)
		if open := status != 401; open != (ep.need == apiauth.None) {
			t.Errorf("%s %s without a token: %d", ep.method, ep.path, status)
		}
		status, _, _ = call(t, c, ep.method, base+ep.path, decideToken, ep.body)
		if allowed := status != 401 && status != 403; allowed != (ep.need <= apiauth.Decide) {
			t.Errorf("%s %s with a decide token: %d", ep.method, ep.path, status)
		}
		if status, _, msg := call(t, c, ep.method, base+ep.path, adminToken, ep.body); status == 401 || status == 403 {
			t.Errorf("%s %s with an admin token: %d %q", ep.method, ep.path, status, msg)
		}
	}
	// Method and path errors say nothing of the tokens.
	if status, _, _ := call(t, c, "GET", base+"/v1/allow", "", ""); status != 405 {
		t.Errorf("GET /v1/allow: %d, want 405", status)
	}

	base, _ = securedAPI(t, path, nil, true)
	if status, _, _ := call(t, c, "GET", base+"/metrics", "", ""); status != 401 {
		t.Errorf("/metrics with MetricsAuth, no token: %d", status)
	}
	if status, _, _ := call(t, c, "GET", base+"/metrics", decideToken, ""); status != 200 {
		t.Errorf("/metrics with MetricsAuth and a token: %d", status)
	}
	if status, _, _ := call(t, c, "GET", base+"/healthz", "", ""); status != 200 {
		t.Errorf("/healthz with MetricsAuth: %d", status)
	}
}

// TestAuthTokenRotation: a token written to the file works, and a removed
// one stops working, without a restart.
func TestAuthTokenRotation(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tokens")
	writeTokens(t, path, "admin "+adminToken)
	base, _ := securedAPI(t, path, nil, false)
	c := http.DefaultClient
	const next = "rotated-admin-token-0123456789"
	if status, _, _ := call(t, c, "GET", base+"/v1/peers", next, ""); status != 401 {
		t.Fatalf("a token not yet in the file: %d", status)
	}
	writeTokens(t, path, "admin "+next)
	testutil.Eventually(t, 5*time.Second, func() (bool, string) {
		s1, _, _ := call(t, c, "GET", base+"/v1/peers", next, "")
		s2, _, _ := call(t, c, "GET", base+"/v1/peers", adminToken, "")
		return s1 == 200 && s2 == 401, "new token " + http.StatusText(s1) + ", old " + http.StatusText(s2)
	})
}

// TestAuthMutualTLS: over TLS with a client CA, a client with a
// certificate the CA signed and an admin token evicts (200), a decide
// token is 403, no token 401, and a client without a certificate is
// refused in the handshake.
func TestAuthMutualTLS(t *testing.T) {
	dir := t.TempDir()
	ca := tlstest.NewCA(t, dir, "api")
	certFile, keyFile := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	ca.Server(t, "node").Write(t, certFile, keyFile)
	certs, err := apiauth.NewCerts(apiauth.CertsConfig{CertFile: certFile, KeyFile: keyFile, ClientCA: ca.File})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "tokens")
	writeTokens(t, path, "admin "+adminToken, "decide "+decideToken)
	base, _ := securedAPI(t, path, certs, false)

	client := ca.Client(t, "ops")
	withCert := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.Pool(), Certificates: []tls.Certificate{client.TLS}}}}
	if status, _, _ := call(t, withCert, "POST", base+"/v1/peers/b/evict", "", ""); status != 401 {
		t.Errorf("mTLS, no token: %d, want 401", status)
	}
	if status, _, _ := call(t, withCert, "POST", base+"/v1/peers/b/evict", decideToken, ""); status != 403 {
		t.Errorf("mTLS, decide token: %d, want 403", status)
	}
	if status, _, msg := call(t, withCert, "POST", base+"/v1/peers/b/evict", adminToken, ""); status != 200 {
		t.Errorf("mTLS, admin token: %d %q, want 200", status, msg)
	}

	noCert := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.Pool()}}}
	req, _ := http.NewRequest("POST", base+"/v1/peers/b/evict", nil)
	req.Header.Set("Authorization", "Bearer "+adminToken)
	if resp, err := noCert.Do(req); err == nil {
		resp.Body.Close()
		t.Errorf("a client without a certificate was answered %d", resp.StatusCode)
	}
	other := tlstest.NewCA(t, dir, "other").Client(t, "stranger")
	strange := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.Pool(), Certificates: []tls.Certificate{other.TLS}}}}
	if resp, err := strange.Do(req.Clone(context.Background())); err == nil {
		resp.Body.Close()
		t.Errorf("a client with another CA's certificate was answered %d", resp.StatusCode)
	}
	plain := http.DefaultClient
	if resp, err := plain.Post(strings.Replace(base, "https", "http", 1)+"/v1/allow", "application/json", strings.NewReader(`{}`)); err == nil {
		resp.Body.Close()
		if resp.StatusCode != 400 {
			t.Errorf("plain HTTP to the TLS port: %d", resp.StatusCode)
		}
	}
}
