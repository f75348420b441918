package node

import (
	"context"
	"time"

	"github.com/ratemesh/ratemesh/crdt"
)

// handle acts on rd, the whole of a Ready just taken from the core: the
// one place the runtime acts on the core's output. Each input that adds
// to the Ready (Tick, AntiEntropy, Flush, Leave) is followed, under the
// same hold of mu, by taking the Ready, and then by handle.
//
// The caller holds pubMu, taken before mu; handle publishes Messages on
// ctx, in order, tells the core they are handed over (Core.Handed), and
// then releases pubMu, so batches go out in the order of their Seq. Then it sends each Direct (from goroutines of their own),
// logs the changes, answers members heard again, saves a new incarnation
// and marks the node ready. It returns how long after now the core next
// has timed work (Ready.NextTick, at most SyncInterval), or 0 when rd
// holds no Tick's output, and the error that stopped publishing.
func (n *Node) handle(ctx context.Context, now time.Time, rd Ready) (time.Duration, error) {
	if f := rd.Fence; f != nil {
		if f.Fenced {
			n.log.Error("fenced: this side of a partition holds no majority of the members; denying every decision until it heals (strict policy)", "alive", f.Alive, "members", f.Live)
		} else {
			n.log.Warn("fence lifted; serving again once the members heard again have sent their state", "alive", f.Alive, "members", f.Live)
		}
	}
	err := n.publish(ctx, rd.Messages)
	if len(rd.Messages) > 0 {
		// Their admissions leave the publish budget only now: a decision
		// that took it there while they were on their way waited (pubMu).
		n.mu.Lock()
		n.core.Handed()
		n.mu.Unlock()
	}
	n.pubMu.Unlock()
	n.sendDirect(rd.Direct) // full states and relays of our whole view
	var again []string
	for _, c := range rd.Changes {
		if c.New {
			n.log.Info("member", "member", c.Peer, "incarnation", c.Incarnation, "state", c.To.String(), "new", true)
		} else {
			n.log.Info("member", "member", c.Peer, "incarnation", c.Incarnation, "from", c.From.String(), "state", c.To.String())
		}
		if c.To == Alive && (c.From == Suspect || c.From == Dead) {
			// Heard again after a silence (a healed partition, a member
			// that was paused or evicted), often over a connection that
			// stayed up: full states go out by themselves only to new
			// connections, and a member whose fence lifted serves again
			// only once it holds ours, or after join_timeout.
			again = append(again, c.Peer)
		}
	}
	if len(again) > 0 {
		n.answer(again...)
	}
	if rd.NewIncarnation != 0 {
		n.log.Warn("evicted by the mesh; took a new incarnation", "incarnation", rd.NewIncarnation)
		if err := n.saveIncarnation(rd.NewIncarnation); err != nil {
			n.log.Error("save incarnation", "incarnation", rd.NewIncarnation, "err", err)
		}
	}
	if rd.Joined {
		if rd.JoinTimedOut {
			n.log.Warn("join timed out; serving with what we have", "join_timeout", n.cfg.JoinTimeout)
		} else {
			n.log.Info("joined")
		}
		n.markReady()
	}
	if st := rd.Stale; st != nil {
		if st.Stale {
			n.log.Error("view stale: the members this node hears have not acknowledged its batches lately; denying every decision under strict, holding to its share under available, until they do",
				"lagging", st.Lagging, "members", st.Live, "strict", n.cfg.Policy == Strict)
		} else {
			n.log.Warn("view fresh again: the members acknowledge this node's batches", "members", st.Live)
		}
	}
	for _, kb := range rd.KeyBudget {
		n.log.Error("peer reached its key budget: its entries for keys this node does not hold are dropped; an honest member never gets here (node.max_keys)",
			"peer", kb.Peer, "keys", kb.Keys, "key_budget", kb.Budget)
	}
	if sk := rd.Skew; sk != nil {
		if sk.Exceeded {
			n.log.Error("clock offset to the mesh beyond max_skew; fix this host's clock", "offset", sk.Offset, "max_skew", n.cfg.MaxSkew)
		} else {
			n.log.Info("clock offset to the mesh back within max_skew", "offset", sk.Offset)
		}
	}
	if rd.NextTick.IsZero() {
		return 0, err
	}
	return min(max(rd.NextTick.Sub(now), 0), n.cfg.SyncInterval), err
}

// publish publishes bs on ctx in order, stopping at the first failure,
// which it logs unless ctx ended, and returns.
func (n *Node) publish(ctx context.Context, bs []*crdt.Batch) error {
	for _, b := range bs {
		if err := n.cfg.Transport.Publish(ctx, b); err != nil {
			if ctx.Err() == nil {
				n.log.Warn("publish", "err", err)
			}
			return err
		}
	}
	return nil
}

// answer sends the member's full state to peers that connected, or that
// were heard again after a silence.
func (n *Node) answer(peers ...string) {
	n.pubMu.Lock()
	n.mu.Lock()
	now := n.readClock()
	n.core.AntiEntropy(now, peers...)
	rd := n.core.Ready()
	n.mu.Unlock()
	n.handle(n.ctx, now, rd)
}

// sendDirect sends each Direct's batches to its peers alone.
func (n *Node) sendDirect(ds []Direct) {
	for _, d := range ds {
		for _, peer := range d.To {
			// Sent from a goroutine of its own: SendDirect may wait for a
			// slow or unreachable peer up to the transport's sync timeout,
			// and the loop's ticks and merges must not wait with it. Close
			// waits for these.
			n.answers.Add(1)
			go func() {
				defer n.answers.Done()
				if err := n.cfg.Transport.SendDirect(n.ctx, peer, d.Batches); err != nil && n.ctx.Err() == nil {
					n.log.Warn("anti-entropy", "to", peer, "err", err)
				}
			}()
		}
	}
}
