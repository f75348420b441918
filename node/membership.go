package node

import (
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/ratemesh/ratemesh/crdt"
	"github.com/ratemesh/ratemesh/limiter"
)

// Membership (docs/design.md, "Membership" and "Partitions and crashes").
//
// A member is alive while heard within SuspectAfter, then suspect (still
// holding capacity), then dead after DeadAfter under the available
// policy. Under the strict one a silent member is reclaimed after
// ReclaimAfter by a side that holds a strict majority, evicted after
// EvictAfter by a side of exactly half, and a side without a majority
// fences itself; a reclaim needs a majority that has held for
// ReclaimAfter, so a healed minority reclaims nobody at once. Evictions
// are announced in our batches for evictMemory (and while the evicted
// incarnation is heard); an evicted member that comes back takes a new
// incarnation once a strict majority announces it, and an announced
// eviction of another member is adopted on the same condition. A newer
// incarnation of a peer replaces the older at once.

const evictMemory = time.Minute // how long our batches announce an eviction

// membership is the member table: every other member this one knows, and
// the counts every decision uses. Its invariants: order holds exactly the
// members of byPeer, sorted by peer; n, nAlive, rank, scale and fenced are
// as recount computes them from the states in order.
type membership struct {
	byPeer map[string]*member
	order  []*member // sorted by peer: deterministic iteration
	n      int       // live members, self included
	nAlive int       // alive members, self included (n − nAlive are suspect)
	rank   int       // self's place among the n live members, by peer
	scale  float64   // partition scale of every limit
	// fenced: under Strict, this member's side holds no majority of the
	// members (recount); it denies with limiter.ReasonFenced.
	fenced bool
	// fenceSeen is fenced as of the last fenceChange.
	fenceSeen bool
	evictions []eviction // slots we evicted, announced for evictMemory
	// announced holds, by slot, the members that announced it evicted
	// and when they last did (noteEvicted): only our own slot and the
	// current incarnations of members we count, forgotten after
	// evictMemory.
	announced map[crdt.Slot]map[string]time.Time
	changes   []MemberChange // transitions since the last Tick (which adds them to the Ready)
	// touched are the members whose state changed since noteFence last
	// brought their suspectServing up to date (duplicates allowed): it
	// looks at those alone, not at every member on every batch.
	touched []*member
	// quietUntil is when the next member can cross a silence threshold
	// of updateMembers at the soonest, as of its last pass (zero: not
	// known). A batch only moves its member's threshold later, so the
	// passes before it may be skipped; recount clears it, and so does a
	// batch heard on a clock behind its member's last one.
	quietUntil time.Time
	// wokeAt is when this member last woke from a stall of its own (see
	// Core.Tick): no member's silence counts from before it towards a
	// reclaim, an eviction or death.
	wokeAt time.Time
	// minorityAt is the last pass of updateMembers that found this
	// member's side without a strict majority (fenced, or an exact half):
	// no member's silence counts from before it towards a reclaim
	// (reclaimSince).
	minorityAt time.Time
}

type eviction struct {
	slot crdt.Slot
	at   time.Time
}

func newMembership() membership { return membership{byPeer: make(map[string]*member)} }

// add inserts a member new to the table, in state m.state, and records it
// as a change. The caller recounts.
func (ms *membership) add(m *member) {
	ms.byPeer[m.peer] = m
	i, _ := slices.BinarySearchFunc(ms.order, m.peer, func(a *member, p string) int { return strings.Compare(a.peer, p) })
	ms.order = slices.Insert(ms.order, i, m)
	ms.changes = append(ms.changes, MemberChange{Peer: m.peer, Incarnation: m.inc, To: m.state, New: true})
	ms.touched = append(ms.touched, m)
}

// restart replaces m's incarnation by inc, alive at once: its gossip
// stream starts again. The caller recounts.
func (ms *membership) restart(m *member, inc uint64) {
	old := m.state
	m.inc, m.evicted, m.state = inc, false, Alive
	m.reset()
	m.heardUsMs = 0 // the new incarnation has echoed nothing yet
	ms.changes = append(ms.changes, MemberChange{Peer: m.peer, Incarnation: m.inc, From: old, To: Alive, New: true})
	ms.touched = append(ms.touched, m)
}

