package node

import (
	"cmp"
	"errors"
	"fmt"
	"time"

	"github.com/ratemesh/ratemesh/crdt"
	"github.com/ratemesh/ratemesh/limiter"
)

// Sentinel errors of the core.
var (
	ErrUnknownRule  = errors.New("node: unknown rule")
	ErrUnknownPeer  = errors.New("node: unknown peer")
	ErrUnknownLease = errors.New("node: unknown or expired lease")
	ErrClosed       = errors.New("node: closed")
)

// NotOwnerError is returned by Renew and Release for a lease another member
// owns; only the owner can renew or release it.
type NotOwnerError struct{ Owner string }

func (e *NotOwnerError) Error() string {
	return fmt.Sprintf("node: lease is owned by peer %s", e.Owner)
}

// Ready is what the core asks its owner to do. Every output of the core
// accumulates in one, and Core.Ready hands it over: the inputs that
// produce output (Tick, AntiEntropy, Flush, Leave) return nothing. The
// owner acts on its fields in order: publish Messages, send each Direct,
// and note the rest. The batches are shared by every recipient and must
// not be modified.
//
// Tick gathers the changes (Changes, NewIncarnation, Joined, Fence, Skew,
// Stale) and sets NextTick; between two Readies a later change of one
// kind replaces an earlier one, lists grow.
type Ready struct {
	// Messages are to be published to every member, in order.
	Messages []*crdt.Batch
	// Direct are batches for some peers alone, sent directly (the
	// anti-entropy stream): full states answering new connections
	// (AntiEntropy) and relays of this member's whole view answering the
	// peers that asked for one (crdt.FlagWant; Tick).
	Direct []Direct
	// Changes are membership transitions, as of the last Tick.
	Changes []MemberChange
	// NewIncarnation, when non-zero, is an incarnation the core switched
	// to (it learned it had been evicted); persist it durably.
	NewIncarnation uint64
	// Joined reports that the member became ready (at a Tick), and
	// JoinTimedOut that it did so because join_timeout passed without an
	// anti-entropy exchange.
	Joined, JoinTimedOut bool
	// Fence, when not nil, reports that the member fenced itself or that
	// its fence lifted since the last Tick (see Core.Fenced).
	Fence *FenceChange
	// Skew, when not nil, reports that the clock offset to the mesh went
	// beyond max_skew or came back within it since the last Tick.
	Skew *SkewChange
	// Stale, when not nil, reports that this member's view turned stale
	// or fresh again since the last Tick (see Core.Stale).
	Stale *StaleChange
	// Persist, when not nil, is what changed since the last Persist of
	// the attached Persister (Core.Persist): write it to the Store, then
	// report how that went with Core.Persisted.
	Persist *Flush
	// KeyBudget lists the peers whose entries reached their key budget
	// here (CoreConfig.MaxKeys), each at most once a minute while it
	// stays there: their entries for keys this member does not hold are
	// dropped until some of theirs expire. An honest peer never gets
	// here; log it loudly.
	KeyBudget []KeyBudgetChange
	// NextTick is when Tick next has timed work to do, as of the last
	// Tick; zero when no Tick ran since the last Ready. Tick at least
	// every SyncInterval all the same.
	NextTick time.Time
}

// Direct is batches for some peers alone: each peer in To gets all of
// Batches, in order.
type Direct struct {
	To      []string
	Batches []*crdt.Batch
}

// FenceChange is a change of the fence (Ready.Fence): Fenced tells whether
// it went up, Alive and Live are the alive and live members, self
// included, as of the change.
type FenceChange struct {
	Fenced      bool
	Alive, Live int
}

// KeyBudgetChange is a peer that reached its key budget (Ready.KeyBudget):
// Keys are held on its account, Budget is the most it may make.
type KeyBudgetChange struct {
	Peer         string
	Keys, Budget int
}

// SkewChange is a change of the clock skew (Ready.Skew): Exceeded tells
// whether the estimated offset to the mesh, Offset, is beyond max_skew.
type SkewChange struct {
	Exceeded bool
	Offset   time.Duration
}

