package discovery_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/miekg/dns"

	"github.com/ratemesh/ratemesh/discovery"
	"github.com/ratemesh/ratemesh/httpapi"
	"github.com/ratemesh/ratemesh/limiter"
	"github.com/ratemesh/ratemesh/mesh"
	"github.com/ratemesh/ratemesh/node"
)

// fakeDNS serves A records (and TXT records, setTXT) for name over UDP
// on 127.0.0.1, and counts the queries.
type fakeDNS struct {
	addr    string
	mu      sync.Mutex
	ips     []string
	txt     []string
	queries int
}

func startDNS(t *testing.T, name string, ips ...string) *fakeDNS {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeDNS{addr: pc.LocalAddr().String(), ips: ips}
	srv := &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(r)
		f.mu.Lock()
		f.queries++
		ips := append([]string(nil), f.ips...)
		txt := append([]string(nil), f.txt...)
		f.mu.Unlock()
		for _, q := range r.Question {
			if q.Qtype == dns.TypeA && strings.EqualFold(q.Name, dns.Fqdn(name)) {
				for _, ip := range ips {
					m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 1}, A: net.ParseIP(ip)})
				}
			}
			if q.Qtype == dns.TypeTXT && strings.EqualFold(q.Name, dns.Fqdn(name)) {
				for _, rec := range txt {
					m.Answer = append(m.Answer, &dns.TXT{Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeTXT, Class: dns.ClassINET, Ttl: 1}, Txt: []string{rec}})
				}
			}
		}
		if len(m.Answer) == 0 && !strings.EqualFold(r.Question[0].Name, dns.Fqdn(name)) {
			m.Rcode = dns.RcodeNameError
		}
		_ = w.WriteMsg(m)
	})}
	go func() { _ = srv.ActivateAndServe() }()
	t.Cleanup(func() { _ = srv.Shutdown() })
	return f
}

func (f *fakeDNS) set(ips ...string) { f.mu.Lock(); f.ips = ips; f.mu.Unlock() }

func (f *fakeDNS) setTXT(recs ...string) { f.mu.Lock(); f.txt = recs; f.mu.Unlock() }

// resolver asks only f.
func (f *fakeDNS) resolver() *net.Resolver {
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "udp", f.addr)
	}}
}

// member is a real node on a libp2p host and an HTTP API, both on ip.
type member struct {
	n   *node.Node
	m   *mesh.Mesh
	api string
}

var rules = []limiter.Rule{{Name: "r", Algorithm: limiter.FixedWindow, Limit: 100, Window: time.Second}}

func startMember(t *testing.T, ip string, port int) *member {
	t.Helper()
	key, _, err := crypto.GenerateEd25519Key(nil)
	if err != nil {
		t.Fatal(err)
	}
	mc := mesh.DefaultConfig()
	mc.Namespace, mc.PrivKey = "dnstest", key
	mc.Listen = []string{"/ip4/" + ip + "/tcp/0"}
	mc.DialTimeout = time.Second
	m, err := mesh.New(mc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	nc := node.DefaultConfig()
	nc.Peer, nc.Transport, nc.Rules = m.PeerID(), m, rules
	nc.SuspectAfter, nc.DeadAfter, nc.EvictAfter = 2*time.Second, 5*time.Second, 30*time.Second
	n, err := node.Start(context.Background(), nc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Close() })
	api, err := httpapi.New(httpapi.Config{Node: n, Transport: m})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(ip, strconv.Itoa(port)))
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: api}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return &member{n: n, m: m, api: ln.Addr().String()}
}

func (mb *member) alive() int {
	a := 0
	for _, p := range mb.n.Peers() {
		if p.State == node.Alive {
			a++
		}
	}
	return a
}

// freePort finds a port free on every ip.
func freePort(t *testing.T, ips ...string) int {
	t.Helper()
	for range 50 {
		ln, err := net.Listen("tcp", ips[0]+":0")
		if err != nil {
			t.Fatal(err)
		}
		port := ln.Addr().(*net.TCPAddr).Port
		ok := true
		var held []net.Listener
		for _, ip := range ips[1:] {
			l, err := net.Listen("tcp", net.JoinHostPort(ip, strconv.Itoa(port)))
			if err != nil {
				ok = false
				break
			}
			held = append(held, l)
		}
		_ = ln.Close()
		for _, l := range held {
			_ = l.Close()
		}
		if ok {
			return port
		}
	}
	t.Fatal("no port free on every address")
	return 0
}

// TestDNSDiscovery: three members whose APIs share one port on
// 127.0.0.1-3, and a name that resolves to those three addresses, served
// by a DNS server of the test over UDP. Each member runs a discovery of
// dns:NAME:PORT and all three form one mesh; a fourth address added to
// the name later is found by a later round.
func TestDNSDiscovery(t *testing.T) {
	ips := []string{"127.0.0.1", "127.0.0.2", "127.0.0.3", "127.0.0.4"}
	port := freePort(t, ips...)
	srv := startDNS(t, "ratemesh.test", ips[:3]...)
	var ms []*member
	for _, ip := range ips[:3] {
		ms = append(ms, startMember(t, ip, port))
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	run := func(mb *member) {
		d, err := discovery.New(discovery.Config{
			Targets:  []string{"ratemesh.test:" + strconv.Itoa(port)},
			Self:     mb.m.PeerID(),
			Connect:  mb.m.Connect,
			Resolver: srv.resolver(),
			Connected: func(id string) bool {
				for _, p := range mb.m.Peers() {
					if p == id {
						return true
					}
				}
				return false
			},
			Interval: 200 * time.Millisecond, FastInterval: 50 * time.Millisecond,
		})
		if err != nil {
			t.Fatal(err)
		}
		go d.Run(ctx)
	}
	for _, mb := range ms {
		run(mb)
	}
	waitAll := func(want int) {
		t.Helper()
		deadline := time.Now().Add(15 * time.Second)
		for {
			done := true
			var state []string
			for i, mb := range ms {
				a := mb.alive()
				state = append(state, fmt.Sprintf("member %d sees %d alive", i, a))
				done = done && a == want
			}
			if done {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("not every member sees %d alive members: %v", want, state)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitAll(3)

	// Scale out: the name now resolves to a fourth member too.
	ms = append(ms, startMember(t, ips[3], port))
	run(ms[3])
	srv.set(ips...)
	waitAll(4)
	srv.mu.Lock()
	q := srv.queries
	srv.mu.Unlock()
	if q < 4 {
		t.Errorf("the DNS server answered %d queries; every member resolves the name", q)
	}
}

func TestNewRefusesBadTargets(t *testing.T) {
	for _, tg := range []string{"ratemesh", "ratemesh:0", ":8080", "ratemesh:http"} {
		_, err := discovery.New(discovery.Config{Targets: []string{tg}, Self: "x", Connect: func(context.Context, string) error { return nil }})
		if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("target %q: want dns:HOST:PORT", tg)) {
			t.Errorf("%q: error %v, want one naming the target and the form", tg, err)
		}
	}
	if _, err := discovery.New(discovery.Config{Targets: []string{"a:1"}}); err == nil {
		t.Error("no Self and Connect accepted")
	}
}
