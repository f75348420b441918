package node

import (
	"slices"
	"sort"
	"time"

	"github.com/ratemesh/ratemesh/crdt"
)

// Persister decides what of a Core survives a restart: it restores the
// saved state into a fresh core at start, and on every flush (Core.Persist)
// exports what changed since the last one as a Flush for a Store, which
// the core hands over in its Ready (Ready.Persist); Core.Persisted takes
// the outcome of writing it. Like the core it is pure: it reads no clock
// and performs no I/O; the caller passes the time and writes the Flush.
//
// What it persists: the merged state (every slot's admitted and attempted
// credits) of the windows of rules whose window is at least MinWindow, and
// the leases the member owns with their expiry. Shorter windows end before
// a restart could matter; other members' leases are theirs to keep.
//
// A Persister attaches itself to its core (see NewPersister), which from
// then on records the persisted windows that change, so that an export
// looks at those windows only. A core has at most one Persister.
//
// A Persister is not safe for concurrent use: serialise its calls with the
// core's (the runtime holds the node's mutex).
type Persister struct {
	c           *Core
	minWindowMs int64
	// seen holds what the store has (or was sent) of every persisted
	// window, and expiring holds the same windows by the mesh time they
	// expire at (crdt.Window.Expired), when an export forgets them.
	seen     map[*crdt.Window]winMark
	expiring map[int64][]*crdt.Window
	gen      uint32
	// The rules of the last export: after a change (Core.SetRules) the
	// next export walks every window, as do the first one and the one
	// after a failed write (full).
	rulesHash uint64
	walk      bool // walk every window next time
	full      bool // export everything next time
	leaseLedger
}

// leaseLedger is what the store holds of the member's own leases.
type leaseLedger struct {
	leases   map[string]time.Time // ID → expiry
	released []string             // releases a failed flush did not write
}

// export appends to f the releases (the leases the store holds that c
// no longer owns, and those a failed flush did not write) and the leases
// acquired or renewed since the last export (all of them when full), and
// records them as held.
func (l *leaseLedger) export(c *Core, full bool, f *Flush) {
	f.Released, l.released = l.released, nil
	for id := range l.leases {
		if c.leases.byID[id] == nil {
			f.Released = append(f.Released, id)
			delete(l.leases, id)
		}
	}
	sort.Strings(f.Released)
	for id, ls := range c.leases.byID {
		if exp, ok := l.leases[id]; ok && !full && exp.Equal(ls.expires) {
			continue
		}
		l.leases[id] = ls.expires
		f.Leases = append(f.Leases, Lease{ID: id, Rule: ls.rule, Key: ls.key, Expires: ls.expires})
	}
	sort.Slice(f.Leases, func(i, j int) bool { return f.Leases[i].ID < f.Leases[j].ID })
}

type winMark struct {
	admitted, attempted uint64
	gen                 uint32
}

// NewPersister returns a Persister over c that persists windows of at least
// minWindow. A minWindow ≤ 0 persists every window. It attaches to c,
// replacing any Persister attached before.
func NewPersister(c *Core, minWindow time.Duration) *Persister {
	p := &Persister{
		c:           c,
		minWindowMs: max(minWindow.Milliseconds(), 1),
		seen:        make(map[*crdt.Window]winMark),
		expiring:    make(map[int64][]*crdt.Window),
		leaseLedger: leaseLedger{leases: make(map[string]time.Time)},
		rulesHash:   c.rulesHash,
		walk:        true, // the core may hold windows changed before
	}
	c.persister = p
	c.persistDirty = make(map[*crdt.Window]struct{})
	c.persistMinMs = p.minWindowMs
	return p
}

// Persist exports, with the attached Persister, what changed since the
// last Persist at now: the Flush goes out in the Ready (Ready.Persist),
// and its owner reports the outcome of writing it with Persisted before
// the next Persist. A Flush not taken yet takes the new one in. Without a
// Persister it does nothing.
func (c *Core) Persist(now time.Time) {
	if c.persister == nil {
		return
	}
	f := c.persister.export(now)
	if old := c.ready.Persist; old != nil {
		old.Windows = gather(old.Windows, f.Windows)
		old.Leases = gather(old.Leases, f.Leases)
		old.Released = gather(old.Released, f.Released)
		old.CollectBeforeMs = f.CollectBeforeMs
		return
	}
	c.ready.Persist = &f
}

// Persisted records the outcome of writing f, the last Ready.Persist, to
// the Store: after a failure the next Persist carries everything again (a
// store merges by max, so writing a value twice is harmless), and the
// releases f did not write.
func (c *Core) Persisted(f *Flush, err error) {
	if c.persister != nil {
		c.persister.done(f, err)
	}
}

