package p2plimit

import (
	"fmt"
	"net/netip"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	ma "github.com/multiformats/go-multiaddr"
	manet "github.com/multiformats/go-multiaddr/net"
)

// RemotePeer keys streams by their remote peer ID, in text form: the peer
// the connection's security handshake authenticated, so a client cannot
// pick its own key short of making a new identity (see RemoteIP for
// clients that can).
func RemotePeer() KeyFunc {
	return func(s network.Stream) (string, error) {
		return s.Conn().RemotePeer().String(), nil
	}
}

// RemoteIP keys streams by the IP address of their connection's remote
// end, so that a client making many peer IDs from one address shares one
// key. IPv4-mapped IPv6 addresses are keyed as IPv4, and zones are
// dropped. A relayed connection (/p2p-circuit) is refused with ErrKey: its
// address is the relay's, which every client behind that relay shares.
func RemoteIP() KeyFunc {
	return func(s network.Stream) (string, error) {
		a := s.Conn().RemoteMultiaddr()
		if _, err := a.ValueForProtocol(ma.P_CIRCUIT); err == nil {
			return "", fmt.Errorf("%w: relayed connection %s: the address is the relay's, not the client's", ErrKey, a)
		}
		ip, err := manet.ToIP(a)
		if err != nil {
			return "", fmt.Errorf("%w: remote address %s: %v", ErrKey, a, err)
		}
		addr, ok := netip.AddrFromSlice(ip)
		if !ok {
			return "", fmt.Errorf("%w: remote address %s: not an IP address", ErrKey, a)
		}
		return addr.Unmap().WithZone("").String(), nil
	}
}

// PeerClasses returns a ClassFunc that gives a stream the class of the
// peer set its remote peer is in, and no class ("") to everyone else:
// the service's own peers "unlimited", say, or partners "gold". Each class
// must be one of the rule's classes (an unknown one refuses every stream
// of its peers with limiter.ErrUnknownClass). A peer in two sets, or an
// empty class name, is an error. The sets are copied.
func PeerClasses(sets map[string][]peer.ID) (ClassFunc, error) {
	classOf := make(map[peer.ID]string)
	for class, peers := range sets {
		if class == "" {
			return nil, fmt.Errorf("%w: PeerClasses: an empty class name", ErrInvalidConfig)
		}
		for _, p := range peers {
			if other, ok := classOf[p]; ok && other != class {
				return nil, fmt.Errorf("%w: PeerClasses: peer %s is in classes %q and %q", ErrInvalidConfig, p, other, class)
			}
			classOf[p] = class
		}
	}
	return func(s network.Stream) (string, error) {
		return classOf[s.Conn().RemotePeer()], nil
	}, nil
}
