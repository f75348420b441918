package p2plimit_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log"
	"time"

	"github.com/libp2p/go-libp2p"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/ratemesh/ratemesh/limiter"
	"github.com/ratemesh/ratemesh/node"
	"github.com/ratemesh/ratemesh/node/memnet"
	"github.com/ratemesh/ratemesh/node/p2plimit"
)

// A service wraps its stream handler. Here the node is alone on an
// in-memory transport; in a p2p service it is attached to the service's
// own host and PubSub with mesh.Attach (see examples/p2p-echo).
func Example() {
	cfg := node.DefaultConfig()
	cfg.Peer, cfg.Transport = "a", memnet.NewHub().Transport("a")
	cfg.Rules = []limiter.Rule{{Name: "echo", Algorithm: limiter.FixedWindow, Limit: 2, Window: time.Hour}}
	n, err := node.Start(context.Background(), cfg)
	if err != nil {
		log.Fatal(err)
	}
	defer n.Close()

	srv, err := libp2p.New(libp2p.ListenAddrStrings("/ip4/127.0.0.1/tcp/0"))
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Close()
	lcfg := p2plimit.DefaultConfig()
	lcfg.Rule = "echo" // keyed by the remote peer ID
	limit, err := p2plimit.New(n, lcfg)
	if err != nil {
		log.Fatal(err)
	}
	srv.SetStreamHandler("/echo/1.0.0", limit(func(s network.Stream) {
		defer s.Close()
		line, _ := bufio.NewReader(s).ReadString('\n')
		_, _ = io.WriteString(s, line)
	}))

	client, err := libp2p.New(libp2p.ListenAddrStrings("/ip4/127.0.0.1/tcp/0"))
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	ctx := context.Background()
	if err := client.Connect(ctx, peer.AddrInfo{ID: srv.ID(), Addrs: srv.Addrs()}); err != nil {
		log.Fatal(err)
	}
	for i := range 3 {
		s, err := client.NewStream(ctx, srv.ID(), "/echo/1.0.0")
		if err != nil {
			log.Fatal(err)
		}
		fmt.Fprintf(s, "hello %d\n", i)
		_ = s.CloseWrite()
		got, err := io.ReadAll(s)
		switch {
		case p2plimit.IsRateLimited(err):
			fmt.Println("denied: reset with RATE_LIMITED")
		case err != nil:
			log.Fatal(err)
		default:
			fmt.Print(string(got))
		}
		_ = s.Close()
	}
	// Output:
	// hello 0
	// hello 1
	// denied: reset with RATE_LIMITED
}