// set moves m to state s and records the change; it reports whether the
// state changed. The caller recounts.
func (ms *membership) set(m *member, s State) bool {
	if m.state == s {
		return false
	}
	ms.changes = append(ms.changes, MemberChange{Peer: m.peer, Incarnation: m.inc, From: m.state, To: s})
	m.state = s
	ms.touched = append(ms.touched, m)
	return true
}

// recount brings n, nAlive, rank, scale and fenced up to date with the
// states, self (peer ID) counted alive.
func (ms *membership) recount(self string, policy Policy) {
	ms.quietUntil = time.Time{}
	// order is sorted by peer: the members before self's place are the
	// ones that rank before it.
	before, _ := slices.BinarySearchFunc(ms.order, self, func(m *member, p string) int { return strings.Compare(m.peer, p) })
	alive, suspect, rank := 1, 0, 0
	for i, m := range ms.order {
		switch m.state {
		case Alive:
			alive++
		case Suspect:
			suspect++
		default:
			continue
		}
		if i < before {
			rank++
		}
	}
	ms.n, ms.nAlive, ms.rank = alive+suspect, alive, rank
	ms.scale = 1
	if policy == Strict && suspect > 0 {
		ms.scale = float64(alive) / float64(alive+suspect)
	}
	// Strict: a side that holds no majority of the members fences itself
	// (an exact half keeps the scale until evict_after).
	ms.fenced = policy == Strict && 2*alive < alive+suspect
}

// majority reports whether the alive members, self included, are a strict
// majority of the live ones; half, whether they are exactly half.
func (ms *membership) majority() bool { return 2*ms.nAlive > ms.n }
func (ms *membership) half() bool     { return 2*ms.nAlive == ms.n }

// fenceChange returns the change of fenced since the last call that
// returned one (initially: not fenced), or nil.
func (ms *membership) fenceChange() *FenceChange {
	if ms.fenced == ms.fenceSeen {
		return nil
	}
	ms.fenceSeen = ms.fenced
	return &FenceChange{Fenced: ms.fenced, Alive: ms.nAlive, Live: ms.n}
}

// reannounce keeps announcing our eviction of slot s, heard from at now:
// a member evicted during a partition longer than evictMemory learns of
// it when the partition heals.
func (ms *membership) reannounce(s crdt.Slot, now time.Time) {
	for i := range ms.evictions {
		if ms.evictions[i].slot == s {
			ms.evictions[i].at = now
			return
		}
	}
	ms.evictions = append(ms.evictions, eviction{slot: s, at: now})
}

// forgetEvictions stops announcing evictions older than evictMemory, and
// forgets announcements as old.
func (ms *membership) forgetEvictions(now time.Time) {
	kept := ms.evictions[:0]
	for _, e := range ms.evictions {
		if now.Sub(e.at) < evictMemory {
			kept = append(kept, e)
		}
	}
	ms.evictions = kept
	for s, by := range ms.announced {
		for peer, at := range by {
			if now.Sub(at) >= evictMemory {
				delete(by, peer)
			}
		}
		if len(by) == 0 {
			delete(ms.announced, s)
		}
	}
}

// liveByRank returns the live members in rank order (sorted by peer ID),
// nil at the rank of self (peer ID).
func (ms *membership) liveByRank(self string) []*member {
	out := make([]*member, 0, ms.n)
	placed := false
	for _, m := range ms.order {
		if !placed && m.peer > self {
			out, placed = append(out, nil), true
		}
		if m.live() {
			out = append(out, m)
		}
	}
	if !placed {
		out = append(out, nil)
	}
	return out
}

// recount brings the membership counts, the gate and the decisions'
// environment up to date.
func (c *Core) recount() {
	ms := &c.members
	ms.recount(c.self.Peer, c.cfg.Policy)
	c.regate()
	c.envBase = limiter.Env{Members: ms.n, Rank: ms.rank, Scale: ms.scale, AckDelay: 2 * c.cfg.SyncInterval}
}

// setState moves m to state s. A member heard again while fenced is noted
// for the rejoin (joinState.fence).
func (c *Core) setState(m *member, s State) {
	if m.state == s {
		return
	}
	if c.members.fenced && s == Alive {
		c.join.heard(m.peer)
	}
	c.members.set(m, s)
	c.recount()
}

