package node

import (
	"fmt"
	"sort"

	"github.com/ratemesh/ratemesh/limiter"
)

// SetRules replaces the core's rules with rules, all or nothing: every rule
// is normalised and validated first, and an invalid rule or a name defined
// twice leaves the core unchanged with an error naming the rule and the
// field. A rule whose definition is unchanged keeps its limiter as it was.
// A changed rule gets a new limiter over the same counters: a key's usage
// carries over when the window is unchanged, while a changed window starts
// fresh, because window_ms is part of a counter's identity (the old
// windows are collected as usual). Leases of a rule that is removed or is
// no longer a concurrency rule are released. The rules hash, which every
// batch advertises, is updated.
func (c *Core) SetRules(rules []limiter.Rule) error {
	next := make(map[string]*limiter.Limiter, len(rules))
	normalised := make([]limiter.Rule, len(rules))
	for i, r := range rules {
		if _, dup := next[r.Name]; dup {
			return fmt.Errorf("%w: rule %q: name: defined twice", ErrInvalidConfig, r.Name)
		}
		if err := r.Normalize(); err != nil {
			return err
		}
		if old := c.limiters[r.Name]; old != nil && old.Rule().Hash() == r.Hash() {
			next[r.Name], normalised[i] = old, *old.Rule()
			continue
		}
		l, err := limiter.New(r, c.c, c.selfID) // as in NewCore
		if err != nil {
			return err
		}
		next[r.Name], normalised[i] = l, *l.Rule()
	}
	var dropped []*lease
	for _, ls := range c.leases.byID {
		if l := next[ls.rule]; l == nil || !l.Rule().Leased() {
			dropped = append(dropped, ls)
		}
	}
	sort.Slice(dropped, func(i, j int) bool { return dropped[i].id < dropped[j].id })
	for _, ls := range dropped {
		c.release(ls) // through the old limiter, which still holds the counter
	}
	c.limiters = next
	c.lastRule, c.lastLim = "", nil
	c.cfg.Rules = normalised
	c.rulesHash = limiter.HashRules(normalised)
	return nil
}

// Rules returns the core's normalised rules, in the order they were given.
func (c *Core) Rules() []limiter.Rule {
	return append([]limiter.Rule(nil), c.cfg.Rules...)
}

// RuleKeys is what a member holds for one rule: the keys (series) and
// the windows over all of them.
type RuleKeys struct {
	Rule    string
	Keys    int
	Windows int
}

// Keys returns, per rule and sorted by name, how many keys and windows
// this member holds (counted as they come and go: it walks no key).
func (c *Core) Keys() []RuleKeys {
	names := c.RuleNames()
	out := make([]RuleKeys, 0, len(names))
	for _, name := range names {
		set := c.limiters[name].Set()
		out = append(out, RuleKeys{Rule: name, Keys: set.Len(), Windows: set.Windows()})
	}
	return out
}

// keyCount counts the keys held over every rule set in the container.
func (c *Core) keyCount() int { return c.c.Keys() }
