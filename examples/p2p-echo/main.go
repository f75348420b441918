// Command p2p-echo is a p2p service that embeds ratemesh: three hosts,
// each with its own libp2p host, gossipsub router and news topic, serve an
// echo protocol under one mesh-wide limit per remote peer. ratemesh is
// attached to each service's host and PubSub (mesh.Attach) rather than
// running hosts of its own, and the echo handler is wrapped with
// node/p2plimit. A client host then opens echo streams round-robin across
// the three faster than the limit allows, and prints, each second, how
// many were echoed and how many were reset with libp2p's RATE_LIMITED
// code.
//
//	go run ./examples/p2p-echo -limit 20 -rate 60 -duration 5s
//
// Everything listens on 127.0.0.1 and the program exits after -duration.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p"
	pubsub "github.com/libp2p/go-libp2p-pubsub"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"

	"github.com/ratemesh/ratemesh/limiter"
	"github.com/ratemesh/ratemesh/mesh"
	"github.com/ratemesh/ratemesh/node"
	"github.com/ratemesh/ratemesh/node/p2plimit"
)

// EchoProtocol is the service's own protocol: one line in, the same line
// back.
const EchoProtocol = protocol.ID("/p2p-echo/1.0.0")

// NewsTopic is the service's own gossipsub topic, which runs beside
// ratemesh's on the same PubSub.
const NewsTopic = "/p2p-echo/news"

// options are the program's flags.
type options struct {
	services int
	limit    uint64        // echo streams per remote peer per window, mesh-wide
	window   time.Duration // the limit's window
	rate     float64       // streams per second the client opens
	duration time.Duration // how long the client runs
}

func main() {
	var o options
	flag.IntVar(&o.services, "services", 3, "service hosts sharing the limit")
	flag.Uint64Var(&o.limit, "limit", 20, "echo streams per remote peer per window, across all services")
	flag.DurationVar(&o.window, "window", time.Second, "the limit's window")
	flag.Float64Var(&o.rate, "rate", 60, "echo streams per second the client opens")
	flag.DurationVar(&o.duration, "duration", 5*time.Second, "how long the client runs before the program exits")
	flag.Parse()
	if err := run(context.Background(), o, os.Stdout); err != nil {
		log.Fatal(err)
	}
}

// service is one host of the p2p service.
type service struct {
	h      host.Host
	ps     *pubsub.PubSub
	cancel context.CancelFunc // ends ps
	news   *pubsub.Topic
	node   *node.Node
	heard  atomic.Int64 // news messages heard from the other services
}

// startService starts a service: its own host and gossipsub, its news
// topic, and its echo protocol rate-limited by a ratemesh member attached
// to that host, which joins the members at bootstrap.
func startService(ctx context.Context, o options, bootstrap []string) (*service, error) {
	h, err := libp2p.New(libp2p.ListenAddrStrings("/ip4/127.0.0.1/tcp/0"))
	if err != nil {
		return nil, err
	}
	psCtx, cancel := context.WithCancel(context.Background())
	s := &service{h: h, cancel: cancel}
	if s.ps, err = pubsub.NewGossipSub(psCtx, h); err != nil {
		s.close()
		return nil, err
	}
	if err := s.readNews(psCtx); err != nil {
		s.close()
		return nil, err
	}

	rules := []limiter.Rule{{Name: "echo", Algorithm: limiter.FixedWindow, Limit: o.limit, Window: o.window}}
	mcfg := mesh.DefaultConfig()
	mcfg.Listen = nil // the service's host listens; ratemesh uses its addresses
	mcfg.Bootstrap = bootstrap
	mcfg.Plausible = mesh.PlausibleFor(rules, 0)
	mcfg.Logger = nil
	ncfg := node.DefaultConfig()
	ncfg.Peer = h.ID().String() // an attached member is the service's own peer
	ncfg.Rules, ncfg.Join = rules, len(bootstrap) > 0
	lcfg := p2plimit.DefaultConfig()
	lcfg.Rule = "echo"
	if err := s.protect(ctx, mcfg, ncfg, lcfg); err != nil {
		return nil, errors.Join(err, s.close())
	}
	return s, nil
}

