package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/ratemesh/ratemesh/config"
	"github.com/ratemesh/ratemesh/httpapi"
)

// This file holds what the API clients (check, peers, bench) share: the
// --api address, a keep-alive HTTP client, and JSON calls that turn a 4xx or
// 5xx answer into an error carrying the server's message.

// apiBase turns an --api value, HOST:PORT or a URL, into the base URL the
// paths of the HTTP API (docs/http-api.md) are appended to.
func apiBase(addr string) (string, error) {
	addr = strings.TrimSpace(addr)
	if addr == "" {
		return "", errors.New("--api: required (HOST:PORT or a URL)")
	}
	if strings.Contains(addr, "://") {
		u, err := url.Parse(addr)
		if err != nil {
			return "", fmt.Errorf("--api %q: %v", addr, err)
		}
		if u.Scheme != "http" && u.Scheme != "https" {
			return "", fmt.Errorf("--api %q: scheme must be http or https", addr)
		}
		if u.Host == "" {
			return "", fmt.Errorf("--api %q: no host", addr)
		}
		if u.RawQuery != "" || u.Fragment != "" {
			return "", fmt.Errorf("--api %q: a base URL takes no query or fragment", addr)
		}
		return strings.TrimRight(u.Scheme+"://"+u.Host+u.Path, "/"), nil
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("--api %q: want HOST:PORT or a URL: %v", addr, err)
	}
	if port == "" {
		return "", fmt.Errorf("--api %q: no port", addr)
	}
	if host == "" {
		host = "127.0.0.1"
	}
	return "http://" + net.JoinHostPort(host, port), nil
}

// newHTTPClient returns a keep-alive client that keeps up to conns idle
// connections per host, so conns concurrent callers never redial.
func newHTTPClient(conns int, timeout time.Duration) *http.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConns = max(conns, 2) * 4
	tr.MaxIdleConnsPerHost = max(conns, 2)
	tr.MaxConnsPerHost = 0
	tr.Proxy = nil // the API is local; an HTTP proxy from the environment would only get in the way
	return &http.Client{Transport: tr, Timeout: timeout}
}

// envToken is the clients' bearer token when --token is not given.
const envToken = "RATEMESH_TOKEN"

// defaultAPI is check's and peers' --api when none is given: the
// variable serve reads its --api from (RATEMESH_API), else serve's own
// default, so that on a node's host (or in its pod: kubectl exec) the
// commands need no flag.
func defaultAPI(getenv func(string) string) string {
	if a := getenv(envName("api")); a != "" {
		return a
	}
	return config.Default().Node.API
}

// clientAuth holds the flags an API client shares for a secured node:
// --token (or RATEMESH_TOKEN), and TLS: --ca, --tls-cert and --tls-key
// (not --key: check's --key is the rate limit key).
type clientAuth struct {
	token, ca, cert, key *string
}

// addClientAuth registers the flags on fset.
func addClientAuth(fset *flag.FlagSet) *clientAuth {
	return &clientAuth{
		token: fset.String("token", "", "bearer `token` for a node that asks for one (default $"+envToken+")"),
		ca:    fset.String("ca", "", "PEM `file` of the CA that signed the node's certificate: talk TLS (https)"),
		cert:  fset.String("tls-cert", "", "PEM client certificate `file`, for a node that asks for one (mutual TLS; with --tls-key)"),
		key:   fset.String("tls-key", "", "PEM private key `file` of --tls-cert"),
	}
}

// tls reports whether any TLS flag is set.
func (a *clientAuth) tls() bool { return *a.ca != "" || *a.cert != "" || *a.key != "" }

