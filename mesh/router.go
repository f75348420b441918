package mesh

import (
	"time"

	pubsub "github.com/libp2p/go-libp2p-pubsub"
)

// The topic mesh of ratemesh's gossipsub router (GossipSubParams).
// Every member publishes its own batches to every subscribed peer it is
// connected to (flood publishing), and members dial every member they
// learn of, so a batch reaches every member on its first hop. The topic
// mesh only relays it once more: with libp2p's degree of 6, every
// receiver forwarded every batch to the other members, who already had
// it — 3 duplicates per delivery at 5 members, 73 % of the wire bytes.
// A degree of 2 keeps a relay (a member whose own link to the author is
// down still hears the batch from a neighbour) at about half the bytes.
// Dhi 3 bounds the degree, and so the bytes: with libp2p's Dhi of 12 a
// member keeps every peer that grafts it, and 5 members sent 3.7 wire
// bytes per delivered payload byte instead of 2.9. The cost is that a
// member relays to at most 3 peers: a member that reaches the others
// only through one member with more than 3 such peers misses some of
// their batches (docs/p2p.md). These are the smallest values
// go-libp2p-pubsub v0.17 accepts above 0 (Dlo ≤ D ≤ Dhi, Dscore ≤ Dhi,
// Dout < Dlo and Dout < D/2).
const (
	GossipD      = 2 // the topic mesh's target degree (libp2p: 6)
	GossipDlo    = 1 // graft below this (libp2p: 5)
	GossipDhi    = 3 // prune above this (libp2p: 12)
	GossipDout   = 0 // outbound peers kept in the mesh (libp2p: 2)
	GossipDscore = 3 // peers kept by score when pruning (libp2p: 4)
)

// Gossip proper — IHAVE announcements of recent message IDs to peers
// outside the topic mesh, and the IWANT requests they answer — is off:
// with a small topic mesh every member is outside some members' meshes,
// and the announcements cost 9–20 % of the wire bytes for batches every
// member already received by flood publishing. A batch that is lost all
// the same is recovered by ratemesh itself: the receiver sees the gap in
// the author's sequence numbers and nacks it, and repair and anti-entropy
// cover the rest (docs/design.md, "Acknowledgements").
const (
	GossipDlazy  = 0 // peers gossiped to per heartbeat, at least (libp2p: 6)
	GossipFactor = 0 // fraction of non-mesh peers gossiped to (libp2p: 0.25)
)

// GossipSubParams returns the gossipsub parameters of the router New
// builds: go-libp2p-pubsub's defaults with heartbeat as the heartbeat
// interval and initial delay, the small topic mesh of GossipD and its
// companions, and no gossip (GossipDlazy, GossipFactor). In a full mesh of
// 5 members under 3000 decisions/s they bring the gossip wire bytes from
// 4.7 to 2.3–2.9 per delivered payload byte (docs/performance.md).
func GossipSubParams(heartbeat time.Duration) pubsub.GossipSubParams {
	p := pubsub.DefaultGossipSubParams()
	p.HeartbeatInterval = heartbeat
	p.HeartbeatInitialDelay = heartbeat
	p.D, p.Dlo, p.Dhi, p.Dout, p.Dscore = GossipD, GossipDlo, GossipDhi, GossipDout, GossipDscore
	p.Dlazy, p.GossipFactor = GossipDlazy, GossipFactor
	return p
}

// PubSubOptions returns the options New builds its gossipsub router with,
// for cfg (validated by the caller): the parameters of
// GossipSubParams(cfg.GossipHeartbeat), flood publishing, StrictSign,
// outbound and validation queues of cfg.QueueSize, and messages up to
// cfg.MaxMessageBytes plus pubsub's envelope. A service that attaches a
// member (Attach) to a router of its own may build that router with them,
// if its own topics can live with them too: the parameters apply to
// every topic of the router (docs/p2p.md, "Gossipsub settings").
func PubSubOptions(cfg Config) []pubsub.Option {
	return []pubsub.Option{
		pubsub.WithGossipSubParams(GossipSubParams(cfg.GossipHeartbeat)),
		pubsub.WithFloodPublish(true),
		pubsub.WithMessageSignaturePolicy(pubsub.StrictSign),
		pubsub.WithPeerOutboundQueueSize(cfg.QueueSize),
		pubsub.WithValidateQueueSize(cfg.QueueSize),
		pubsub.WithMaxMessageSize(cfg.MaxMessageBytes + rpcOverhead),
	}
}
