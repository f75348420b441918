package config_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/ratemesh/ratemesh/config"
)

// TestAPISection: the api section's keys as written, its defaults (no
// authentication, /metrics open) and its refusals naming the key.
func TestAPISection(t *testing.T) {
	if def := config.Default().API; def != (config.API{}) || def.Secured(false) || !def.Secured(true) {
		t.Fatalf("defaults %+v", def)
	}
	cfg, err := config.Parse([]byte(`api:
  token_file: /run/tokens
  tls_cert: /run/cert.pem
  tls_key: /run/key.pem
  client_ca: /run/ca.pem
  insecure: true
  metrics_auth: true
`))
	want := config.API{TokenFile: "/run/tokens", TLSCert: "/run/cert.pem", TLSKey: "/run/key.pem", ClientCA: "/run/ca.pem", Insecure: true, MetricsAuth: true}
	if err != nil || cfg.API != want {
		t.Fatalf("%+v %v, want %+v", cfg.API, err, want)
	}
	if !(&config.API{ClientCA: "ca.pem"}).Secured(false) {
		t.Error("mutual TLS alone is not secured")
	}
	for src, prefix := range map[string]string{
		"api: {tls_cert: c.pem}\n":    "api.tls_key: required with api.tls_cert",
		"api: {tls_key: k.pem}\n":     "api.tls_cert: required with api.tls_key",
		"api: {client_ca: ca.pem}\n":  "api.client_ca: needs api.tls_cert and api.tls_key",
		"api: {insecure: maybe}\n":    "api.insecure: line 1",
		"api: {token: abc}\n":         "api.token",
		"api: {token_file: [a, b]}\n": "api.token_file: line 1",
	} {
		_, err := config.Parse([]byte(src))
		if err == nil || !strings.HasPrefix(err.Error(), prefix) || !errors.Is(err, config.ErrInvalid) {
			t.Errorf("%q: %v, want prefix %q", src, err, prefix)
		}
	}
	if ch := config.ChangedSettings(cfg, []byte("api: {token_file: /run/other}\n")); !strings.Contains(strings.Join(ch, ","), "api.token_file") {
		t.Errorf("changed settings %v lack api.token_file", ch)
	}
}
