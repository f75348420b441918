package node

import (
	"sort"
	"time"

	"github.com/ratemesh/ratemesh/crdt"
	"github.com/ratemesh/ratemesh/limiter"
)

// PersisterTracked returns how many windows p remembers as exported, and
// how many its expiry index holds (the same windows).
func PersisterTracked(p *Persister) (seen, indexed int) {
	for _, ws := range p.expiring {
		indexed += len(ws)
	}
	return len(p.seen), indexed
}

// RefPersister is the reference for Persister's windows and leases: the
// export of the first version, which walked every persisted window under
// the node's mutex and compared it with what it last exported. It reads
// the core only, so it can run beside a Persister on the same core.
type RefPersister struct {
	c           *Core
	minWindowMs int64
	seen        map[*crdt.Window]winMark
	gen         uint32
	leases      map[string]time.Time
	released    []string
	full        bool
}

// NewRefPersister returns the reference export over c.
func NewRefPersister(c *Core, minWindow time.Duration) *RefPersister {
	return &RefPersister{
		c:           c,
		minWindowMs: max(minWindow.Milliseconds(), 1),
		seen:        make(map[*crdt.Window]winMark),
		leases:      make(map[string]time.Time),
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
	for _, name := range p.c.RuleNames() {
		l := p.c.limiters[name]
		r := l.Rule()
		if r.Algorithm == limiter.Concurrency || r.WindowMs() < p.minWindowMs {
			continue
		}
		l.Set().Each(func(s *crdt.Series) {
			for _, w := range s.Windows {
				if w.WindowMs >= p.minWindowMs && !w.Expired(nowMs) {
					f(w)
				}
			}
		})
	}
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
	})
	for w, m := range p.seen {
		if m.gen != p.gen {
			delete(p.seen, w)
		}
	}
	f.Released, p.released = p.released, nil
	for id := range p.leases {
		if c.leases[id] == nil {
			f.Released = append(f.Released, id)
			delete(p.leases, id)
		}
	}
	sort.Strings(f.Released)
	for id, ls := range c.leases {
		if exp, ok := p.leases[id]; ok && !full && exp.Equal(ls.expires) {
			continue
		}
		p.leases[id] = ls.expires
		f.Leases = append(f.Leases, Lease{ID: id, Rule: ls.rule, Key: ls.key, Expires: ls.expires})
	}
	sort.Slice(f.Leases, func(i, j int) bool { return f.Leases[i].ID < f.Leases[j].ID })
	return f
}

// Done is the first version's Persister.Done, without the core's stats.
func (p *RefPersister) Done(f *Flush, err error) {
	if err != nil {
		p.full = true
		p.released = append(p.released, f.Released...)
	}
}
