package node

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
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

const (
	batchEntries = 2000    // entries per published batch; well under crdt.MaxBatchBytes
	ringCap      = 1 << 14 // published batches awaiting acknowledgement
	maxGaps      = 64      // missing seqs tracked per member before asking for everything
	// nackRepeats is how many consecutive batches of ours nack one gap.
	// Our acknowledgement watermark passes a gap at once (the nack says
	// what it excludes), so a nack lost on its way would leave the gap
	// acknowledged and its entries missing here for good; three copies
	// make that a cube of the loss rate. The author serves the first copy
	// and ignores the others (Core.nacked).
	nackRepeats = 3
	// nackedMemory is how many recently nacked seqs of ours we remember,
	// to tell a repeated nack from one of a batch we no longer hold.
	nackedMemory = 256
	evictMemory  = time.Minute
)

// Ready is what a Tick asks the caller to do.
type Ready struct {
	// Messages are to be published to every member, in order.
	Messages []*crdt.Batch
	// Changes are membership transitions since the last Tick.
	Changes []MemberChange
	// NewIncarnation, when non-zero, is an incarnation the core switched
	// to (it learned it had been evicted); persist it durably.
	NewIncarnation uint64
	// Joined reports that the member became ready this Tick, and
	// JoinTimedOut that it did so because join_timeout passed without an
	// anti-entropy exchange.
	Joined, JoinTimedOut bool
	// Relays are the peers that asked for this member's whole view
	// (crdt.FlagWant): send each RelayState, directly.
	Relays []string
}

// Stats counts what the core has done; every field only grows.
type Stats struct {
	BatchesSent, BatchesReceived uint64
	EntriesSent, EntriesMerged   uint64
	// Entries dropped: for a window already collected, for a window too
	// far ahead, for a rule this member does not have, or from a stale
	// incarnation's lease slot.
	DroppedExpired, DroppedFuture, DroppedUnknownRule, DroppedStale uint64
	NacksSent, NacksReceived                                        uint64
	WindowsCollected                                                uint64
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
}

type sentWin struct {
	w *crdt.Window
	v uint64
}

type sentLease struct {
	s *crdt.Series
	v int64
}

type sentBatch struct {
	seq    uint64
	sent   int64
	wins   []sentWin
	leases []sentLease
	nacked bool
}

type lease struct {
	id      string
	rule    string
	key     string
	expires time.Time
}

// Core is one member of the mesh as a pure state machine: requests, inbound
// batches and ticks go in with the time they happen at; batches to publish
// and membership changes come out of Tick. It never reads a clock, starts a
// goroutine or performs I/O, so the simulator runs exactly the code
// production runs.
//
// A Core is not safe for concurrent use: its owner serialises every call.
type Core struct {
	cfg       CoreConfig
	self      crdt.Slot
	selfID    crdt.SlotID
	slots     *crdt.SlotTable
	meta      []slotMeta
	c         *crdt.Container
	limiters  map[string]*limiter.Limiter
	rulesHash uint64

	members map[string]*member
	order   []*member // sorted by peer: deterministic iteration
	n       int       // live members, self included
	nAlive  int       // alive members, self included (n − nAlive are suspect)
	rank    int       // self's place among the n live members, by peer
	scale   float64   // partition scale of every limit
	// envBase is the decisions' limiter.Env but for NowMs, kept by
	// recount (one copy per decision instead of building a five-field
	// struct, which the compiler cannot keep in registers).
	envBase limiter.Env

	seq       uint64
	ring      []sentBatch
	repairWin map[*crdt.Window]struct{}
	repairLs  map[*crdt.Series]struct{}
	resendAll bool
	// persistDirty holds the windows of at least persistMinMs whose
	// values may have grown since the attached Persister's last export;
	// nil without a Persister (see notePersist).
	persistDirty map[*crdt.Window]struct{}
	persistMinMs int64
	// nackedSeqs are the latest seqs of ours served a nack (oldest
	// first, at most nackedMemory), so their repeats are ignored.
	nackedSeqs []uint64
	needAck    bool
	lastAck    int64 // the Ack of the last gossip batch we sent
	offsetMs   int64
	samples    []int64
	selfTag    uint32    // crdt.PeerTag of our peer ID: echoes of our clock carry it
	echoQ      []*member // members owing an echo, in the order they came to owe it
	echoOK     bool      // every live member has announced crdt.FlagEcho

	lastRule string           // the rule of the latest decision, and
	lastLim  *limiter.Limiter // its limiter; nil when SetRules replaced them

	started time.Time
	joined  bool
	// fenced: under Strict, this member's side holds no majority of the
	// members (recount); it denies with limiter.ReasonFenced.
	fenced bool
	// gated is !joined || fenced: the one test on the decision path.
	gated bool
	// A reclaim's hold (see applyHold): windows that began before
	// holdFromMs (mesh time; 0 when no hold is on) keep holdScale.
	holdFromMs int64
	holdScale  float64
	stateFrom  map[string]bool // joining: peers whose full state has arrived
	expecting  map[string]bool // joining: connected peers whose full state is awaited
	// healed, while fenced: members heard again, and whether their full
	// state has arrived since (see rejoin).
	healed map[string]bool
	// wasFenced is fenced as of the last recount, to see the fence lift.
	wasFenced bool
	// wants are the peers whose full state asked for a relay (FlagWant),
	// in the order they asked, until the next Ready.
	wants        []string
	lastSent     time.Time
	nextSync     time.Time
	nextRepair   time.Time
	nextCollect  time.Time
	nextOffset   time.Time
	leases       map[string]*lease
	leaseSeq     uint64
	evictions    []eviction
	changes      []MemberChange
	newInc       uint64
	becameJoined bool
	timedOut     bool
	closed       bool
	stats        Stats
}

type eviction struct {
	slot crdt.Slot
	at   time.Time
}

