// Command embed is a Go service that embeds a ratemesh member: the member
// runs in the service's process, joins the other replicas over libp2p, and
// decides each request with a method call — no network hop on the request
// path. docs/embedding.md walks through it.
//
// Run two replicas on one host:
//
//	go run ./examples/embed --data-dir d1 --http 127.0.0.1:9001 --listen /ip4/127.0.0.1/tcp/4101
//	go run ./examples/embed --data-dir d2 --http 127.0.0.1:9002 --listen /ip4/127.0.0.1/tcp/4102 \
//	  --bootstrap /ip4/127.0.0.1/tcp/4101/p2p/<the peer ID the first one prints>
//
// Then GET /hello (100 per second per client address, shared by the
// replicas), GET /search (5 credits of an account's 100 per second), POST
// /report (an all-or-nothing check of two limits) and GET /stream (a
// concurrency lease held for the request).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"log/slog"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/ratemesh/ratemesh/limiter"
	"github.com/ratemesh/ratemesh/mesh"
	"github.com/ratemesh/ratemesh/node"
	"github.com/ratemesh/ratemesh/node/httplimit"
	"github.com/ratemesh/ratemesh/persistence"
)

// Rules are the service's limits. Every replica must run the same ones
// (a mismatch shows in the peers' rules_hash and in the log).
func Rules() []limiter.Rule {
	return []limiter.Rule{
		{Name: "api", Algorithm: limiter.SlidingWindow, Limit: 100, Window: time.Second},
		{Name: "hourly", Algorithm: limiter.FixedWindow, Limit: 5000, Window: time.Hour},
		{Name: "conns", Algorithm: limiter.Concurrency, Limit: 10, LeaseTTL: time.Minute},
	}
}

// Options configures one member.
type Options struct {
	DataDir   string         // the identity key and the store live here
	Listen    []string       // libp2p listen multiaddrs
	Bootstrap []string       // other members' full multiaddrs, ending in /p2p/<peer ID>
	Rules     []limiter.Rule // the limits; every member runs the same
	Logger    *slog.Logger   // nil discards the member's log
}

// StartMember runs one member: its libp2p transport, its store on disk
// and the node that decides. The node owns the mesh (use it for its peer
// ID and addresses); close the node to leave the mesh.
func StartMember(ctx context.Context, o Options) (*node.Node, *mesh.Mesh, error) {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if err := os.MkdirAll(o.DataDir, 0o700); err != nil {
		return nil, nil, err
	}
	key, err := mesh.LoadOrCreateKey(filepath.Join(o.DataDir, "identity.key"))
	if err != nil {
		return nil, nil, err // a persisted key keeps the peer ID, the member's counter slot
	}
	mcfg := mesh.DefaultConfig()
	mcfg.PrivKey, mcfg.Listen, mcfg.Bootstrap = key, o.Listen, o.Bootstrap
	mcfg.Plausible = mesh.PlausibleFor(o.Rules, 0) // refuse values no member could have admitted
	mcfg.Logger = o.Logger
	m, err := mesh.New(mcfg)
	if err != nil {
		return nil, nil, err
	}
	store, err := persistence.Open(o.DataDir) // long windows and leases survive a restart
	if err != nil {
		return nil, nil, errors.Join(err, m.Close())
	}
	ncfg := node.DefaultConfig()
	ncfg.Peer, ncfg.Rules, ncfg.Transport, ncfg.Store = m.PeerID(), o.Rules, m, store
	ncfg.Join = len(o.Bootstrap) > 0 // merge the mesh's state before deciding
	ncfg.Logger = o.Logger
	n, err := node.Start(ctx, ncfg) // returns once ready (or after the join timeout)
	if err != nil {
		return nil, nil, errors.Join(err, m.Close(), store.Close())
	}
	return n, m, nil // n owns m and store now: n.Close closes them
}