// Stats counts what the core has done; every field only grows.
type Stats struct {
	BatchesSent, BatchesReceived uint64
	EntriesSent, EntriesMerged   uint64
	// RepairsSkipped counts window entries tagged as repairs of a batch
	// we had merged, which we skipped (crdt.Repair).
	RepairsSkipped uint64
	// Entries dropped: for a window already collected, for a window too
	// far ahead, for a rule this member does not have, or from a stale
	// incarnation's lease slot.
	DroppedExpired, DroppedFuture, DroppedUnknownRule, DroppedStale uint64
	// DroppedWindowLength counts window entries whose window length is
	// not their rule's here (or for a rule without windows), or that would
	// make a key hold more than crdt.MaxSeriesWindows.
	DroppedWindowLength uint64
	// DroppedKeyBudget counts entries for keys this member did not hold
	// from a peer at its key budget (Ready.KeyBudget).
	DroppedKeyBudget uint64
	// FutureHeld counts entries for a window beginning beyond max_skew
	// ahead of mesh time, held and merged once it comes within
	// (future.go); DroppedFuture those beyond what is held.
	FutureHeld uint64
	// RelayLowering counts relayed lease entries whose released count
	// was above this member's and was not taken: only a slot's author
	// lowers its live leases (Core.relayedLease).
	RelayLowering            uint64
	NacksSent, NacksReceived uint64
	// NacksAll counts nacks served by publishing every own value again:
	// of seq 0 (a receiver past its gap limit) or of a batch no longer
	// held. RepairEntriesSent counts window entries sent tagged as
	// repairs (crdt.Repair), EntriesSent included.
	NacksAll, RepairEntriesSent uint64
	WindowsCollected            uint64
	// KeysCollected counts keys dropped once none of their windows was
	// live any more (eviction of idle keys; see max_keys).
	KeysCollected uint64
	// Decisions by limiter.Reason; Shadowed counts denials turned into
	// admissions by shadow mode.
	Decisions [limiter.NumReasons]uint64
	Shadowed  uint64
	// Persistence (see Persister): flushes written, entries (window
	// records and leases) they carried, and flushes that failed.
	PersistFlushes, PersistEntries, PersistErrors uint64
	// ClockSamplesRejected counts clock samples (one-way and round
	// trips) refused as taken across a stall: their delay was far above
	// the peer's recent least (docs/design.md, "Mesh time").
	ClockSamplesRejected uint64
}

// Core is one member of the mesh as a pure state machine: requests, inbound
// batches (Step), new connections (AntiEntropy) and ticks go in with the
// time they happen at; everything it asks its owner to do accumulates in a
// Ready, which Ready hands over (HasReady tells whether there is one). It never reads a clock, starts a goroutine or performs I/O, so
// the simulator runs exactly the code production runs.
//
// Core holds the slots, the replicated counters (the container), the
// limiters that decide over them, and dispatches to its sub-states, each
// in a file of its own with its invariants: the member table
// (membership), the gossip it sends (outbox) and receives (inStream, in
// acks.go), mesh time (meshClock), joining (joinState) and the leases it
// owns (leaseTable).
//
// A Core is not safe for concurrent use: its owner serialises every call.
type Core struct {
	cfg       CoreConfig
	self      crdt.Slot
	selfID    crdt.SlotID
	slots     *crdt.SlotTable
	meta      []slotMeta // by SlotID: the member a slot belongs to
	c         *crdt.Container
	limiters  map[string]*limiter.Limiter
	rulesHash uint64
	lastRule  string           // the rule of the latest decision, and
	lastLim   *limiter.Limiter // its limiter; nil when SetRules replaced them

	members membership

	// deferring: StepMany is stepping, and mergeEntries defers the raises
	// of window entries to deferred instead of raising them
	// (core_fast.go).
	deferring bool
	deferred  []deferredRaise
	// lastTick is the time of the latest Tick: a gap of SuspectAfter or
	// more between two is a stall of this member's own (membership.wokeAt).
	lastTick time.Time
	touched  byte // the sum of what raiseDeferred's touches read: keeps them
	out      outbox
	clock    meshClock
	join     joinState
	leases   leaseTable
	// reclaimScale keeps the scale of before a reclaim for the windows
	// that began before it (membership.go).
	reclaimScale reclaimScale

	// unpub counts, per rule, the credits admitted since the last batch;
	// overBudget: one is past its publish budget (budget.go).
	unpub      map[*limiter.Limiter]*unpublished
	overBudget bool
	// stale: whether the members this one hears have acknowledged it
	// lately (stale.go).
	stale staleState
	// gated is !join.joined || members.fenced, or a stale view under
	// strict: the one test on the decision path.
	gated bool
	// envBase is the decisions' limiter.Env but for NowMs, kept by
	// recount (one copy per decision instead of building a five-field
	// struct, which the compiler cannot keep in registers).
	envBase limiter.Env

	// persister is the attached Persister, nil without one, and
	// persistDirty holds the windows of at least persistMinMs whose
	// values may have grown since its last export; nil without a
	// Persister (see notePersist).
	persister    *Persister
	persistDirty map[*crdt.Window]struct{}
	persistMinMs int64

	nextCollect time.Time
	// collectBehind: the last collection stopped at collectBudget with
	// keys due left, so every Tick collects until it catches up.
	collectBehind bool
	madeAtTick    uint64 // the container's Made at the last Tick
	// keyBudget is the most keys one peer's entries may make here
	// (keyBudget); atKeyBudget the peers at it, reported or to report,
	// and budgetReported when each peer was last reported.
	keyBudget      int
	atKeyBudget    []*member
	budgetReported map[*member]time.Time
	// future holds entries for windows ahead of max_skew (future.go).
	future futureHold
	newInc uint64 // an incarnation taken since the last Tick
	ready  Ready  // the outputs not handed over yet (Ready)
	closed bool
	stats  Stats
}

