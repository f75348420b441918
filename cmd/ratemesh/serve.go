package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
	ma "github.com/multiformats/go-multiaddr"
	manet "github.com/multiformats/go-multiaddr/net"

	"github.com/ratemesh/ratemesh/config"
	"github.com/ratemesh/ratemesh/discovery"
	"github.com/ratemesh/ratemesh/httpapi"
	"github.com/ratemesh/ratemesh/limiter"
	"github.com/ratemesh/ratemesh/mesh"
	"github.com/ratemesh/ratemesh/node"
	"github.com/ratemesh/ratemesh/persistence"
)

const serveUsage = "serve [--config FILE] [--listen MULTIADDR]... [--api HOST:PORT] [--data-dir DIR] [--bootstrap MULTIADDR|dns:HOST:PORT]... [--psk-file FILE] [--allow-peer PEER_ID]... [--allow-peers-file FILE] [--allow-peers-dns NAME]... [--grpc HOST:PORT] [--envoy-config PATH] [--envoy-share-wait D] [--token-file FILE] [--tls-cert FILE --tls-key FILE [--client-ca FILE]] [--insecure-api] [--metrics-auth] [--log-level LEVEL] [--log-format text|json] [--config-poll D] [--pprof HOST:PORT] [--upgrade-alone]"

// ReadyLine is what serve prints on stdout once it serves: one JSON line.
type ReadyLine struct {
	API    string   `json:"api"`
	PeerID string   `json:"peer_id"`
	Addrs  []string `json:"addrs"`
	// GRPC is the rate limit service's address, when node.grpc is set.
	GRPC string `json:"grpc,omitempty"`
}

// multiFlag is a repeatable string flag.
type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ",") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }

// serveOpts are serve's flags.
type serveOpts struct {
	cfgPath, api, dataDir, pskFile, allowFile, logLevel, logFormat string
	grpcAddr, envoyCfg, tokenFile, tlsCert, tlsKey, clientCA       string
	pprofAddr                                                      string
	listen, bootstrap, allowPeers, allowDNS                        multiFlag
	insecureAPI, metricsAuth, upgradeAlone                         bool
	configPoll, envoyShareWait                                     time.Duration
}