// Handler is the service: /hello behind the net/http middleware, /search,
// /report and /stream deciding by hand. trusted are the proxies whose
// X-Forwarded-For is believed.
func Handler(n *node.Node, trusted []netip.Prefix) (http.Handler, error) {
	lcfg := httplimit.DefaultConfig()
	lcfg.Rule = "api"
	lcfg.Key = httplimit.ClientIP(trusted) // the client address, not a spoofable header
	limit, err := httplimit.New(n, lcfg)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("GET /hello", limit(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "hello")
	})))
	mux.HandleFunc("GET /search", func(w http.ResponseWriter, r *http.Request) {
		d, err := n.Allow(r.Context(), "api", r.Header.Get("X-Account"), node.Cost(5))
		if err != nil { // an empty key, an unknown rule or class, a closed node
			http.Error(w, err.Error(), httplimit.StatusOf(err))
			return
		}
		if !d.Allowed { // d.Reason says why, d.RetryAfter when a retry could pass
			http.Error(w, "over the limit: "+d.Reason.String(), http.StatusTooManyRequests)
			return
		}
		fmt.Fprintf(w, "results (%d left this second)\n", d.Remaining)
	})
	mux.HandleFunc("POST /report", func(w http.ResponseWriter, r *http.Request) {
		account := r.Header.Get("X-Account")
		if account == "" {
			http.Error(w, "X-Account: missing", http.StatusBadRequest)
			return
		}
		// A report costs 10 of the per-second limit and 10 of the hourly
		// one; it passes only if both have room, and a denial consumes
		// nothing.
		ok, ds, err := n.AllowAll(r.Context(),
			node.NewCheck("api", account, node.Cost(10)),
			node.NewCheck("hourly", account, node.Cost(10)))
		if err != nil {
			http.Error(w, err.Error(), httplimit.StatusOf(err))
			return
		}
		if !ok {
			for _, d := range ds {
				if secs, ok := httplimit.RetryAfterSeconds(d.RetryAfter); ok && d.RetryAfter > 0 {
					w.Header().Set("Retry-After", fmt.Sprint(secs))
					break
				}
			}
			http.Error(w, "over the limit", http.StatusTooManyRequests)
			return
		}
		fmt.Fprintln(w, "report accepted")
	})
	mux.HandleFunc("GET /stream", func(w http.ResponseWriter, r *http.Request) {
		// One lease per open stream: at most 10 streams per account
		// across every replica.
		lease, d, err := n.Acquire(r.Context(), "conns", r.Header.Get("X-Account"))
		if err != nil {
			http.Error(w, err.Error(), httplimit.StatusOf(err))
			return
		}
		if !d.Allowed {
			http.Error(w, "too many streams: "+d.Reason.String(), http.StatusTooManyRequests)
			return
		}
		defer lease.Release(context.WithoutCancel(r.Context()))
		if _, err := lease.Renew(r.Context()); err != nil { // renew before the TTL runs out
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "streaming under lease", lease.ID)
	})
	return mux, nil
}

func main() {
	var (
		dataDir   = flag.String("data-dir", "embed-data", "identity key and store `dir`")
		httpAddr  = flag.String("http", "127.0.0.1:9001", "the service's `host:port`")
		listen    = flag.String("listen", "/ip4/127.0.0.1/tcp/0", "libp2p listen `multiaddr`")
		bootstrap = flag.String("bootstrap", "", "comma-separated full multiaddrs of other replicas")
		trusted   = flag.String("trusted-proxies", "", "comma-separated `prefixes` whose X-Forwarded-For is believed")
	)
	flag.Parse()
	if err := run(*dataDir, *httpAddr, *listen, *bootstrap, *trusted); err != nil {
		log.Fatal(err)
	}
}

func run(dataDir, httpAddr, listen, bootstrap, trusted string) error {
	var prefixes []netip.Prefix
	for _, s := range splitList(trusted) {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return fmt.Errorf("--trusted-proxies: %w", err)
		}
		prefixes = append(prefixes, p)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	n, m, err := StartMember(ctx, Options{
		DataDir:   dataDir,
		Listen:    []string{listen},
		Bootstrap: splitList(bootstrap),
		Rules:     Rules(),
		Logger:    slog.Default(),
	})
	if err != nil {
		return err
	}
	h, err := Handler(n, prefixes)
	if err != nil {
		return errors.Join(err, n.Close())
	}
	srv := &http.Server{Addr: httpAddr, Handler: h, ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.ListenAndServe() }()
	log.Printf("serving on %s; other replicas bootstrap from %s", httpAddr, strings.Join(m.Addrs(), " or "))
	select {
	case err = <-errc:
	case <-ctx.Done():
		shutdownCtx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		err = srv.Shutdown(shutdownCtx)
		cancel()
	}
	// A graceful leave: the others stop counting this member at once, and
	// the last flush reaches the disk.
	return errors.Join(err, n.Close())
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}