// NewCore returns a core for cfg that starts at now. Every rule is
// validated; the error names the rule and the field.
func NewCore(cfg CoreConfig, now time.Time) (*Core, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	c := &Core{
		cfg:         cfg,
		self:        crdt.Slot{Peer: cfg.Peer, Incarnation: cfg.Incarnation},
		slots:       crdt.NewSlotTable(),
		c:           crdt.NewContainer(),
		limiters:    make(map[string]*limiter.Limiter, len(cfg.Rules)),
		members:     newMembership(),
		out:         newOutbox(now, cfg.RepairInterval),
		clock:       newMeshClock(&cfg, now),
		join:        joinState{started: now, joined: !cfg.Join, everJoined: !cfg.Join},
		leases:      newLeaseTable(),
		nextCollect: now,
	}
	c.c.SetMaxKeys(cmp.Or(cfg.MaxKeys, DefaultMaxKeys))
	c.keyBudget = keyBudget(c.c.MaxKeys())
	c.recount() // alone: n 1, rank 0, scale 1
	c.selfID = c.intern(c.self, nil)
	c.seedKnown(now, cfg.Known)
	rules := make([]limiter.Rule, len(cfg.Rules))
	for i, r := range cfg.Rules {
		l, err := limiter.New(r, c.c, c.selfID) // draws stratified mesh-wide: see limiter.Limiter.draw
		if err != nil {
			return nil, err
		}
		c.limiters[r.Name] = l
		rules[i] = *l.Rule()
	}
	c.rulesHash = limiter.HashRules(rules)
	return c, nil
}

func (c *Core) intern(s crdt.Slot, m *member) crdt.SlotID {
	id := c.slots.Intern(s)
	for int(id) >= len(c.meta) {
		c.meta = append(c.meta, slotMeta{})
	}
	if c.meta[id].inc == 0 || (c.meta[id].m == nil && m != nil && s.Peer != c.self.Peer) {
		// A slot first seen without its member (restored from disk, or in
		// a full state) belongs to the member once it appears.
		c.meta[id] = slotMeta{m: m, inc: s.Incarnation}
	}
	return id
}

// Self returns this member's current slot.
func (c *Core) Self() crdt.Slot { return c.self }

// RulesHash returns the hash of this member's rules.
func (c *Core) RulesHash() uint64 { return c.rulesHash }

// Joined reports whether the member has joined and serves decisions.
func (c *Core) Joined() bool { return c.join.joined }