// protect attaches a ratemesh member to the service's host and PubSub,
// starts its node and serves the echo protocol through p2plimit.
func (s *service) protect(ctx context.Context, mcfg mesh.Config, ncfg node.Config, lcfg p2plimit.Config) (err error) {
	var limit func(network.StreamHandler) network.StreamHandler
	// snippet:start libp2p-service
	if ncfg.Transport, err = mesh.Attach(s.h, s.ps, mcfg); err != nil { // the service's own host and gossipsub
		return err
	}
	if s.node, err = node.Start(ctx, ncfg); err != nil { // s.node.Close detaches; s.h and s.ps run on
		return errors.Join(err, ncfg.Transport.Close())
	}
	if limit, err = p2plimit.New(s.node, lcfg); err != nil { // lcfg.Rule "echo": per remote peer, mesh-wide
		return err
	}
	s.h.SetStreamHandler(EchoProtocol, limit(echo)) // a denied stream is reset with RATE_LIMITED
	// snippet:end
	return nil
}

// readNews subscribes to the service's own topic and counts what the other
// services publish there.
func (s *service) readNews(ctx context.Context) error {
	var err error
	if s.news, err = s.ps.Join(NewsTopic); err != nil {
		return err
	}
	sub, err := s.news.Subscribe()
	if err != nil {
		return err
	}
	go func() {
		for {
			msg, err := sub.Next(ctx)
			if err != nil {
				return
			}
			if msg.ReceivedFrom != s.h.ID() {
				s.heard.Add(1)
			}
		}
	}()
	return nil
}

// close stops the node (which detaches ratemesh), then the PubSub and the
// host, as the service would at shutdown.
func (s *service) close() error {
	var errs []error
	if s.node != nil {
		errs = append(errs, s.node.Close())
		s.node = nil
	}
	s.cancel()
	errs = append(errs, s.h.Close())
	return errors.Join(errs...)
}

// echo is the service's handler: one line in, the same line back.
func echo(s network.Stream) {
	defer s.Close()
	_ = s.SetDeadline(time.Now().Add(10 * time.Second))
	line, err := bufio.NewReader(s).ReadString('\n')
	if err != nil {
		_ = s.Reset()
		return
	}
	_, _ = io.WriteString(s, line)
}

// addrOf returns h's first address with /p2p/<peer ID>.
func addrOf(h host.Host) (string, error) {
	mas, err := peer.AddrInfoToP2pAddrs(&peer.AddrInfo{ID: h.ID(), Addrs: h.Addrs()})
	if err != nil || len(mas) == 0 {
		return "", fmt.Errorf("no address for %s: %v", h.ID(), err)
	}
	return mas[0].String(), nil
}

// run starts the services and the client, prints what the client sees
// every second to out, and returns after o.duration with every host
// closed.
func run(ctx context.Context, o options, out io.Writer) (err error) {
	if o.services < 1 || o.limit < 1 || o.window <= 0 || o.rate <= 0 || o.duration <= 0 {
		return fmt.Errorf("p2p-echo: -services, -limit, -window, -rate and -duration must be positive")
	}
	var svcs []*service
	defer func() {
		for _, s := range svcs {
			err = errors.Join(err, s.close())
		}
	}()
	var bootstrap []string
	for i := range o.services {
		s, err := startService(ctx, o, bootstrap)
		if err != nil {
			return fmt.Errorf("service %d: %w", i, err)
		}
		svcs = append(svcs, s)
		a, err := addrOf(s.h)
		if err != nil {
			return err
		}
		bootstrap = append(bootstrap, a)
		fmt.Fprintf(out, "service %d: %s\n", i, s.h.ID())
	}

	client, err := libp2p.New(libp2p.ListenAddrStrings("/ip4/127.0.0.1/tcp/0"))
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, client.Close()) }()
	for _, s := range svcs {
		if err := client.Connect(ctx, peer.AddrInfo{ID: s.h.ID(), Addrs: s.h.Addrs()}); err != nil {
			return err
		}
	}
	fmt.Fprintf(out, "client %s: %.0f streams/s round-robin for %v; limit %d per %v per peer\n",
		client.ID(), o.rate, o.duration, o.limit, o.window)
	c := &counts{}
	if err := c.drive(ctx, o, client, svcs, out); err != nil {
		return err
	}
	fmt.Fprintf(out, "total: %d echoed, %d denied (RATE_LIMITED), %d failed\n", c.echoed.Load(), c.denied.Load(), c.failed.Load())
	if e := c.firstErr.Load(); e != nil {
		fmt.Fprintf(out, "first failure: %s\n", e)
	}
	for i, s := range svcs {
		fmt.Fprintf(out, "service %d heard %d news messages on its own topic\n", i, s.heard.Load())
	}
	return nil
}