// serveFlags returns serve's flag set, writing into o; each flag's help
// names its environment variable (applyEnv).
func serveFlags(stderr io.Writer, o *serveOpts) *flag.FlagSet {
	fset := flag.NewFlagSet("serve", flag.ContinueOnError)
	setUsage(fset, stderr)
	fset.StringVar(&o.cfgPath, "config", "", "YAML config `file` (docs/operations.md); flags override it")
	fset.Var(&o.listen, "listen", "libp2p listen `multiaddr` (repeatable; default /ip4/127.0.0.1/tcp/4001)")
	fset.StringVar(&o.api, "api", "", "HTTP API `host:port` (default 127.0.0.1:8080; port 0 picks one)")
	fset.StringVar(&o.dataDir, "data-dir", "", "data `dir` (default ./ratemesh-data)")
	fset.Var(&o.bootstrap, "bootstrap", "peer `multiaddr` ending in /p2p/<id> to join, or dns:HOST:PORT to join every peer HOST resolves to (PORT: their API port) (repeatable)")
	fset.StringVar(&o.pskFile, "psk-file", "", "private network key `file` (swarm.key format)")
	fset.Var(&o.allowPeers, "allow-peer", "`peer ID` that may be a member; with any --allow-peer* flag (or node.allow_peers*), only listed peers may connect (repeatable)")
	fset.StringVar(&o.allowFile, "allow-peers-file", "", "`file` of member peer IDs, one a line, # comments; re-read when it changes")
	fset.Var(&o.allowDNS, "allow-peers-dns", "DNS `name` whose TXT records ratemesh-peer=<peer ID> list members; re-read every 10 s (repeatable)")
	fset.StringVar(&o.logLevel, "log-level", "info", "log `level`: debug, info, warn, error")
	fset.StringVar(&o.logFormat, "log-format", "text", "log `format` on stderr: text or json (one JSON object a line)")
	fset.StringVar(&o.grpcAddr, "grpc", "", "serve Envoy's rate limit service (gRPC) and gRPC health on `host:port` (port 0 picks one)")
	fset.StringVar(&o.envoyCfg, "envoy-config", "", "envoyproxy/ratelimit descriptor `path`: a YAML file or a directory of *.yaml")
	fset.DurationVar(&o.envoyShareWait, "envoy-share-wait", 0, "hold a share denial of the rules generated from --envoy-config for at most this `duration`, 0 to 1s; 0 refuses at once (envoy.share_wait; a call's deadline bounds a hold anyway)")
	fset.StringVar(&o.tokenFile, "token-file", "", "API bearer tokens `file`: \"SCOPE TOKEN\" a line, scope decide or admin; re-read on change (api.token_file; also "+envAPITokens+")")
	fset.StringVar(&o.tlsCert, "tls-cert", "", "serve the HTTP API and gRPC over TLS with this PEM certificate `file` (api.tls_cert; with --tls-key); re-read on change")
	fset.StringVar(&o.tlsKey, "tls-key", "", "the PEM private key `file` of --tls-cert (api.tls_key)")
	fset.StringVar(&o.clientCA, "client-ca", "", "require client certificates signed by a CA of this PEM `file` (mutual TLS; api.client_ca)")
	fset.BoolVar(&o.upgradeAlone, "upgrade-alone", false, "this node ran alone: migrate a data directory an older ratemesh wrote, which does not record the members its node knew (with --bootstrap it migrates anyway)")
	fset.BoolVar(&o.insecureAPI, "insecure-api", false, "allow a non-loopback --api or --grpc without tokens or client certificates (api.insecure)")
	fset.BoolVar(&o.metricsAuth, "metrics-auth", false, "/metrics asks for a token too (api.metrics_auth)")
	fset.DurationVar(&o.configPoll, "config-poll", defaultConfigPoll, "re-read --config when the file changes on disk (a Kubernetes ConfigMap update too), checking this often; 0: only on SIGHUP")
	fset.StringVar(&o.pprofAddr, "pprof", "", "serve Go's profiler (/debug/pprof/) on its own `host:port`, loopback unless the host says otherwise (a non-loopback host needs --insecure-api); off by default")
	fset.VisitAll(func(f *flag.Flag) { f.Usage += " [$" + envName(f.Name) + "]" })
	return fset
}

