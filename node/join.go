package node

import (
	"slices"
	"time"
)

// Joining (docs/design.md, "Joining and state transfer" and "Readiness").
//
// A member started with peers to join (CoreConfig.Join) denies every
// decision (limiter.ReasonJoining) until it holds the mesh's usage: every
// connection is answered with a full state flagged FlagWant, which the
// peer answers with a relay of its whole view (FlagRelay, the last batch
// FlagLast); the member is ready once the relay of every peer it expects
// (ExpectState: every peer it connected to) has arrived, or after
// join_timeout. A member whose fence lifts (a partition healed, under the
// strict policy) joins again the same way: the members heard again hold
// usage it has not merged yet.
//
// A full state's member table is a suggestion, not evidence: the peers it
// names that this member has not heard are awaited while joining (each
// until its first batch arrives, or join_timeout), so a joiner through one
// seed does not decide on the seed and itself alone; they never count in
// N (docs/design.md, "Trust model"). The suggestions are bounded:
// maxSuggestPerSender per member that named them, maxSuggested in all.

// The bounds of the suggested peers a joining member awaits: a member
// table names at most crdt.MaxMembers peers, and a mesh of a few hundred
// is the largest one joins by suggestion (beyond, gossip names the others
// within a heartbeat anyway). One sender fills at most a quarter of the
// table, so a member listing invented peers cannot crowd out the real
// ones, and the table costs at most about 100 kB; what they cost a joiner
// is its join_timeout at most.
const (
	maxSuggestPerSender = 256
	maxSuggested        = 1024
)

// joinState is whether this member serves decisions yet, and what it
// waits for. Its invariants: while joined, stateFrom, expecting,
// suggested and perSender are nil; a peer is never in both stateFrom and
// expecting; perSender counts suggested by sender.
type joinState struct {
	started time.Time // when the join (or the rejoin) began
	joined  bool
	// everJoined: the member has joined at least once (a rejoin after a
	// fence lifted is not its first join).
	everJoined bool
	// stateFrom holds, while joining, the peers whose full state has
	// arrived, and expecting the connected peers whose full state is
	// awaited.
	stateFrom, expecting map[string]bool
	// healed, while fenced: members heard again, and whether their full
	// state has arrived since (see fence).
	healed map[string]bool
	// wasFenced is the fence as of the last call of fence, to see it lift.
	wasFenced bool
	// ask are the members heard again while fenced whose relay the
	// rejoin awaits and has not asked for, set when the fence lifts (see
	// fence): noteFence asks each for it. asked holds the peers a full
	// state flagged FlagWant went to since the last join whose relay has
	// not arrived: a relay is on its way from each.
	ask   []string
	asked map[string]bool
	// became and timedOut report a join, and one by join_timeout, since
	// the last Tick (which adds them to the Ready).
	became, timedOut bool
	// wants are the peers whose full state asked for a relay (FlagWant),
	// in the order they asked, until the next Tick relays to them.
	wants []string
	// suggested holds, while joining, the peers a member table named that
	// this member has not heard yet, each with the member that named it,
	// and perSender how many each member named (see suggest).
	suggested map[string]string
	perSender map[string]int
}

// expect notes that peer's full state is on its way while joining (see
// Core.ExpectState). self is this member's peer ID.
func (j *joinState) expect(self, peer string) {
	if j.joined || peer == self || j.stateFrom[peer] {
		return
	}
	if j.expecting == nil {
		j.expecting = make(map[string]bool)
	}
	j.expecting[peer] = true
}

// arrived records a peer's complete full state while joining, and joins
// once no expected full state is outstanding.
func (j *joinState) arrived(peer string) {
	if j.stateFrom == nil {
		j.stateFrom = make(map[string]bool)
	}
	j.stateFrom[peer] = true
	delete(j.expecting, peer)
	j.maybeJoin()
}

// maybeJoin joins once a relay has arrived and neither an expected full
// state nor a suggested peer is outstanding.
func (j *joinState) maybeJoin() {
	if !j.joined && len(j.stateFrom) > 0 && len(j.expecting) == 0 && len(j.suggested) == 0 {
		j.join(false)
	}
}

func (j *joinState) join(timedOut bool) {
	j.joined, j.became, j.everJoined = true, true, true
	j.timedOut = j.timedOut || timedOut
	j.stateFrom, j.expecting = nil, nil
	j.suggested, j.perSender = nil, nil
	j.asked = nil
}

// suggest notes, while joining, that from's member table names peer, a
// peer this member has not heard: the join waits until peer is heard
// (heardFrom) or join_timeout passes. It reports whether peer is awaited:
// not once joined, not beyond maxSuggestPerSender from one sender or
// maxSuggested in all.
func (j *joinState) suggest(from, peer string) bool {
	if j.joined {
		return false
	}
	if _, ok := j.suggested[peer]; ok {
		return true
	}
	if len(j.suggested) >= maxSuggested || j.perSender[from] >= maxSuggestPerSender {
		return false
	}
	if j.suggested == nil {
		j.suggested, j.perSender = make(map[string]string), make(map[string]int)
	}
	j.suggested[peer] = from
	j.perSender[from]++
	return true
}

