package node

import (
	"time"
)

// armPublish wakes the run loop to publish the changes about to be made
// (see Config.PublishGap), unless it has been woken already. mu must be
// held.
func (n *Node) armPublish() {
	n.pubArmed = true
	select {
	case n.pubSig <- struct{}{}:
	default:
	}
}

// armIfPending wakes the run loop to publish when the core holds changes
// that no decision announced (a nack's request, a held request decided
// again). mu must be held.
func (n *Node) armIfPending() {
	if !n.pubArmed && n.core.pending() {
		n.armPublish()
	}
}

// EdgeInbound is how many batches a second the leading edges of the
// other members may bring a member at most under the default publish gap
// (PublishGap): about 1.3 cores at the 128 µs a delivered batch costs
// (docs/cost-model.md, c1).
const EdgeInbound = 10_000

// PublishGap returns the least time between two batches of a member on
// its leading edge when it counts members live members (Core.Members,
// itself included) and Config.PublishGap is gap: gap itself unless it is
// 0, the default. The default is half the sync interval, stretched as the
// mesh grows to (members − 1) ÷ EdgeInbound seconds, and never more than
// the sync interval. A busy member publishes once a gap, so under the
// default its N − 1 others bring it at most EdgeInbound batches a second,
// or (N − 1) ÷ sync interval, what their ticks alone send, when that is
// more: in a 1000-member mesh at a 100 ms interval the gap is the
// interval, where half of it would double every member's inbound (2·999
// batches each 100 ms, 2.6 cores) under a steady load. A sparse change
// still goes out at once; only a member that published within the gap
// waits.
func PublishGap(gap, syncInterval time.Duration, members int) time.Duration {
	if gap != 0 {
		return gap
	}
	stretch := time.Duration(max(members-1, 0)) * time.Second / EdgeInbound
	return min(max(syncInterval/2, stretch), syncInterval)
}

// PublishWait returns how long after now a change may be published when
// the member's last batch was built at last and batches are at least gap
// apart: 0 once gap has passed (or before any batch), never more than gap
// (a clock that stepped back does not hold changes longer). The simulator
// paces its nodes' leading edges with it too.
func PublishWait(now, last time.Time, gap time.Duration) time.Duration {
	if last.IsZero() {
		return 0
	}
	return min(max(last.Add(gap).Sub(now), 0), gap)
}

// publishEarly publishes the pending changes when the member's last batch
// is at least PublishGap old (Core.Flush) and returns 0, or returns how
// long until it is. With nothing pending it disarms the leading edge and
// returns 0.
func (n *Node) publishEarly() time.Duration {
	n.pubMu.Lock()
	n.mu.Lock()
	if !n.core.pending() {
		n.pubArmed = false
		n.mu.Unlock()
		n.pubMu.Unlock()
		return 0
	}
	now := n.readClock()
	members, _ := n.core.Members()
	gap := PublishGap(n.cfg.PublishGap, n.cfg.SyncInterval, members)
	if wait := PublishWait(now, n.core.LastPublished(), gap); wait > 0 {
		n.mu.Unlock()
		n.pubMu.Unlock()
		return wait
	}
	n.core.Flush(now)
	rd := n.core.Ready()
	n.pubArmed = false
	n.mu.Unlock()
	n.handle(n.ctx, now, rd)
	return 0
}

// publishOver publishes the pending changes before a decision's answer
// returns, when the admissions not yet published are past a rule's
// publish budget (Core.OverBudget; docs/design.md, "What a kill loses"):
// a kill then loses at most the budget. The caller has released mu; it
// holds the answer until the batches are handed to the Transport.
//
//go:noinline
func (n *Node) publishOver() {
	n.pubMu.Lock()
	n.mu.Lock()
	if n.closed || !n.core.OverBudget() {
		n.mu.Unlock() // published meanwhile
		n.pubMu.Unlock()
		return
	}
	now := n.readClock()
	n.core.Flush(now)
	rd := n.core.Ready()
	n.mu.Unlock()
	n.handle(n.ctx, now, rd)
}

// publishIfOver is publishOver for a caller that does not hold mu and has
// not checked the budget.
func (n *Node) publishIfOver() {
	n.mu.Lock()
	over := !n.closed && n.core.OverBudget()
	n.mu.Unlock()
	if over {
		n.publishOver()
	}
}