func runServe(args []string, stdout, stderr io.Writer) int {
	var o serveOpts
	fset := serveFlags(stderr, &o)
	if err := fset.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fset.NArg() > 0 {
		fmt.Fprintln(stderr, "usage: ratemesh "+serveUsage)
		return 2
	}
	fromEnv, err := applyEnv(fset, os.Getenv)
	if err != nil {
		fmt.Fprintf(stderr, "ratemesh serve: %v\n", err)
		return 2
	}
	level, err := parseLevel(o.logLevel)
	if err != nil {
		fmt.Fprintf(stderr, "ratemesh serve: %s: %v\n", flagSource("log-level", fromEnv), err)
		return 2
	}
	log, err := newLogger(stderr, o.logFormat, level)
	if err != nil {
		fmt.Fprintf(stderr, "ratemesh serve: %s: %v\n", flagSource("log-format", fromEnv), err)
		return 2
	}
	for _, b := range o.bootstrap {
		if err := config.CheckBootstrap(b); err != nil {
			fmt.Fprintf(stderr, "ratemesh serve: %s %s: %v\n", flagSource("bootstrap", fromEnv), b, err)
			return 2
		}
	}
	if o.configPoll < 0 {
		fmt.Fprintf(stderr, "ratemesh serve: %s %v: must be 0 (off) or positive\n", flagSource("config-poll", fromEnv), o.configPoll)
		return 2
	}

	cfg := config.Default()
	if o.cfgPath != "" {
		c, err := config.Load(o.cfgPath)
		if err != nil {
			fmt.Fprintf(stderr, "ratemesh serve: %v\n", err)
			return 1
		}
		cfg = *c
	}
	// The file as read: a reload compares the file with it, and leaves
	// out what the flags and their variables decide.
	ex := &serveExtras{file: cfg, overridden: overridden(fset), poll: o.configPoll, upgradeAlone: o.upgradeAlone}
	// A flag (or its variable) given replaces the file's value.
	for _, f := range []struct {
		flag multiFlag
		dst  *[]string
	}{
		{o.listen, &cfg.Node.Listen}, {o.bootstrap, &cfg.Node.Bootstrap},
		{o.allowPeers, &cfg.Node.AllowPeers}, {o.allowDNS, &cfg.Node.AllowPeersDNS},
	} {
		if len(f.flag) > 0 {
			*f.dst = f.flag
		}
	}
	for _, f := range []struct{ flag, dst *string }{
		{&o.api, &cfg.Node.API}, {&o.dataDir, &cfg.Node.DataDir}, {&o.pskFile, &cfg.Node.PSKFile},
		{&o.allowFile, &cfg.Node.AllowPeersFile}, {&o.grpcAddr, &cfg.Node.GRPC}, {&o.envoyCfg, &cfg.Envoy.Config},
		{&o.tokenFile, &cfg.API.TokenFile}, {&o.tlsCert, &cfg.API.TLSCert}, {&o.tlsKey, &cfg.API.TLSKey}, {&o.clientCA, &cfg.API.ClientCA},
	} {
		if *f.flag != "" {
			*f.dst = *f.flag
		}
	}
	var flagErr error
	fset.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "insecure-api":
			cfg.API.Insecure = o.insecureAPI
		case "metrics-auth":
			cfg.API.MetricsAuth = o.metricsAuth
		case "envoy-share-wait":
			switch w := o.envoyShareWait; {
			case w < 0 || w > limiter.MaxShareWait:
				flagErr = fmt.Errorf("%s %v: must be from 0 (refuse at once) to %v", flagSource(f.Name, fromEnv), w, limiter.MaxShareWait)
			case w == 0:
				cfg.Envoy.ShareWait = limiter.NoShareWait
			default:
				cfg.Envoy.ShareWait = w
			}
		}
	})
	if flagErr != nil {
		fmt.Fprintf(stderr, "ratemesh serve: %v\n", flagErr)
		return 2
	}
	if err := cfg.Validate(); err != nil {
		fmt.Fprintf(stderr, "ratemesh serve: %v\n", err)
		return 1
	}
	if ex.pprofAddr, err = pprofAddress(o.pprofAddr, cfg.API.Insecure); err != nil {
		fmt.Fprintf(stderr, "ratemesh serve: %s: %v\n", flagSource("pprof", fromEnv), err)
		return 1
	}
	envTokens := os.Getenv(envAPITokens)
	if err := checkExposure(&cfg, envTokens != ""); err != nil {
		fmt.Fprintf(stderr, "ratemesh serve: %v\n", err)
		return 1
	}
	if ex.auth, err = newAPIAuth(&cfg, envTokens, log); err != nil {
		fmt.Fprintf(stderr, "ratemesh serve: %v\n", err)
		return 1
	}
	if ex.desc, err = loadEnvoy(&cfg); err != nil {
		fmt.Fprintf(stderr, "ratemesh serve: %v\n", err)
		return 1
	}
	ex.envoyPath, ex.envoy = cfg.Envoy.Config, cfg.Envoy
	for _, w := range cfg.Warnings {
		log.Warn("config: " + w)
	}
	if stopGC, ok := startGCTuner(gcHeadroom, os.Getenv); ok {
		defer stopGC()
		log.Debug("garbage collection: the heap may grow by at least 64 MiB between collections (GOGC or GOMEMLIMIT in the environment turn this off)")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	routeLibraryLogs(o.logFormat)
	done := make(chan error, 1)
	go func() { done <- serve(ctx, cfg, o.cfgPath, ex, hup, stdout, log) }()
	select {
	case err = <-done:
	case <-ctx.Done():
		// Shutting down: a second signal kills at once, and the shutdown
		// has shutdownBudget whatever the disk or the peers do.
		stop()
		select {
		case err = <-done:
		case <-time.After(shutdownBudget):
			log.Error("shutdown did not finish in time; exiting without it", "budget", shutdownBudget, "data_dir", cfg.Node.DataDir)
			return 1
		}
	}
	if err != nil {
		log.Error("serve", "err", err)
		return 1
	}
	return 0
}