// heardFrom notes a batch peer signed: it is awaited no longer. It
// reports whether the member joined.
func (j *joinState) heardFrom(peer string) bool {
	from, ok := j.suggested[peer]
	if !ok {
		return false
	}
	delete(j.suggested, peer)
	if j.perSender[from]--; j.perSender[from] == 0 {
		delete(j.perSender, from)
	}
	j.maybeJoin()
	return j.joined
}

// relayed records that peer's relay (its whole view) has arrived.
func (j *joinState) relayed(peer string) {
	delete(j.asked, peer)
	if _, ok := j.healed[peer]; ok {
		j.healed[peer] = true
	}
	if !j.joined {
		j.arrived(peer)
	}
}

// tick joins at now once timeout has passed since the join began, and
// reports whether it did.
func (j *joinState) tick(now time.Time, timeout time.Duration) bool {
	if !j.joined && now.Sub(j.started) >= timeout {
		j.join(true)
		return true
	}
	return false
}

// left returns how much of timeout is left at now.
func (j *joinState) left(now time.Time, timeout time.Duration) time.Duration {
	return timeout - now.Sub(j.started)
}

// heard notes that peer turned alive again while fenced.
func (j *joinState) heard(peer string) {
	if j.healed == nil {
		j.healed = make(map[string]bool)
	}
	j.healed[peer] = false
}

// fence follows the fence at now: a new one starts recording the members
// heard again; when it lifts (the partition healed), the members heard
// again hold usage this member has not merged yet — the other side's
// partition-time admissions arrive with their full states, and a
// heartbeat may come first — so the member joins again, expecting the full
// state of each of them that is still alive (alive reports it) and has not
// sent it yet, and of every member still suspect (suspects returns them):
// the fence lifts with the first members of the other side heard, and the
// others' streams restart later, and until their full states arrive this
// member cannot know whether they evicted it. It waits until join_timeout
// passes at most. It reports whether the member stopped serving.
func (j *joinState) fence(now time.Time, fenced bool, self string, alive func(peer string) bool, suspects func() []string) (rejoined bool) {
	switch {
	case j.wasFenced && !fenced:
		healed := j.healed
		j.healed = nil
		rejoin := func(peer string) {
			if j.joined {
				j.joined, j.started, rejoined = false, now, true
			}
			j.expect(self, peer)
		}
		for peer, arrived := range healed {
			if arrived || !alive(peer) {
				continue
			}
			rejoin(peer)
			if j.expecting[peer] && !j.asked[peer] {
				j.ask = append(j.ask, peer) // awaited, never asked: see Core.noteFence
			}
		}
		for _, peer := range suspects() {
			if !healed[peer] {
				rejoin(peer)
			}
		}
	case fenced && !j.wasFenced:
		j.healed = nil
	}
	j.wasFenced = fenced
	return rejoined
}

// want records that peer asked for a relay of our whole view.
func (j *joinState) want(peer string) {
	if !slices.Contains(j.wants, peer) {
		j.wants = append(j.wants, peer)
	}
}

// ExpectState tells a joining member that a connection to peer is up, so
// peer's full state is on its way (the runtime answers every connection
// with its full state): the member stays joining until the full state of
// every peer it expects has arrived, not only the first, so a joiner
// connected to several members does not decide on one member's view.
// join_timeout still bounds the wait. After joining it does nothing.
func (c *Core) ExpectState(peer string) { c.join.expect(c.self.Peer, peer) }

// regate brings gated up to date: a member that has not joined, or is
// fenced, or whose view is stale under strict, denies every decision.
func (c *Core) regate() {
	c.gated = !c.join.joined || c.members.fenced || (c.stale.on && c.cfg.Policy == Strict)
}

// noteFence follows the fence (joinState.fence).
func (c *Core) noteFence(now time.Time) {
	alive := func(peer string) bool {
		m := c.members.byPeer[peer]
		return m != nil && m.state == Alive
	}
	// The suspects awaited when a fence lifts leave out those that were
	// suspect already while this member served before the fence: it
	// decided without their latest state then, under the same scaling,
	// and the fence changed nothing about them. A majority member fenced
	// for a moment during a partition (its own process starved, so it
	// stopped hearing its side) would otherwise wait for the other side's
	// full states, which cannot come before the partition heals, and deny
	// as joining until join_timeout.
	suspects := func() []string {
		var out []string
		for _, m := range c.members.order {
			if m.state == Suspect && !m.evicted && !m.suspectServing {
				out = append(out, m.peer)
			}
		}
		return out
	}
	if c.join.fence(now, c.members.fenced, c.self.Peer, alive, suspects) {
		c.regate()
	}
	if ask := c.join.ask; len(ask) > 0 {
		// A member heard again may never have lost its connection to this
		// one (a member of this side suspected for a lost heartbeat), and
		// a full state and relay travel only on a new connection: ask
		// each for its relay with a full state of ours (FlagWant), or the
		// rejoin would wait out join_timeout for it.
		c.join.ask = nil
		slices.Sort(ask)
		c.AntiEntropy(now, ask...)
	}
	if !c.members.fenced {
		// Only a member whose state changed since the last call can have
		// another value: this runs on every batch, and walking every
		// member there cost a 1000-member replica half its CPU.
		ms := &c.members
		for _, m := range ms.touched {
			m.suspectServing = m.state == Suspect && !m.evicted
		}
		clear(ms.touched)
		ms.touched = ms.touched[:0]
	}
}
