// Package mesh is ratemesh's libp2p transport: the node.Transport that
// carries batches between members over gossipsub, with an anti-entropy
// stream protocol, discovery, a private-network key and redialling.
//
// # Embedding
//
// A Go service runs a member in-process: a Mesh is the node's transport,
// its peer ID the node's counter slot, and decisions are method calls on
// the node (no network hop on the request path):
//
//	key, err := mesh.LoadOrCreateKey(filepath.Join(dataDir, "identity.key"))
//	rules := []limiter.Rule{{Name: "api", Algorithm: limiter.SlidingWindow, Limit: 1000, Window: time.Second}}
//	mcfg := mesh.DefaultConfig()
//	mcfg.PrivKey, mcfg.Namespace = key, "default"
//	mcfg.Listen = []string{"/ip4/127.0.0.1/tcp/4001"}
//	mcfg.Bootstrap = []string{"/ip4/127.0.0.1/tcp/4002/p2p/12D3KooW…"}
//	mcfg.PSK, err = mesh.LoadPSK("swarm.key") // optional; TCP only
//	mcfg.AllowPeersFile = "members"           // optional: only the peers listed may be members
//	mcfg.Plausible = mesh.PlausibleFor(rules, 0)
//	m, err := mesh.New(mcfg)
//
//	ncfg := node.DefaultConfig()
//	ncfg.Peer, ncfg.Rules, ncfg.Transport = m.PeerID(), rules, m
//	ncfg.Join = len(mcfg.Bootstrap) > 0 // merge the mesh's state before serving
//	n, err := node.Start(ctx, ncfg)    // n owns m: n.Close closes it
//	defer n.Close()                    // a graceful leave
//
//	d, err := n.Allow(ctx, "api", "acct:42")
//	if !d.Allowed {
//		// 429, retry after d.RetryAfter
//	}
//
// # In a libp2p service
//
// A program that already runs a libp2p host and gossipsub attaches the
// member to them instead (Attach), so that it has one peer ID and one set
// of connections, and limits its own streams with node/p2plimit:
//
//	mcfg := mesh.DefaultConfig()
//	mcfg.Listen = nil // the service's host listens
//	mcfg.Bootstrap = []string{"/ip4/10.0.0.2/tcp/4001/p2p/12D3KooW…"} // other service hosts
//	m, err := mesh.Attach(h, ps, mcfg) // h host.Host, ps *pubsub.PubSub: the service's
//	ncfg.Peer, ncfg.Transport = m.PeerID(), m // the host's peer ID
//	n, err := node.Start(ctx, ncfg) // n.Close detaches m; h and ps run on
//
// Attach refuses a PubSub that does not sign its messages as the host; see
// docs/p2p.md and examples/p2p-echo.
//
// The node runtime drives the Mesh like this:
//
//	err = m.Start(ctx, handler) // handler queues into the runtime's loop
//	for {
//		select {
//		case in := <-inbound: // HandleBatch
//			core.Step(time.Now(), in.Batch)
//		case p := <-connected: // PeerConnected: anti-entropy on connect
//			core.AntiEntropy(time.Now(), p)
//		case <-ticker.C:
//			core.Tick(time.Now())
//		}
//		rd := core.Ready() // every output, handled in one place
//		for _, b := range rd.Messages {
//			m.Publish(ctx, b)
//		}
//		for _, d := range rd.Direct { // full states and relays
//			for _, p := range d.To {
//				go m.SendDirect(ctx, p, d.Batches)
//			}
//		}
//		… // the rest of rd
//	}
//
// # Gossip
//
// Every member publishes its batches on the topic /ratemesh/1/<namespace>,
// signed by its peer key (StrictSign). Gossipsub runs with a 100 ms
// heartbeat, flood publishing (a member's own batches go at once to every
// connected subscriber, mesh or not, so nothing it publishes while the
// topic mesh forms is lost to an empty mesh; what others relay before
// their mesh forms can still be lost, and anti-entropy on connect covers
// it), a small topic mesh that relays each batch to at most 3 peers and
// no IHAVE/IWANT gossip (GossipSubParams: members connect to each other,
// so flood publishing already delivers, and ratemesh's nacks recover a
// lost batch), and queues raised from 32 to QueueSize (PubSubOptions);
// the subscription is read in its own goroutine.
//
// The topic validator admits a message only if it is at most
// MaxMessageBytes, decodes with the strict crdt.DecodeBatch, names its
// signature-verified author as From, carries only From's own slot (every
// entry's slot index is 0) and holds no value beyond any possible
// admission (Config.Plausible), and, with an allowlist, whose author is
// listed. Anything else is rejected — not forwarded, and its forwarder
// penalised — and counted in Stats by Reason, as are the refusals
// gossipsub makes itself: a signature that does not verify, a message
// claiming this member as its author, an RPC over the size cap (see
// sizeHost). Stats.RefusedMessages sums every refusal by Reason; each
// reason is logged at most once every 5 s, with a count of the rest.
//
// # Anti-entropy
//
// SendDirect opens the stream protocol /ratemesh/1/<namespace>/sync to one
// peer and writes length-prefixed batches; the listener applies the same
// checks with the stream's authenticated remote peer as the author, so a
// value reaches the core only when its owner sent it: anti-entropy never
// relays a third party's slot. The runtime answers PeerConnected with its
// full state (anti-entropy on connect) and re-announces on its repair
// interval.
//
// # Connections
//
// The host speaks TCP and QUIC, Noise and TLS, yamux. Bootstrap peers are
// dialled at Start, in parallel, each bounded by DialTimeout, and redialled
// with jittered exponential backoff (RedialMin to RedialMax) whenever their
// last connection drops; a connection that drops at once backs off like a
// failed dial. mDNS discovery (Config.MDNS) finds peers on the local
// network; it is off by default.
//
// PeerConnected(p) fires once per spell of connectivity, in either
// direction: when p has a live connection and identify has shown that it
// speaks this namespace's sync protocol (so it can take an anti-entropy
// answer at once), and again after p's last connection closed and a new
// one came up. Peers of other namespaces, other programs, and connections
// refused right after the handshake are never reported.
//
// # Private networks
//
// Config.PSK (LoadPSK reads the libp2p/IPFS swarm.key format) makes the
// host accept only peers holding the same key. With a key only TCP works:
// QUIC cannot use a pre-shared key, and a QUIC listen address is refused
// by New. A peer with a different key (or none) stalls the handshake
// rather than failing it, so every dial is bounded by DialTimeout and
// fails with ErrKeyMismatchOrUnreachable naming the address.
//
// # Admission
//
// Config.AllowPeers, AllowPeersFile (re-read when it changes) and
// SetAllowedPeers (with AllowExternal; serve feeds it DNS TXT records)
// make an allowlist of member peer IDs. A peer not on it is refused by the
// connection gater right after the handshake (and never dialled), its
// gossip is rejected whoever forwards it, and its sync and forward streams
// are reset: it never becomes a member. Without an allowlist any peer that
// can connect and publish its own slot is a member. Refused connections
// are counted in Stats.RefusedConns by ConnReason.
//
// # Partitions
//
// Block and Unblock cut and restore the connection to one peer through a
// connection gater; tests use them for partitions and `ratemesh peers
// evict` to keep an evicted peer out. An attached Mesh, which has no gater
// on the service's host, ignores a blocked peer instead and leaves the
// service's connection to it up.
package mesh