// client returns a client of the node at addr (--api) with conns
// connections: https when a TLS flag is set (a HOST:PORT becomes an
// https URL), the token on every request. Errors name the flag.
func (a *clientAuth) client(addr string, conns int, timeout time.Duration) (*apiClient, error) {
	base, err := apiBase(addr)
	if err != nil {
		return nil, err
	}
	hc := newHTTPClient(conns, timeout)
	if a.tls() {
		switch {
		case strings.HasPrefix(base, "http://") && strings.Contains(addr, "://"):
			return nil, fmt.Errorf("--api %q: an http:// URL with --ca, --tls-cert or --tls-key; use https://", addr)
		case strings.HasPrefix(base, "http://"):
			base = "https://" + strings.TrimPrefix(base, "http://")
		}
		tc, err := a.tlsConfig()
		if err != nil {
			return nil, err
		}
		hc.Transport.(*http.Transport).TLSClientConfig = tc
	}
	return &apiClient{base: base, http: hc, token: a.bearer()}, nil
}

// bearer returns --token, else $RATEMESH_TOKEN, "" for none.
func (a *clientAuth) bearer() string {
	if *a.token != "" {
		return *a.token
	}
	return strings.TrimSpace(os.Getenv(envToken))
}

// tlsConfig returns the client TLS config of --ca, --tls-cert and
// --tls-key; errors name the flag.
func (a *clientAuth) tlsConfig() (*tls.Config, error) {
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if *a.ca != "" {
		data, err := os.ReadFile(*a.ca)
		if err != nil {
			return nil, fmt.Errorf("--ca: %w", err)
		}
		tc.RootCAs = x509.NewCertPool()
		if !tc.RootCAs.AppendCertsFromPEM(data) {
			return nil, fmt.Errorf("--ca %s: no PEM certificate in the file", *a.ca)
		}
	}
	if (*a.cert == "") != (*a.key == "") {
		return nil, errors.New("--tls-cert and --tls-key: give both or neither")
	}
	if *a.cert != "" {
		c, err := tls.LoadX509KeyPair(*a.cert, *a.key)
		if err != nil {
			return nil, fmt.Errorf("--tls-cert %s and --tls-key %s: %w", *a.cert, *a.key, err)
		}
		tc.Certificates = []tls.Certificate{c}
	}
	return tc, nil
}

// apiClient calls one node's API.
type apiClient struct {
	base string
	http *http.Client
	// token is sent as Authorization: Bearer when not empty.
	token string
}

// apiStatusError is a 4xx or 5xx answer.
type apiStatusError struct {
	Status int
	Msg    string
	Owner  string
}

func (e *apiStatusError) Error() string {
	msg := e.Msg
	if msg == "" {
		msg = http.StatusText(e.Status)
	}
	if e.Owner != "" {
		msg += " (owner " + e.Owner + ")"
	}
	return fmt.Sprintf("HTTP %d: %s", e.Status, msg)
}

// call sends body (JSON-encoded unless nil) with method to path and decodes
// a 2xx answer into out (unless nil).
func (c *apiClient) call(ctx context.Context, method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		return err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return fmt.Errorf("%s %s: reading the answer: %w", method, path, err)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		e := &apiStatusError{Status: resp.StatusCode}
		var er httpapi.ErrorResponse
		if json.Unmarshal(data, &er) == nil && er.Error != "" {
			e.Msg, e.Owner = er.Error, er.Owner
		} else {
			e.Msg = strings.TrimSpace(string(data))
		}
		return e
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			return fmt.Errorf("%s %s: the answer is not the expected JSON: %w", method, path, err)
		}
	}
	return nil
}

// parseInterspersed parses fset's flags wherever they stand among args and
// returns the positional arguments in order, so that both
// `peers evict ID --api X` and `peers --api X evict ID` work.
func parseInterspersed(fset *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fset.Parse(args); err != nil {
			return nil, err
		}
		rest := fset.Args()
		if len(rest) == 0 {
			return pos, nil
		}
		if rest[0] == "--" {
			return append(pos, rest[1:]...), nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

// writeJSON prints v as indented JSON: the only thing --json puts on stdout.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// flagUsage returns a flag.ErrHelp-aware exit code for a parse error.
func flagExit(err error) int {
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	return 2
}