// IsLive reports whether peer is a live member (alive or suspect, not
// evicted) in this member's view; this member itself is.
func (c *Core) IsLive(peer string) bool {
	if peer == c.self.Peer {
		return true
	}
	m := c.members.byPeer[peer]
	return m != nil && m.live() && !m.evicted
}

// Evict removes a silent member at once: its leases stop counting and,
// under the strict policy, it no longer holds capacity. If it comes back
// it learns it was evicted and takes a new incarnation.
func (c *Core) Evict(now time.Time, peer string) error {
	m := c.members.byPeer[peer]
	if m == nil {
		return unknownPeer(peer)
	}
	c.evict(now, m)
	return nil
}

func (c *Core) evict(now time.Time, m *member) {
	if m.evicted {
		return
	}
	m.evicted = true
	c.setState(m, Dead)
	c.members.evictions = append(c.members.evictions, eviction{slot: crdt.Slot{Peer: m.peer, Incarnation: m.inc}, at: now})
}

// noteEvicted records the evictions a batch of by (its authenticated
// author) announces and acts on those that enough members announce
// (docs/design.md, "Partitions and crashes"): one member's word evicts
// nobody and never makes us drop our leases, or a member could do so at
// will.
//
// Our own current slot: we take a new incarnation once the members that
// announce it are a strict majority of the others — the live members but
// us, and the announcers we no longer count live (a member we evicted
// ourselves, say across the same partition). A lone member of three
// announcing it is not enough; two of two others are, and so is one of
// one.
//
// Another member's current incarnation: we evict it too once its live
// announcers are a strict majority of the live members, self included.
// This member's own evidence needs no announcement: updateMembers
// reclaims a silent member by itself, by the same rule as everyone.
func (c *Core) noteEvicted(now time.Time, by *member, b *crdt.Batch) {
	if len(b.Evicted) == 0 {
		return
	}
	ms := &c.members
	for _, s := range b.Evicted {
		if s == c.self {
			ms.announce(s, by.peer, now)
			if c.agreed(now, s, true) {
				c.reincarnate(now)
			}
			continue
		}
		m := ms.byPeer[s.Peer]
		if m == nil || m.inc != s.Incarnation || m.evicted || m == by {
			continue // not a member we count: nothing to agree on
		}
		ms.announce(s, by.peer, now)
		if c.agreed(now, s, false) {
			c.evict(now, m)
		}
	}
}

// announce records that peer announced slot s evicted at now.
func (ms *membership) announce(s crdt.Slot, peer string, now time.Time) {
	if ms.announced == nil {
		ms.announced = make(map[crdt.Slot]map[string]time.Time)
	}
	by := ms.announced[s]
	if by == nil {
		by = make(map[string]time.Time)
		ms.announced[s] = by
	}
	by[peer] = now
}

// agreed reports whether enough members announced slot s evicted within
// evictMemory of now (see noteEvicted); self says s is our own slot.
func (c *Core) agreed(now time.Time, s crdt.Slot, self bool) bool {
	ms := &c.members
	k, others := 0, ms.n-1 // the live members but us
	for peer, at := range ms.announced[s] {
		m := ms.byPeer[peer]
		if m == nil || now.Sub(at) >= evictMemory {
			continue
		}
		live := m.live() && !m.evicted
		switch {
		case live:
			k++
		case self:
			k++
			others++
		}
	}
	if self {
		return 2*k > others
	}
	return 2*k > ms.n
}

// learnMembers takes a full state's member table as what it is, the
// sender's word: the peers it lists alive or suspect that this member has
// not heard are suggestions a joining member awaits (joinState.suggest),
// and the transport dials them. They never count in N, and nothing of
// them is kept once the member has joined: a member's existence,
// incarnation and state come only from batches it signed, or from this
// member's own observation (docs/design.md, "Trust model"). Before, every
// listed member counted in N at once, and 10 full states listing 1024
// invented members fenced their receiver for good.
func (c *Core) learnMembers(from string, es []crdt.MemberEntry) {
	if c.join.joined {
		return
	}
	for _, e := range es {
		if e.Peer == c.self.Peer || e.Peer == from || c.members.byPeer[e.Peer] != nil {
			continue
		}
		if e.State != crdt.MemberAlive && e.State != crdt.MemberSuspect {
			continue
		}
		if !c.join.suggest(from, e.Peer) {
			return // the sender's budget, or the table, is full
		}
	}
}

