package simulator

import (
	"fmt"
	"time"

	"github.com/ratemesh/ratemesh/crdt"
)

// The simulated network: what a node's core hands over (sim.handle, in
// engine.go) goes to the other nodes through it, each copy after a
// latency and jitter draw, and gossip copies through a loss draw.

// fullState has node i answer a new connection from node j (its
// Core.AntiEntropy) and hands the Ready to handle, which sends it.
func (s *sim) fullState(i, j int) error {
	c := s.nodes[i].core
	c.AntiEntropy(s.local(i), s.nodes[j].peer)
	return s.handle(i, c.Ready())
}

// countDirect counts one direct send of bs by node from.
func (s *sim) countDirect(from int, bs []*crdt.Batch) error {
	for _, b := range bs {
		if err := s.account(from, b, 1); err != nil {
			return err
		}
	}
	return nil
}

// schedule sends b from node from to node to, delivered delayMs from now;
// nacks says whether b may nack a batch of to (see markNacks).
func (s *sim) schedule(from int, to int32, b *crdt.Batch, delayMs int64, nacks bool) {
	slot := (s.now + delayMs) & s.mask
	s.inbox[slot] = append(s.inbox[slot], inMsg{b: b, from: int32(from), to: to, nacks: nacks})
}

// markNacks marks, in nackMark, the nodes whose peer a nack of b names,
// and returns them for unmarkNacks. The receiver compares the nack with
// its own slot when it is delivered (its incarnation may change before):
// a node whose peer no nack names needs not look.
func (s *sim) markNacks(b *crdt.Batch) []int32 {
	marked := s.marked[:0]
	for _, nk := range b.Nacks {
		if i, ok := s.peerIdx[nk.Slot.Peer]; ok && !s.nackMark[i] {
			s.nackMark[i] = true
			marked = append(marked, i)
		}
	}
	s.marked = marked
	return marked
}

func (s *sim) unmarkNacks(marked []int32) {
	for _, i := range marked {
		s.nackMark[i] = false
	}
}

func (s *sim) delayMs() int64 {
	ns := s.latNs
	if s.jitNs > 0 {
		ns += s.rng.Int64N(s.jitNs)
	}
	ms := (ns + int64(time.Millisecond) - 1) / int64(time.Millisecond)
	return max(ms, 1)
}

func (s *sim) account(from int, b *crdt.Batch, copies uint64) error {
	data, err := b.Encode()
	if err != nil {
		return fmt.Errorf("node %d built a batch that does not encode: %w", from, err)
	}
	n := s.nodes[from]
	bytes := uint64(len(data)) * copies
	n.bytes += bytes
	n.msgs += copies
	s.totBytes += bytes
	s.totMsgs += copies
	sec := &s.seconds[s.now/1000]
	sec.Bytes += bytes
	sec.Messages += copies
	return nil
}

// publish gossips b from node from to every up node in its group.
func (s *sim) publish(from int, b *crdt.Batch) error {
	if err := s.account(from, b, 1); err != nil {
		return err
	}
	g := s.nodes[from].group
	smp := s.maybeSample(from, b)
	marked := s.markNacks(b)
	defer s.unmarkNacks(marked)
	for _, r := range s.upList {
		if int(r) == from || s.nodes[r].group != g {
			continue
		}
		if smp != nil {
			smp.add(int(r))
		}
		if s.loss > 0 && s.rng.Float64() < s.loss {
			continue
		}
		s.schedule(from, r, b, s.delayMs(), s.nackMark[r])
	}
	if smp != nil {
		s.closeDone(from)
	}
	return nil
}

// direct sends batches from node from to node to alone (anti-entropy),
// never lost.
func (s *sim) direct(from, to int, bs []*crdt.Batch) {
	d := s.delayMs()
	for _, b := range bs {
		s.schedule(from, int32(to), b, d, len(b.Nacks) > 0)
	}
}

// relay sends bs, a Direct of node from's Ready (a full state answering a
// connection, or a relay of its whole view answering a joiner, restarted
// or fenced node's FlagWant), to peer alone, if it is up and reachable.
func (s *sim) relay(from int, peer string, bs []*crdt.Batch) error {
	to := -1
	for _, r := range s.upList {
		if s.nodes[r].peer == peer {
			to = int(r)
		}
	}
	if to < 0 || s.nodes[to].group != s.nodes[from].group {
		return nil
	}
	if err := s.countDirect(from, bs); err != nil {
		return err
	}
	s.direct(from, to, bs)
	return nil
}
