package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	golog "github.com/ipfs/go-log/v2"
	"github.com/libp2p/go-libp2p/gologshim"

	"github.com/ratemesh/ratemesh/apiauth"
	"github.com/ratemesh/ratemesh/config"
	"github.com/ratemesh/ratemesh/discovery"
	"github.com/ratemesh/ratemesh/envoy"
	"github.com/ratemesh/ratemesh/httpapi"
	"github.com/ratemesh/ratemesh/limiter"
	"github.com/ratemesh/ratemesh/mesh"
	"github.com/ratemesh/ratemesh/node"
)

// serveExtras is what serve needs beside the effective config: the file
// as it was read (before flags), to tell which changed settings a reload
// cannot apply, and the Envoy descriptor files loaded at start.
type serveExtras struct {
	file      config.Config
	envoyPath string
	desc      *envoy.Descriptors
	// envoy is the envoy section in force (share_wait and domains are
	// reloaded with the file, the flag's share_wait kept).
	envoy config.Envoy
	// auth is who may call the APIs (the api section).
	auth *apiAuth
	// overridden are the settings flags or their environment variables
	// decide: a reload does not report them changed in the file.
	overridden map[string]bool
	// poll is how often the config file is checked for changes (0: off).
	poll time.Duration
	// pprofAddr is the profiler's listen address; empty: off.
	pprofAddr string
	// upgradeAlone: --upgrade-alone, migrate an older store that does not
	// record its node's members (persistence.UpgradeUnknownMembers).
	upgradeAlone bool
}

// newLogger returns the daemon's logger: text or JSON lines on w.
func newLogger(w io.Writer, format string, level slog.Level) (*slog.Logger, error) {
	opts := &slog.HandlerOptions{Level: level}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("%q is not one of text, json", format)
}

