package mesh

import (
	"errors"
	"fmt"
	"syscall"

	"github.com/libp2p/go-libp2p/core/host"
	ma "github.com/multiformats/go-multiaddr"
)

// ErrAddrInUse wraps the error of New when a listen address is held by
// another socket (another member on the same port, say).
var ErrAddrInUse = errors.New("mesh: listen address in use")

// listen binds every address of addrs on h, in order, and fails on the
// first that cannot be bound, naming it. libp2p's own listening succeeds
// when any one address binds, and only logs the others; a member that
// silently lacks one of its configured addresses (or, with SO_REUSEPORT,
// shares one with another process) is worse than one that does not start.
func listen(h host.Host, addrs []string) error {
	// The swarm's AddListenAddr returns the transport's error itself;
	// Network.Listen flattens it into text.
	type adder interface{ AddListenAddr(ma.Multiaddr) error }
	for _, s := range addrs {
		a, err := ma.NewMultiaddr(s)
		if err != nil {
			return fmt.Errorf("mesh: listen %s: %w", s, err) // validate refused it already
		}
		if sw, ok := h.Network().(adder); ok {
			err = sw.AddListenAddr(a)
		} else {
			err = h.Network().Listen(a)
		}
		switch {
		case errors.Is(err, syscall.EADDRINUSE):
			return fmt.Errorf("%w: %s (%s): %w", ErrAddrInUse, s, portOf(a), err)
		case err != nil:
			return fmt.Errorf("mesh: listen %s: %w", s, err)
		}
	}
	return nil
}

// portOf names a's transport port, "tcp port 4001" or "udp port 4001".
func portOf(a ma.Multiaddr) string {
	if p, err := a.ValueForProtocol(ma.P_TCP); err == nil {
		return "tcp port " + p
	}
	if p, err := a.ValueForProtocol(ma.P_UDP); err == nil {
		return "udp port " + p
	}
	return "port unknown"
}
