package node_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/ratemesh/ratemesh/limiter"
	"github.com/ratemesh/ratemesh/node"
	"github.com/ratemesh/ratemesh/node/memnet"
)

// A Go service embeds a node: Start it with its rules and a transport,
// then decide requests in-process. Here two nodes share an in-memory hub;
// in production the transport is package mesh (libp2p) and each node runs
// in its own process.
func Example() {
	ctx := context.Background()
	hub := memnet.NewHub()
	rules := []limiter.Rule{
		{Name: "api", Algorithm: limiter.FixedWindow, Limit: 3, Window: time.Hour},
		{Name: "conns", Algorithm: limiter.Concurrency, Limit: 2, LeaseTTL: time.Minute},
	}
	start := func(peer string, join bool) *node.Node {
		cfg := node.DefaultConfig()
		cfg.Peer, cfg.Rules, cfg.Transport = peer, rules, hub.Transport(peer)
		cfg.Join = join // peers are known: join their state before serving
		n, err := node.Start(ctx, cfg)
		if err != nil {
			log.Fatal(err)
		}
		return n
	}

	a := start("a", false)
	defer a.Close() // a graceful leave
	for i := 1; i <= 4; i++ {
		d, err := a.Allow(ctx, "api", "user:42")
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("request %d: allowed=%t remaining=%d\n", i, d.Allowed, d.Remaining)
	}

	// b joins: Start returns once it has merged a's state.
	b := start("b", true)
	defer b.Close()
	rep, err := b.Usage("api", "user:42")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("b sees user:42 used", rep.Total, "of 3")
	for _, p := range b.Peers() {
		fmt.Println("member", p.Peer, p.State, "self:", p.Self)
	}

	// A concurrency lease: renew it while in use, release it when done.
	lease, d, err := b.Acquire(ctx, "conns", "db")
	if err != nil || !d.Allowed {
		log.Fatal(d, err)
	}
	ttl, err := lease.Renew(ctx)
	fmt.Println("lease renewed for", ttl, err)
	fmt.Println("released:", lease.Release(ctx))
	// Output:
	// request 1: allowed=true remaining=2
	// request 2: allowed=true remaining=1
	// request 3: allowed=true remaining=0
	// request 4: allowed=false remaining=0
	// b sees user:42 used 3 of 3
	// member a alive self: false
	// member b alive self: true
	// lease renewed for 1m0s <nil>
	// released: <nil>
}

// AllowAll admits a request only if every limit passes, and consumes
// nothing when one fails.
func ExampleNode_AllowAll() {
	ctx := context.Background()
	cfg := node.DefaultConfig()
	cfg.Peer, cfg.Transport = "a", memnet.NewHub().Transport("a")
	cfg.Rules = []limiter.Rule{
		{Name: "per-hour", Algorithm: limiter.FixedWindow, Limit: 10, Window: time.Hour},
		{Name: "per-day", Algorithm: limiter.FixedWindow, Limit: 12, Window: 24 * time.Hour},
	}
	n, err := node.Start(ctx, cfg)
	if err != nil {
		log.Fatal(err)
	}
	defer n.Close()
	for _, cost := range []uint64{5, 8, 5} {
		ok, ds, err := n.AllowAll(ctx,
			node.NewCheck("per-hour", "user:42", node.Cost(cost)),
			node.NewCheck("per-day", "user:42", node.Cost(cost)))
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("cost %d: allowed=%t remaining=%d,%d reasons=%s,%s\n", cost, ok, ds[0].Remaining, ds[1].Remaining, ds[0].Reason, ds[1].Reason)
	}
	// A denial's Remaining is what a retry can expect now: nothing.
	// Output:
	// cost 5: allowed=true remaining=5,7 reasons=admitted,admitted
	// cost 8: allowed=false remaining=0,0 reasons=limit,limit
	// cost 5: allowed=true remaining=0,2 reasons=admitted,admitted
}

// Wait blocks until admitted, or returns the denial at once when the
// earliest possible admission is past MaxWait or the context's deadline.
func ExampleNode_Wait() {
	ctx := context.Background()
	cfg := node.DefaultConfig()
	cfg.Peer, cfg.Transport = "a", memnet.NewHub().Transport("a")
	cfg.Rules = []limiter.Rule{{Name: "api", Algorithm: limiter.FixedWindow, Limit: 1, Window: time.Hour}}
	n, err := node.Start(ctx, cfg)
	if err != nil {
		log.Fatal(err)
	}
	defer n.Close()
	d, _ := n.Wait(ctx, "api", "user:42", node.MaxWait(time.Second))
	fmt.Println("first:", d.Allowed)
	d, _ = n.Wait(ctx, "api", "user:42", node.MaxWait(time.Second))
	fmt.Println("second:", d.Allowed, "(the window is spent for longer than a second)")
	// Output:
	// first: true
	// second: false (the window is spent for longer than a second)
}