// HasReady reports whether the core holds output its owner has not taken
// yet (Ready).
func (c *Core) HasReady() bool {
	rd := &c.ready
	return len(rd.Messages) > 0 || len(rd.Direct) > 0 || len(rd.Changes) > 0 ||
		rd.NewIncarnation != 0 || rd.Joined || rd.JoinTimedOut || rd.Fence != nil || rd.Skew != nil ||
		rd.Stale != nil || rd.Persist != nil || len(rd.KeyBudget) > 0 || !rd.NextTick.IsZero()
}

// Ready hands over every output gathered since the last Ready, and forgets
// it: the one way out of the core. The owner acts on all of it (see the
// type Ready); the zero Ready when there is none.
func (c *Core) Ready() Ready {
	rd := c.ready
	c.ready = Ready{}
	return rd
}

// gather appends more to the list a of not yet handed over outputs,
// taking more itself when a is empty.
func gather[T any](a, more []T) []T {
	if len(a) == 0 {
		return more
	}
	return append(a, more...)
}

// Fenced reports whether the member denies every decision because, under
// the strict policy, its side of a partition holds no majority of the
// members (see MeshConfig.ReclaimAfter).
func (c *Core) Fenced() bool { return c.members.fenced }

// Stats returns a copy of the counters.
func (c *Core) Stats() Stats {
	s := c.stats
	s.ClockSamplesRejected = c.clock.rejected
	return s
}

// Members returns N, the live members (alive and suspect, self included),
// and the partition scale applied to every limit.
func (c *Core) Members() (n int, scale float64) { return c.members.n, c.members.scale }

// MeshMs returns the mesh time at the member's local time now: its clock
// corrected by its estimated offset to the mesh (uncorrected under
// CoreConfig.LocalClock).
func (c *Core) MeshMs(now time.Time) int64 { return c.clock.meshMs(now) }

// Offset returns the member's estimated clock offset to the mesh.
func (c *Core) Offset() time.Duration { return c.clock.offset() }

// Container exposes the replicated counters, read-only by contract.
func (c *Core) Container() *crdt.Container { return c.c }

// Step merges one batch received from a peer at now. The caller (the
// transport) has authenticated b.From as the batch's author; entries of
// other slots are only ever in full-state batches whose values the
// transport has verified. Step never fails on content it can ignore; it
// returns an error only for a batch that claims this member's own peer ID.
// Step is shorthand for StepReceived(now, now, b).
func (c *Core) Step(now time.Time, b *crdt.Batch) error {
	return c.StepReceived(now, now, b)
}