// routeLibraryLogs makes the libraries' own logs JSON lines on stderr too,
// under --log-format json: libp2p's (slog, through gologshim) and
// gossipsub's (go-log's zap), at their default level, errors only. Without
// it a library's error would be a text line among the JSON ones. It
// changes process-wide state: call it once, from serve.
func routeLibraryLogs(format string) {
	if format != "json" {
		return
	}
	gologshim.SetDefaultHandler(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	if os.Getenv("GOLOG_LOG_FMT") == "" {
		cfg := golog.GetConfig()
		cfg.Format, cfg.Stderr, cfg.Stdout = golog.JSONOutput, true, false
		golog.SetupLogging(cfg)
	}
}

// loadEnvoy loads cfg.Envoy.Config (nil when unset) with the envoy
// section's settings applied, and checks that its rules and cfg's do not
// clash.
func loadEnvoy(cfg *config.Config) (*envoy.Descriptors, error) {
	if cfg.Envoy.Config == "" {
		if cfg.Envoy.ShareWait != 0 || len(cfg.Envoy.Domains) > 0 {
			return nil, errors.New("envoy.share_wait, envoy.domains: they set the rules generated from the descriptor files, and envoy.config (--envoy-config) names none")
		}
		return nil, nil
	}
	d, err := envoy.Load(cfg.Envoy.Config)
	if err != nil {
		return nil, err
	}
	if d, err = applyEnvoySettings(d, cfg.Envoy); err != nil {
		return nil, err
	}
	if err := checkEnvoyRules(cfg.Rules, d); err != nil {
		return nil, err
	}
	return d, nil
}

// applyEnvoySettings gives d's rules the share_wait of e (envoy.share_wait,
// envoy.domains). A domain of e.Domains that d does not hold is an error
// naming it: a misspelt domain would silently set nothing.
func applyEnvoySettings(d *envoy.Descriptors, e config.Envoy) (*envoy.Descriptors, error) {
	names := make([]string, 0, len(e.Domains))
	for name := range e.Domains {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		if !slices.Contains(d.Domains(), name) {
			return nil, fmt.Errorf("envoy.domains.%s: no such domain in envoy.config %s (its domains: %s)", name, e.Config, strings.Join(d.Domains(), ", "))
		}
	}
	return d.WithShareWait(e.ShareWait, e.DomainShareWaits())
}

// checkEnvoyRules refuses config rules named with envoy.RulePrefix, and
// validates the generated rules.
func checkEnvoyRules(rules []limiter.Rule, d *envoy.Descriptors) error {
	for i, r := range rules {
		if strings.HasPrefix(r.Name, envoy.RulePrefix) {
			return fmt.Errorf("rules[%d] %q: name: the prefix %s is kept for the rules generated from envoy.config", i, r.Name, envoy.RulePrefix)
		}
	}
	for _, r := range d.Rules() {
		if err := r.Normalize(); err != nil {
			return fmt.Errorf("envoy.config: generated rule: %w", err)
		}
	}
	return nil
}

// envoyFront is the gRPC side of serve: Envoy's rate limit service and
// gRPC health on node.grpc.
type envoyFront struct {
	srv      *envoy.Server
	ln       net.Listener
	done     chan error
	stopOnce sync.Once
}

// listenGRPC binds node.grpc early, so that a bad address stops the start.
func listenGRPC(cfg *config.Config) (net.Listener, error) {
	if cfg.Node.GRPC == "" {
		return nil, nil
	}
	ln, err := net.Listen("tcp", cfg.Node.GRPC)
	if err != nil {
		return nil, fmt.Errorf("node.grpc: %w", err)
	}
	return ln, nil
}

// startEnvoy serves the rate limit service on ln (nil: no gRPC).
func startEnvoy(ln net.Listener, n *node.Node, api *httpapi.Server, desc *envoy.Descriptors, auth *apiAuth, log *slog.Logger) (*envoyFront, error) {
	if ln == nil {
		return nil, nil
	}
	var toks *apiauth.Tokens
	if auth != nil {
		toks = auth.tokens
	}
	srv, err := envoy.New(envoy.Config{Node: n, Descriptors: desc, Registerer: api.Registry(), Logger: log.With("component", "grpc"), Tokens: toks, TLS: auth.grpcTLS()})
	if err != nil {
		return nil, err
	}
	f := &envoyFront{srv: srv, ln: ln, done: make(chan error, 1)}
	go func() { f.done <- srv.Serve(ln) }()
	if desc == nil {
		log.Warn("gRPC is on without envoy.config (--envoy-config): every descriptor is answered OK")
	}
	log.Info("serving Envoy's rate limit service over gRPC", "grpc", ln.Addr().String(), "domains", desc.Domains(), "entries", desc.Entries())
	return f, nil
}

// addr returns the gRPC address, "" when off.
func (f *envoyFront) addr() string {
	if f == nil {
		return ""
	}
	return f.ln.Addr().String()
}

func (f *envoyFront) setServing(ok bool) {
	if f != nil {
		f.srv.SetServing(ok)
	}
}

// stop lets calls under way finish for up to 5 s.
func (f *envoyFront) stop() {
	if f == nil {
		return
	}
	f.stopOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		f.srv.Stop(ctx)
	})
}

// startDNS runs the discovery of the dns: bootstrap entries until ctx ends.
func startDNS(ctx context.Context, cfg *config.Config, m *mesh.Mesh, auth *apiAuth, log *slog.Logger) error {
	targets := cfg.DNSBootstrap()
	if len(targets) == 0 {
		return nil
	}
	d, err := discovery.New(discovery.Config{
		Targets: targets, Self: m.PeerID(), Connect: m.Connect,
		Connected: func(id string) bool { return slices.Contains(m.Peers(), id) },
		Logger:    log.With("component", "discovery"),
		Token:     auth.peerToken, TLS: auth.peerTLS(),
	})
	if err != nil {
		return err
	}
	go d.Run(ctx)
	log.Info("discovering peers by DNS", "targets", targets)
	return nil
}

