package node

import (
	"slices"
	"sort"
	"time"

	"github.com/ratemesh/ratemesh/crdt"
)

// What this member publishes (docs/design.md, "Replication" and
// "Acknowledgements"): every SyncInterval its own changed values, as
// absolute values in gossip batches numbered by seq; every RepairInterval
// the values changed since the last repair again, so a lost last delta
// heals; a bare batch at least every Heartbeat, and whenever it owes an
// acknowledgement or a nack. The outbox remembers every gossip batch until
// the mesh has acknowledged it, so that its values count as acknowledged
// then, or are published again when a member nacks it.

const (
	batchEntries = 2000             // entries per published batch; well under crdt.MaxBatchBytes
	repairSlice  = 4 * batchEntries // the fewest windows of a repair one flush sends
	ringCap      = 1 << 14          // published batches awaiting acknowledgement
	// nackedMemory is how many recently nacked seqs of ours we remember,
	// to tell a repeated nack from one of a batch we no longer hold.
	nackedMemory = 256
)

type sentWin struct {
	w *crdt.Window
	v uint64
}

type sentLease struct {
	s *crdt.Series
	v int64
}

// sentBatch is a gossip batch of ours awaiting acknowledgement: the own
// values it carried, to mark acknowledged (or dirty again, when nacked),
// and the repair copies it carried. nack is set by its first nack.
type sentBatch struct {
	seq    uint64
	sent   int64
	wins   []sentWin
	leases []sentLease
	copies []carried
	nack   *nackedBatch
}

// nackedBatch is what the first nack of our batch seq made of it: a repair
// line of its windows (nil when it had none, or repeats went out
// untagged), and the repair copies it carried. It outlives the batch's
// place in the ring (outbox.nackedSeqs), so that a late nack of it is
// served too.
type nackedBatch struct {
	seq    uint64
	line   *repairLine
	copies []carried
}

// repairLine is a nacked batch of ours repaired (crdt.Repair): its
// windows, with the own values it carried (a repeat counts as
// acknowledged only up to them, since a member that merged the batch
// skips the repeat; later values count through their own batches), and
// its latest copy, queued or sent.
type repairLine struct {
	seq  uint64
	wins []sentWin
	last *repairCopy
}

// repairCopy is one publication of a repair line, for the members in to:
// those that nacked the repaired batch, or a batch carrying a copy meant
// for them. Only their nack of a batch carrying the copy publishes the
// line again. Every other member merged the repaired batch and skips the
// copy, so its loss there costs nothing; publishing again on any nack
// made a line last as long as some member lost each copy, which at 1 %
// loss over a thousand members is forever.
type repairCopy struct {
	line *repairLine
	to   []crdt.SlotID
}

// carried is a repair copy in a batch of ours: the windows it sent, with
// the values the repaired batch carried, and whether a member it was for
// nacked the batch (then they count as acknowledged through the next
// copy instead).
type carried struct {
	c    *repairCopy
	wins []sentWin
	lost bool
}

// outbox is the sending side of this member's gossip. Its invariants: ring
// holds at most ringCap batches in increasing seq order, the last of them
// (if any) numbered seq; nackedSeqs holds at most nackedMemory batches,
// each nacked, oldest first.
type outbox struct {
	seq  uint64      // the seq of our latest gossip batch
	ring []sentBatch // gossip batches not yet acknowledged, oldest first
	// nackedSeqs are the latest batches of ours served a nack (oldest
	// first, at most nackedMemory), so that a nack of one no longer in
	// the ring is not taken for a nack of a batch we never held.
	nackedSeqs []*nackedBatch
	// changed holds the windows published since the last repair began,
	// in the order first published, each marked (crdt.Window.Queue);
	// repairLs the lease counters.
	changed  []*crdt.Window
	repairLs map[*crdt.Series]struct{}
	// repairing holds the windows of the repair under way still to go
	// out, still marked; each flush sends the next repairPer of them.
	repairing []*crdt.Window
	repairPer int
	// skipAcked: the repair under way leaves out the windows whose own
	// values every live member has acknowledged (acknowledged); set when
	// it starts, if every live member has our rules (rulesAgree).
	skipAcked bool
	// repairs are the repair copies (of nacked batches' windows) to
	// publish tagged as repairs (crdt.Repair), in the order the nacks
	// came.
	repairs   []*repairCopy
	resendAll bool  // a nack asked for everything: publish every own value again
	needAck   bool  // we merged something since our last batch: answer it
	lastAck   int64 // the Ack of the last gossip batch we sent
	// ackMs is how long, in ms, our batches with entries took lately
	// from going out to being acknowledged by every alive member: up at
	// once by half of a slower one, down by an eighth of a faster one
	// (noteAck). It stretches the default hold (Core.ShareWait).
	ackMs    float64
	lastSent time.Time
	nextSync time.Time
	// nextRepair is when the values changed since the last repair go out
	// again.
	nextRepair time.Time
}