// NewCore returns a core for cfg that starts at now. Every rule is
// validated; the error names the rule and the field.
func NewCore(cfg CoreConfig, now time.Time) (*Core, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	c := &Core{
		cfg:       cfg,
		self:      crdt.Slot{Peer: cfg.Peer, Incarnation: cfg.Incarnation},
		slots:     crdt.NewSlotTable(),
		c:         crdt.NewContainer(),
		limiters:  make(map[string]*limiter.Limiter, len(cfg.Rules)),
		members:   make(map[string]*member),
		repairWin: make(map[*crdt.Window]struct{}),
		repairLs:  make(map[*crdt.Series]struct{}),
		leases:    make(map[string]*lease),
		started:   now,
		joined:    !cfg.Join,
		gated:     cfg.Join,
		selfTag:   crdt.PeerTag(cfg.Peer),
	}
	c.recount() // alone: n 1, rank 0, scale 1
	c.selfID = c.intern(c.self, nil)
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
	c.nextSync, c.nextRepair = now, now.Add(cfg.RepairInterval)
	c.nextCollect, c.nextOffset = now, now
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

// Ready reports whether the member has joined and serves decisions.
func (c *Core) Ready() bool { return c.joined }

// Alive returns how many members, self included, are alive, and how many
// are live (alive or suspect).
func (c *Core) Alive() (alive, live int) { return c.nAlive, c.n }

// Fenced reports whether the member denies every decision because, under
// the strict policy, its side of a partition holds no majority of the
// members (see CoreConfig.ReclaimAfter).
func (c *Core) Fenced() bool { return c.fenced }

// Stats returns a copy of the counters.
func (c *Core) Stats() Stats { return c.stats }

// Members returns N, the live members (alive and suspect, self included),
// and the partition scale applied to every limit.
func (c *Core) Members() (n int, scale float64) { return c.n, c.scale }

// MeshMs returns the mesh time at the member's local time now: its clock
// corrected by its estimated offset to the mesh (uncorrected under
// CoreConfig.LocalClock).
func (c *Core) MeshMs(now time.Time) int64 {
	if c.cfg.LocalClock {
		return now.UnixMilli()
	}
	return now.UnixMilli() + c.offsetMs
}

// Offset returns the member's estimated clock offset to the mesh.
func (c *Core) Offset() time.Duration { return time.Duration(c.offsetMs) * time.Millisecond }

// Container exposes the replicated counters, read-only by contract.
func (c *Core) Container() *crdt.Container { return c.c }

// Rule returns the normalised rule called name.
func (c *Core) Rule(name string) (*limiter.Rule, bool) {
	l, ok := c.limiters[name]
	if !ok {
		return nil, false
	}
	return l.Rule(), true
}

// RuleNames returns the rule names, sorted.
func (c *Core) RuleNames() []string {
	names := make([]string, 0, len(c.limiters))
	for n := range c.limiters {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

func (c *Core) env(now time.Time) limiter.Env {
	e := c.envBase
	e.NowMs = c.MeshMs(now)
	return e
}

func (c *Core) limiter(rule string) (*limiter.Limiter, error) {
	// Requests mostly name the rule of the request before: compare the
	// name before hashing it (SetRules clears the cache).
	if c.lastLim != nil && rule == c.lastRule {
		return c.lastLim, nil
	}
	l, ok := c.limiters[rule]
	if !ok {
		return nil, unknownRule(rule)
	}
	c.lastRule, c.lastLim = rule, l
	return l, nil
}

// Allow decides one request at now and, unless it is a peek, counts it.
// A denial is a Decision with Allowed false; an error means a bad request
// (unknown rule, bad key, cost, class or type).
func (c *Core) Allow(now time.Time, rule, key string, req limiter.Request) (limiter.Decision, error) {
	var d limiter.Decision
	err := c.allowInto(&d, now, rule, key, &req)
	return d, err
}

// allowInto is Allow writing into *d, with req by pointer: the runtime's
// hot path (see limiter.Limiter.AllowInto).
func (c *Core) allowInto(d *limiter.Decision, now time.Time, rule, key string, req *limiter.Request) error {
	l, err := c.limiter(rule)
	if err != nil {
		*d = limiter.Decision{}
		return err
	}
	env := c.env(now)
	if c.gated {
		ch, err := l.Resolve(key, *req)
		if err != nil {
			*d = limiter.Decision{}
			return err
		}
		*d = c.gate(l, ch, now, env)
		return nil
	}
	if c.holdFromMs != 0 {
		c.applyHold(l, &env)
	}
	// Limiter.AllowInto resolves, decides and records in one pass,
	// finding the key's window once.
	if err := l.AllowInto(d, key, req, &env); err != nil {
		return err
	}
	c.count(d)
	return nil
}

func (c *Core) count(d *limiter.Decision) {
	c.stats.Decisions[d.Reason]++
	if d.Shadow {
		c.stats.Shadowed++
	}
}

// gate is the denial of a member that is joining or fenced: joining
// members retry once join_timeout has passed at the latest; fenced ones
// after a heartbeat, within which a healed partition shows.
func (c *Core) gate(l *limiter.Limiter, ch limiter.Check, now time.Time, env limiter.Env) limiter.Decision {
	d := l.Rule().Decide(ch.Limit, 0, limiter.Usage{}, env, 0)
	d.Allowed, d.Shadow, d.Remaining = false, false, 0
	if !c.joined {
		d.Reason = limiter.ReasonJoining
		d.RetryAfter = max(c.cfg.JoinTimeout-now.Sub(c.started), time.Millisecond)
	} else {
		d.Reason = limiter.ReasonFenced
		d.RetryAfter = c.cfg.Heartbeat
	}
	d.RetryAfter = (d.RetryAfter + time.Millisecond - 1) / time.Millisecond * time.Millisecond
	c.count(&d)
	return d
}

// applyHold keeps the partition scale of before a reclaim for the rule's
// windows that began before it (a sliding window's previous one too): the
// reclaimed members may have admitted their share of those windows,
// unseen, before they fenced themselves. Windows that begin later get the
// whole limit.
func (c *Core) applyHold(l *limiter.Limiter, env *limiter.Env) {
	r := l.Rule()
	wms := r.WindowMs()
	if wms <= 0 {
		return // concurrency: an evicted member's leases stop counting at once
	}
	start := env.NowMs / wms * wms
	if r.Algorithm == limiter.SlidingWindow {
		start -= wms
	}
	if start < c.holdFromMs && c.holdScale < env.Scale {
		env.Scale = c.holdScale
	}
}

// Check is one (rule, key, request) of an AllowAll.
type Check struct {
	Rule    string
	Key     string
	Request limiter.Request
	err     error // an option NewCheck refused; AllowAll reports it
}

// AllowAll decides several checks as one: it admits only if every check
// passes, and consumes nothing when any fails (the attempts still count as
// demand). The decisions come back in the order of checks.
func (c *Core) AllowAll(now time.Time, checks []Check) (allowed bool, ds []limiter.Decision, err error) {
	return c.allowAll(now, checks, nil)
}

// allowAll is AllowAll; with counted set it decides held checks again,
// counted[i] the window check i's attempt counts in (see
// limiter.Limiter.RecordRetry), and counts only admissions in the stats.
func (c *Core) allowAll(now time.Time, checks []Check, counted []int64) (allowed bool, ds []limiter.Decision, err error) {
	ls := make([]*limiter.Limiter, len(checks))
	chs := make([]limiter.Check, len(checks))
	for i, ck := range checks {
		if ls[i], err = c.limiter(ck.Rule); err != nil {
			return false, nil, &CheckError{Index: i, Err: err}
		}
		if chs[i], err = ls[i].Resolve(ck.Key, ck.Request); err != nil {
			return false, nil, &CheckError{Index: i, Err: err}
		}
	}
	env := c.env(now)
	ds = make([]limiter.Decision, len(checks))
	allowed = true
	for i := range checks {
		if c.gated {
			ds[i] = c.gate(ls[i], chs[i], now, env)
		} else {
			e := env
			if c.holdFromMs != 0 {
				c.applyHold(ls[i], &e)
			}
			ds[i] = ls[i].Decide(chs[i], e)
			if counted == nil {
				c.count(&ds[i])
			}
		}
		allowed = allowed && ds[i].Allowed
	}
	if c.gated {
		return false, ds, nil
	}
	for i := range checks {
		switch {
		case ds[i].Reason == limiter.ReasonKeyCap:
		case counted == nil:
			ls[i].Record(chs[i], allowed, env.NowMs)
		default:
			counted[i] = ls[i].RecordRetry(chs[i], allowed, env.NowMs, counted[i])
			if allowed {
				c.count(&ds[i])
			}
		}
		if !allowed && ds[i].Allowed {
			// It would have passed alone; as part of the whole it did not.
			ds[i].Allowed = false
			ds[i].Remaining = min(ds[i].Remaining+chs[i].Cost, ds[i].Limit)
		}
	}
	return allowed, ds, nil
}

// Earliest returns how long from now until the request could first be
// admitted as far as this member can tell (0 if now), or limiter.Never.
// Wait sleeps this long between attempts.
func (c *Core) Earliest(now time.Time, rule, key string, req limiter.Request) (time.Duration, error) {
	l, err := c.limiter(rule)
	if err != nil {
		return 0, err
	}
	ch, err := l.Resolve(key, req)
	if err != nil {
		return 0, err
	}
	if !c.joined {
		return max(c.cfg.JoinTimeout-now.Sub(c.started), 0), nil
	}
	if c.fenced {
		return c.cfg.Heartbeat, nil
	}
	env := c.env(now)
	if c.holdFromMs != 0 {
		c.applyHold(l, &env)
	}
	return l.Earliest(ch, env), nil
}

// Lease is a concurrency slot held by this member for a client.
type Lease struct {
	ID      string
	Rule    string
	Key     string
	Expires time.Time
}

// Acquire admits one more concurrent lease of (rule, key) iff the merged
// live leases plus the projection stay within the limit, and returns the
// lease, owned by this member, expiring after the rule's lease_ttl unless
// renewed.
func (c *Core) Acquire(now time.Time, rule, key, class string) (Lease, limiter.Decision, error) {
	l, err := c.limiter(rule)
	if err != nil {
		return Lease{}, limiter.Decision{}, err
	}
	ch, err := l.ResolveLease(key, class)
	if err != nil {
		return Lease{}, limiter.Decision{}, err
	}
	env := c.env(now)
	if c.gated {
		return Lease{}, c.gate(l, ch, now, env), nil
	}
	d := l.DecideLease(ch, env, c.liveSlot)
	c.count(&d)
	if !d.Allowed {
		return Lease{}, d, nil
	}
	l.RecordLease(key, 1)
	c.leaseSeq++
	ls := &lease{
		id:      c.self.Peer + "~" + strconv.FormatUint(c.self.Incarnation, 36) + "~" + strconv.FormatUint(c.leaseSeq, 36),
		rule:    rule,
		key:     key,
		expires: now.Add(l.Rule().LeaseTTL),
	}
	c.leases[ls.id] = ls
	return Lease{ID: ls.id, Rule: rule, Key: key, Expires: ls.expires}, d, nil
}

func (c *Core) ownLease(now time.Time, id string) (*lease, error) {
	if ls, ok := c.leases[id]; ok {
		if now.Before(ls.expires) {
			return ls, nil
		}
		c.release(ls)
		return nil, ErrUnknownLease
	}
	if owner, _, ok := strings.Cut(id, "~"); ok && owner != c.self.Peer && owner != "" {
		return nil, &NotOwnerError{Owner: owner}
	}
	return nil, ErrUnknownLease
}

// Renew extends a lease this member owns by the rule's lease_ttl from now
// and returns the TTL.
func (c *Core) Renew(now time.Time, id string) (time.Duration, error) {
	ls, err := c.ownLease(now, id)
	if err != nil {
		return 0, err
	}
	ttl := c.limiters[ls.rule].Rule().LeaseTTL
	ls.expires = now.Add(ttl)
	return ttl, nil
}

// Release ends a lease this member owns.
func (c *Core) Release(now time.Time, id string) error {
	ls, err := c.ownLease(now, id)
	if err != nil {
		return err
	}
	c.release(ls)
	return nil
}

func (c *Core) release(ls *lease) {
	delete(c.leases, ls.id)
	if l := c.limiters[ls.rule]; l != nil {
		l.RecordLease(ls.key, -1)
	}
}

// Leases returns the leases this member owns, sorted by ID.
func (c *Core) Leases() []Lease {
	out := make([]Lease, 0, len(c.leases))
	for _, ls := range c.leases {
		out = append(out, Lease{ID: ls.id, Rule: ls.rule, Key: ls.key, Expires: ls.expires})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// liveSlot reports whether a slot's lease counts still count: our current
// incarnation, or a live member's current incarnation.
func (c *Core) liveSlot(id crdt.SlotID) bool {
	m := c.meta[id]
	if m.m == nil {
		return m.inc == c.self.Incarnation
	}
	return m.m.inc == m.inc && m.m.live()
}

// SlotUsage is one slot's counts in a UsageReport.
type SlotUsage struct {
	Peer        string
	Incarnation uint64
	Admitted    uint64 // admitted credits, or held leases
	Attempted   uint64 // attempted credits, or acquired leases
}

// UsageReport is what this member knows of one key.
type UsageReport struct {
	Rule, Key string
	// Window is the current window's index and WindowMs its length (0
	// for concurrency; a token bucket's epoch).
	Window, WindowMs int64
	// QuotaMs is the period the limit applies to: WindowMs, or a token
	// bucket's time to fill from empty (max/refill × interval).
	QuotaMs int64
	// Total is the merged admitted credits of the current window, or the
	// live leases.
	Total uint64
	Slots []SlotUsage
}

// Usage reports the merged usage of (rule, key) at now.
func (c *Core) Usage(now time.Time, rule, key string) (UsageReport, error) {
	l, err := c.limiter(rule)
	if err != nil {
		return UsageReport{}, err
	}
	r := l.Rule()
	rep := UsageReport{Rule: rule, Key: key, WindowMs: r.WindowMs(), QuotaMs: r.QuotaMs()}
	s := l.Set().Series(key)
	if r.Algorithm == limiter.Concurrency {
		if s != nil {
			rep.Total = uint64(s.Leases.ValueWhere(c.liveSlot))
			s.Leases.P.Each(func(id crdt.SlotID, p uint64) {
				if !c.liveSlot(id) {
					return
				}
				sl := c.slots.Slot(id)
				n := s.Leases.N.Get(id)
				rep.Slots = append(rep.Slots, SlotUsage{Peer: sl.Peer, Incarnation: sl.Incarnation, Admitted: p - min(n, p), Attempted: p})
			})
		}
	} else {
		nowMs := c.MeshMs(now)
		rep.Window = nowMs / rep.WindowMs
		if s != nil {
			if w := s.Window(rep.WindowMs, rep.Window); w != nil {
				rep.Total = w.Admitted.Value()
				w.Attempted.Each(func(id crdt.SlotID, att uint64) {
					sl := c.slots.Slot(id)
					rep.Slots = append(rep.Slots, SlotUsage{Peer: sl.Peer, Incarnation: sl.Incarnation, Admitted: w.Admitted.Get(id), Attempted: att})
				})
			}
		}
	}
	sort.Slice(rep.Slots, func(i, j int) bool {
		a, b := rep.Slots[i], rep.Slots[j]
		return a.Peer < b.Peer || (a.Peer == b.Peer && a.Incarnation < b.Incarnation)
	})
	return rep, nil
}

// Peers returns every member this member knows, itself included, sorted
// by peer ID.
func (c *Core) Peers(now time.Time) []PeerInfo {
	out := make([]PeerInfo, 0, len(c.order)+1)
	out = append(out, PeerInfo{Peer: c.self.Peer, Incarnation: c.self.Incarnation, State: Alive, RulesHash: c.rulesHash, RulesMatch: true, Self: true})
	for _, m := range c.order {
		out = append(out, PeerInfo{
			Peer: m.peer, Incarnation: m.inc, State: m.state, LastSeen: now.Sub(m.lastHeard),
			RulesHash: m.rulesHash, RulesMatch: m.rulesHash == c.rulesHash,
			ClockOffset: time.Duration(m.clockMs) * time.Millisecond, ClockRoundTrip: m.clockRT,
			ClockOneWay: time.Duration(m.oneWayMs) * time.Millisecond,
		})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Peer < out[j].Peer })
	return out
}

// Evict removes a silent member at once: its leases stop counting and,
// under the strict policy, it no longer holds capacity. If it comes back
// it learns it was evicted and takes a new incarnation.
func (c *Core) Evict(now time.Time, peer string) error {
	m := c.members[peer]
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
	c.evictions = append(c.evictions, eviction{slot: crdt.Slot{Peer: m.peer, Incarnation: m.inc}, at: now})
}

func (c *Core) setState(m *member, s State) {
	if m.state == s {
		return
	}
	if c.fenced && s == Alive {
		if c.healed == nil {
			c.healed = make(map[string]bool)
		}
		c.healed[m.peer] = false
	}
	c.changes = append(c.changes, MemberChange{Peer: m.peer, Incarnation: m.inc, From: m.state, To: s})
	m.state = s
	c.recount()
}

// recount brings c.n, c.rank and c.scale up to date with the membership.
func (c *Core) recount() {
	// c.order is sorted by peer: the members before self's place are the
	// ones that rank before it.
	before, _ := slices.BinarySearchFunc(c.order, c.self.Peer, func(m *member, p string) int { return strings.Compare(m.peer, p) })
	alive, suspect, rank := 1, 0, 0
	for i, m := range c.order {
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
	c.n, c.nAlive, c.rank = alive+suspect, alive, rank
	c.scale = 1
	if c.cfg.Policy == Strict && suspect > 0 {
		c.scale = float64(alive) / float64(alive+suspect)
	}
	// Strict: a side that holds no majority of the members fences itself
	// (an exact half keeps the scale until evict_after).
	c.fenced = c.cfg.Policy == Strict && 2*alive < alive+suspect
	c.gated = !c.joined || c.fenced
	c.envBase = limiter.Env{Members: c.n, Rank: c.rank, Scale: c.scale, AckDelay: 2 * c.cfg.SyncInterval}
}

// Step merges one batch received from a peer at now. The caller (the
// transport) has authenticated b.From as the batch's author; entries of
// other slots are only ever in full-state batches whose values the
// transport has verified. Step never fails on content it can ignore; it
// returns an error only for a batch that claims this member's own peer ID.
func (c *Core) Step(now time.Time, b *crdt.Batch) error {
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
	m := c.members[b.From.Peer]
	switch {
	case m == nil:
		m = &member{peer: b.From.Peer, inc: b.From.Incarnation, state: Alive, tag: crdt.PeerTag(b.From.Peer)}
		m.slot = c.intern(b.From, m)
		c.members[m.peer] = m
		i, _ := slices.BinarySearchFunc(c.order, m.peer, func(a *member, p string) int { return strings.Compare(a.peer, p) })
		c.order = slices.Insert(c.order, i, m)
		c.changes = append(c.changes, MemberChange{Peer: m.peer, Incarnation: m.inc, To: Alive, New: true})
		c.recount()
	case b.From.Incarnation < m.inc:
		// A late batch of a replaced incarnation: its window counts are
		// still real usage; its leases and membership are not.
		c.mergeEntries(now, b, false)
		return nil
	case b.From.Incarnation > m.inc:
		// A restart: the new incarnation replaces the old one at once; the
		// old slot's lease counts stop counting, its window counts go on.
		old := m.state
		m.inc, m.slot = b.From.Incarnation, c.intern(b.From, m)
		m.evicted, m.lastSeq, m.seqKnown, m.heardSent, m.entrySent, m.ackW, m.gaps = false, 0, false, 0, 0, 0, m.gaps[:0]
		m.state = Alive
		c.changes = append(c.changes, MemberChange{Peer: m.peer, Incarnation: m.inc, From: old, To: Alive, New: true})
		c.recount()
	}
	if full && b.Has(crdt.FlagWant) && !slices.Contains(c.wants, m.peer) {
		// Asked for our whole view: joining, restarting, or fenced (an
		// evicted member too: it needs the state to serve again).
		c.wants = append(c.wants, m.peer)
	}
	if m.evicted {
		// We evicted this incarnation; its counts still count, but it is
		// not a member again until it takes a new incarnation (it learns
		// of the eviction from our batches).
		c.mergeEntries(now, b, false)
		c.noteEvicted(now, b)
		return nil
	}
	m.lastHeard = now
	m.rulesHash = b.RulesHash
	c.stepClock(now, m, b)
	if b.Has(crdt.FlagLeaving) {
		c.setState(m, Left)
	} else if m.state != Alive && m.state != Left {
		// A left incarnation never comes back (a restart takes a new one):
		// a batch of it arriving after its leave is late or a duplicate.
		c.setState(m, Alive)
	}
	if !full {
		c.track(m, b)
	} else if !m.seqKnown {
		// A full state carries everything up to its Seq: a later gap in
		// the gossip sequence is a lost batch to nack.
		m.lastSeq, m.seqKnown = b.Seq, true
	}
	if b.Ack > m.ackW {
		m.ackW = b.Ack
	}
	for _, nk := range b.Nacks {
		if nk.Slot == c.self {
			c.nacked(nk.Seq)
		}
	}
	c.noteEvicted(now, b)
	if full {
		c.learnMembers(now, m.peer, b.Members)
	}
	if c.mergeEntries(now, b, true) > 0 || len(b.Windows)+len(b.Leases) > 0 {
		c.needAck = true
	}
	if full && b.Has(crdt.FlagLast) && b.Has(crdt.FlagRelay) {
		if _, ok := c.healed[m.peer]; ok {
			c.healed[m.peer] = true
		}
		if !c.joined {
			c.stateArrived(m.peer)
		}
	}
	c.noteFence(now)
	return nil
}

// noteFence follows the fence: a fence that lifted makes the member rejoin,
// a new one starts recording the members heard again.
func (c *Core) noteFence(now time.Time) {
	switch {
	case c.wasFenced && !c.fenced:
		c.rejoin(now)
	case c.fenced && !c.wasFenced:
		c.healed = nil
	}
	c.wasFenced = c.fenced
}

// rejoin follows the lifting of a fence (the partition healed): the
// members heard again hold usage this member has not merged yet — the
// other side's partition-time admissions arrive with their full states,
// and a heartbeat may come first — so the member serves again only once
// the full state of each of them has arrived, as a joiner does, or
// join_timeout passes.
func (c *Core) rejoin(now time.Time) {
	healed := c.healed
	c.healed = nil
	for peer, arrived := range healed {
		if arrived || c.members[peer] == nil || c.members[peer].state != Alive {
			continue
		}
		if c.joined {
			c.joined, c.gated, c.started = false, true, now
		}
		c.ExpectState(peer)
	}
}

// ExpectState tells a joining member that a connection to peer is up, so
// peer's full state is on its way (the runtime answers every connection
// with its full state): the member stays joining until the full state of
// every peer it expects has arrived, not only the first, so a joiner
// connected to several members does not decide on one member's view.
// join_timeout still bounds the wait. After joining it does nothing.
func (c *Core) ExpectState(peer string) {
	if c.joined || peer == c.self.Peer || c.stateFrom[peer] {
		return
	}
	if c.expecting == nil {
		c.expecting = make(map[string]bool)
	}
	c.expecting[peer] = true
}

// stateArrived records a peer's complete full state while joining, and
// joins once no expected full state is outstanding.
func (c *Core) stateArrived(peer string) {
	if c.stateFrom == nil {
		c.stateFrom = make(map[string]bool)
	}
	c.stateFrom[peer] = true
	delete(c.expecting, peer)
	if len(c.expecting) == 0 {
		c.joined, c.becameJoined = true, true
		c.stateFrom, c.expecting = nil, nil
		c.gated = c.fenced
	}
}

// track follows a member's gossip sequence: gaps become nacks, and the
// latest Sent time feeds our acknowledgement watermark.
func (c *Core) track(m *member, b *crdt.Batch) {
	switch {
	case !m.seqKnown || b.Seq == m.lastSeq+1:
	case b.Seq > m.lastSeq+1:
		for s := m.lastSeq + 1; s < b.Seq; s++ {
			if len(m.gaps) >= maxGaps {
				m.gaps = append(m.gaps[:0], gap{}) // seq 0: send everything again
				break
			}
			m.gaps = append(m.gaps, gap{seq: s})
		}
	default: // a late or duplicate batch may fill a gap
		if i := slices.IndexFunc(m.gaps, func(g gap) bool { return g.seq == b.Seq }); i >= 0 {
			m.gaps = slices.Delete(m.gaps, i, i+1)
		}
	}
	m.lastSeq, m.seqKnown = max(m.lastSeq, b.Seq), true
	m.heardSent = max(m.heardSent, b.Sent)
	if len(b.Windows)+len(b.Leases) > 0 {
		m.entrySent = max(m.entrySent, b.Sent)
	}
}

func (c *Core) noteEvicted(now time.Time, b *crdt.Batch) {
	for _, s := range b.Evicted {
		if s == c.self {
			c.reincarnate(now)
			continue
		}
		if m := c.members[s.Peer]; m != nil && m.inc == s.Incarnation && !m.evicted {
			c.evict(now, m)
		}
	}
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
			for _, w := range s.Windows {
				w.Acked = 0
			}
			s.LeasesAcked = 0
		})
	}
	c.leases = make(map[string]*lease)
	c.ring = c.ring[:0]
	c.nackedSeqs = c.nackedSeqs[:0]
	c.seq = 0
	c.newInc = inc
}

// nacked handles a peer's report that it missed our batch seq: that batch's
// entries are published again and never count as acknowledged through it.
func (c *Core) nacked(seq uint64) {
	i, ok := slices.BinarySearchFunc(c.ring, seq, func(sb sentBatch, s uint64) int { return cmpU64(sb.seq, s) })
	if seq != 0 && (ok && c.ring[i].nacked || !ok && slices.Contains(c.nackedSeqs, seq)) {
		return // a repeat (nackRepeats) of a nack already served
	}
	c.stats.NacksReceived++
	if seq == 0 || !ok {
		c.resendAll = true
		return
	}
	if len(c.nackedSeqs) >= nackedMemory {
		c.nackedSeqs = append(c.nackedSeqs[:0], c.nackedSeqs[1:]...)
	}
	c.nackedSeqs = append(c.nackedSeqs, seq)
	sb := &c.ring[i]
	sb.nacked = true
	for _, sw := range sb.wins {
		c.c.MarkDirty(sw.w)
	}
	for _, sl := range sb.leases {
		c.c.MarkLeasesDirty(sl.s)
	}
}

func cmpU64(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// mergeEntries merges a batch's entries and returns how many raised a
// value. Lease entries are merged only when leases is true.
func (c *Core) mergeEntries(now time.Time, b *crdt.Batch, leases bool) int {
	nowMs := c.MeshMs(now)
	skewMs := c.cfg.MaxSkew.Milliseconds()
	raised := 0
	var lastRule string
	var set *crdt.RuleSet
	var sc slotCache
	for i := range b.Windows {
		e := &b.Windows[i]
		if e.Rule != lastRule || set == nil {
			lastRule, set = e.Rule, nil
			if l := c.limiters[e.Rule]; l != nil {
				set = l.Set()
			}
		}
		if set == nil {
			c.stats.DroppedUnknownRule++
			continue
		}
		switch {
		case nowMs >= (e.Window+2)*e.WindowMs:
			c.stats.DroppedExpired++
			continue
		case e.Window*e.WindowMs > nowMs+skewMs:
			c.stats.DroppedFuture++
			continue
		}
		id := c.slotOf(b, e.Slot, &sc)
		if id == c.selfID {
			continue // our own values come only from us
		}
		w := set.Ensure(e.Key).EnsureWindow(e.WindowMs, e.Window)
		if w.Raise(id, e.Admitted, e.Attempted) {
			raised++
			c.notePersist(w)
		}
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
		if l.Set().Ensure(e.Key).Leases.Raise(id, e.Acquired, e.Released) {
			raised++
		}
	}
	c.stats.EntriesMerged += uint64(raised)
	return raised
}

func (c *Core) entrySlot(b *crdt.Batch, i uint32) crdt.SlotID {
	if i == 0 {
		if m := c.members[b.From.Peer]; m != nil && m.inc == b.From.Incarnation {
			return m.slot
		}
	}
	s := b.SlotOf(i)
	if id, ok := c.slots.Lookup(s); ok {
		return id
	}
	var m *member
	if mm := c.members[s.Peer]; mm != nil {
		m = mm
	}
	return c.intern(s, m)
}

// Tick advances timers to now: membership states, acknowledgements, lease
// expiry, the clock offset, garbage collection, and the batches due. Call
// it at least every SyncInterval.
func (c *Core) Tick(now time.Time) Ready {
	var rd Ready
	if c.closed {
		return rd
	}
	c.updateMembers(now)
	c.noteFence(now)
	if !now.Before(c.nextOffset) {
		c.updateOffset()
		c.nextOffset = now.Add(c.cfg.Heartbeat)
	}
	c.applyAcks()
	c.expireLeases(now)
	if !c.joined && now.Sub(c.started) >= c.cfg.JoinTimeout {
		c.joined, c.becameJoined, c.timedOut = true, true, true
		c.stateFrom, c.expecting = nil, nil
		c.gated = c.fenced
	}
	if c.holdFromMs != 0 {
		c.endHold(c.MeshMs(now))
	}
	if !now.Before(c.nextSync) {
		c.nextSync = now.Add(c.cfg.SyncInterval)
		rd.Messages = c.flush(now, 0)
	}
	if !now.Before(c.nextCollect) {
		keys := c.keysHeld()
		c.stats.WindowsCollected += uint64(c.c.Collect(c.MeshMs(now)))
		c.stats.KeysCollected += uint64(keys - c.keysHeld())
		c.nextCollect = now.Add(c.collectEvery())
		c.forgetEvictions(now)
	}
	rd.Changes, c.changes = c.changes, nil
	rd.NewIncarnation, c.newInc = c.newInc, 0
	rd.Joined, rd.JoinTimedOut = c.becameJoined, c.timedOut
	rd.Relays, c.wants = c.wants, nil
	c.becameJoined, c.timedOut = false, false
	return rd
}

// NextTick returns when Tick next has timed work to do.
func (c *Core) NextTick() time.Time { return c.nextSync }

func (c *Core) collectEvery() time.Duration {
	every := time.Second
	for _, l := range c.limiters {
		if w := l.Rule().Window / 2; w > 0 && w < every {
			every = w
		}
	}
	return max(every, c.cfg.SyncInterval)
}

func (c *Core) updateMembers(now time.Time) {
	if c.cfg.Policy == Strict {
		// Every silent member turns suspect before any reclaim, so the
		// majority a reclaim needs counts only the members heard lately.
		// Ticks on time make a member suspect long before reclaim_after;
		// but after a stall of this member's own (a pause, a frozen VM)
		// every other one may be past reclaim_after at once, and counting
		// them alive until each is reclaimed let a lone member evict the
		// majority instead of fencing itself.
		for _, m := range c.order {
			if m.state == Alive && now.Sub(m.lastHeard) >= c.cfg.SuspectAfter {
				c.setState(m, Suspect)
			}
		}
	}
	reclaim := c.cfg.reclaimAfter()
	for _, m := range c.order {
		if m.state == Left || m.state == Dead {
			continue
		}
		silent := now.Sub(m.lastHeard)
		switch {
		case c.cfg.Policy == Strict && silent >= reclaim && c.majority():
			c.reclaim(now, m)
		case c.cfg.Policy == Strict && silent >= c.cfg.EvictAfter && c.half():
			c.evict(now, m)
		case c.cfg.Policy == Available && silent >= c.cfg.DeadAfter:
			c.setState(m, Dead)
		case silent >= c.cfg.SuspectAfter && m.state == Alive:
			c.setState(m, Suspect)
		}
	}
}

// majority reports whether the alive members, self included, are a strict
// majority of the live ones; half, whether they are exactly half.
func (c *Core) majority() bool { return 2*c.nAlive > c.n }
func (c *Core) half() bool     { return 2*c.nAlive == c.n }

// reclaim evicts a silent member on the side of a strict majority. The
// member's side fenced itself before now (CoreConfig.ReclaimAfter), but it
// may have admitted its share of the current windows, unseen: those keep
// the scale of before (applyHold); later windows get the whole limit.
func (c *Core) reclaim(now time.Time, m *member) {
	scale := c.scale
	if c.holdFromMs != 0 {
		scale = min(scale, c.holdScale)
	}
	c.holdFromMs, c.holdScale = c.MeshMs(now), scale
	c.evict(now, m)
}

// endHold ends a reclaim's hold once every rule's windows that began
// before it have ended.
func (c *Core) endHold(nowMs int64) {
	var longest int64
	for _, l := range c.limiters {
		longest = max(longest, l.Rule().WindowMs())
	}
	if nowMs >= c.holdFromMs+2*longest {
		c.holdFromMs, c.holdScale = 0, 0
	}
}

// clockEpochMs is the epoch of the members' clock estimates: one
// heartbeat, so every epoch holds a sample even from idle members, and a
// peer's clock stepping back shows within two heartbeats.
func (c *Core) clockEpochMs() int64 { return max(c.cfg.Heartbeat.Milliseconds(), 1) }

// stepClock takes the clock readings of b, from m, received at now: a
// one-way sample of b's Clock, a round trip if b echoes our clock, and the
// echo we owe m in return.
func (c *Core) stepClock(now time.Time, m *member, b *crdt.Batch) {
	nowMs, epochMs := now.UnixMilli(), c.clockEpochMs()
	m.clockSample(b.Clock-nowMs, nowMs, epochMs)
	m.echoes = b.Has(crdt.FlagEcho)
	if !m.echoes {
		c.echoOK = false // at once; updateOffset sets it again
	}
	for _, e := range b.Echoes {
		if e.Peer == c.selfTag {
			// t1 = our Clock it echoes, t2 = when it arrived, t3 = b.Clock.
			m.rtSample(b.Clock-e.Ago, b.Clock-int64(e.Held), b.Clock, nowMs, epochMs)
			break
		}
	}
	if m.noteEcho(b.Clock, nowMs, epochMs) && !m.echoQueued {
		c.echoQ = append(c.echoQ, m)
		m.echoQueued = true
	}
}

// echoesPerBatch is how many peers' clocks one batch echoes at most. A
// batch is broadcast, so it cannot echo every peer of a big mesh. One echo
// (about 10 bytes) per batch gives every peer of a ten-node mesh several
// round trips a heartbeat at a 20 ms sync interval, and in a mesh of a
// thousand one every 1000 of our batches, which the forward delay learned
// from the last round trip bridges (member.estimate). Four per batch kept
// the nodes' mesh clocks no closer (within 2 ms in clock-skew either way)
// and cost an idle 60-node mesh (hermes-60) 58 % more bytes than no
// echoes, against 17 % for one.
const echoesPerBatch = 1

// takeEchoes returns the echoes for the batch we send at our raw time
// nowMs: the members that have owed one longest first, so echoes rotate
// over every member heard since its last echo (and not echoed in the
// last 1/echoesPerEpoch of an epoch). It returns none while any
// live member has not announced crdt.FlagEcho (a peer of an older version
// refuses a batch carrying echoes); every member then measures one-way.
func (c *Core) takeEchoes(nowMs int64) []crdt.Echo {
	if len(c.echoQ) == 0 || !c.echoOK {
		return nil
	}
	var out []crdt.Echo
	i := 0
	for ; i < len(c.echoQ) && len(out) < echoesPerBatch; i++ {
		m := c.echoQ[i]
		pending := m.echoPending
		m.echoQueued, m.echoPending = false, false
		held, ago := nowMs-m.echoAt, nowMs-m.echoClock
		if !pending || !m.live() || m.evicted || held < 0 || held > crdt.MaxEchoHeldMs ||
			m.echoClock < -crdt.MaxValue || m.echoClock > crdt.MaxValue || ago < -crdt.MaxValue || ago > crdt.MaxValue {
			continue
		}
		out = append(out, crdt.Echo{Peer: m.tag, Ago: ago, Held: uint32(held)})
		m.echoedAt, m.hasEchoed = nowMs, true
	}
	n := copy(c.echoQ, c.echoQ[i:])
	clear(c.echoQ[n:])
	c.echoQ = c.echoQ[:n]
	return out
}

// updateOffset estimates the clock offset to the mesh: the median of the
// live members' raw clock offsets and our own (0), so every member
// converges on the mesh's median clock. It also notes whether every live
// member understands echoes.
func (c *Core) updateOffset() {
	c.samples = append(c.samples[:0], 0)
	c.echoOK = true
	for _, m := range c.order {
		if m.live() && m.hasClock {
			c.samples = append(c.samples, m.clockMs)
		}
		if m.live() && !m.evicted && !m.echoes {
			c.echoOK = false
		}
	}
	slices.Sort(c.samples)
	n := len(c.samples)
	if n%2 == 1 {
		c.offsetMs = c.samples[n/2]
	} else {
		c.offsetMs = (c.samples[n/2-1] + c.samples[n/2]) / 2
	}
}

// SkewExceeded reports whether the estimated offset to the mesh is beyond
// max_skew.
func (c *Core) SkewExceeded() bool {
	return time.Duration(abs(c.offsetMs))*time.Millisecond > c.cfg.MaxSkew
}

func abs(x int64) int64 {
	if x < 0 {
		return -x
	}
	return x
}

// ackFrontier returns the mesh time up to which every alive member has
// acknowledged our batches; with no alive member, everything is.
func (c *Core) ackFrontier() int64 {
	f := int64(math.MaxInt64)
	for _, m := range c.order {
		if m.state == Alive && m.ackW < f {
			f = m.ackW
		}
	}
	return f
}

// watermark is our acknowledgement: every alive member's gossip merged up
// to this mesh time (0, nothing, when we have heard none).
func (c *Core) watermark() int64 {
	w := int64(math.MaxInt64)
	for _, m := range c.order {
		if m.state == Alive && m.heardSent < w {
			w = m.heardSent
		}
	}
	if w == math.MaxInt64 {
		return 0
	}
	return w
}

// ackOwed reports whether our watermark has passed a batch with entries
// that the Ack of our last batch did not cover yet. The author counts
// those entries as acknowledged only when every alive member's Ack
// reaches them, and a member's watermark often passes them only after its
// own acknowledging batch has gone out (it waits for the others' batches
// too): without one more batch the author's u would stay up until our next
// heartbeat. Batches without entries never make an ack owed, so this adds
// at most one batch per member after a burst and never ping-pongs.
func (c *Core) ackOwed() bool {
	w := c.watermark()
	if w <= c.lastAck {
		return false
	}
	for _, m := range c.order {
		if m.state == Alive && m.entrySent > c.lastAck && m.entrySent <= w {
			return true
		}
	}
	return false
}

func (c *Core) applyAcks() {
	f := c.ackFrontier()
	done := 0
	for done < len(c.ring) && c.ring[done].sent <= f {
		sb := &c.ring[done]
		if !sb.nacked {
			for _, sw := range sb.wins {
				if sw.v > sw.w.Acked {
					sw.w.Acked = sw.v
				}
			}
			for _, sl := range sb.leases {
				sl.s.LeasesAcked = sl.v
			}
		}
		done++
	}
	if done > 0 {
		clear(c.ring[:done])
		c.ring = c.ring[done:]
	}
}

func (c *Core) expireLeases(now time.Time) {
	var expired []*lease
	for _, ls := range c.leases {
		if !now.Before(ls.expires) {
			expired = append(expired, ls)
		}
	}
	sort.Slice(expired, func(i, j int) bool { return expired[i].id < expired[j].id })
	for _, ls := range expired {
		c.release(ls)
	}
}

func (c *Core) forgetEvictions(now time.Time) {
	kept := c.evictions[:0]
	for _, e := range c.evictions {
		if now.Sub(e.at) < evictMemory {
			kept = append(kept, e)
		}
	}
	c.evictions = kept
}

// flush builds the batches due at now: own dirty slots (plus the repair
// set when a repair is due), or a bare heartbeat/acknowledgement.
func (c *Core) flush(now time.Time, flags uint64) []*crdt.Batch {
	if c.resendAll {
		c.resendAll = false
		c.markAllDirty()
	}
	wins, ls := c.c.TakeDirty()
	for _, w := range wins {
		c.repairWin[w] = struct{}{}
		c.notePersist(w)
	}
	for _, s := range ls {
		c.repairLs[s] = struct{}{}
	}
	if !now.Before(c.nextRepair) {
		c.nextRepair = now.Add(c.cfg.RepairInterval)
		wins, ls = c.repairSet(wins, ls)
	}
	nacks := c.takeNacks()
	due := len(wins)+len(ls) > 0 || c.needAck || len(nacks) > 0 || flags != 0 ||
		now.Sub(c.lastSent) >= c.cfg.Heartbeat || c.lastSent.IsZero() || c.ackOwed()
	if !due {
		return nil
	}
	c.needAck = false
	c.lastAck = c.watermark()
	c.lastSent = now
	return c.build(now, wins, ls, nacks, flags, true)
}

// takeNacks returns the nacks for the next batch: every gap of a member
// that is neither dead nor gone, each in nackRepeats consecutive batches,
// at most crdt.MaxNacks (the rest wait for the next batch). Stats count a
// gap once, at its first nack.
func (c *Core) takeNacks() []crdt.Nack {
	var nacks []crdt.Nack
	for _, m := range c.order {
		if len(m.gaps) == 0 || m.state == Dead || m.state == Left {
			continue
		}
		keep := m.gaps[:0]
		for _, g := range m.gaps {
			if len(nacks) < crdt.MaxNacks {
				nacks = append(nacks, crdt.Nack{Slot: crdt.Slot{Peer: m.peer, Incarnation: m.inc}, Seq: g.seq})
				if g.sent == 0 {
					c.stats.NacksSent++
				}
				g.sent++
			}
			if g.sent < nackRepeats {
				keep = append(keep, g)
			}
		}
		m.gaps = keep
	}
	return nacks
}

// build turns entries into batches of at most batchEntries each. Gossip
// batches take sequence numbers and are remembered until acknowledged.
func (c *Core) build(now time.Time, wins []*crdt.Window, ls []*crdt.Series, nacks []crdt.Nack, flags uint64, gossip bool) []*crdt.Batch {
	nowMs := c.MeshMs(now)
	var out []*crdt.Batch
	newBatch := func() *crdt.Batch {
		b := &crdt.Batch{
			Version: crdt.Version, From: c.self, Sent: nowMs, Clock: now.UnixMilli(),
			RulesHash: c.rulesHash, Ack: c.watermark(), Flags: flags&^crdt.FlagLast | crdt.FlagEcho,
		}
		if gossip {
			c.seq++
			b.Seq = c.seq
		} else {
			b.Seq = c.seq
		}
		if len(out) == 0 {
			b.Nacks = nacks
			if gossip {
				b.Echoes = c.takeEchoes(b.Clock)
			}
			for _, e := range c.evictions {
				if len(b.Evicted) < crdt.MaxEvicted {
					b.Evicted = append(b.Evicted, e.slot)
				}
			}
		}
		out = append(out, b)
		return b
	}
	b := newBatch()
	var sb sentBatch
	finish := func() {
		if gossip {
			// Batches without entries are remembered too, so a nack of
			// a lost heartbeat is known to need nothing, instead of
			// making us re-send everything.
			sb.seq, sb.sent = b.Seq, b.Sent
			if len(c.ring) >= ringCap {
				c.ring = c.ring[1:]
			}
			c.ring = append(c.ring, sb)
		}
		c.stats.EntriesSent += uint64(len(b.Windows) + len(b.Leases))
		sb = sentBatch{}
	}
	for _, w := range wins {
		own, att := w.Admitted.Get(c.selfID), w.Attempted.Get(c.selfID)
		if att == 0 && own == 0 {
			continue
		}
		if len(b.Windows)+len(b.Leases) >= batchEntries {
			finish()
			b = newBatch()
		}
		s := w.Series()
		b.Windows = append(b.Windows, crdt.WindowEntry{Rule: s.Rule().Name, Key: s.Key, WindowMs: w.WindowMs, Window: w.Index, Admitted: own, Attempted: att})
		sb.wins = append(sb.wins, sentWin{w: w, v: own})
	}
	for _, s := range ls {
		p, n := s.Leases.P.Get(c.selfID), s.Leases.N.Get(c.selfID)
		if p == 0 && n == 0 {
			continue
		}
		if len(b.Windows)+len(b.Leases) >= batchEntries {
			finish()
			b = newBatch()
		}
		b.Leases = append(b.Leases, crdt.LeaseEntry{Rule: s.Rule().Name, Key: s.Key, Acquired: p, Released: n})
		sb.leases = append(sb.leases, sentLease{s: s, v: int64(p) - int64(n)})
	}
	finish()
	if flags&crdt.FlagLast != 0 {
		out[len(out)-1].Flags |= crdt.FlagLast
	}
	c.stats.BatchesSent += uint64(len(out))
	return out
}

// repairSet returns the windows and lease counters changed since the last
// repair that are not already in wins and ls, appended to them.
func (c *Core) repairSet(wins []*crdt.Window, ls []*crdt.Series) ([]*crdt.Window, []*crdt.Series) {
	for _, w := range wins {
		delete(c.repairWin, w)
	}
	for _, s := range ls {
		delete(c.repairLs, s)
	}
	extra := make([]*crdt.Window, 0, len(c.repairWin))
	for w := range c.repairWin {
		extra = append(extra, w)
	}
	sortWindows(extra)
	extraLs := make([]*crdt.Series, 0, len(c.repairLs))
	for s := range c.repairLs {
		extraLs = append(extraLs, s)
	}
	sortSeries(extraLs)
	clear(c.repairWin)
	clear(c.repairLs)
	return append(wins, extra...), append(ls, extraLs...)
}

func sortWindows(ws []*crdt.Window) {
	sort.Slice(ws, func(i, j int) bool {
		a, b := ws[i], ws[j]
		if ra, rb := a.Series().Rule().Name, b.Series().Rule().Name; ra != rb {
			return ra < rb
		}
		if a.Series().Key != b.Series().Key {
			return a.Series().Key < b.Series().Key
		}
		if a.WindowMs != b.WindowMs {
			return a.WindowMs < b.WindowMs
		}
		return a.Index < b.Index
	})
}

func sortSeries(ss []*crdt.Series) {
	sort.Slice(ss, func(i, j int) bool {
		if ra, rb := ss[i].Rule().Name, ss[j].Rule().Name; ra != rb {
			return ra < rb
		}
		return ss[i].Key < ss[j].Key
	})
}

// ownLive returns every window and lease counter holding a value of our
// current slot, sorted.
func (c *Core) ownLive() ([]*crdt.Window, []*crdt.Series) {
	var wins []*crdt.Window
	var ls []*crdt.Series
	for _, name := range c.RuleNames() {
		c.limiters[name].Set().Each(func(s *crdt.Series) {
			for _, w := range s.Windows {
				if w.Attempted.Get(c.selfID) > 0 {
					wins = append(wins, w)
				}
			}
			if s.Leases.P.Get(c.selfID) > 0 {
				ls = append(ls, s)
			}
		})
	}
	sortWindows(wins)
	sortSeries(ls)
	return wins, ls
}

func (c *Core) markAllDirty() {
	wins, ls := c.ownLive()
	for _, w := range wins {
		c.c.MarkDirty(w)
	}
	for _, s := range ls {
		c.c.MarkLeasesDirty(s)
	}
}

// FullState returns what this member sends a peer on every new connection:
// batches flagged FlagFull with every live window value of its own slots
// (the current incarnation's and earlier ones': a member evicted during a
// partition has taken a new incarnation by the time it reconnects), the
// lease counts of its current slot, its member table and the slots it
// evicted; the last is flagged FlagLast.
// While joining or fenced it also sets FlagWant: the peer answers with a
// relay of its whole view (RelayState), which is what readiness waits
// for. They take no sequence number and are meant for that peer alone.
func (c *Core) FullState(now time.Time) []*crdt.Batch {
	flags := crdt.FlagFull
	if !c.joined || c.fenced {
		flags |= crdt.FlagWant
	}
	return c.fullState(now, flags, false)
}

// RelayState returns the answer to a peer's FlagWant: like FullState, plus
// every live value this member holds of other slots — other members',
// dead and left members', earlier incarnations' windows, and the lease
// counts of live slots — flagged FlagRelay. Merge is per-slot max, so a
// relayed value can only raise what the receiver knows, never let it
// admit more.
func (c *Core) RelayState(now time.Time) []*crdt.Batch {
	return c.fullState(now, crdt.FlagFull|crdt.FlagRelay, true)
}

// ownSlot reports whether id is one of this member's slots: the current
// incarnation's or an earlier one's (restored from disk, or left behind by
// a new incarnation taken after an eviction).
func (c *Core) ownSlot(id crdt.SlotID) bool {
	return id == c.selfID || c.slots.Slot(id).Peer == c.self.Peer
}

func (c *Core) fullState(now time.Time, flags uint64, relay bool) []*crdt.Batch {
	nowMs := c.MeshMs(now)
	var out []*crdt.Batch
	var b *crdt.Batch
	var index map[crdt.SlotID]uint32
	newBatch := func() {
		b = &crdt.Batch{
			Version: crdt.Version, From: c.self, Seq: c.seq, Sent: nowMs, Clock: now.UnixMilli(),
			RulesHash: c.rulesHash, Ack: c.watermark(), Flags: flags | crdt.FlagEcho,
		}
		index = make(map[crdt.SlotID]uint32)
		out = append(out, b)
	}
	// slot returns id's index in the current batch, starting a new batch
	// when the current one is full.
	slot := func(id crdt.SlotID) uint32 {
		if len(b.Windows)+len(b.Leases) >= batchEntries {
			newBatch()
		}
		if id == c.selfID {
			return 0
		}
		if i, ok := index[id]; ok {
			return i
		}
		if len(b.Slots) >= crdt.MaxSlots {
			newBatch()
		}
		b.Slots = append(b.Slots, c.slots.Slot(id))
		index[id] = uint32(len(b.Slots))
		return index[id]
	}
	newBatch()
	for _, e := range c.evictions {
		if len(b.Evicted) < crdt.MaxEvicted {
			b.Evicted = append(b.Evicted, e.slot)
		}
	}
	for _, m := range c.order {
		if len(b.Members) >= crdt.MaxMembers {
			newBatch()
		}
		b.Members = append(b.Members, crdt.MemberEntry{Peer: m.peer, Incarnation: m.inc, State: uint8(m.state)})
	}
	for _, name := range c.RuleNames() {
		var series []*crdt.Series
		c.limiters[name].Set().Each(func(s *crdt.Series) { series = append(series, s) })
		sort.Slice(series, func(i, j int) bool { return series[i].Key < series[j].Key })
		for _, s := range series {
			wins := slices.Clone(s.Windows)
			sortWindows(wins)
			for _, w := range wins {
				if w.Expired(nowMs) {
					continue
				}
				w.Attempted.Each(func(id crdt.SlotID, att uint64) {
					if !relay && !c.ownSlot(id) {
						return
					}
					i := slot(id)
					b.Windows = append(b.Windows, crdt.WindowEntry{Slot: i, Rule: name, Key: s.Key, WindowMs: w.WindowMs, Window: w.Index, Admitted: w.Admitted.Get(id), Attempted: att})
				})
			}
			s.Leases.P.Each(func(id crdt.SlotID, p uint64) {
				if (id != c.selfID && !relay) || !c.liveSlot(id) {
					return
				}
				i := slot(id)
				b.Leases = append(b.Leases, crdt.LeaseEntry{Slot: i, Rule: name, Key: s.Key, Acquired: p, Released: s.Leases.N.Get(id)})
			})
		}
	}
	out[len(out)-1].Flags |= crdt.FlagLast
	for _, b := range out {
		c.stats.EntriesSent += uint64(len(b.Windows) + len(b.Leases))
	}
	c.stats.BatchesSent += uint64(len(out))
	return out
}

// learnMembers adds the members of a full state's member table that this
// member does not know yet: alive and suspect ones count in N from now on
// (a joiner must not take one member's view for the whole mesh); dead and
// left ones are not members to learn of. Known members are left to their
// own batches.
func (c *Core) learnMembers(now time.Time, from string, ms []crdt.MemberEntry) {
	added := false
	for _, e := range ms {
		if e.Peer == c.self.Peer || e.Peer == from || c.members[e.Peer] != nil {
			continue
		}
		var st State
		heard := now
		switch e.State {
		case crdt.MemberAlive:
			st = Alive
		case crdt.MemberSuspect:
			st, heard = Suspect, now.Add(-c.cfg.SuspectAfter)
		default:
			continue
		}
		m := &member{peer: e.Peer, inc: e.Incarnation, state: st, lastHeard: heard, tag: crdt.PeerTag(e.Peer)}
		m.slot = c.intern(crdt.Slot{Peer: e.Peer, Incarnation: e.Incarnation}, m)
		c.members[m.peer] = m
		i, _ := slices.BinarySearchFunc(c.order, m.peer, func(a *member, p string) int { return strings.Compare(a.peer, p) })
		c.order = slices.Insert(c.order, i, m)
		c.changes = append(c.changes, MemberChange{Peer: m.peer, Incarnation: m.inc, To: st, New: true})
		added = true
	}
	if added {
		c.recount()
	}
}

// Leave returns the final batches of a graceful leave: own pending changes
// and the leave announcement. The core serves nothing afterwards.
func (c *Core) Leave(now time.Time) []*crdt.Batch {
	if c.closed {
		return nil
	}
	out := c.flush(now, crdt.FlagLeaving)
	c.closed = true
	return out
}