// StepReceived is Step for a batch that arrived at received, before now:
// a runtime that queues batches stamps their arrival at its edge, so the
// time a batch waited in its queue is not taken for delay on the path
// (mesh time's samples use received; everything else now). A zero
// received, or one after now, means now.
func (c *Core) StepReceived(now, received time.Time, b *crdt.Batch) error {
	if c.closed {
		return ErrClosed
	}
	if b.From.Peer == c.self.Peer {
		if b.From.Incarnation > c.self.Incarnation {
			return fmt.Errorf("node: a batch claims this peer ID %s with a newer incarnation %d (ours %d): two processes share one identity", b.From.Peer, b.From.Incarnation, c.self.Incarnation)
		}
		return nil // our own echo, or our own older incarnation
	}
	c.stats.BatchesReceived++
	full := b.Has(crdt.FlagFull)
	m := c.members.byPeer[b.From.Peer]
	switch {
	case m == nil:
		m = &member{peer: b.From.Peer, inc: b.From.Incarnation, state: Alive, tag: crdt.PeerTag(b.From.Peer)}
		m.slot = c.intern(b.From, m)
		c.members.add(m)
		c.recount()
	case b.From.Incarnation < m.inc:
		// A late batch of a replaced incarnation: its window counts are
		// still real usage; its leases and membership are not.
		c.mergeEntries(now, b, false, nil, m)
		return nil
	case b.From.Incarnation > m.inc:
		// A restart: the new incarnation replaces the old one at once; the
		// old slot's lease counts stop counting, its window counts go on.
		c.members.restart(m, b.From.Incarnation)
		m.slot = c.intern(b.From, m)
		c.recount()
	}
	if !c.join.joined && c.join.heardFrom(m.peer) {
		c.regate()
	}
	if full && b.Has(crdt.FlagWant) {
		// Asked for our whole view: joining, restarting, or fenced (an
		// evicted member too: it needs the state to serve again).
		c.join.want(m.peer)
	}
	if m.evicted {
		// We evicted this incarnation; its counts still count, but it is
		// not a member again until it takes a new incarnation (it learns
		// of the eviction from our batches, which announce it as long as
		// it is heard).
		c.members.reannounce(crdt.Slot{Peer: m.peer, Incarnation: m.inc}, now)
		c.mergeEntries(now, b, false, nil, m)
		c.noteEvicted(now, m, b)
		return nil
	}
	if now.Before(m.lastHeard) {
		c.members.quietUntil = time.Time{} // its threshold moved earlier
	}
	m.lastHeard = now
	m.rulesHash = b.RulesHash
	if received.IsZero() || received.After(now) {
		received = now
	}
	c.clock.step(received, m, b)
	if b.Has(crdt.FlagLeaving) {
		c.setState(m, Left)
	} else if m.state != Alive && m.state != Left {
		// A left incarnation never comes back (a restart takes a new one):
		// a batch of it arriving after its leave is late or a duplicate.
		c.setState(m, Alive)
	}
	if full {
		m.fullState(b.Seq)
	} else {
		m.track(b)
	}
	m.acked(b.Ack)
	for _, nk := range b.Nacks {
		if nk.Slot.Is(c.self) {
			c.nacked(nk.Seq, m.slot)
		}
	}
	c.noteEvicted(now, m, b)
	if full {
		c.learnMembers(m.peer, b.Members)
	}
	if c.mergeEntries(now, b, true, m, m) > 0 || len(b.Windows)+len(b.Leases) > 0 {
		c.out.needAck = true
	}
	if full && b.Has(crdt.FlagLast) && b.Has(crdt.FlagRelay) {
		// Only a relay: a peer of a release that never relays (before
		// 92bf997) costs a joiner its join_timeout, since its plain full
		// state lacks the dead slots and the joiner's own earlier
		// incarnation's last values (TestJoinerWaitsForARelay).
		c.join.relayed(m.peer)
		c.regate()
	}
	c.noteFence(now)
	return nil
}

// reincarnate switches to a new slot after learning of our own eviction:
// our old slot's window counts go on counting; its leases are dropped.
func (c *Core) reincarnate(now time.Time) {
	inc := NextIncarnation(c.self.Incarnation, now)
	c.self = crdt.Slot{Peer: c.self.Peer, Incarnation: inc}
	c.selfID = c.intern(c.self, nil)
	for _, l := range c.limiters {
		l.SetSelf(c.selfID)
		l.Set().Each(func(s *crdt.Series) {
			for _, w := range s.Windows() {
				w.Acked = 0
			}
			if s.HasLeases() {
				s.Leases().Acked = 0
			}
		})
	}
	c.leases.byID = make(map[string]*lease)
	c.out.reset()
	c.newInc = inc
}

