package simulator

import (
	"math"
	"time"
)

func (s *sim) apply(e simEvent) error {
	switch e.kind {
	case EvSkew:
		for _, i := range e.ev.Nodes {
			n := s.nodes[i]
			if !n.exists || n.gone {
				s.skipped++
				continue
			}
			if e.ev.HasBy {
				n.skewNs = int64(e.ev.By)
			} else {
				ms := e.ev.Spread.Milliseconds()
				n.skewNs = (s.rng.Int64N(2*ms+1) - ms) * int64(time.Millisecond)
			}
		}
	case EvPartition:
		if s.partStart < 0 {
			s.partStart = s.now
		}
		old := s.groups()
		for _, i := range s.present {
			s.nodes[i].group = 0
		}
		for g, grp := range e.ev.Groups {
			for _, i := range grp {
				s.nodes[i].group = g + 1
			}
		}
		s.pruneSamples()
		if err := s.reconnect(old); err != nil {
			return err
		}
	case EvHeal:
		if s.partStart >= 0 {
			s.shades = append(s.shades, Shade{Kind: "partition", From: s.partStart, To: s.now})
			s.partStart = -1
		}
		old := s.groups()
		for _, i := range s.present {
			s.nodes[i].group = 0
		}
		if err := s.reconnect(old); err != nil {
			return err
		}
	case EvCrash:
		for _, i := range e.ev.Nodes {
			if !s.crash(i) {
				s.skipped++
			}
		}
	case EvRestart:
		for _, i := range e.ev.Nodes {
			ok, err := s.restart(i)
			if err != nil {
				return err
			}
			if !ok {
				s.skipped++
			}
		}
	case EvJoin:
		for range e.ev.Count {
			i := len(s.present)
			for j, n := range s.nodes {
				if !n.exists {
					i = j
					break
				}
			}
			if err := s.startNode(i, true); err != nil {
				return err
			}
			s.refreshUp()
			if err := s.bootstrap(i); err != nil {
				return err
			}
		}
	case EvLeave:
		for _, i := range e.ev.Nodes {
			n := s.nodes[i]
			if !n.up {
				s.skipped++
				continue
			}
			n.core.Leave(s.local(i))
			if err := s.handle(i, n.core.Ready()); err != nil {
				return err
			}
			s.dropNodeLeases(i, "left") // leases.go: its leases end with it
			n.core, n.up, n.gone = nil, false, true
			for k, p := range s.present {
				if p == i {
					s.present = append(s.present[:k], s.present[k+1:]...)
					break
				}
			}
			s.refreshUp()
			s.dropSender(i)
			s.pruneSamples()
		}
	case EvRate:
		ws := s.wls[e.ev.Workload]
		if e.ev.HasRate {
			ws.setRate(e.ev.Rate)
		}
		if e.ev.HasNodeDist {
			ws.w.NodeDist = e.ev.NodeDist
		}
	case evChurn:
		c := s.sc.Churn
		up := append([]int32(nil), s.upList...)
		k := int(math.Round(c.Fraction * float64(len(up))))
		k = max(1, min(k, len(up)))
		for j := 0; j < k; j++ {
			p := j + s.rng.IntN(len(up)-j)
			up[j], up[p] = up[p], up[j]
			i := int(up[j])
			s.crash(i)
			s.push(simEvent{at: s.now + c.DownFor.Milliseconds(), kind: evChurnRestart, node: i})
		}
		s.push(simEvent{at: s.now + c.Every.Milliseconds(), kind: evChurn})
	case evChurnRestart:
		if _, err := s.restart(e.node); err != nil {
			return err
		}
	case evDial:
		if n := s.nodes[e.node]; n.up && n.inc == e.inc {
			return s.antiEntropy(e.node, -1, e.seed)
		}
	}
	return nil
}

// groups returns every node's partition group.
func (s *sim) groups() []int {
	old := make([]int, len(s.nodes))
	for i, n := range s.nodes {
		old[i] = n.group
	}
	return old
}

// reconnect runs anti-entropy between every pair of up nodes that the
// change from the old groups connected: each sends the other its full
// state.
func (s *sim) reconnect(old []int) error {
	for _, a := range s.upList {
		for _, b := range s.upList {
			if a != b && old[a] != old[b] && s.nodes[a].group == s.nodes[b].group {
				if err := s.fullState(int(a), int(b)); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// crash stops node i and drops its core: its volatile state is lost.
func (s *sim) crash(i int) bool {
	n := s.nodes[i]
	if !n.up {
		return false
	}
	s.dropNodeLeases(i, "crashed") // leases.go: its leases are lost with it
	n.core, n.up = nil, false
	s.downStart[i] = s.now
	s.refreshUp()
	s.dropSender(i)
	s.pruneSamples()
	return true
}

// restart starts a crashed node with a new incarnation that rejoins as in
// production (bootstrap).
func (s *sim) restart(i int) (bool, error) {
	n := s.nodes[i]
	if n.up || n.gone || !n.exists {
		return false, nil
	}
	if err := s.startNode(i, true); err != nil {
		return false, err
	}
	s.refreshUp()
	return true, s.bootstrap(i)
}

// bootstrap models how a starting node joins in production: it connects to
// one seed (its bootstrap address: the first up node of its group) and
// exchanges full states with it alone; the seed's answer names every member
// with its addresses, and the node dials the others once that answer has
// arrived (a network delay, plus one for the dial). Until then it knows
// the others only through the seed's relayed state and their gossip.
func (s *sim) bootstrap(i int) error {
	seed := -1
	for _, r := range s.upList {
		if j := int(r); j != i && s.nodes[j].group == s.nodes[i].group {
			seed = j
			break
		}
	}
	if seed < 0 {
		return nil
	}
	if err := s.antiEntropy(i, seed, -1); err != nil {
		return err
	}
	dialMs := 2*(s.latNs+s.jitNs)/int64(time.Millisecond) + 1
	s.push(simEvent{at: s.now + dialMs, kind: evDial, node: i, inc: s.nodes[i].inc, seed: seed})
	return nil
}

// antiEntropy exchanges full states between node i and node only, or every
// up node in its group but skip when only is −1.
func (s *sim) antiEntropy(i, only, skip int) error {
	var to []int32
	for _, r := range s.upList {
		j := int(r)
		if j != i && j != skip && s.nodes[j].group == s.nodes[i].group && (only < 0 || j == only) {
			to = append(to, r)
		}
	}
	for _, r := range to {
		if err := s.fullState(int(r), i); err != nil {
			return err
		}
		if err := s.fullState(i, int(r)); err != nil {
			return err
		}
	}
	return nil
}
