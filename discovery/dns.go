// Package discovery finds peers by DNS name, for Kubernetes headless
// services and Docker Compose, where a name resolves to the address of
// every replica: a bootstrap entry dns:HOST:PORT makes a member resolve
// HOST, ask each address's HTTP API (PORT) for its peer ID and multiaddrs
// (GET /v1/peers, the entry marked self), and dial the peers it is not
// connected to, again every Interval.
//
//	d, err := discovery.New(discovery.Config{
//		Targets: []string{"ratemesh:8080"},
//		Self:    m.PeerID(),
//		Connect: m.Connect, Connected: connected,
//	})
//	go d.Run(ctx)
package discovery

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ratemesh/ratemesh/config"
)

// Resolver resolves a name to addresses; *net.Resolver is one. Calls may
// be concurrent.
type Resolver interface {
	LookupHost(ctx context.Context, host string) ([]string, error)
}

// Config configures a DNS discovery. Targets, Self and Connect are
// required.
type Config struct {
	// Targets are HOST:PORT pairs: a name and the API port of the peers
	// it resolves to.
	Targets []string
	// Self is this member's peer ID; the address that answers with it is
	// skipped.
	Self string
	// Connect dials a full multiaddr ending in /p2p/<peer ID>
	// (mesh.Mesh.Connect). It may block up to its own dial timeout.
	Connect func(ctx context.Context, addr string) error
	// Connected reports whether a peer is connected already; nil: never.
	Connected func(peerID string) bool
	// Resolver resolves the names; nil is net.DefaultResolver.
	Resolver Resolver
	// Client asks the APIs; nil is a client with a 3 s timeout.
	Client *http.Client
	// Token returns the bearer token presented to the APIs (GET
	// /v1/peers needs the admin scope when they ask for tokens); nil or
	// "": none.
	Token func() string
	// TLS, when not nil, asks the APIs over HTTPS with this client
	// config, each target's certificate verified against the target's
	// host name (ServerName is set per target). It replaces Client's
	// transport.
	TLS *tls.Config
	// Interval is the time between rounds once a peer was found
	// (default 10 s); until then rounds are FastInterval apart (default
	// 1 s), so members that start together find each other at once.
	Interval, FastInterval time.Duration
	// Logger receives what a round found and failed; nil discards it.
	Logger *slog.Logger
}

// DNS is a running discovery; see Run.
type DNS struct {
	cfg     Config
	targets []target
}

type target struct {
	host   string
	port   int
	client *http.Client
	scheme string
}