// mergeEntries merges a batch's entries and returns how many raised a
// value. Lease entries are merged only when leases is true. from, when not
// nil, is the sender's member, current with the batch's incarnation: its
// slot is the one the sender's own entries resolve to, and entries tagged
// as repairs of its batches that we merged are skipped (crdt.Repair). by
// is the sender, current or not: the keys its entries make are charged to
// it (keyBudget).
func (c *Core) mergeEntries(now time.Time, b *crdt.Batch, leases bool, from, by *member) int {
	nowMs := c.MeshMs(now)
	skewMs := c.cfg.MaxSkew.Milliseconds()
	raised := 0
	var lastRule string
	var set *crdt.RuleSet
	var windowMs int64 // set's rule's window length
	var sc slotCache
	if from != nil && from.inc == b.From.Incarnation {
		sc = slotCache{from: from.slot, fromOK: true}
	} else {
		from = nil
	}
	// The batch's fresh entries and then each repair group (crdt.Repair)
	// form segments: seg is the one entry i is in (-1: the fresh part),
	// end the entry after it, skip whether we skip it, whole whether
	// every entry of it merged so far, and allWhole whether every
	// segment merged did so whole.
	seg, end, skip, whole, allWhole := -1, len(b.Windows), false, true, true
	if len(b.Repairs) > 0 {
		end = b.Fresh()
	}
	closeSeg := func() {
		if skip {
			return
		}
		allWhole = allWhole && whole
		if seg >= 0 && whole && from != nil {
			from.fill(b.Repairs[seg].Seq)
		}
	}
	for i := range b.Windows {
		if i == end {
			closeSeg()
			seg++
			end += int(b.Repairs[seg].N)
			whole = true
			skip = from != nil && from.merged(b.Repairs[seg].Seq)
			if skip {
				c.stats.RepairsSkipped += uint64(b.Repairs[seg].N)
			}
		}
		if skip {
			continue
		}
		e := &b.Windows[i]
		if e.Rule != lastRule || set == nil {
			lastRule, set = e.Rule, nil
			if l := c.lookupLimiter(e.Rule); l != nil {
				set, windowMs = l.Set(), l.Rule().WindowMs()
			}
		}
		if set == nil {
			c.stats.DroppedUnknownRule++
			whole = false
			continue
		}
		if e.WindowMs != windowMs {
			// Not a window of the rule here (a member whose rule has
			// another window, or none): no decision would read it, and
			// a member inventing lengths would make windows without
			// bound for one key.
			c.stats.DroppedWindowLength++
			whole = false
			continue
		}
		if nowMs >= (e.Window+2)*e.WindowMs {
			c.stats.DroppedExpired++
			continue
		}
		id := c.slotOf(b, e.Slot, &sc)
		if id == c.selfID {
			continue // our own values come only from us
		}
		if e.Window*e.WindowMs > nowMs+skewMs {
			if !c.holdFuture(nowMs, e, id, by) {
				c.stats.DroppedFuture++
				whole = false
			}
			continue
		}
		w := c.windowFor(set, e.Key, e.WindowMs, e.Window, by)
		if w == nil {
			whole = false
			continue
		}
		if c.deferring {
			c.deferred = append(c.deferred, deferredRaise{w: w, id: id, adm: e.Admitted, att: e.Attempted})
			continue
		}
		if w.Raise(id, e.Admitted, e.Attempted) {
			raised++
			c.notePersist(w)
		}
	}
	closeSeg()
	if from != nil && !allWhole && !b.Has(crdt.FlagFull) {
		from.partial(b.Seq)
	}
	for i := range b.Leases {
		e := &b.Leases[i]
		l := c.limiters[e.Rule]
		if l == nil {
			c.stats.DroppedUnknownRule++
			continue
		}
		if !leases {
			c.stats.DroppedStale++
			continue
		}
		id := c.slotOf(b, e.Slot, &sc)
		if id == c.selfID {
			continue
		}
		se := c.seriesFor(l.Set(), e.Key, by)
		if se == nil {
			continue
		}
		ls := se.EnsureLeases()
		acq, rel := e.Acquired, e.Released
		if id != c.slotOf(b, 0, &sc) {
			acq, rel = c.relayedLease(&ls.PNCounter, id, acq, rel)
		}
		if ls.Raise(id, acq, rel) {
			raised++
		}
	}
	c.stats.EntriesMerged += uint64(raised)
	return raised
}

// relayedLease returns what a relayed lease entry (acquired, released)
// of slot id may raise ls to. Merge takes each half's maximum, and for a
// PN pair a higher released count is a lower live count: a relay that
// could raise it could make every receiver forget another member's live
// leases. So only the slot's author lowers its count (its gossip, its own
// full state); a relay's released count is never taken, and its acquired
// count only up to what keeps the slot's live count at the relay's
// (acquired − released, which Validate keeps non-negative and the
// plausibility check bounds). An honest relay thus shows a joiner the
// slot's true live count; any relay can only raise it.
func (c *Core) relayedLease(ls *crdt.PNCounter, id crdt.SlotID, acq, rel uint64) (uint64, uint64) {
	have := ls.N.Get(id)
	if rel > have {
		c.stats.RelayLowering++
	}
	if most := have + (acq - rel); acq > most {
		acq = most
	}
	return acq, have
}