// notePersist records that the merged values of w may have grown, for the
// next export of the attached Persister. Without one it does nothing.
func (c *Core) notePersist(w *crdt.Window) {
	if c.persistDirty != nil && w.WindowMs >= c.persistMinMs {
		c.persistDirty[w] = struct{}{}
	}
}

// RestoreStats counts what Restore did with the saved state.
type RestoreStats struct {
	// Windows and Leases were restored.
	Windows, Leases int
	// Skipped records: of a rule that no longer exists or whose window
	// changed, already collected, or of this member's current slot.
	SkippedWindows int
	// Skipped leases: expired, or of a rule that no longer exists or is
	// no longer a concurrency rule.
	SkippedLeases int
}

// Restore loads saved state into the core at now, before it serves. Window
// records merge into their slots by max: the member's own earlier
// incarnations keep counting until their windows end, and other members'
// slots are known before they are heard again. Leases still live at now
// are owned again under the current incarnation, with their IDs and
// expiry, so their clients can renew and release them; the others are
// released from the store at the next flush.
func (p *Persister) Restore(now time.Time, recs []WindowRecord, leases []Lease) RestoreStats {
	c := p.c
	var st RestoreStats
	nowMs := c.MeshMs(now)
	for _, r := range recs {
		l := c.limiters[r.Rule]
		if l == nil || l.Rule().Leased() || l.Rule().WindowMs() != r.WindowMs ||
			r.WindowMs <= 0 || r.CollectAt() <= nowMs || r.Slot == c.self || r.Slot.Peer == "" || r.Slot.Incarnation == 0 {
			st.SkippedWindows++
			continue
		}
		id, ok := c.slots.Lookup(r.Slot)
		if !ok {
			id = c.intern(r.Slot, c.members.byPeer[r.Slot.Peer])
		}
		se := l.Set().Ensure(r.Key)
		if !se.CanEnsure(r.WindowMs, r.Window) {
			st.SkippedWindows++
			continue
		}
		w := se.EnsureWindow(r.WindowMs, r.Window)
		w.Admitted.Raise(id, r.Admitted)
		w.Attempted.Raise(id, r.Attempted)
		st.Windows++
	}
	// What was restored is on disk already: mark it exported. Every
	// window is known now, so the next export looks at changes only.
	p.walkAll(nowMs, nil, false)
	p.walk, p.rulesHash = false, c.rulesHash
	clear(c.persistDirty)
	for _, ls := range leases {
		p.leases[ls.ID] = ls.Expires // on disk: released below unless restored
		l := c.limiters[ls.Rule]
		if l == nil || !l.Rule().Leased() || !now.Before(ls.Expires) || c.leases.byID[ls.ID] != nil {
			st.SkippedLeases++
			continue
		}
		l.RecordLease(ls.Key, 1)
		c.leases.byID[ls.ID] = &lease{id: ls.ID, rule: ls.Rule, key: ls.Key, expires: ls.Expires}
		st.Leases++
	}
	return st
}

// eachWindow calls f for every window persisted and not yet collected at
// nowMs.
func (p *Persister) eachWindow(nowMs int64, f func(w *crdt.Window)) {
	eachPersisted(p.c, p.minWindowMs, nowMs, f)
}

// eachPersisted calls f for every window of c at least minWindowMs long,
// of a windowed rule, and not yet collected at nowMs.
func eachPersisted(c *Core, minWindowMs, nowMs int64, f func(w *crdt.Window)) {
	for _, name := range c.RuleNames() {
		l := c.limiters[name]
		r := l.Rule()
		if r.Leased() || r.WindowMs() < minWindowMs {
			continue
		}
		l.Set().Each(func(s *crdt.Series) {
			for _, w := range s.Windows() {
				if w.WindowMs >= minWindowMs && !w.Expired(nowMs) {
					f(w)
				}
			}
		})
	}
}

// persisted reports whether w is one of the windows eachWindow would visit
// at nowMs: of a persisted rule, long enough, not expired, still held.
func (p *Persister) persisted(w *crdt.Window, nowMs int64) bool {
	if w.WindowMs < p.minWindowMs || w.Expired(nowMs) {
		return false
	}
	s := w.Series()
	rs := s.Rule()
	l := p.c.limiters[rs.Name]
	if l == nil || l.Set() != rs {
		return false
	}
	if r := l.Rule(); r.Leased() || r.WindowMs() < p.minWindowMs {
		return false
	}
	// Not collected since it changed (mesh time may step back).
	return rs.Series(s.Key) == s && slices.Contains(s.Windows(), w)
}

