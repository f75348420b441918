package apiauth

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// CertsConfig configures Certs. Keys name the files in errors (the config
// keys: api.tls_cert, …); empty keys default to "tls_cert", "tls_key",
// "client_ca".
type CertsConfig struct {
	// CertFile and KeyFile are the server's PEM certificate (chain) and
	// private key; both required.
	CertFile, KeyFile string
	// ClientCA is a PEM bundle of the CAs that sign client certificates;
	// when set, every client must present a certificate one of them
	// signed (mutual TLS). Empty: no client certificate is asked for.
	ClientCA string
	// Keys name the files in errors.
	CertKey, KeyKey, ClientCAKey string
	// CheckEvery is how often the files are checked for a change, at
	// most; default 1 s.
	CheckEvery time.Duration
	// Logger receives reloads and failed reloads; nil discards them.
	Logger *slog.Logger
}

// Certs holds a server's TLS certificate and its client CAs, read again
// from their files when one of them changes (checked at most every
// CheckEvery, at a handshake), so a rotated certificate serves the next
// connections without a restart. A change that does not load (a key
// that does not match its new certificate yet) keeps the running ones
// and is retried. The zero value is not usable; see NewCerts. It is safe
// for concurrent use.
type Certs struct {
	cfg     CertsConfig
	cur     atomic.Pointer[loaded]
	checked atomic.Int64
	mu      sync.Mutex
}

type loaded struct {
	cert  *tls.Certificate
	pool  *x509.CertPool // nil: no client certificates
	stamp [3]stamp
}

type stamp struct {
	mod  time.Time
	size int64
	fi   os.FileInfo
}

func (a stamp) same(b stamp) bool {
	if a.fi == nil || b.fi == nil {
		return a.fi == b.fi
	}
	return os.SameFile(a.fi, b.fi) && a.mod.Equal(b.mod) && a.size == b.size
}

// NewCerts loads cfg's files; errors name the key and the path.
func NewCerts(cfg CertsConfig) (*Certs, error) {
	if cfg.CertKey == "" {
		cfg.CertKey = "tls_cert"
	}
	if cfg.KeyKey == "" {
		cfg.KeyKey = "tls_key"
	}
	if cfg.ClientCAKey == "" {
		cfg.ClientCAKey = "client_ca"
	}
	switch {
	case cfg.CertFile == "":
		return nil, fmt.Errorf("%s: required with %s", cfg.CertKey, cfg.KeyKey)
	case cfg.KeyFile == "":
		return nil, fmt.Errorf("%s: required with %s", cfg.KeyKey, cfg.CertKey)
	}
	if cfg.CheckEvery <= 0 {
		cfg.CheckEvery = time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	c := &Certs{cfg: cfg}
	l, err := c.load()
	if err != nil {
		return nil, err
	}
	c.cur.Store(l)
	c.checked.Store(time.Now().UnixNano())
	return c, nil
}

func (c *Certs) stamps() ([3]stamp, error) {
	var out [3]stamp
	for i, f := range []struct{ key, path string }{{c.cfg.CertKey, c.cfg.CertFile}, {c.cfg.KeyKey, c.cfg.KeyFile}, {c.cfg.ClientCAKey, c.cfg.ClientCA}} {
		if f.path == "" {
			continue
		}
		fi, err := os.Stat(f.path)
		if err != nil {
			return out, fmt.Errorf("%s: %w", f.key, err)
		}
		out[i] = stamp{mod: fi.ModTime(), size: fi.Size(), fi: fi}
	}
	return out, nil
}

func (c *Certs) load() (*loaded, error) {
	st, err := c.stamps()
	if err != nil {
		return nil, err
	}
	certPEM, err := os.ReadFile(c.cfg.CertFile)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", c.cfg.CertKey, err)
	}
	keyPEM, err := os.ReadFile(c.cfg.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", c.cfg.KeyKey, err)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("%s %s and %s %s: %w", c.cfg.CertKey, c.cfg.CertFile, c.cfg.KeyKey, c.cfg.KeyFile, err)
	}
	l := &loaded{cert: &cert, stamp: st}
	if c.cfg.ClientCA != "" {
		data, err := os.ReadFile(c.cfg.ClientCA)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", c.cfg.ClientCAKey, err)
		}
		l.pool = x509.NewCertPool()
		if !l.pool.AppendCertsFromPEM(data) {
			return nil, fmt.Errorf("%s %s: no PEM certificate in the file", c.cfg.ClientCAKey, c.cfg.ClientCA)
		}
	}
	return l, nil
}