func (c *Core) entrySlot(b *crdt.Batch, i uint32) crdt.SlotID {
	if i == 0 {
		if m := c.members.byPeer[b.From.Peer]; m != nil && m.inc == b.From.Incarnation {
			return m.slot
		}
	}
	s := b.SlotOf(i)
	if id, ok := c.slots.Lookup(s); ok {
		return id
	}
	return c.intern(s, c.members.byPeer[s.Peer])
}

// Tick advances timers to now — membership states, acknowledgements, lease
// expiry, the clock offset, the join timeout, garbage collection — and
// adds to the Ready everything the core has for its owner: the batches
// due, the relays asked for since the last Tick, the changes, and
// NextTick. Call it at least every SyncInterval, and at Ready.NextTick.
// After Leave it sets NextTick alone.
func (c *Core) Tick(now time.Time) {
	rd := &c.ready
	if c.closed {
		rd.NextTick = c.out.nextSync
		return
	}
	if !c.lastTick.IsZero() && now.Sub(c.lastTick) >= c.cfg.SuspectAfter {
		// This member stalled (a pause, a frozen VM, SIGSTOP): Ticks come
		// at least every SyncInterval, far below SuspectAfter, when it runs.
		c.members.wokeAt = now
		c.members.quietUntil = time.Time{}
	}
	c.lastTick = now
	c.updateMembers(now)
	c.noteFence(now)
	c.clock.tick(now, c.members.order)
	c.mergeFuture(c.MeshMs(now))
	c.out.acked(ackFrontier(c.members.order), c.MeshMs(now))
	c.restale(now)
	c.expireLeases(now)
	if c.join.tick(now, c.cfg.JoinTimeout) {
		c.regate()
	}
	if c.reclaimScale.fromMs != 0 {
		c.reclaimScale.end(c.MeshMs(now), c.longestWindowMs())
	}
	if !now.Before(c.out.nextSync) {
		c.out.nextSync = now.Add(c.cfg.SyncInterval)
		rd.Messages = gather(rd.Messages, c.flush(now, 0))
	}
	made := c.c.Made()
	if due := !now.Before(c.nextCollect); due || c.collectBehind {
		keys := c.keyCount()
		dropped, more := c.c.CollectSome(c.MeshMs(now), collectBudget+int(made-c.madeAtTick))
		c.stats.WindowsCollected += uint64(dropped)
		c.stats.KeysCollected += uint64(keys - c.keyCount())
		c.collectBehind = more
		if due {
			c.nextCollect = now.Add(c.collectEvery())
			c.members.forgetEvictions(now)
		}
	}
	c.madeAtTick = made
	if len(c.join.wants) > 0 {
		rd.Direct = gather(rd.Direct, c.relay(now, c.join.wants))
		c.join.wants = nil
	}
	rd.Changes, c.members.changes = gather(rd.Changes, c.members.changes), nil
	if c.newInc != 0 {
		rd.NewIncarnation, c.newInc = c.newInc, 0
	}
	rd.Joined, rd.JoinTimedOut = rd.Joined || c.join.became, rd.JoinTimedOut || c.join.timedOut
	c.join.became, c.join.timedOut = false, false
	if c.join.everJoined {
		// A member joining for the first time answers joining; a fence
		// meanwhile (members it knew from an earlier run not heard yet)
		// is reported once it has joined, if it holds.
		if f := c.members.fenceChange(); f != nil {
			rd.Fence = f
		}
	}
	if sk := c.clock.skewChange(); sk != nil {
		rd.Skew = sk
	}
	if st := c.staleChange(); st != nil {
		rd.Stale = st
	}
	rd.KeyBudget = c.keyBudgetChanges(now, rd.KeyBudget)
	rd.NextTick = c.out.nextSync
}

