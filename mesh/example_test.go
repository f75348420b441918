package mesh_test

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"time"

	"github.com/libp2p/go-libp2p"
	pubsub "github.com/libp2p/go-libp2p-pubsub"
	"github.com/libp2p/go-libp2p/core/crypto"

	"github.com/ratemesh/ratemesh/limiter"
	"github.com/ratemesh/ratemesh/mesh"
	"github.com/ratemesh/ratemesh/node"
)

// Two members on loopback: b bootstraps from a, joins its state, and both
// decide requests of the same global limit in-process. In a service each
// member runs in its own process with a persisted key
// (mesh.LoadOrCreateKey) and, across hosts, a private network key
// (mesh.LoadPSK).
func Example() {
	ctx := context.Background()
	rules := []limiter.Rule{{Name: "api", Algorithm: limiter.FixedWindow, Limit: 100, Window: time.Hour}}
	start := func(bootstrap ...string) (*node.Node, *mesh.Mesh) {
		key, _, err := crypto.GenerateEd25519Key(nil)
		if err != nil {
			log.Fatal(err)
		}
		mcfg := mesh.DefaultConfig()
		mcfg.PrivKey, mcfg.Bootstrap = key, bootstrap
		mcfg.Listen = []string{"/ip4/127.0.0.1/tcp/0"}
		mcfg.Plausible = mesh.PlausibleFor(rules, 0)
		mcfg.Logger = slog.New(slog.DiscardHandler) // the default logs to slog.Default
		m, err := mesh.New(mcfg)
		if err != nil {
			log.Fatal(err)
		}
		ncfg := node.DefaultConfig()
		ncfg.Peer, ncfg.Rules, ncfg.Transport = m.PeerID(), rules, m
		ncfg.Join = len(bootstrap) > 0
		n, err := node.Start(ctx, ncfg) // n owns m now
		if err != nil {
			log.Fatal(err)
		}
		return n, m
	}
	a, ma := start()
	defer a.Close()
	for range 2 {
		if _, err := a.Allow(ctx, "api", "acct:42"); err != nil {
			log.Fatal(err)
		}
	}
	b, _ := start(ma.Addrs()[0])
	defer b.Close()
	rep, err := b.Usage("api", "acct:42")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("b joined and sees", rep.Total, "of 100 used")
	d, _ := b.Allow(ctx, "api", "acct:42")
	fmt.Println("b admits one more:", d.Allowed)
	// Output:
	// b joined and sees 2 of 100 used
	// b admits one more: true
}

// A service that runs its own libp2p host and gossipsub router builds the
// router with ratemesh's options before attaching a member to it (when
// its own topics can live with them: they apply to every topic of the
// router), so that ratemesh's gossip costs what it costs under mesh.New.
func ExamplePubSubOptions() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	h, err := libp2p.New(libp2p.ListenAddrStrings("/ip4/127.0.0.1/tcp/0"))
	if err != nil {
		log.Fatal(err)
	}
	defer h.Close()
	mcfg := mesh.DefaultConfig()
	mcfg.Listen = nil // the service's host listens
	mcfg.Logger = slog.New(slog.DiscardHandler)
	// The service's router, for all its topics:
	ps, err := pubsub.NewGossipSub(ctx, h, mesh.PubSubOptions(mcfg)...)
	if err != nil {
		log.Fatal(err)
	}
	m, err := mesh.Attach(h, ps, mcfg)
	if err != nil {
		log.Fatal(err)
	}
	defer m.Close()
	p := mesh.GossipSubParams(mcfg.GossipHeartbeat)
	fmt.Println(m.Topic(), "D", p.D, "Dhi", p.Dhi, "Dlazy", p.Dlazy)
	// Output:
	// /ratemesh/1/default D 2 Dhi 3 Dlazy 0
}
