package node

import (
	"fmt"

	"github.com/ratemesh/ratemesh/limiter"
)

// Reload replaces the running member's rules (see Core.SetRules): all or
// nothing, effective for the next decision. Merging rule by rule, so that
// an invalid rule keeps its old version, is the caller's part (package
// config).
func (n *Node) Reload(rules []limiter.Rule) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return ErrClosed
	}
	before := n.core.RulesHash()
	if err := n.core.SetRules(rules); err != nil {
		return err
	}
	n.log.Info("rules reloaded", "rules", len(rules), "rules_hash", fmt.Sprintf("%016x", n.core.RulesHash()), "previous_hash", fmt.Sprintf("%016x", before))
	return nil
}

// Rules returns the member's normalised rules.
func (n *Node) Rules() []limiter.Rule {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.core.Rules()
}

// RulesHash returns the hash of the member's rules, as its batches
// advertise it.
func (n *Node) RulesHash() uint64 {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.core.RulesHash()
}

// Keys returns how many keys and windows the member holds per rule (see
// Core.Keys); nil after Close.
func (n *Node) Keys() []RuleKeys {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return nil
	}
	return n.core.Keys()
}
