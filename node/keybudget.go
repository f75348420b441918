package node

import (
	"time"

	"github.com/ratemesh/ratemesh/crdt"
)

// A peer's key budget (CoreConfig.MaxKeys, keyBudget): the keys a peer's
// entries make here are charged to it while they are held, and once it
// holds its budget its entries for keys this member does not hold are
// dropped. Keys already held still merge, whoever sends them, so an
// honest peer's counts are never lost: it stops making keys of its own at
// its own cap, below its budget here.

// keyBudgetReportEvery is how often a peer that stays at its key budget
// is reported again (Ready.KeyBudget).
const keyBudgetReportEvery = time.Minute

// chargeOf returns the account the keys m's entries make are charged to,
// opening one on first use.
func (c *Core) chargeOf(m *member) uint32 {
	if m.charge == 0 {
		m.charge = c.c.NewCharge()
	}
	return m.charge
}

// seriesFor returns the series of key in set for an entry m sent, made on
// m's account if set does not hold it, or nil when m is at its key budget
// (the entry is then dropped, and counted).
func (c *Core) seriesFor(set *crdt.RuleSet, key string, m *member) *crdt.Series {
	s := set.EnsureCharged(key, c.chargeOf(m), c.keyBudget)
	if s == nil {
		c.overKeyBudget(m)
	}
	return s
}

// windowFor returns the window (windowMs, index) of key in set for an
// entry m sent, the key made on m's account if set does not hold it
// (seriesFor), or nil when the entry is dropped, counted: m is at its key
// budget, or the key holds crdt.MaxSeriesWindows (only with a max_skew of
// hours).
func (c *Core) windowFor(set *crdt.RuleSet, key string, windowMs, index int64, m *member) *crdt.Window {
	s := c.seriesFor(set, key, m)
	if s == nil {
		return nil
	}
	if !s.CanEnsure(windowMs, index) {
		c.stats.DroppedWindowLength++
		return nil
	}
	return s.EnsureWindow(windowMs, index)
}

// overKeyBudget notes an entry of m's dropped because m is at its key
// budget.
func (c *Core) overKeyBudget(m *member) {
	c.stats.DroppedKeyBudget++
	if !m.atKeyBudget {
		m.atKeyBudget = true
		c.atKeyBudget = append(c.atKeyBudget, m)
	}
}

// keyBudgetChanges appends to changes the peers at their key budget not
// reported within keyBudgetReportEvery, and forgets those whose keys went
// below it.
func (c *Core) keyBudgetChanges(now time.Time, changes []KeyBudgetChange) []KeyBudgetChange {
	keep := c.atKeyBudget[:0]
	for _, m := range c.atKeyBudget {
		held := c.c.Charged(m.charge)
		if held < c.keyBudget {
			m.atKeyBudget = false
			continue
		}
		keep = append(keep, m)
		if at, ok := c.budgetReported[m]; !ok || now.Sub(at) >= keyBudgetReportEvery {
			if c.budgetReported == nil {
				c.budgetReported = make(map[*member]time.Time)
			}
			c.budgetReported[m] = now
			changes = append(changes, KeyBudgetChange{Peer: m.peer, Keys: held, Budget: c.keyBudget})
		}
	}
	clear(c.atKeyBudget[len(keep):])
	c.atKeyBudget = keep
	return changes
}
