package node

import (
	"time"

	"github.com/ratemesh/ratemesh/crdt"
)

// PersisterTracked returns how many windows p remembers as exported, and
// how many its expiry index holds (the same windows).
func PersisterTracked(p *Persister) (seen, indexed int) {
	for _, ws := range p.expiring {
		indexed += len(ws)
	}
	return len(p.seen), indexed
}

// RefPersister is the reference for Persister's windows: the export of
// the first version, which walked every persisted window under the node's
// mutex and compared it with what it last exported. (Its window records
// and its leases are built by the same code as Persister's; what differs,
// and is under test, is which windows an export looks at.) It reads the
// core only, so it can run beside a Persister on the same core.
type RefPersister struct {
	c           *Core
	minWindowMs int64
	seen        map[*crdt.Window]winMark
	gen         uint32
	full        bool
	leaseLedger
}

// NewRefPersister returns the reference export over c.
func NewRefPersister(c *Core, minWindow time.Duration) *RefPersister {
	return &RefPersister{
		c:           c,
		minWindowMs: max(minWindow.Milliseconds(), 1),
		seen:        make(map[*crdt.Window]winMark),
		leaseLedger: leaseLedger{leases: make(map[string]time.Time)},
	}
}

// Restored is what Restore did to the reference's bookkeeping: every
// window is on disk, and so are the leases.
func (p *RefPersister) Restored(now time.Time, leases []Lease) {
	p.gen++
	p.eachWindow(p.c.MeshMs(now), func(w *crdt.Window) {
		p.seen[w] = winMark{w.Admitted.Value(), w.Attempted.Value(), p.gen}
	})
	for _, ls := range leases {
		p.leases[ls.ID] = ls.Expires
	}
}

func (p *RefPersister) eachWindow(nowMs int64, f func(w *crdt.Window)) {
	eachPersisted(p.c, p.minWindowMs, nowMs, f)
}

// Export is the first version's Persister.Export.
func (p *RefPersister) Export(now time.Time) Flush {
	c := p.c
	nowMs := c.MeshMs(now)
	f := Flush{CollectBeforeMs: nowMs}
	p.gen++
	full := p.full
	p.full = false
	p.eachWindow(nowMs, func(w *crdt.Window) {
		m := winMark{w.Admitted.Value(), w.Attempted.Value(), p.gen}
		old, ok := p.seen[w]
		p.seen[w] = m
		if ok && !full && old.admitted == m.admitted && old.attempted == m.attempted {
			return
		}
		appendRecords(c, w, &f)
	})
	for w, m := range p.seen {
		if m.gen != p.gen {
			delete(p.seen, w)
		}
	}
	p.leaseLedger.export(c, full, &f)
	return f
}

// Done is the first version's Persister.Done, without the core's stats.
func (p *RefPersister) Done(f *Flush, err error) {
	if err != nil {
		p.full = true
		p.released = append(p.released, f.Released...)
	}
}

// Suggested returns how many peers named by member tables c awaits while
// joining (joinState.suggest).
func Suggested(c *Core) int { return len(c.join.suggested) }

// MaxSuggestPerSender is maxSuggestPerSender, for tests.
const MaxSuggestPerSender = maxSuggestPerSender

// Pending reports whether own changes of c wait for the next gossip batch
// (what the runtime's leading edge asks).
func Pending(c *Core) bool { return c.pending() }

const StepAhead = stepAhead