// reloadAll applies, on SIGHUP, the rules of the config file and the
// Envoy descriptor files: an invalid rule keeps its running version, the
// others apply; descriptor files that fail to load keep the running ones
// whole. The result is counted: ok, partial, or failed when nothing could
// be read (a config file that is not YAML, descriptors that fail, or no
// file at all). Settings that only a restart applies are logged.
func reloadAll(n *node.Node, api *httpapi.Server, front *envoyFront, plaus *mesh.Plausibility, path string, ex *serveExtras, log *slog.Logger) {
	var results []string
	envoyRules := ex.desc.Rules()
	rules := n.Rules()
	rules = slices.DeleteFunc(rules, func(r limiter.Rule) bool { return strings.HasPrefix(r.Name, envoy.RulePrefix) })
	settings := ex.envoy
	if path != "" {
		data, err := os.ReadFile(path)
		switch {
		case err != nil:
			log.Error("reload: keeping every rule", "err", err)
			results = append(results, "failed")
		default:
			if e, err := config.ReloadEnvoy(settings, data); err != nil {
				log.Error("reload: keeping the running envoy settings", "err", err)
			} else {
				e.Config = settings.Config // only a restart changes it
				if ex.overridden["envoy.share_wait"] {
					e.ShareWait = settings.ShareWait
				}
				settings = e
			}
			ch := slices.DeleteFunc(config.ChangedSettings(&ex.file, data), func(s string) bool { return ex.overridden[s] })
			if len(ch) > 0 {
				log.Warn("reload: these settings changed in the file and apply only after a restart", "settings", ch)
			}
			var errs []error
			rules, errs = config.Reload(rules, data)
			for _, e := range errs {
				log.Error("reload", "path", path, "err", e)
			}
			switch {
			case len(errs) > 0 && errors.Is(errs[0], config.ErrYAML):
				results = append(results, "failed")
			case len(errs) > 0:
				results = append(results, "partial")
			default:
				results = append(results, "ok")
			}
		}
	}
	next := ex.desc
	if p := ex.envoyPath; ex.desc != nil && p != "" {
		d, err := envoy.Load(p)
		if err == nil {
			d, err = applyEnvoySettings(d, settings)
		}
		if err == nil {
			err = checkEnvoyRules(rules, d)
		}
		if err != nil {
			log.Error("reload: keeping the running envoy descriptors", "err", err)
			results = append(results, "failed")
		} else {
			next, envoyRules = d, d.Rules()
			results = append(results, "ok")
		}
	}
	if len(results) == 0 {
		log.Warn("SIGHUP: no --config file to reload; nothing changes")
		api.ObserveReload("failed")
		return
	}
	all := append(rules, envoyRules...)
	plaus.Update(all)
	// The running descriptors may still name a rule the new ones drop:
	// keep it until they are replaced.
	kept := all
	for _, r := range ex.desc.Rules() {
		if !slices.ContainsFunc(all, func(x limiter.Rule) bool { return x.Name == r.Name }) {
			kept = append(kept, r)
		}
	}
	if err := n.Reload(kept); err != nil {
		log.Error("reload: keeping every rule", "err", err)
		api.ObserveReload("failed")
		return
	}
	if front != nil {
		front.srv.SetDescriptors(next)
	}
	if next != ex.desc {
		ex.envoy = settings
	}
	ex.desc = next
	if len(kept) != len(all) {
		if err := n.Reload(all); err != nil {
			log.Error("reload: dropping the rules of removed descriptors", "err", err)
		}
	}
	api.ObserveReload(combine(results))
}

// combine is ok when every part reloaded, failed when none did, partial
// otherwise.
func combine(results []string) string {
	switch {
	case !slices.ContainsFunc(results, func(r string) bool { return r != "ok" }):
		return "ok"
	case !slices.ContainsFunc(results, func(r string) bool { return r != "failed" }):
		return "failed"
	}
	return "partial"
}
