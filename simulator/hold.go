package simulator

import (
	"fmt"

	"github.com/ratemesh/ratemesh/limiter"
	"github.com/ratemesh/ratemesh/node"
)

// Held requests (share_wait). A rule of the scenario that sets share_wait
// holds an Allow its node's core denies for its share (limiter.ReasonShare)
// as the node runtime does: the node decides it again (Core.Retry) after
// each of its Ticks, which apply acknowledgements, until it is admitted,
// denied for another reason, or share_wait has passed, and the outcome
// counts at that millisecond. Rules that leave share_wait out refuse at
// once, as every scenario did before the runtime held requests, so the
// library's published figures stay comparable; concurrency rules' Acquires
// are decided at once either way.

// heldCall is one held Allow at its node.
type heldCall struct {
	call    allowCall
	core    *node.Core // the core that holds it: a crash or restart drops it
	until   int64      // the virtual ms at which share_wait has passed
	counted int64      // the window its attempt counts in (Core.Retry)
	settled bool
}

// holdable reports whether the denial d of c is held.
func (s *sim) holdable(c *allowCall, d limiter.Decision) bool {
	return !d.Allowed && d.Reason == limiter.ReasonShare && c.ra.rule.ShareWait > 0
}

// hold starts holding call c, denied at node r's local time now.
func (s *sim) hold(r int, c *allowCall, n *simNode) {
	rule := c.ws.w.Rule
	now := s.local(r)
	wait := n.core.ShareWait(rule)
	s.held[r] = append(s.held[r], heldCall{
		call: *c, core: n.core, until: s.now + (wait.Milliseconds()),
		counted: n.core.WindowIndex(rule, now),
	})
	c.held = true
}

// retryHeld decides node r's held calls again after its Tick (in job,
// possibly in parallel with other nodes).
func (s *sim) retryHeld(r int, n *simNode) {
	now := s.local(r)
	for i := range s.held[r] {
		h := &s.held[r][i]
		if h.settled || h.core != n.core {
			continue
		}
		c := &h.call
		d, counted, err := n.core.Retry(now, c.ws.w.Rule, c.ws.keys[c.k], c.ws.req, h.counted)
		if err != nil {
			panic(fmt.Sprintf("simulator: a validated request was refused: %v", err))
		}
		h.counted = counted
		if d.Allowed || d.Reason != limiter.ReasonShare {
			c.allowed, h.settled = d.Allowed, true
		}
	}
}

// settleHeld counts the outcomes of the held calls settled this
// millisecond, and denies those whose share_wait has passed or whose node
// went down, in node order (after work's calls: they were decided after
// them).
func (s *sim) settleHeld() {
	for r := range s.held {
		hs := s.held[r]
		if len(hs) == 0 {
			continue
		}
		n := s.nodes[r]
		kept := hs[:0]
		for i := range hs {
			h := &hs[i]
			switch {
			case h.settled:
			case !n.up || h.core != n.core || s.now >= h.until:
				h.call.allowed = false
			default:
				kept = append(kept, *h)
				continue
			}
			s.allowOutcome(&h.call)
		}
		clear(hs[len(kept):])
		s.held[r] = kept
	}
}
