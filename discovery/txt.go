package discovery

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"strings"
	"time"

	libp2ppeer "github.com/libp2p/go-libp2p/core/peer"
)

// TXTPrefix starts a DNS TXT record that names a member of the mesh:
//
//	ratemesh.example.internal. 60 IN TXT "ratemesh-peer=12D3KooW…"
//
// one record per member, usually on the same name as a dns:HOST:PORT
// bootstrap entry (node.allow_peers_dns in the config file). Other TXT
// records on the name are ignored.
const TXTPrefix = "ratemesh-peer="

// TXTResolver looks up TXT records; *net.Resolver is one. Calls may be
// concurrent.
type TXTResolver interface {
	LookupTXT(ctx context.Context, name string) ([]string, error)
}

// ParseTXT returns the peer IDs that records name (TXTPrefix records, the
// prefix matched without regard to case, spaces around the ID ignored),
// sorted and without repeats, and the TXTPrefix records whose ID does not
// decode as a peer ID. Other records are skipped.
func ParseTXT(records []string) (ids, bad []string) {
	for _, r := range records {
		r = strings.TrimSpace(r)
		if len(r) < len(TXTPrefix) || !strings.EqualFold(r[:len(TXTPrefix)], TXTPrefix) {
			continue
		}
		id := strings.TrimSpace(r[len(TXTPrefix):])
		p, err := libp2ppeer.Decode(id)
		if err != nil {
			bad = append(bad, r)
			continue
		}
		ids = append(ids, p.String())
	}
	slices.Sort(ids)
	return slices.Compact(ids), bad
}

// TXTConfig configures an allowlist read from DNS TXT records. Names and
// Set are required.
type TXTConfig struct {
	// Names are the DNS names whose TXT records list the members.
	Names []string
	// Set receives the peer IDs every name lists together, after each
	// round that resolved every name (mesh.Mesh.SetAllowedPeers with a
	// source name of its own). It is called from Round's goroutine.
	Set func(peerIDs []string) error
	// Resolver looks the names up; nil is net.DefaultResolver.
	Resolver TXTResolver
	// Interval is the time between rounds (default 10 s, as for
	// dns:HOST:PORT discovery).
	Interval time.Duration
	// Logger receives what a round found and failed; nil discards it.
	Logger *slog.Logger
}

// TXT keeps an allowlist from DNS TXT records; see Round and Run.
type TXT struct {
	cfg  TXTConfig
	last []string
	ok   bool // a round has succeeded
}

// NewTXT checks cfg and returns the TXT source.
func NewTXT(cfg TXTConfig) (*TXT, error) {
	if len(cfg.Names) == 0 || cfg.Set == nil {
		return nil, errors.New("discovery: TXTConfig.Names and TXTConfig.Set must be set")
	}
	for i, n := range cfg.Names {
		if strings.TrimSpace(n) == "" || strings.ContainsAny(n, " \t/:") {
			return nil, fmt.Errorf("discovery: TXT name [%d] %q: want a DNS name", i, n)
		}
	}
	if cfg.Resolver == nil {
		cfg.Resolver = net.DefaultResolver
	}
	if cfg.Interval <= 0 {
		cfg.Interval = 10 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return &TXT{cfg: cfg}, nil
}

// Round looks every name up once and, when every lookup succeeded, hands
// the peers they list to Set (even none: an answer is the operator's
// word). A failed lookup — a timeout, a server failure, a name that does
// not exist — keeps the list of the last good round, and Round returns
// the error naming the name. It is not safe to call Round concurrently.
func (d *TXT) Round(ctx context.Context) error {
	var all []string
	for _, name := range d.cfg.Names {
		recs, err := d.cfg.Resolver.LookupTXT(ctx, name)
		if err != nil {
			return fmt.Errorf("discovery: TXT %s: %w (keeping the last list)", name, err)
		}
		ids, bad := ParseTXT(recs)
		if len(bad) > 0 {
			d.cfg.Logger.Warn("dns allowlist: records that name no peer ID; skipped", "name", name, "records", bad)
		}
		all = append(all, ids...)
	}
	slices.Sort(all)
	all = slices.Compact(all)
	if d.ok && slices.Equal(all, d.last) {
		return nil
	}
	if err := d.cfg.Set(all); err != nil {
		return fmt.Errorf("discovery: TXT: %w", err)
	}
	d.last, d.ok = all, true
	d.cfg.Logger.Info("dns allowlist", "names", d.cfg.Names, "peers", len(all))
	return nil
}

// Run runs a round every Interval until ctx ends, logging failures once
// until a round succeeds again.
func (d *TXT) Run(ctx context.Context) {
	failing := ""
	for {
		err := d.Round(ctx)
		switch {
		case err != nil && err.Error() != failing && ctx.Err() == nil:
			d.cfg.Logger.Warn("dns allowlist: lookup failed", "err", err)
			failing = err.Error()
		case err == nil:
			failing = ""
		}
		t := time.NewTimer(d.cfg.Interval)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}