// Shutdown bounds. Close takes at most LeaveTimeout (2 s) + StoreTimeout
// (2 s) plus the transport's close; with the HTTP drain that stays well
// within shutdownBudget, the backstop.
const (
	httpDrain      = 2 * time.Second // in-flight requests finish, then connections are closed
	shutdownBudget = 9 * time.Second // from the signal to the exit, whatever happens
)

// serve runs a node until ctx ends, reloading the rules from cfgPath on
// every value from hup.
func serve(ctx context.Context, cfg config.Config, cfgPath string, ex *serveExtras, hup <-chan os.Signal, stdout io.Writer, log *slog.Logger) error {
	if err := os.MkdirAll(cfg.Node.DataDir, 0o700); err != nil {
		return fmt.Errorf("node.data_dir: %w", err)
	}
	key, err := mesh.LoadOrCreateKey(filepath.Join(cfg.Node.DataDir, "identity.key"))
	if err != nil {
		return err
	}
	mcfg := meshConfig(&cfg)
	mcfg.PrivKey, mcfg.Logger = key, log
	if cfg.Node.PSKFile != "" {
		if mcfg.PSK, err = mesh.LoadPSK(cfg.Node.PSKFile); err != nil {
			return fmt.Errorf("node.psk_file: %w", err)
		}
	}
	if cfg.Node.AllowPeersFile != "" {
		if _, err := mesh.LoadAllowList(cfg.Node.AllowPeersFile); err != nil {
			return fmt.Errorf("node.allow_peers_file: %w", err)
		}
	}
	warnAdmission(&cfg, mcfg.PSK != nil, log)
	rules := append(append([]limiter.Rule(nil), cfg.Rules...), ex.desc.Rules()...)
	plaus := mesh.NewPlausibility(rules)
	mcfg.Plausible = plaus.Bound
	opts := []persistence.Option{persistence.WithLogger(log)}
	if len(cfg.Node.Bootstrap) > 0 || ex.upgradeAlone { // it joins (node.Config.Join), or ran alone: an old store's silence on members is harmless
		opts = append(opts, persistence.UpgradeUnknownMembers())
	}
	store, err := persistence.Open(cfg.Node.DataDir, opts...)
	if err != nil {
		return fmt.Errorf("node.data_dir: %w", err)
	}
	known, err := knownPeers(ctx, store, mcfg.Bootstrap, key)
	if err != nil {
		_ = store.Close()
		return fmt.Errorf("node.data_dir: %w", err)
	}
	if len(known) > 0 {
		log.Info("dialing the members known before the restart", "addrs", len(known))
		mcfg.Bootstrap = append(mcfg.Bootstrap, known...)
	}
	m, err := mesh.New(mcfg)
	if err != nil {
		_ = store.Close()
		return err
	}
	if err := startAllowDNS(ctx, &cfg, m, log); err != nil {
		_ = m.Close()
		_ = store.Close()
		return err
	}
	ncfg := cfg.NodeConfig(node.DefaultConfig())
	ncfg.Join = ncfg.Join || len(known) > 0 // --bootstrap (dns: entries too), or members saved by an earlier run
	ncfg.Peer, ncfg.Transport, ncfg.Store, ncfg.Logger = m.PeerID(), m, store, log.With("component", "node")
	ncfg.Rules = rules
	// The API serves during the join: /healthz answers 503 "joining" and
	// decisions are denied with retry_after = the time left of
	// join_timeout (docs/design.md, "Joining and state transfer").
	ncfg.StartJoining = true

	// The API listens before the node has joined, so /healthz can say so.
	ln, err := net.Listen("tcp", cfg.Node.API)
	if err != nil {
		_ = m.Close()
		_ = store.Close()
		return fmt.Errorf("node.api: %w", err)
	}
	ln = limitConns(ln, cfg.Node.HTTP)
	ex.auth.warn(&cfg, log)
	gln, err := listenGRPC(&cfg)
	if err != nil {
		_ = ln.Close()
		_ = m.Close()
		_ = store.Close()
		return err
	}
	if gln != nil {
		defer gln.Close() // closed by the gRPC server once it serves; this covers a failed start
	}
	front := &frontHandler{}
	srv := newAPIServer(cfg.Node.HTTP, front, log)
	srvDone := make(chan error, 1)
	if ex.auth.certs != nil {
		// HTTP/1.1 only: bounded's deadlines are per connection.
		srv.TLSConfig = ex.auth.certs.ServerConfig("http/1.1")
		go func() { srvDone <- srv.ServeTLS(ln, "", "") }()
	} else {
		go func() { srvDone <- srv.Serve(ln) }()
	}
	shutdownHTTP := func() {
		sctx, cancel := context.WithTimeout(context.Background(), httpDrain)
		defer cancel()
		if srv.Shutdown(sctx) != nil {
			_ = srv.Close() // requests still running (a long /v1/wait) are cut
		}
	}

	log.Info("starting", "peer_id", m.PeerID(), "listen", cfg.Node.Listen, "bootstrap", cfg.Node.Bootstrap, "api", ln.Addr().String(), "rules", len(cfg.Rules))
	n, err := node.Start(ctx, ncfg)
	if err != nil {
		shutdownHTTP()
		_ = m.Close()     // idempotent: Start closes it only if it started it
		_ = store.Close() // a failed Start leaves the store to us
		if ctx.Err() != nil {
			log.Info("interrupted while joining")
			return nil
		}
		return err
	}
	api, err := httpapi.New(httpapi.Config{Node: n, Transport: m, MaxWait: maxWait, Logger: log.With("component", "api"), Tokens: ex.auth.tokens, MetricsAuth: cfg.API.MetricsAuth})
	if err != nil {
		_ = n.Close()
		shutdownHTTP()
		return err
	}
	api.Registry().MustRegister(buildInfoCollector())
	front.h.Store(api)
	if ex.pprofAddr != "" {
		stopPprof, err := startPprof(ex.pprofAddr, log)
		if err != nil {
			_ = n.Close()
			shutdownHTTP()
			return err
		}
		defer stopPprof()
	}
	grpcFront, err := startEnvoy(gln, n, api, ex.desc, ex.auth, log)
	if err != nil {
		_ = n.Close()
		shutdownHTTP()
		return err
	}
	defer grpcFront.stop()
	if err := startDNS(ctx, &cfg, m, ex.auth, log); err != nil {
		_ = n.Close()
		shutdownHTTP()
		return err
	}

	select {
	case <-n.ReadyC():
	case <-ctx.Done():
		log.Info("interrupted while joining")
		shutdownHTTP()
		if err := n.Close(); err != nil {
			log.Warn("close", "err", err)
		}
		return nil
	}
	grpcFront.setServing(true)
	line, _ := json.Marshal(ReadyLine{API: ln.Addr().String(), PeerID: m.PeerID(), Addrs: m.Addrs(), GRPC: grpcFront.addr()})
	if _, err := fmt.Fprintf(stdout, "%s\n", line); err != nil {
		log.Warn("write ready line", "err", err)
	}
	log.Info("ready", "api", ln.Addr().String(), "peer_id", m.PeerID())

	var wg sync.WaitGroup
	watchCtx, stopWatch := context.WithCancel(ctx)
	wg.Add(1)
	go func() { defer wg.Done(); watchRules(watchCtx, n, log) }()
	// The config file is looked at every ex.poll; a SIGHUP reload takes
	// the file as it is then as the new baseline, so the same change is
	// not applied twice.
	var watch *fileWatch
	var poll <-chan time.Time
	if cfgPath != "" && ex.poll > 0 {
		watch = newFileWatch(cfgPath)
		t := time.NewTicker(ex.poll)
		defer t.Stop()
		poll = t.C
		log.Info("re-reading the config file when it changes", "path", cfgPath, "poll", ex.poll)
	}

	var serveErr error
loop:
	for {
		select {
		case <-ctx.Done():
			log.Info("signal received; leaving the mesh")
			break loop
		case err := <-srvDone:
			serveErr = fmt.Errorf("http: %w", err)
			break loop
		case <-hup:
			if watch != nil {
				watch.check()
			}
			reloadAll(n, api, grpcFront, plaus, cfgPath, ex, log)
		case <-poll:
			if watch.check() {
				log.Info("the config file changed on disk; reloading as on SIGHUP", "path", cfgPath)
				reloadAll(n, api, grpcFront, plaus, cfgPath, ex, log)
			}
		}
	}
	stopWatch()
	wg.Wait()
	grpcFront.stop()
	shutdownHTTP()
	if err := n.Close(); err != nil {
		if errors.Is(err, node.ErrPersist) {
			// What the member admitted since its last good flush is not on
			// disk: say so, and where, and exit non-zero.
			return errors.Join(serveErr, fmt.Errorf("node.data_dir %s: %w", cfg.Node.DataDir, err))
		}
		log.Warn("close", "err", err)
	}
	log.Info("stopped")
	return serveErr
}

