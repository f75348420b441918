package main

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"net"
	"os"

	"github.com/ratemesh/ratemesh/apiauth"
	"github.com/ratemesh/ratemesh/config"
)

// envAPITokens holds token lines for serve beside api.token_file
// ("SCOPE TOKEN", lines or comma-separated), read once at start.
const envAPITokens = "RATEMESH_API_TOKENS"

// apiAuth is who may call serve's APIs: the tokens (nil: none asked) and
// the TLS certificates (nil: plaintext). A nil *apiAuth is an open API.
type apiAuth struct {
	tokens *apiauth.Tokens
	certs  *apiauth.Certs
	// roots verify the peers' APIs for DNS discovery over TLS: the
	// system's and api.client_ca's.
	roots *x509.CertPool
}

// newAPIAuth loads the api section's files and envTokens (the value of
// RATEMESH_API_TOKENS); errors name the key and the path.
func newAPIAuth(cfg *config.Config, envTokens string, log *slog.Logger) (*apiAuth, error) {
	a := &apiAuth{}
	var err error
	if cfg.API.TokenFile != "" || envTokens != "" {
		a.tokens, err = apiauth.NewTokens(apiauth.TokensConfig{
			File: cfg.API.TokenFile, FileKey: "api.token_file",
			Env: envTokens, EnvName: envAPITokens,
			Logger: log.With("component", "api"),
		})
		if err != nil {
			return nil, err
		}
	}
	if cfg.API.TLSCert != "" {
		a.certs, err = apiauth.NewCerts(apiauth.CertsConfig{
			CertFile: cfg.API.TLSCert, KeyFile: cfg.API.TLSKey, ClientCA: cfg.API.ClientCA,
			CertKey: "api.tls_cert", KeyKey: "api.tls_key", ClientCAKey: "api.client_ca",
			Logger: log.With("component", "api"),
		})
		if err != nil {
			return nil, err
		}
		if a.roots, err = x509.SystemCertPool(); err != nil || a.roots == nil {
			a.roots = x509.NewCertPool()
		}
		if cfg.API.ClientCA != "" {
			data, err := os.ReadFile(cfg.API.ClientCA)
			if err != nil {
				return nil, fmt.Errorf("api.client_ca: %w", err)
			}
			a.roots.AppendCertsFromPEM(data)
		}
	}
	return a, nil
}

// loopback reports whether a listen address host:port binds loopback
// only: a loopback IP or localhost. An empty host, 0.0.0.0, :: or any
// other name or address is reachable from other hosts.
func loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// checkExposure refuses an API (node.api, node.grpc) that listens beyond
// loopback without any authentication, unless api.insecure says so.
func checkExposure(cfg *config.Config, envTokens bool) error {
	if cfg.API.Secured(envTokens) || cfg.API.Insecure {
		return nil
	}
	for _, l := range []struct{ key, addr string }{{"node.api", cfg.Node.API}, {"node.grpc", cfg.Node.GRPC}} {
		if l.addr == "" || loopback(l.addr) {
			continue
		}
		return fmt.Errorf("%s %s is not a loopback address and the APIs ask for no credentials: anyone who reaches it could spend limits and evict members. "+
			"Set api.token_file (--token-file FILE, or %s), or mutual TLS with api.tls_cert, api.tls_key and api.client_ca (--tls-cert, --tls-key, --client-ca); "+
			"or, to serve an open API on purpose, api.insecure: true (--insecure-api)", l.key, l.addr, envAPITokens)
	}
	return nil
}

// warn logs what is still open: a non-loopback API under api.insecure,
// tokens sent in clear text.
func (a *apiAuth) warn(cfg *config.Config, log *slog.Logger) {
	exposed := !loopback(cfg.Node.API) || (cfg.Node.GRPC != "" && !loopback(cfg.Node.GRPC))
	switch {
	case !exposed:
	case a.tokens == nil && !a.certs.MutualTLS():
		log.Warn("the APIs listen beyond loopback with no authentication (api.insecure): anyone who can reach them may spend limits and evict members", "api", cfg.Node.API, "grpc", cfg.Node.GRPC)
	case a.certs == nil:
		log.Warn("the APIs listen beyond loopback without TLS: tokens cross the network in clear text; set api.tls_cert and api.tls_key", "api", cfg.Node.API, "grpc", cfg.Node.GRPC)
	}
}

// grpcTLS is the gRPC server's TLS config, nil for plaintext.
func (a *apiAuth) grpcTLS() *tls.Config {
	if a == nil || a.certs == nil {
		return nil
	}
	return a.certs.ServerConfig("h2")
}

// peerToken is what the node presents to its peers' APIs (DNS
// discovery asks GET /v1/peers, an admin call): the first admin token
// it accepts itself, the members of a mesh sharing their token file.
func (a *apiAuth) peerToken() string {
	if a == nil {
		return ""
	}
	return a.tokens.First(apiauth.Admin)
}

// peerTLS is the client config DNS discovery asks its peers' APIs with:
// nil without TLS; else it presents this node's certificate and trusts
// the system's CAs and api.client_ca.
func (a *apiAuth) peerTLS() *tls.Config {
	if a == nil || a.certs == nil {
		return nil
	}
	return a.certs.ClientConfig(a.roots)
}