// New checks cfg and returns a discovery.
func New(cfg Config) (*DNS, error) {
	if cfg.Self == "" || cfg.Connect == nil {
		return nil, errors.New("discovery: Config.Self and Config.Connect must be set")
	}
	d := &DNS{cfg: cfg}
	for _, t := range cfg.Targets {
		h, n, err := config.SplitDNS(t)
		if err != nil {
			return nil, fmt.Errorf("discovery: target %q: %w", t, err)
		}
		d.targets = append(d.targets, target{host: h, port: n, scheme: "http"})
	}
	if d.cfg.Resolver == nil {
		d.cfg.Resolver = net.DefaultResolver
	}
	if d.cfg.Client == nil {
		d.cfg.Client = &http.Client{Timeout: 3 * time.Second}
	}
	for i := range d.targets {
		d.targets[i].client = d.cfg.Client
		if d.cfg.TLS != nil {
			tc := d.cfg.TLS.Clone()
			tc.ServerName = d.targets[i].host
			c := *d.cfg.Client
			c.Transport = &http.Transport{TLSClientConfig: tc, Proxy: nil, MaxIdleConnsPerHost: 2, IdleConnTimeout: 30 * time.Second}
			d.targets[i].client, d.targets[i].scheme = &c, "https"
		}
	}
	if d.cfg.Interval <= 0 {
		d.cfg.Interval = 10 * time.Second // a replica that scales in is found within this
	}
	if d.cfg.FastInterval <= 0 {
		d.cfg.FastInterval = time.Second
	}
	if d.cfg.Logger == nil {
		d.cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return d, nil
}

// Run runs rounds until ctx ends.
func (d *DNS) Run(ctx context.Context) {
	found := false
	for {
		if n := d.Round(ctx); n > 0 {
			found = true
		}
		wait := d.cfg.Interval
		if !found {
			wait = d.cfg.FastInterval
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// Round resolves every target once and dials each peer found that is
// not connected yet. It returns how many peers (other than this member)
// answered.
func (d *DNS) Round(ctx context.Context) int {
	peers := 0
	for _, t := range d.targets {
		addrs, err := d.cfg.Resolver.LookupHost(ctx, t.host)
		if err != nil {
			d.cfg.Logger.Warn("dns discovery: cannot resolve", "host", t.host, "err", err)
			continue
		}
		slices.Sort(addrs)
		for _, ip := range addrs {
			api := net.JoinHostPort(ip, strconv.Itoa(t.port))
			self, err := d.ask(ctx, t, api)
			if err != nil {
				level := slog.LevelDebug
				if errors.Is(err, errRefused) {
					level = slog.LevelWarn // a configuration to fix, not a peer still starting
				}
				d.cfg.Logger.Log(ctx, level, "dns discovery: no answer", "host", t.host, "api", api, "err", err)
				continue
			}
			if self.PeerID == d.cfg.Self {
				continue
			}
			peers++
			if d.cfg.Connected != nil && d.cfg.Connected(self.PeerID) {
				continue
			}
			d.dial(ctx, ip, self)
		}
	}
	return peers
}

// peer is the self entry of GET /v1/peers (see httpapi.PeerJSON).
type peer struct {
	PeerID string   `json:"peer_id"`
	Addrs  []string `json:"addrs"`
	Self   bool     `json:"self"`
}

// errRefused is a 401 or 403 from a peer's API: its tokens and ours
// differ.
var errRefused = errors.New("refused: the members' API tokens differ (GET /v1/peers needs an admin token from api.token_file)")

// ask returns the member that serves the API at api (an address of t).
func (d *DNS) ask(ctx context.Context, t target, api string) (peer, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, t.scheme+"://"+api+"/v1/peers", nil)
	if err != nil {
		return peer{}, err
	}
	if d.cfg.Token != nil {
		if tok := d.cfg.Token(); tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
	}
	resp, err := t.client.Do(req)
	if err != nil {
		return peer{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden {
		return peer{}, fmt.Errorf("GET /v1/peers: %s: %w", resp.Status, errRefused)
	}
	if resp.StatusCode != http.StatusOK {
		return peer{}, fmt.Errorf("GET /v1/peers: %s", resp.Status)
	}
	var pr struct {
		Peers []peer `json:"peers"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 4<<20)).Decode(&pr); err != nil {
		return peer{}, fmt.Errorf("GET /v1/peers: %w", err)
	}
	for _, p := range pr.Peers {
		if p.Self && p.PeerID != "" {
			return p, nil
		}
	}
	return peer{}, errors.New("GET /v1/peers: no entry marked self")
}

// dial tries the peer's addresses, those on the address its name resolved
// to first (a member listening on 0.0.0.0 advertises every interface,
// loopback included, and only the resolved one is sure to be reachable).
func (d *DNS) dial(ctx context.Context, ip string, p peer) {
	addrs := slices.Clone(p.Addrs)
	onIP := func(a string) bool {
		return strings.Contains(a, "/ip4/"+ip+"/") || strings.Contains(a, "/ip6/"+ip+"/")
	}
	slices.SortStableFunc(addrs, func(a, b string) int {
		switch {
		case onIP(a) && !onIP(b):
			return -1
		case onIP(b) && !onIP(a):
			return 1
		}
		return 0
	})
	var errs []error
	for _, a := range addrs {
		if !strings.HasSuffix(a, "/p2p/"+p.PeerID) {
			continue
		}
		err := d.cfg.Connect(ctx, a)
		if err == nil {
			d.cfg.Logger.Info("dns discovery: connected", "peer", p.PeerID, "addr", a)
			return
		}
		errs = append(errs, err)
	}
	d.cfg.Logger.Warn("dns discovery: cannot dial a peer it found", "peer", p.PeerID, "err", errors.Join(errs...))
}