// counts is what the client saw, in total and per window of the limit
// (by the client's clock, which on one machine is the members').
type counts struct {
	echoed, denied, failed atomic.Int64
	firstErr               atomic.Value // the first failure's error text

	mu        sync.Mutex
	perWindow map[int64]*[3]int // echoed, denied, failed
}

const (
	echoed = iota
	denied
	failed
)

func (c *counts) add(window int64, what int) {
	[]*atomic.Int64{&c.echoed, &c.denied, &c.failed}[what].Add(1)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.perWindow[window] == nil {
		c.perWindow[window] = new([3]int)
	}
	c.perWindow[window][what]++
}

// drive opens o.rate streams a second round-robin across svcs for
// o.duration, publishing one news message per service a window, and
// prints each window's counts once it has ended.
func (c *counts) drive(ctx context.Context, o options, client host.Host, svcs []*service, out io.Writer) error {
	c.perWindow = make(map[int64]*[3]int)
	win := o.window.Nanoseconds()
	windowOf := func(t time.Time) int64 { return t.UnixNano() / win }
	due := make(chan int, 64)
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range due {
				what, err := call(ctx, client, svcs[i%len(svcs)].h.ID())
				if err != nil {
					c.firstErr.CompareAndSwap(nil, err.Error())
				}
				c.add(windowOf(time.Now()), what)
			}
		}()
	}
	report := func(w int64, note string) {
		c.mu.Lock()
		n := c.perWindow[w]
		c.mu.Unlock()
		if n == nil {
			n = new([3]int)
		}
		fmt.Fprintf(out, "window %s: %d echoed, %d denied (RATE_LIMITED), %d failed%s\n",
			time.Unix(0, w*win).Format("15:04:05.000"), n[echoed], n[denied], n[failed], note)
	}
	start := time.Now()
	first, current := windowOf(start), windowOf(start)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	sent := 0
	for time.Since(start) < o.duration {
		<-tick.C
		for target := int(time.Since(start).Seconds() * o.rate); sent < target; sent++ {
			select {
			case due <- sent:
			default: // every client goroutine busy: the stream is not opened
			}
		}
		if w := windowOf(time.Now()); w > current {
			note := ""
			if current == first {
				note = " (partial window)"
			}
			report(current, note)
			current = w
			for i, s := range svcs {
				_ = s.news.Publish(ctx, []byte(fmt.Sprintf("news %d from service %d", w, i)))
			}
		}
	}
	close(due)
	wg.Wait()
	report(current, " (partial window)")
	return nil
}

// call opens one echo stream to p and says how it ended: echoed, denied
// with RATE_LIMITED, or failed (with the error).
func call(ctx context.Context, client host.Host, p peer.ID) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	s, err := client.NewStream(ctx, p, EchoProtocol)
	if err != nil {
		return failed, err
	}
	_ = s.SetDeadline(time.Now().Add(5 * time.Second))
	_, err = io.WriteString(s, "ping\n")
	if err == nil {
		err = s.CloseWrite()
	}
	var got []byte
	if err == nil {
		got, err = io.ReadAll(s)
	}
	switch {
	case p2plimit.IsRateLimited(err):
		_ = s.Reset()
		return denied, nil
	case err != nil:
		_ = s.Reset()
		return failed, err
	case string(got) != "ping\n":
		_ = s.Reset()
		return failed, fmt.Errorf("echoed %q", got)
	}
	_ = s.Close()
	return echoed, nil
}