// maxKnown is how many known peers (CoreConfig.Known) a member seeds its
// table with: as many as a member table holds.
const maxKnown = crdt.MaxMembers

// seedKnown counts the peers this member saw as live members in an
// earlier run as suspect members, silent since now, under incarnation 0
// (their first batch replaces it at once): its own evidence, from before
// the restart. A member restarted on the minority side of a partition
// under strict hears only the minority, and without them would count the
// minority alone as the mesh and decide with it; with them it fences
// itself until it hears a majority of them. What it costs: a known peer
// that is gone for good (removed while this member was down) counts until
// a majority reclaims it (reclaim_after) — and a member that hears no
// majority of the peers it knew stays fenced until an operator evicts
// them (docs/design.md, "Restart without flags").
func (c *Core) seedKnown(now time.Time, peers []string) {
	added := 0
	for _, p := range peers {
		if added == maxKnown {
			break
		}
		if p == c.self.Peer || p == "" || c.members.byPeer[p] != nil {
			continue
		}
		m := &member{peer: p, state: Suspect, lastHeard: now, tag: crdt.PeerTag(p)}
		m.slot = c.intern(crdt.Slot{Peer: p}, m)
		c.members.add(m)
		added++
	}
	if added > 0 {
		c.recount()
	}
}

// updateMembers moves silent members on at now: suspect, dead, reclaimed
// or evicted, by the partition policy.
func (c *Core) updateMembers(now time.Time) {
	ms := &c.members
	if c.cfg.Policy == Strict && !ms.majority() {
		ms.minorityAt = now
	}
	if now.Before(ms.quietUntil) {
		return // no member can have crossed a threshold yet
	}
	changes := len(ms.changes)
	defer func() {
		if len(ms.changes) == changes {
			ms.quietUntil = c.nextSilence()
		}
	}()
	if c.cfg.Policy == Strict {
		// Every silent member turns suspect before any reclaim, so the
		// majority a reclaim needs counts only the members heard lately.
		// Ticks on time make a member suspect long before reclaim_after;
		// but after a stall of this member's own (a pause, a frozen VM)
		// every other one may be past reclaim_after at once, and counting
		// them alive until each is reclaimed let a lone member evict the
		// majority instead of fencing itself.
		for _, m := range ms.order {
			if m.state == Alive && now.Sub(m.lastHeard) >= c.cfg.SuspectAfter {
				c.setState(m, Suspect)
			}
		}
	}
	reclaim := c.cfg.reclaimAfter()
	// An exact half evicts every member silent past evict_after in one
	// pass: the first eviction makes it a majority, but one that has not
	// held for reclaim_after (reclaimSince).
	half := ms.half()
	for _, m := range ms.order {
		if m.state == Left || m.state == Dead {
			continue
		}
		silent := now.Sub(m.lastHeard)
		gone := now.Sub(ms.heardSince(m))
		switch {
		case c.cfg.Policy == Strict && now.Sub(ms.reclaimSince(m)) >= reclaim && ms.majority():
			c.reclaim(now, m)
		case c.cfg.Policy == Strict && gone >= c.cfg.EvictAfter && (half || ms.half()):
			c.evict(now, m)
		case c.cfg.Policy == Available && gone >= c.cfg.DeadAfter:
			c.setState(m, Dead)
		case silent >= c.cfg.SuspectAfter && m.state == Alive:
			c.setState(m, Suspect)
		}
	}
}

// heardSince returns when m's silence began as far as ending its
// membership goes: its last batch, or this member's wake from a stall of
// its own if that came later. A member that stalled cannot tell who fell
// silent meanwhile; the batches the others sent during the stall may
// arrive only once their streams to it restart, one member before
// another, and the first heard would otherwise make a majority that
// reclaims the rest at once.
func (ms *membership) heardSince(m *member) time.Time {
	if ms.wokeAt.After(m.lastHeard) {
		return ms.wokeAt
	}
	return m.lastHeard
}