// newOutbox returns the outbox of a member started at now: its first sync
// is due at once, its first repair after repairEvery.
func newOutbox(now time.Time, repairEvery time.Duration) outbox {
	return outbox{
		repairLs:   make(map[*crdt.Series]struct{}),
		nextSync:   now,
		nextRepair: now.Add(repairEvery),
	}
}

// remember records a gossip batch just sent; the oldest is forgotten when
// the ring is full.
func (o *outbox) remember(sb sentBatch) {
	if len(o.ring) >= ringCap {
		o.ring = o.ring[1:]
	}
	o.ring = append(o.ring, sb)
}

// nacked finds our batch seq, which a member reports missing: in the
// ring, or remembered as nacked before (nackedSeqs). first is true for
// the batch's first nack, which makes its record nb. nb is nil when seq
// is 0 or a batch we no longer know: then every own value is published
// again (resendAll), and first is true.
func (o *outbox) nacked(seq uint64) (nb *nackedBatch, sb *sentBatch, first bool) {
	i, ok := slices.BinarySearchFunc(o.ring, seq, func(sb sentBatch, s uint64) int { return cmpU64(sb.seq, s) })
	switch {
	case seq == 0:
	case ok && o.ring[i].nack != nil:
		return o.ring[i].nack, &o.ring[i], false
	case ok:
		sb = &o.ring[i]
		sb.nack = &nackedBatch{seq: seq, copies: sb.copies}
		if len(o.nackedSeqs) >= nackedMemory {
			clear(o.nackedSeqs[:1])
			o.nackedSeqs = append(o.nackedSeqs[:0], o.nackedSeqs[1:]...)
		}
		o.nackedSeqs = append(o.nackedSeqs, sb.nack)
		return sb.nack, sb, true
	default:
		if j := slices.IndexFunc(o.nackedSeqs, func(nb *nackedBatch) bool { return nb.seq == seq }); j >= 0 {
			return o.nackedSeqs[j], nil, false
		}
	}
	o.resendAll = true
	return nil, nil, true
}