// export returns what changed since the last export at now: the records of
// every persisted window whose merged values grew (all its slots), the
// leases acquired or renewed, the leases released or expired, and the mesh
// time before which the store may collect.
//
// It looks at the windows the core recorded as changed since the last
// export, and costs a record per slot of each window that grew. The first
// export, the one after a failed write (see done) and the one after the
// rules changed walk every persisted window instead.
func (p *Persister) export(now time.Time) Flush {
	c := p.c
	nowMs := c.MeshMs(now)
	f := Flush{CollectBeforeMs: nowMs}
	full := p.full
	p.full = false
	if full || p.walk || p.rulesHash != c.rulesHash {
		p.walkAll(nowMs, &f, full)
		p.walk, p.rulesHash = false, c.rulesHash
	} else {
		p.forgetExpired(nowMs)
		p.exportChanged(nowMs, &f)
	}
	if len(c.persistDirty) > 4096 {
		// After a burst: a map keeps its size, and clearing costs that.
		c.persistDirty = make(map[*crdt.Window]struct{})
	} else {
		clear(c.persistDirty)
	}

	p.leaseLedger.export(c, full, &f)
	return f
}

// walkAll visits every persisted window at nowMs, appends to f (unless it
// is nil) the records of those whose values grew since seen, or of all of
// them when all is true, and rebuilds seen and expiring from what it
// visited.
func (p *Persister) walkAll(nowMs int64, f *Flush, all bool) {
	p.gen++
	p.eachWindow(nowMs, func(w *crdt.Window) { p.record(w, f, all) })
	clear(p.expiring)
	for w, m := range p.seen {
		if m.gen != p.gen {
			delete(p.seen, w) // collected, or no longer persisted
			continue
		}
		at := expiresAt(w)
		p.expiring[at] = append(p.expiring[at], w)
	}
}

// exportChanged appends to f the records of the windows changed since the
// last export whose values grew: those the core recorded (its merges, and
// its own admissions the run loop published) and its own admissions still
// waiting in the container's dirty set.
func (p *Persister) exportChanged(nowMs int64, f *Flush) {
	c := p.c
	// Read the dirty set without consuming it: gossip publishes it next.
	for _, w := range c.c.DirtyWindows() {
		if p.persisted(w, nowMs) {
			p.exportNew(w, f)
		}
	}
	for w := range c.persistDirty {
		if p.persisted(w, nowMs) {
			p.exportNew(w, f)
		}
	}
}

// exportNew is record for a window found changed, indexing it by expiry
// when it is new to seen.
func (p *Persister) exportNew(w *crdt.Window, f *Flush) {
	if p.record(w, f, false) {
		at := expiresAt(w)
		p.expiring[at] = append(p.expiring[at], w)
	}
}

// record records w's values in seen and, when they grew since seen or all
// is true, appends w's records (one per slot) to f unless f is nil. It
// reports whether w was new to seen.
func (p *Persister) record(w *crdt.Window, f *Flush, all bool) (added bool) {
	m := winMark{w.Admitted.Value(), w.Attempted.Value(), p.gen}
	old, ok := p.seen[w]
	p.seen[w] = m
	if f == nil || ok && !all && old.admitted == m.admitted && old.attempted == m.attempted {
		return !ok
	}
	appendRecords(p.c, w, f)
	return !ok
}

// appendRecords appends to f the records of w: one per slot with credits.
func appendRecords(c *Core, w *crdt.Window, f *Flush) {
	s := w.Series()
	rec := WindowRecord{Rule: s.Rule().Name, Key: s.Key, WindowMs: w.WindowMs, Window: w.Index}
	w.Attempted.Each(func(id crdt.SlotID, att uint64) {
		rec.Slot, rec.Admitted, rec.Attempted = c.slots.Slot(id), w.Admitted.Get(id), att
		f.Windows = append(f.Windows, rec)
	})
	w.Admitted.Each(func(id crdt.SlotID, adm uint64) {
		if w.Attempted.Get(id) == 0 {
			rec.Slot, rec.Admitted, rec.Attempted = c.slots.Slot(id), adm, 0
			f.Windows = append(f.Windows, rec)
		}
	})
}

// expiresAt is the mesh time at which w is Expired.
func expiresAt(w *crdt.Window) int64 { return (w.Index + 2) * w.WindowMs }

// forgetExpired drops from seen the windows expired at nowMs.
func (p *Persister) forgetExpired(nowMs int64) {
	for at, ws := range p.expiring {
		if at <= nowMs {
			for _, w := range ws {
				delete(p.seen, w)
			}
			delete(p.expiring, at)
		}
	}
}

// done records the outcome of writing f, the last export (Core.Persisted).
func (p *Persister) done(f *Flush, err error) {
	if err != nil {
		p.c.stats.PersistErrors++
		p.full = true
		p.released = append(p.released, f.Released...)
		return
	}
	p.c.stats.PersistFlushes++
	p.c.stats.PersistEntries += uint64(len(f.Windows) + len(f.Leases) + len(f.Released))
}