// current returns the loaded files, reloading them first when one
// changed and CheckEvery has passed since the last look.
func (c *Certs) current() *loaded {
	now := time.Now().UnixNano()
	last := c.checked.Load()
	if now-last < int64(c.cfg.CheckEvery) || !c.checked.CompareAndSwap(last, now) {
		return c.cur.Load()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	cur := c.cur.Load()
	st, err := c.stamps()
	if err != nil {
		c.cfg.Logger.Error("TLS files: keeping the running certificate", "err", err)
		return cur
	}
	if st[0].same(cur.stamp[0]) && st[1].same(cur.stamp[1]) && st[2].same(cur.stamp[2]) {
		return cur
	}
	l, err := c.load()
	if err != nil {
		// Likely half-rotated (a new certificate beside the old key):
		// keep serving the old pair and look again next time.
		c.cfg.Logger.Error("TLS files changed but do not load: keeping the running certificate", "err", err)
		return cur
	}
	c.cur.Store(l)
	c.cfg.Logger.Info("TLS files reloaded", "cert", c.cfg.CertFile, "client_ca", c.cfg.ClientCA)
	return l
}

// MutualTLS reports whether clients must present a certificate.
func (c *Certs) MutualTLS() bool { return c != nil && c.cfg.ClientCA != "" }

// Certificate returns the certificate served now.
func (c *Certs) Certificate() *tls.Certificate { return c.current().cert }

// ServerConfig returns a server TLS config that serves the current
// certificate and, with a client CA, requires and verifies client
// certificates against the current CAs, at every handshake.
// nextProtos are the ALPN protocols ("h2", "http/1.1" for HTTP; "h2"
// for gRPC).
func (c *Certs) ServerConfig(nextProtos ...string) *tls.Config {
	protos := append([]string(nil), nextProtos...)
	conf := func(l *loaded) *tls.Config {
		tc := &tls.Config{
			MinVersion:   tls.VersionTLS12,
			NextProtos:   protos,
			Certificates: []tls.Certificate{*l.cert},
		}
		if l.pool != nil {
			tc.ClientAuth = tls.RequireAndVerifyClientCert
			tc.ClientCAs = l.pool
		}
		return tc
	}
	base := conf(c.cur.Load())
	base.Certificates = nil
	base.GetCertificate = func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return c.current().cert, nil }
	base.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) { return conf(c.current()), nil }
	return base
}

// ClientConfig returns a client TLS config presenting the current
// certificate (for a node asking its peers' APIs) and trusting roots
// (nil: the system's).
func (c *Certs) ClientConfig(roots *x509.CertPool) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		RootCAs:    roots,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return c.current().cert, nil
		},
	}
}

// ClientCAs returns the client CAs loaded now, nil without any.
func (c *Certs) ClientCAs() *x509.CertPool { return c.current().pool }

// LoadPool reads a PEM bundle of CA certificates; errors name key.
func LoadPool(key, path string) (*x509.CertPool, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", key, err)
	}
	p := x509.NewCertPool()
	if !p.AppendCertsFromPEM(data) {
		return nil, fmt.Errorf("%s %s: %w", key, path, errNoPEM)
	}
	return p, nil
}

var errNoPEM = errors.New("no PEM certificate in the file")
