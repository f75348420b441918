package simulator

import (
	"container/heap"
	"time"

	"github.com/ratemesh/ratemesh/crdt"
	"github.com/ratemesh/ratemesh/node"
)

// The leading edge. The node runtime publishes a member's own changes
// ahead of its sync tick (node.Config.PublishGap; node/runtime_publish.go,
// publishEarly): a decision, a lease operation or a nack to serve wakes its
// run loop, which calls Core.Flush and hands the Ready over once the
// member's last batch (Core.LastPublished) is at least PublishGap old, and
// otherwise arms a timer for the rest of the gap, when it looks again. The
// engine does the same in virtual time. arm schedules a node's edge, one
// at a time, on the heap edges at max(now, last batch + gap) in whole
// milliseconds; edgesDue, after the millisecond's ticks are handled, steps
// the node's pending deliveries, looks at its last batch again (a Tick may
// have published since) and either schedules the edge anew or calls
// Core.Flush and hands the Ready to handle, as tick does a Tick's.
//
// The runtime arms on every decision and disarms when its edge finds
// nothing pending; the core does not export whether anything is (its
// pending), and needs not: Flush adds nothing and changes nothing then, so
// an edge armed in vain publishes nothing, and it comes no earlier than
// the runtime's would have for a change made meanwhile. A nack is seen
// where the batch is delivered (deliver), not where it is stepped, so the
// edge does not depend on when the engine steps it.
//
// Scenario.PublishGap negative (mesh.publish_gap: tick) arms nothing: the
// nodes publish on their sync tick alone, as the simulator did before it
// had a leading edge.

// arm schedules node r's leading edge unless one is scheduled already
// (its simNode.edge) or the scenario turns it off.
func (s *sim) arm(r int) {
	n := s.nodes[r]
	if s.gap < 0 || n.edge != 0 || !n.up {
		return
	}
	s.pushEdge(r, node.PublishWait(s.local(r), n.core.LastPublished(), s.gapOf(n)))
}

// pushEdge schedules node r's edge wait after now, rounded up to whole
// milliseconds; none at or after the end of the run.
func (s *sim) pushEdge(r int, wait time.Duration) {
	at := s.now + int64((wait+time.Millisecond-1)/time.Millisecond)
	if at >= s.durMs {
		return
	}
	s.evSeq++
	s.nodes[r].edge = s.evSeq
	heap.Push(&s.edges, simEvent{at: at, seq: s.evSeq, kind: evEdge, node: r})
}

// edgesDue runs the leading edges due now, in the order of the heap:
// by time, then by the order they were scheduled in. What an edge does to
// its own node (step its pending deliveries, read its last batch, Flush)
// touches that node alone, so the edges due run it as jobs, in parallel
// with Workers > 1; what they hand over (handle, pushEdge) runs after, in
// heap order. Nothing an edge hands over reaches a node this millisecond:
// handle schedules deliveries at least a millisecond ahead and pushEdge
// edges too, so every edge due now is on the heap before the first runs.
func (s *sim) edgesDue() error {
	s.jobs = s.jobs[:0]
	for len(s.edges) > 0 && s.edges[0].at <= s.now {
		e := heap.Pop(&s.edges).(simEvent)
		n := s.nodes[e.node]
		if !n.up || n.edge != e.seq {
			continue // the node crashed, left or restarted since
		}
		n.edge = 0
		s.jobs = append(s.jobs, int32(e.node))
	}
	if len(s.jobs) == 0 {
		return nil
	}
	order := append(s.edgeOrder[:0], s.jobs...) // runJobs may sort s.jobs
	s.edgeOrder = order
	load := 16 * len(s.jobs) // a Flush and its Ready, as much as 16 deliveries
	for _, r := range s.jobs {
		load += len(s.pending[r])
	}
	if err := s.runJobs(load, s.edge); err != nil {
		return err
	}
	for _, r := range order {
		if wait := s.edgeWait[r]; wait > 0 {
			s.pushEdge(int(r), wait) // a Tick published since the edge was armed
			continue
		}
		rd := s.readies[r]
		s.readies[r] = node.Ready{}
		if err := s.handle(int(r), rd); err != nil {
			return err
		}
	}
	return nil
}

// edge is node r's part of its leading edge (see edgesDue): it steps the
// node's pending deliveries and either notes how long its last batch
// holds the edge off (edgeWait[r]) or flushes the core into readies[r].
func (s *sim) edge(r int) error {
	if err := s.flush(r); err != nil {
		return err
	}
	n := s.nodes[r]
	now := s.local(r)
	s.edgeWait[r] = node.PublishWait(now, n.core.LastPublished(), s.gapOf(n))
	if s.edgeWait[r] <= 0 {
		n.core.Flush(now)
		s.readies[r] = n.core.Ready()
	}
	return nil
}

// nacks reports whether b nacks a batch of self, which the receiver's
// Core.Step then serves (a repair, or every own value again).
func nacks(b *crdt.Batch, self crdt.Slot) bool {
	for _, nk := range b.Nacks {
		if nk.Slot.Is(self) {
			return true
		}
	}
	return false
}

// gapOf is the least time between two batches of node n: the scenario's
// PublishGap, or by default the runtime's, which stretches with the
// members n's core counts (node.PublishGap).
func (s *sim) gapOf(n *simNode) time.Duration {
	members, _ := n.core.Members()
	return node.PublishGap(s.gap, s.sc.Mesh.SyncInterval, members)
}
