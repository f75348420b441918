package httplimit

import (
	"fmt"
	"net/http"
	"net/netip"
	"strings"
)

// ClientIP keys requests by the client's IP address. With no trusted proxies
// it is the connection's peer address (Request.RemoteAddr) and forwarding
// headers are ignored, so a client cannot pick its own key. When the peer is
// inside one of trusted, X-Forwarded-For is read from the right: the
// rightmost address that is not a trusted proxy is the client (each trusted
// proxy appends the address it saw, so everything left of that point may be
// forged by the client). If every address is trusted, the leftmost is used.
// A malformed address on that path is an error (ErrKey), not a guess.
//
// IPv4-mapped IPv6 addresses are keyed as IPv4, and zones are dropped.
func ClientIP(trusted []netip.Prefix) KeyFunc {
	ps := make([]netip.Prefix, 0, len(trusted))
	for _, p := range trusted {
		if p.IsValid() {
			ps = append(ps, p.Masked())
		}
	}
	isTrusted := func(a netip.Addr) bool {
		for _, p := range ps {
			if p.Contains(a) {
				return true
			}
		}
		return false
	}
	return func(r *http.Request) (string, error) {
		peer, err := parseAddr(r.RemoteAddr)
		if err != nil {
			return "", fmt.Errorf("%w: remote address %q: %v", ErrKey, r.RemoteAddr, err)
		}
		if len(ps) == 0 || !isTrusted(peer) {
			return peer.String(), nil
		}
		client := peer
		vals := r.Header.Values("X-Forwarded-For")
		for i := len(vals) - 1; i >= 0; i-- {
			parts := strings.Split(vals[i], ",")
			for j := len(parts) - 1; j >= 0; j-- {
				a, err := parseAddr(strings.TrimSpace(parts[j]))
				if err != nil {
					return "", fmt.Errorf("%w: X-Forwarded-For entry %q: %v", ErrKey, strings.TrimSpace(parts[j]), err)
				}
				if !isTrusted(a) {
					return a.String(), nil
				}
				client = a
			}
		}
		return client.String(), nil
	}
}

// parseAddr parses an IP address with or without a port ("192.0.2.1",
// "192.0.2.1:80", "[2001:db8::1]:80", "2001:db8::1").
func parseAddr(s string) (netip.Addr, error) {
	if s == "" {
		return netip.Addr{}, fmt.Errorf("empty address")
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		ap, err2 := netip.ParseAddrPort(s)
		if err2 != nil {
			return netip.Addr{}, err
		}
		a = ap.Addr()
	}
	return a.Unmap().WithZone(""), nil
}

// Header keys requests by the value of the header name (an API key, an
// account ID), trimmed of surrounding space. A request without it, or with
// an empty value, is refused with ErrKey (400 by default). Only use it for a
// header the client cannot forge, or where any value it sends is its own.
func Header(name string) KeyFunc {
	canon := http.CanonicalHeaderKey(name)
	return func(r *http.Request) (string, error) {
		v := strings.TrimSpace(r.Header.Get(canon))
		if v == "" {
			return "", fmt.Errorf("%w: header %s missing or empty", ErrKey, canon)
		}
		return v, nil
	}
}