// reclaimSince returns when m's silence began as far as a reclaim goes:
// heardSince, or the last time this member's side held no strict
// majority if that came later. A side that was fenced, or an exact half,
// reconnects with the members of the other side one stream after another
// when a partition heals; the first heard made a majority that reclaimed
// the rest at once, silent since the partition began (a healed 2 | 3
// split under strict evicted all five members within 60 ms, each taking
// a new incarnation). A reclaim needs a strict majority that has held for
// reclaim_after: time to reconnect with everyone still there.
func (ms *membership) reclaimSince(m *member) time.Time {
	since := ms.heardSince(m)
	if ms.minorityAt.After(since) {
		return ms.minorityAt
	}
	return since
}

// nextSilence returns when updateMembers can move a member on at the
// soonest, after a pass that moved none: the earliest time a member's
// silence reaches one of its thresholds. A threshold already reached gives
// a time not after now, so every pass runs while a member waits past one
// for its condition (a majority, half), as before.
func (c *Core) nextSilence() time.Time {
	reclaim := c.cfg.reclaimAfter()
	var next time.Time
	for _, m := range c.members.order {
		if m.state == Left || m.state == Dead {
			continue
		}
		at := func(from time.Time, after time.Duration) {
			if t := from.Add(after); next.IsZero() || t.Before(next) {
				next = t
			}
		}
		if m.state == Alive {
			at(m.lastHeard, c.cfg.SuspectAfter)
		}
		since := c.members.heardSince(m)
		if c.cfg.Policy == Strict {
			at(c.members.reclaimSince(m), reclaim)
			at(since, c.cfg.EvictAfter)
		} else {
			at(since, c.cfg.DeadAfter)
		}
	}
	return next
}

// reclaim evicts a silent member on the side of a strict majority. The
// member's side fenced itself before now (MeshConfig.ReclaimAfter), but it
// may have admitted its share of the current windows, unseen: those keep
// the scale of before (reclaimScale); later windows get the whole limit.
func (c *Core) reclaim(now time.Time, m *member) {
	c.reclaimScale.start(c.MeshMs(now), c.members.scale)
	c.evict(now, m)
}

// reclaimScale is the scale a reclaim keeps: windows that began before
// fromMs (mesh time; 0 when none is kept) keep the partition scale of
// before the reclaim, scale. The zero value keeps nothing.
type reclaimScale struct {
	fromMs int64
	scale  float64
}

// start keeps scale from nowMs on, or the scale already kept if lower.
func (h *reclaimScale) start(nowMs int64, scale float64) {
	if h.fromMs != 0 {
		scale = min(scale, h.scale)
	}
	h.fromMs, h.scale = nowMs, scale
}

// apply keeps the scale of before a reclaim for rule r's windows that
// began before it (a sliding window's previous one too): the reclaimed
// members may have admitted their share of those windows, unseen, before
// they fenced themselves. Windows that begin later get the whole limit.
func (h *reclaimScale) apply(r *limiter.Rule, env *limiter.Env) {
	if h.fromMs == 0 {
		return
	}
	start, ok := r.OldestWindowStart(env.NowMs)
	if !ok {
		return // leases: an evicted member's leases stop counting at once
	}
	if start < h.fromMs && h.scale < env.Scale {
		env.Scale = h.scale
	}
}

// end stops keeping the scale at nowMs once every window that began
// before the reclaim has ended, longestMs being the longest window of any
// rule.
func (h *reclaimScale) end(nowMs, longestMs int64) {
	if h.fromMs != 0 && nowMs >= h.fromMs+2*longestMs {
		h.fromMs, h.scale = 0, 0
	}
}

// Peers returns every member this member knows, itself included, sorted
// by peer ID.
func (c *Core) Peers(now time.Time) []PeerInfo {
	out := make([]PeerInfo, 0, len(c.members.order)+1)
	out = append(out, PeerInfo{Peer: c.self.Peer, Incarnation: c.self.Incarnation, State: Alive, RulesHash: c.rulesHash, RulesMatch: true, Self: true, Flags: announced})
	for _, m := range c.members.order {
		out = append(out, PeerInfo{
			Peer: m.peer, Incarnation: m.inc, State: m.state, LastSeen: now.Sub(m.lastHeard),
			RulesHash: m.rulesHash, RulesMatch: m.rulesHash == c.rulesHash,
			ClockOffset: time.Duration(m.clockMs) * time.Millisecond, ClockRoundTrip: m.clockRT,
			ClockOneWay: time.Duration(m.oneWayEstimate()) * time.Millisecond,
			Flags:       m.caps.flags(),
		})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Peer < out[j].Peer })
	return out
}
