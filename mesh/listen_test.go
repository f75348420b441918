package mesh

import (
	"errors"
	"net"
	"strings"
	"testing"

	ma "github.com/multiformats/go-multiaddr"
)

// TestNewRefusesAddressInUse: a listen address another socket holds fails
// New with ErrAddrInUse naming the address and the port — for a member on
// the same port (before, SO_REUSEPORT let both bind it), for a plain
// socket, over QUIC, and when it is only one of several addresses (libp2p
// alone starts when any one binds).
func TestNewRefusesAddressInUse(t *testing.T) {
	first, _ := startMesh(t, testConfig(t))
	var tcpPort, udpPort string
	for _, a := range first.Host().Network().ListenAddresses() {
		if p, err := a.ValueForProtocol(ma.P_TCP); err == nil {
			tcpPort = p
		}
		if p, err := a.ValueForProtocol(ma.P_UDP); err == nil {
			udpPort = p
		}
	}
	if tcpPort == "" || udpPort == "" {
		t.Fatalf("first member listens on %v", first.Host().Network().ListenAddresses())
	}
	plain, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	_, plainPort, _ := net.SplitHostPort(plain.Addr().String())

	for _, tc := range []struct {
		name   string
		listen []string
		want   string // the address named
		port   string
	}{
		{"member's tcp port", []string{"/ip4/127.0.0.1/tcp/" + tcpPort}, "/ip4/127.0.0.1/tcp/" + tcpPort, "tcp port " + tcpPort},
		{"plain socket's port", []string{"/ip4/127.0.0.1/tcp/" + plainPort}, "/ip4/127.0.0.1/tcp/" + plainPort, "tcp port " + plainPort},
		{"member's quic port", []string{"/ip4/127.0.0.1/udp/" + udpPort + "/quic-v1"}, "/ip4/127.0.0.1/udp/" + udpPort + "/quic-v1", "udp port " + udpPort},
		{"second of two", []string{"/ip4/127.0.0.1/tcp/0", "/ip4/127.0.0.1/tcp/" + tcpPort}, "/ip4/127.0.0.1/tcp/" + tcpPort, "tcp port " + tcpPort},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t)
			cfg.Listen = tc.listen
			m, err := New(cfg)
			if err == nil {
				_ = m.Close()
				t.Fatalf("New on %v: started, listening on %v", tc.listen, m.Host().Network().ListenAddresses())
			}
			if !errors.Is(err, ErrAddrInUse) || !strings.Contains(err.Error(), tc.want+" ("+tc.port+")") {
				t.Fatalf("New on %v: %v; want ErrAddrInUse naming %s (%s)", tc.listen, err, tc.want, tc.port)
			}
		})
	}

	// The first member still serves on its addresses alone.
	second, _ := startMesh(t, testConfig(t))
	if err := second.Connect(t.Context(), first.Addrs()[0]); err != nil {
		t.Fatalf("dial the first member after the refusals: %v", err)
	}
}
