// Package tlstest makes throwaway certificate authorities and
// certificates for tests (crypto/x509, ECDSA P-256), written as PEM
// files. It is imported only by _test.go files.
package tlstest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

var serial atomic.Int64

// CA is a certificate authority.
type CA struct {
	Cert *x509.Certificate
	Key  *ecdsa.PrivateKey
	// File is its certificate's PEM file.
	File string
}

// NewCA returns a CA named name with its certificate in dir.
func NewCA(t testing.TB, dir, name string) *CA {
	t.Helper()
	key, tmpl := newTemplate(t, name)
	tmpl.IsCA, tmpl.BasicConstraintsValid = true, true
	tmpl.KeyUsage = x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	ca := &CA{Cert: cert, Key: key, File: filepath.Join(dir, name+"-ca.pem")}
	WriteFile(t, ca.File, pemBlock("CERTIFICATE", der))
	return ca
}

// newTemplate returns a fresh P-256 key and a certificate template for
// name, valid from an hour ago for a day, with the next serial number.
func newTemplate(t testing.TB, name string) (*ecdsa.PrivateKey, *x509.Certificate) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return key, &x509.Certificate{
		SerialNumber: big.NewInt(serial.Add(1)),
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
	}
}

// Pool returns a pool holding the CA.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.Cert)
	return p
}

// Leaf is a certificate and its key, as PEM bytes and as a tls.Certificate.
type Leaf struct {
	CertPEM, KeyPEM []byte
	TLS             tls.Certificate
	Serial          *big.Int
}

// Server issues a server certificate for 127.0.0.1, ::1, localhost and
// dnsNames.
func (ca *CA) Server(t testing.TB, name string, dnsNames ...string) *Leaf {
	t.Helper()
	return ca.issue(t, name, x509.ExtKeyUsageServerAuth, func(c *x509.Certificate) {
		c.DNSNames = append([]string{"localhost"}, dnsNames...)
		c.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}
	})
}

// Client issues a client certificate.
func (ca *CA) Client(t testing.TB, name string) *Leaf {
	t.Helper()
	return ca.issue(t, name, x509.ExtKeyUsageClientAuth, nil)
}

func (ca *CA) issue(t testing.TB, name string, use x509.ExtKeyUsage, edit func(*x509.Certificate)) *Leaf {
	t.Helper()
	key, tmpl := newTemplate(t, name)
	tmpl.KeyUsage, tmpl.ExtKeyUsage = x509.KeyUsageDigitalSignature, []x509.ExtKeyUsage{use}
	if edit != nil {
		edit(tmpl)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.Key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	l := &Leaf{CertPEM: pemBlock("CERTIFICATE", der), KeyPEM: pemBlock("PRIVATE KEY", kder), Serial: tmpl.SerialNumber}
	if l.TLS, err = tls.X509KeyPair(l.CertPEM, l.KeyPEM); err != nil {
		t.Fatal(err)
	}
	return l
}

// Write writes the leaf's certificate and key to certFile and keyFile,
// each replaced at once (a temporary file renamed over it), as a
// rotation should.
func (l *Leaf) Write(t testing.TB, certFile, keyFile string) {
	t.Helper()
	WriteFile(t, keyFile, l.KeyPEM)
	WriteFile(t, certFile, l.CertPEM)
}

// WriteFile replaces path with data at once: a temporary file in the
// same directory renamed over it.
func WriteFile(t testing.TB, path string, data []byte) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func pemBlock(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}