// knownPeers returns the saved members' addresses (node.Store.LoadPeers)
// that the bootstrap list does not name already: a restarted node dials
// the members it knew, with or without --bootstrap. Its own peer ID is
// left out.
func knownPeers(ctx context.Context, store node.Store, bootstrap []string, self crypto.PrivKey) ([]string, error) {
	peers, err := store.LoadPeers(ctx)
	if err != nil || len(peers) == 0 {
		return nil, err
	}
	selfID, err := peer.IDFromPrivateKey(self)
	if err != nil {
		return nil, err
	}
	named := make(map[string]bool)
	for _, a := range bootstrap {
		if pi, err := peer.AddrInfoFromString(a); err == nil {
			named[pi.ID.String()] = true
		}
	}
	var out []string
	for _, p := range peers {
		if p.Peer == selfID.String() || named[p.Peer] {
			continue
		}
		for _, a := range p.Addrs {
			if _, err := peer.AddrInfoFromString(a); err == nil {
				out = append(out, a)
			}
		}
	}
	return out, nil
}

// watchRules logs, once per peer and hash, a live member whose rules hash
// differs from ours.
func watchRules(ctx context.Context, n *node.Node, log *slog.Logger) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	warned := make(map[string]uint64)
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		ours := n.RulesHash()
		for _, p := range n.Peers() {
			live := p.State == node.Alive || p.State == node.Suspect
			if p.Self || !live || p.RulesMatch || p.RulesHash == 0 {
				delete(warned, p.Peer)
				continue
			}
			if h, ok := warned[p.Peer]; ok && h == p.RulesHash {
				continue
			}
			warned[p.Peer] = p.RulesHash
			log.Warn("a member runs different rules; limits differ until its config matches ours", "member", p.Peer, "rules_hash", fmt.Sprintf("%016x", p.RulesHash), "ours", fmt.Sprintf("%016x", ours))
		}
	}
}

