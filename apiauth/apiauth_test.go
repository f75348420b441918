package apiauth_test

import (
	"crypto/tls"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ratemesh/ratemesh/apiauth"
	"github.com/ratemesh/ratemesh/internal/testutil"
	"github.com/ratemesh/ratemesh/internal/tlstest"
)

const (
	adminTok  = "admin-0123456789abcdef"
	decideTok = "decide-0123456789abcdef"
	otherTok  = "other-0123456789abcdef"
)

func TestParseTokens(t *testing.T) {
	lines, err := apiauth.ParseTokens([]byte("# tokens\n\nadmin "+adminTok+"\n  decide   "+decideTok+"  \n"), "f")
	if err != nil || len(lines) != 2 || lines[0].Scope != apiauth.Admin || lines[1].Value != decideTok {
		t.Fatalf("%+v %v", lines, err)
	}
	if lines, err := apiauth.ParseTokens([]byte("admin "+adminTok+",decide "+decideTok), "RATEMESH_API_TOKENS"); err != nil || len(lines) != 2 {
		t.Errorf("comma-separated: %+v %v", lines, err)
	}
	for in, want := range map[string]string{
		"root " + adminTok:            `f line 1: scope "root" is not one of decide, admin`,
		"admin":                       "f line 1: want \"SCOPE TOKEN\"",
		"\nadmin short":               "f line 2: token of 5 characters: at least 16",
		"admin " + adminTok + " more": "3 fields",
		"admin " + adminTok + "\"x":   `character '"'`,
	} {
		if _, err := apiauth.ParseTokens([]byte(in), "f"); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", in, err, want)
		}
	}
}

func TestBearerToken(t *testing.T) {
	for in, want := range map[string]string{"Bearer abc": "abc", "bearer  abc ": "abc", "Basic abc": "", "": "", "Bearer": ""} {
		if got := apiauth.BearerToken(in); got != want {
			t.Errorf("BearerToken(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestAuthorize(t *testing.T) {
	toks, err := apiauth.NewTokens(apiauth.TokensConfig{Env: "admin " + adminTok + "\ndecide " + decideTok})
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		tok  string
		need apiauth.Scope
		want error
	}{
		{"", apiauth.Decide, apiauth.ErrUnauthenticated},
		{otherTok, apiauth.Decide, apiauth.ErrUnauthenticated},
		{adminTok[:len(adminTok)-1], apiauth.Decide, apiauth.ErrUnauthenticated},
		{decideTok, apiauth.Decide, nil},
		{decideTok, apiauth.Admin, apiauth.ErrForbidden},
		{adminTok, apiauth.Admin, nil},
		{adminTok, apiauth.Decide, nil}, // admin implies decide
		{"", apiauth.None, nil},
	}
	for _, c := range cases {
		if err := toks.Authorize(c.tok, c.need); !errors.Is(err, c.want) || (c.want == nil) != (err == nil) {
			t.Errorf("Authorize(%q, %v) = %v, want %v", c.tok, c.need, err, c.want)
		}
	}
	var nilToks *apiauth.Tokens
	if err := nilToks.Authorize("", apiauth.Admin); err != nil {
		t.Errorf("no tokens configured: %v", err)
	}
	if _, err := apiauth.NewTokens(apiauth.TokensConfig{File: filepath.Join(t.TempDir(), "none"), FileKey: "api.token_file"}); err == nil || !strings.Contains(err.Error(), "api.token_file") {
		t.Errorf("missing file: %v", err)
	}
	empty := filepath.Join(t.TempDir(), "empty")
	tlstest.WriteFile(t, empty, []byte("# nothing\n"))
	if _, err := apiauth.NewTokens(apiauth.TokensConfig{File: empty, FileKey: "api.token_file"}); err == nil || !strings.Contains(err.Error(), "api.token_file "+empty+": holds no token") {
		t.Errorf("empty file: %v", err)
	}
}

// TestTokenFileRotation: a token added to the file is accepted and a
// removed one refused without a restart; a file that no longer parses
// keeps the running tokens.
func TestTokenFileRotation(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tokens")
	tlstest.WriteFile(t, path, []byte("admin "+adminTok+"\n"))
	toks, err := apiauth.NewTokens(apiauth.TokensConfig{File: path, CheckEvery: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if toks.Scope(otherTok) != apiauth.None || toks.Scope(adminTok) != apiauth.Admin {
		t.Fatal("initial tokens")
	}
	tlstest.WriteFile(t, path, []byte("decide "+otherTok+"\n"))
	testutil.Eventually(t, 5*time.Second, func() (bool, string) {
		return toks.Scope(otherTok) == apiauth.Decide && toks.Scope(adminTok) == apiauth.None, "the rotated file is not in use"
	})
	tlstest.WriteFile(t, path, []byte("decide short\n"))
	deadline := time.Now().Add(50 * time.Millisecond)
	for time.Now().Before(deadline) {
		if toks.Scope(otherTok) != apiauth.Decide {
			t.Fatal("an invalid file replaced the running tokens")
		}
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if toks.Scope(otherTok) != apiauth.Decide {
		t.Fatal("a removed file dropped the running tokens")
	}
}

// TestCertRotation: a server on Certs.ServerConfig serves a rotated
// certificate to the next connection without a restart, and with a
// client CA refuses a client without a certificate.
func TestCertRotation(t *testing.T) {
	dir := t.TempDir()
	ca := tlstest.NewCA(t, dir, "api")
	certFile, keyFile := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	first := ca.Server(t, "first")
	first.Write(t, certFile, keyFile)
	certs, err := apiauth.NewCerts(apiauth.CertsConfig{CertFile: certFile, KeyFile: keyFile, ClientCA: ca.File, CheckEvery: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", certs.ServerConfig("h2"))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_ = c.(*tls.Conn).Handshake()
				_, _ = c.Read(make([]byte, 1))
			}()
		}
	}()
	client := ca.Client(t, "client")
	served := func(withCert bool) (string, error) {
		cfg := &tls.Config{RootCAs: ca.Pool(), NextProtos: []string{"h2"}}
		if withCert {
			cfg.Certificates = []tls.Certificate{client.TLS}
		}
		c, err := tls.Dial("tcp", ln.Addr().String(), cfg)
		if err != nil {
			return "", err
		}
		defer c.Close()
		// TLS 1.3: a refused client certificate shows on the first read.
		_ = c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
		if _, err := c.Read(make([]byte, 1)); err != nil && !isTimeout(err) {
			return "", err
		}
		return c.ConnectionState().PeerCertificates[0].Subject.CommonName, nil
	}
	if cn, err := served(true); err != nil || cn != "first" {
		t.Fatalf("served %q, %v", cn, err)
	}
	if _, err := served(false); err == nil {
		t.Fatal("a client without a certificate was accepted")
	}
	ca.Server(t, "second").Write(t, certFile, keyFile)
	testutil.Eventually(t, 5*time.Second, func() (bool, string) {
		cn, err := served(true)
		return cn == "second", "served " + cn + ", " + errString(err)
	})
	// A key that does not match its certificate keeps the running pair.
	tlstest.WriteFile(t, keyFile, first.KeyPEM)
	if cn, err := served(true); err != nil || cn != "second" {
		t.Fatalf("after a half rotation: served %q, %v", cn, err)
	}
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}

func errString(err error) string {
	if err == nil {
		return "no error"
	}
	return err.Error()
}