// collectBudget bounds the keys one Tick's collection looks at, so the
// lock a runtime holds around Tick is held briefly even when a million
// keys expire in the same second. A collection that stops there leaves
// the rest to the next Tick, every SyncInterval (20 ms by default), until
// none is due. Each Tick may look at collectBudget keys plus as many as
// the member made since the last Tick, a fraction of the time it took to
// make them: looking at a key that expired takes about 0.3 µs, making one
// (a decision or a merge of a key not held) over 1 µs
// (BenchmarkTickHoldingKeys, BenchmarkCoreAllow). So collection keeps up
// with keys made at any rate R: the R·T/2 keys due at a collection every
// T/2 (T the shortest window) are looked at by the T/2 ÷ SyncInterval
// Ticks until the next, which may look at 8192·T/(2·SyncInterval) +
// R·T/2. With nothing made, 8192 keys take 2-3 ms a Tick, 410,000 keys a
// second: a million that expire at once are gone in 2.5 s.
const collectBudget = 8192

// collectEvery is how often Tick starts a collection: every half of the
// shortest window, at most a second and at least SyncInterval apart, so a
// window goes soon after it expires.
func (c *Core) collectEvery() time.Duration {
	every := time.Second
	for _, l := range c.limiters {
		if w := l.Rule().Window / 2; w > 0 && w < every {
			every = w
		}
	}
	return max(every, c.cfg.SyncInterval)
}

// longestWindowMs returns the longest window of any rule.
func (c *Core) longestWindowMs() int64 {
	var longest int64
	for _, l := range c.limiters {
		longest = max(longest, l.Rule().WindowMs())
	}
	return longest
}

// AntiEntropy adds to the Ready what this member sends a peer on every new
// connection, for each of peers: a Direct carrying its full state,
// batches flagged FlagFull with every live window value of its own slots
// (the current incarnation's and earlier ones': a member evicted during a
// partition has taken a new incarnation by the time it reconnects), the
// lease counts of its current slot, its member table and the slots it
// evicted; the last is flagged FlagLast. The member table goes only to
// peers whose batches announced that they decode it (caps.table): the
// others, and peers not heard from yet, get a second Direct without it. While joining or fenced it also
// sets FlagWant: the peer answers with a relay of its whole view (see
// relay), which is what readiness waits for. The batches take no sequence
// number and are meant for those peers alone.
func (c *Core) AntiEntropy(now time.Time, peers ...string) {
	if len(peers) == 0 {
		return
	}
	flags := crdt.FlagFull
	if !c.join.joined || c.members.fenced {
		flags |= crdt.FlagWant
		if c.join.asked == nil {
			c.join.asked = make(map[string]bool)
		}
		for _, p := range peers {
			c.join.asked[p] = true
		}
	}
	c.ready.Direct = gather(c.ready.Direct, c.directs(peers, func(table bool) []*crdt.Batch { return c.fullState(now, flags, false, table) }))
}

// relay returns the answer to the peers that asked for this member's whole
// view (FlagWant): like AntiEntropy's full state, plus every live value
// this member holds of other slots — other members', dead and left
// members', earlier incarnations' windows, and the lease counts of live
// slots — flagged FlagRelay. Merge is per-slot max, so a relayed value can
// only raise what the receiver knows, never let it admit more. The peers
// asked in a full state, which announced their capabilities, so each
// gets the member table if it decodes one.
func (c *Core) relay(now time.Time, peers []string) []Direct {
	return c.directs(peers, func(table bool) []*crdt.Batch { return c.fullState(now, crdt.FlagFull|crdt.FlagRelay, true, table) })
}

// direct returns bs for peers, counted as sent to each of them.
func (c *Core) direct(peers []string, bs []*crdt.Batch) Direct {
	k := uint64(len(peers))
	for _, b := range bs {
		c.stats.EntriesSent += k * uint64(len(b.Windows)+len(b.Leases))
	}
	c.stats.BatchesSent += k * uint64(len(bs))
	return Direct{To: peers, Batches: bs}
}

// Leave adds the final batches of a graceful leave to the Ready's
// Messages: own pending changes and the leave announcement. The core
// serves nothing afterwards; a second Leave adds nothing.
func (c *Core) Leave(now time.Time) {
	if c.closed {
		return
	}
	c.ready.Messages = gather(c.ready.Messages, c.flush(now, crdt.FlagLeaving))
	c.closed = true
}