// need makes the next copy of line reach member by, which nacked the
// repaired batch (lost nil) or a batch carrying lost, a copy meant for
// it: a new copy when there is none yet or lost is the latest; otherwise
// the latest, queued or on its way (by merges it, or nacks its batch in
// turn).
func (o *outbox) need(line *repairLine, by crdt.SlotID, lost *repairCopy) {
	if line.last == nil || line.last == lost {
		line.last = &repairCopy{line: line}
		o.repairs = append(o.repairs, line.last)
	}
	if !slices.Contains(line.last.to, by) {
		line.last.to = append(line.last.to, by)
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

// acked marks the values of every batch sent at or before frontier (the
// mesh's acknowledgement, ackFrontier) acknowledged, except a nacked
// batch's own and its repair copies lost by a member they were for, and
// forgets those batches; nowMs is the mesh time, which
// times the acknowledgements.
func (o *outbox) acked(frontier, nowMs int64) {
	done := 0
	for done < len(o.ring) && o.ring[done].sent <= frontier {
		sb := &o.ring[done]
		if len(sb.wins)+len(sb.leases) > 0 {
			o.noteAck(nowMs - sb.sent)
		}
		if sb.nack == nil {
			ackWins(sb.wins)
			for _, sl := range sb.leases {
				sl.s.EnsureLeases().Acked = sl.v
			}
		}
		for _, cp := range sb.copies {
			if !cp.lost {
				ackWins(cp.wins)
			}
		}
		done++
	}
	if done > 0 {
		clear(o.ring[:done])
		o.ring = o.ring[done:]
	}
}

func ackWins(ws []sentWin) {
	for _, sw := range ws {
		if sw.v > sw.w.Acked {
			sw.w.Acked = sw.v
		}
	}
}

// noteAck takes ms, one batch's time from going out to its
// acknowledgement, into ackMs: a slower one raises it by half the
// difference at once (a starved host is believed quickly), a faster one
// lowers it by an eighth (one quick round does not undo it).
func (o *outbox) noteAck(ms int64) {
	d := float64(max(ms, 0)) - o.ackMs
	if d > 0 {
		o.ackMs += d / 2
	} else {
		o.ackMs += d / 8
	}
}

// ackDelay returns ackMs as a duration.
func (o *outbox) ackDelay() time.Duration {
	return time.Duration(o.ackMs * float64(time.Millisecond))
}

// published adds windows and lease counters about to be published to
// the next repair.
func (o *outbox) published(wins []*crdt.Window, ls []*crdt.Series) {
	for _, w := range wins {
		if w.Queue() {
			o.changed = append(o.changed, w)
		}
	}
	for _, s := range ls {
		o.repairLs[s] = struct{}{}
	}
}

// startRepair begins the repair of the windows published since the last
// one began, queued after whatever of the last is still to go out. A
// flush sends repairSlice of them, or more when there are so many that
// less would not send them all within one repair interval (every) of
// syncs (sync): a repair of a million windows, a burst of new keys, goes
// out over the syncs that follow instead of stalling one of them (the
// runtime holds the lock decisions take while it builds the batches).
func (o *outbox) startRepair(every, sync time.Duration) {
	if len(o.repairing) == 0 {
		o.repairing, o.changed = o.changed, o.repairing[:0]
	} else {
		o.repairing = append(o.repairing, o.changed...)
		clear(o.changed)
		o.changed = o.changed[:0]
	}
	per := len(o.repairing)
	if every > sync {
		per = int(int64(per)*int64(sync)/int64(every)) + 1
	}
	o.repairPer = max(per, repairSlice)
}

// takeRepair appends to dst the next slice of the repair under way,
// sorted, and clears their marks. It leaves out the windows marked dirty,
// which this flush publishes fresh (call it before Container.TakeDirty),
// and those expired at nowMs, which every member collects or drops, and,
// with skipAcked, those acknowledged for self.
func (o *outbox) takeRepair(dst []*crdt.Window, self crdt.SlotID, nowMs int64) []*crdt.Window {
	n := min(o.repairPer, len(o.repairing))
	if n == 0 {
		return dst
	}
	start := len(dst)
	for _, w := range o.repairing[:n] {
		w.Unqueue()
		if !w.Dirty() && !w.Expired(nowMs) && !(o.skipAcked && acknowledged(w, self)) {
			dst = append(dst, w)
		}
	}
	clear(o.repairing[:n])
	if o.repairing = o.repairing[n:]; len(o.repairing) == 0 {
		o.repairing = nil // let a burst's array go
	}
	sortWindows(dst[start:])
	return dst
}

// acknowledged reports whether every live member has acknowledged self's
// values in w: its admitted value is acknowledged (Window.Acked), and its
// attempted value is no more than that. Attempts only grow and never
// below admissions, so the batch that carried the acknowledged admitted
// value carried that attempted value too. (A window with denials, or a
// token bucket's, whose attempted value is above its admitted one, is
// never taken for acknowledged.)
func acknowledged(w *crdt.Window, self crdt.SlotID) bool {
	adm := w.Admitted.Get(self)
	return w.Acked == adm && w.Attempted.Get(self) == adm
}

// repairLeases returns the lease counters changed since the last repair
// that are not in ls, appended to it, and starts the next repair's set.
func (o *outbox) repairLeases(ls []*crdt.Series) []*crdt.Series {
	for _, s := range ls {
		delete(o.repairLs, s)
	}
	extra := make([]*crdt.Series, 0, len(o.repairLs))
	for s := range o.repairLs {
		extra = append(extra, s)
	}
	sortSeries(extra)
	clear(o.repairLs)
	return append(ls, extra...)
}

// reset starts a new gossip sequence: the member took a new incarnation.
func (o *outbox) reset() {
	o.ring = o.ring[:0]
	clear(o.repairs)
	o.repairs = o.repairs[:0]
	clear(o.nackedSeqs)
	o.nackedSeqs = o.nackedSeqs[:0]
	o.seq = 0
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

// nacked serves member by's nack of our batch seq (outbox.nacked). The
// first nack of a batch makes its windows a repair line, published tagged
// (crdt.Repair) so that the members that merged the batch skip it, or
// marks them dirty to go out untagged, and marks its leases dirty. Every
// nack, the first or not, of the batch or of a copy of one of its repair
// lines, has the line published again for by (outbox.need).
func (c *Core) nacked(seq uint64, by crdt.SlotID) {
	nb, sb, first := c.out.nacked(seq)
	if first {
		c.stats.NacksReceived++
	}
	if nb == nil {
		c.stats.NacksAll++
		return
	}
	tagged := c.clock.all(capRepairs)
	if first {
		switch {
		case !tagged:
			for _, sw := range sb.wins {
				c.c.MarkDirty(sw.w)
			}
			for _, cp := range sb.copies {
				for _, sw := range cp.wins {
					c.c.MarkDirty(sw.w)
				}
			}
		case len(sb.wins) > 0:
			nb.line = &repairLine{seq: seq, wins: slices.Clone(sb.wins)}
		}
		for _, sl := range sb.leases {
			c.c.MarkLeasesDirty(sl.s)
		}
	}
	if !tagged {
		return
	}
	if nb.line != nil {
		c.out.need(nb.line, by, nil)
	}
	for i := range nb.copies {
		cp := &nb.copies[i]
		if slices.Contains(cp.c.to, by) {
			cp.lost = true
			c.out.need(cp.c.line, by, cp.c)
		}
	}
}

// flush builds the gossip batches due at now: own dirty values (plus the
// repair set when a repair is due), or a bare heartbeat/acknowledgement.
func (c *Core) flush(now time.Time, flags uint64) []*crdt.Batch {
	o := &c.out
	if o.resendAll {
		o.resendAll = false
		c.markAllDirty()
	}
	groups := o.repairs
	o.repairs = nil
	if len(groups) > 0 && !c.clock.all(capRepairs) {
		// A member that cannot read the tags turned up since the nacks:
		// everyone gets the repeats untagged.
		for _, g := range groups {
			for _, sw := range g.line.wins {
				c.c.MarkDirty(sw.w)
			}
		}
		groups = nil
	}
	nowMs := c.MeshMs(now)
	groups = slices.DeleteFunc(groups, func(g *repairCopy) bool {
		// An expired window is collected or dropped everywhere: its
		// repairs end there.
		g.line.wins = slices.DeleteFunc(g.line.wins, func(sw sentWin) bool { return sw.w.Expired(nowMs) })
		return len(g.line.wins) == 0
	})
	for _, g := range groups {
		for _, sw := range g.line.wins {
			if sw.w.Queue() { // as published does
				o.changed = append(o.changed, sw.w)
			}
			c.notePersist(sw.w)
		}
	}
	repairDue := !now.Before(o.nextRepair)
	if repairDue {
		o.nextRepair = now.Add(c.cfg.RepairInterval)
		o.startRepair(c.cfg.RepairInterval, c.cfg.SyncInterval)
		o.skipAcked = c.rulesAgree()
	}
	repair := o.takeRepair(nil, c.selfID, nowMs) // before TakeDirty: it leaves out the fresh
	wins, ls := c.c.TakeDirty()
	c.builtBudgets()
	if repairDue {
		// The fresh values go out now, with the repair: the next repair
		// repeats only what changes after it.
		ls = o.repairLeases(ls)
	} else {
		o.published(wins, ls)
	}
	for _, w := range wins {
		c.notePersist(w)
	}
	wins = append(wins, repair...)
	groups = withoutFresh(groups, wins)
	nacks, first := takeNacks(c.members.order)
	c.stats.NacksSent += uint64(first)
	due := len(wins)+len(ls)+len(groups) > 0 || o.needAck || len(nacks) > 0 || flags != 0 ||
		now.Sub(o.lastSent) >= c.cfg.Heartbeat || o.lastSent.IsZero() || ackOwed(c.members.order, o.lastAck)
	if !due {
		return nil
	}
	o.needAck = false
	o.lastAck = watermark(c.members.order)
	o.lastSent = now
	return c.build(now, wins, ls, groups, nacks, flags)
}

// rulesAgree reports whether every live member has announced our rules
// (crdt.Batch.RulesHash). Then a member that acknowledged a batch of ours
// merged every window entry of it: one drops an acknowledged entry only
// for a rule or window length it does not have, for a key past our key
// budget (which an honest member with the same rules never reaches), or
// for a window a minute past max_skew ahead (future.go). While a member's
// rules differ — a rollout of new rules under way — the repairs repeat
// every window changed, acknowledged or not, as the only second chance of
// what it dropped.
func (c *Core) rulesAgree() bool {
	for _, m := range c.members.order {
		if m.state == Alive && m.rulesHash != c.rulesHash {
			return false
		}
	}
	return true
}

// withoutFresh drops from the repair copies' lines the windows published
// fresh (untagged) in the same batches, and the copies left empty: every
// member merges a fresh entry, which carries the current value anyway, or
// nacks its batch, whose own repair line then carries it.
func withoutFresh(groups []*repairCopy, fresh []*crdt.Window) []*repairCopy {
	if len(groups) == 0 || len(fresh) == 0 {
		return groups
	}
	in := make(map[*crdt.Window]struct{}, len(fresh))
	for _, w := range fresh {
		in[w] = struct{}{}
	}
	out := groups[:0]
	for _, g := range groups {
		g.line.wins = slices.DeleteFunc(g.line.wins, func(sw sentWin) bool { _, ok := in[sw.w]; return ok })
		if len(g.line.wins) > 0 {
			out = append(out, g)
		}
	}
	return out
}

// build turns entries into gossip batches of at most batchEntries each,
// numbered in sequence and remembered until acknowledged.
func (c *Core) build(now time.Time, wins []*crdt.Window, ls []*crdt.Series, groups []*repairCopy, nacks []crdt.Nack, flags uint64) []*crdt.Batch {
	nowMs := c.MeshMs(now)
	var out []*crdt.Batch
	newBatch := func() *crdt.Batch {
		c.out.seq++
		b := &crdt.Batch{
			Version: crdt.Version, From: c.self, Seq: c.out.seq, Sent: nowMs, Clock: now.UnixMilli(),
			RulesHash: c.rulesHash, Ack: watermark(c.members.order), Flags: flags&^crdt.FlagLast | announced,
		}
		if len(out) == 0 {
			b.Nacks = nacks
			b.Echoes = c.clock.takeEchoes(b.Clock)
			for _, e := range c.members.evictions {
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
		// Batches without entries are remembered too, so a nack of a
		// lost heartbeat is known to need nothing, instead of making us
		// re-send everything.
		sb.seq, sb.sent = b.Seq, b.Sent
		c.out.remember(sb)
		c.stats.EntriesSent += uint64(len(b.Windows) + len(b.Leases))
		sb = sentBatch{}
	}
	for _, w := range wins {
		e, ok := c.ownEntry(w)
		if !ok {
			continue
		}
		if len(b.Windows)+len(b.Leases) >= batchEntries {
			finish()
			b = newBatch()
		}
		b.Windows = append(b.Windows, e)
		sb.wins = append(sb.wins, sentWin{w: w, v: e.Admitted})
	}
	for _, s := range ls {
		p, n := s.Leases().P.Get(c.selfID), s.Leases().N.Get(c.selfID)
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
	// The repairs come last, after every fresh window entry of their batch
	// (crdt.Batch.Repairs). A group is never split: a receiver that merged
	// the first part would take the repaired batch for merged and skip the
	// rest. It fits an empty batch, being at most a batch's entries.
	for _, g := range groups {
		type entry struct {
			e  crdt.WindowEntry
			sw sentWin
		}
		var es []entry
		for _, sw := range g.line.wins {
			if e, ok := c.ownEntry(sw.w); ok {
				es = append(es, entry{e, sw})
			}
		}
		if len(es) == 0 {
			continue
		}
		if len(b.Windows)+len(b.Leases)+len(es) > batchEntries || len(b.Repairs) >= crdt.MaxRepairs {
			finish()
			b = newBatch()
		}
		b.Repairs = append(b.Repairs, crdt.Repair{Seq: g.line.seq, N: uint32(len(es))})
		c.stats.RepairEntriesSent += uint64(len(es))
		cp := carried{c: g, wins: make([]sentWin, len(es))}
		for i, x := range es {
			b.Windows = append(b.Windows, x.e)
			cp.wins[i] = x.sw
		}
		sb.copies = append(sb.copies, cp)
	}
	finish()
	if flags&crdt.FlagLast != 0 {
		out[len(out)-1].Flags |= crdt.FlagLast
	}
	c.stats.BatchesSent += uint64(len(out))
	return out
}

// ownLive returns every window and lease counter holding a value of our
// current slot, sorted.
func (c *Core) ownLive() ([]*crdt.Window, []*crdt.Series) {
	var wins []*crdt.Window
	var ls []*crdt.Series
	for _, name := range c.RuleNames() {
		c.limiters[name].Set().Each(func(s *crdt.Series) {
			for _, w := range s.Windows() {
				if w.Attempted.Get(c.selfID) > 0 {
					wins = append(wins, w)
				}
			}
			if s.Leases().P.Get(c.selfID) > 0 {
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

// ownSlot reports whether id is one of this member's slots: the current
// incarnation's or an earlier one's (restored from disk, or left behind by
// a new incarnation taken after an eviction).
func (c *Core) ownSlot(id crdt.SlotID) bool {
	return id == c.selfID || c.slots.Slot(id).Peer == c.self.Peer
}

// fullState builds a full state at now (flags; see AntiEntropy and
// Core.relay): every live window value of our own slots, or with relay of
// every slot, the lease counts of our current slot (with relay, of every
// live slot), with table the member table (for a receiver that decodes
// it: caps.table), and the slots we evicted, the last batch flagged
// FlagLast. It takes no sequence number; the caller counts it in the
// stats (Core.direct).
func (c *Core) fullState(now time.Time, flags uint64, relay, table bool) []*crdt.Batch {
	nowMs := c.MeshMs(now)
	var out []*crdt.Batch
	var b *crdt.Batch
	var index map[crdt.SlotID]uint32
	newBatch := func() {
		b = &crdt.Batch{
			Version: crdt.Version, From: c.self, Seq: c.out.seq, Sent: nowMs, Clock: now.UnixMilli(),
			RulesHash: c.rulesHash, Ack: watermark(c.members.order), Flags: flags | announced,
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
	for _, e := range c.members.evictions {
		if len(b.Evicted) < crdt.MaxEvicted {
			b.Evicted = append(b.Evicted, e.slot)
		}
	}
	for _, m := range c.members.order {
		if !table {
			break
		}
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
			wins := slices.Clone(s.Windows())
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
			s.Leases().P.Each(func(id crdt.SlotID, p uint64) {
				if (id != c.selfID && !relay) || !c.liveSlot(id) {
					return
				}
				i := slot(id)
				b.Leases = append(b.Leases, crdt.LeaseEntry{Slot: i, Rule: name, Key: s.Key, Acquired: p, Released: s.Leases().N.Get(id)})
			})
		}
	}
	out[len(out)-1].Flags |= crdt.FlagLast
	return out
}

// ownEntry returns the gossip entry of our own values in w, false when
// we hold none there.
func (c *Core) ownEntry(w *crdt.Window) (crdt.WindowEntry, bool) {
	own, att := w.Admitted.Get(c.selfID), w.Attempted.Get(c.selfID)
	s := w.Series()
	return crdt.WindowEntry{Rule: s.Rule().Name, Key: s.Key, WindowMs: w.WindowMs, Window: w.Index, Admitted: own, Attempted: att}, att != 0 || own != 0
}

// pending reports whether own changes wait for the next gossip batch:
// values a decision, a lease or a nack marked dirty, a nacked batch's
// repair, or a nack's request to publish everything again. False after
// Leave. The runtime asks it to arm its leading edge (Config.PublishGap).
func (c *Core) pending() bool {
	return !c.closed && (c.c.Dirty() > 0 || c.out.resendAll || len(c.out.repairs) > 0)
}

// LastPublished returns the local time the latest gossip batch was built
// at, by Tick, Flush or Leave; zero before the first.
func (c *Core) LastPublished() time.Time { return c.out.lastSent }

// Flush adds to the Ready's Messages, at now, the batch a sync would
// publish — own pending changes, a due repair, what the batch owes
// (acknowledgement, nacks, echoes) — ahead of the sync tick, and moves the
// next sync to SyncInterval after now: a sync that came early. It adds
// nothing, and changes nothing, when no own change is pending or after
// Leave. The runtime calls it on the leading edge of a change
// (Config.PublishGap), and the simulator does the same in virtual time
// (simulator/edge.go).
func (c *Core) Flush(now time.Time) {
	if !c.pending() {
		return
	}
	c.out.nextSync = now.Add(c.cfg.SyncInterval)
	c.ready.Messages = gather(c.ready.Messages, c.flush(now, 0))
}