// frontHandler serves the API once the node has started (the API itself
// says "joining" until the node is ready); before, while the store and
// the transport start, /livez says 200 joining, /healthz and /readyz 503
// joining, and everything else 503.
type frontHandler struct {
	h atomic.Pointer[httpapi.Server]
}

func (f *frontHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if h := f.h.Load(); h != nil {
		h.ServeHTTP(w, r)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	if r.URL.Path == "/livez" { // the process serves: live, not ready
		_ = json.NewEncoder(w).Encode(httpapi.HealthResponse{State: "joining"})
		return
	}
	w.Header().Set("Retry-After", "1")
	w.WriteHeader(http.StatusServiceUnavailable)
	if r.URL.Path == "/healthz" || r.URL.Path == "/readyz" {
		_ = json.NewEncoder(w).Encode(httpapi.HealthResponse{State: "joining"})
		return
	}
	_ = json.NewEncoder(w).Encode(httpapi.ErrorResponse{Error: "joining the mesh; retry shortly"})
}

// meshConfig returns mesh's defaults with the file's transport settings:
// the namespace, the listen addresses, the bootstrap multiaddrs (the dns:
// entries are discovered separately: startDNS) and mDNS. The key, the PSK
// (node.psk_file) and the plausibility bounds are the caller's.
func meshConfig(cfg *config.Config) mesh.Config {
	mcfg := mesh.DefaultConfig()
	mcfg.Namespace = cfg.Mesh.Namespace
	mcfg.Listen = append([]string(nil), cfg.Node.Listen...)
	mcfg.Bootstrap = cfg.PeerBootstrap()
	mcfg.MDNS = cfg.Node.MDNS
	mcfg.AllowPeers = append([]string(nil), cfg.Node.AllowPeers...)
	mcfg.AllowPeersFile = cfg.Node.AllowPeersFile
	mcfg.AllowExternal = len(cfg.Node.AllowPeersDNS) > 0
	return mcfg
}

// allowlistOn reports whether the config names an allowlist.
func allowlistOn(cfg *config.Config) bool {
	n := &cfg.Node
	return len(n.AllowPeers) > 0 || n.AllowPeersFile != "" || len(n.AllowPeersDNS) > 0
}

// warnAdmission says, for a node listening on a routable address, who can
// join: with neither a private network key nor an allowlist, anyone who
// can reach it (a warning); with one of them, what the other would add.
func warnAdmission(cfg *config.Config, psk bool, log *slog.Logger) {
	var addrs []string
	for _, a := range cfg.Node.Listen {
		if routable(a) {
			addrs = append(addrs, a)
		}
	}
	if len(addrs) == 0 {
		return
	}
	switch allow := allowlistOn(cfg); {
	case !psk && !allow:
		log.Warn("listening on a routable address with neither a private network key nor an allowlist: any peer that can reach it may join the mesh and spend its limits; set node.psk_file (--psk-file) and node.allow_peers, allow_peers_file or allow_peers_dns (--allow-peer, --allow-peers-file, --allow-peers-dns)", "listen", addrs)
	case !psk:
		log.Info("no private network key: any peer can reach the handshake, and the allowlist refuses the unlisted ones after it; node.psk_file (--psk-file) would keep them out before it", "listen", addrs)
	case !allow:
		log.Info("no allowlist: any holder of the private network key may join; node.allow_peers, allow_peers_file or allow_peers_dns name the members", "listen", addrs)
	}
}

// startAllowDNS keeps the allowlist's DNS TXT part (node.allow_peers_dns)
// up to date. Its first round runs before the node dials anyone, bounded
// by dnsFirstRound; a failure is logged and the rounds go on every 10 s
// in the background (until then only the other sources' peers may
// connect).
func startAllowDNS(ctx context.Context, cfg *config.Config, m *mesh.Mesh, log *slog.Logger) error {
	names := cfg.Node.AllowPeersDNS
	if len(names) == 0 {
		return nil
	}
	dlog := log.With("component", "discovery")
	d, err := discovery.NewTXT(discovery.TXTConfig{
		Names:  names,
		Set:    func(ids []string) error { return m.SetAllowedPeers("dns", ids) },
		Logger: dlog,
	})
	if err != nil {
		return fmt.Errorf("node.allow_peers_dns: %w", err)
	}
	first, cancel := context.WithTimeout(ctx, dnsFirstRound)
	err = d.Round(first)
	cancel()
	if err != nil {
		log.Warn("node.allow_peers_dns: first lookup failed; members the records list are refused until one succeeds", "err", err)
	}
	go d.Run(ctx)
	return nil
}

// dnsFirstRound bounds the allowlist's first DNS lookup at start.
const dnsFirstRound = 5 * time.Second

// routable reports whether a listen multiaddr is reachable from other
// hosts: anything but loopback.
func routable(addr string) bool {
	a, err := ma.NewMultiaddr(addr)
	if err != nil {
		return false // mesh.New names the bad address
	}
	return !manet.IsIPLoopback(a)
}
