package node

import (
	"sort"
	"time"

	"github.com/ratemesh/ratemesh/crdt"
	"github.com/ratemesh/ratemesh/limiter"
)

// Decisions (docs/design.md, "The decision rule"). Each member counts its
// own admissions in its own CRDT slot and admits a request of cost c iff
//
//	P + N·(u + c) ≤ L
//
// where u is its own usage that not every alive member has acknowledged
// yet, P the merged usage minus u, N the live members and L the limit
// (scaled by alive/(alive+suspect) under the strict partition policy); the
// limiter package does the math, given the membership as a limiter.Env. A
// member that is joining or fenced denies every decision (gate).

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

// env returns the limiter.Env a decision under l takes at now (setUp's
// second half). Every decision path takes it before it looks at gated:
// after a stall of this member's own (no Tick for suspect_after) it runs
// the wake-up's membership pass first, so no decision uses the
// membership of before the stall (see stale.go); while the view is stale
// under available, the limit is scaled to this member's share; and
// unless the member is gated, a reclaim keeps its scale for the windows
// of l's rule that began before it (reclaimScale).
func (c *Core) env(now time.Time, l *limiter.Limiter) limiter.Env {
	if now.Sub(c.lastTick) >= c.cfg.SuspectAfter && !c.lastTick.IsZero() && !c.closed {
		c.wake(now)
	}
	e := c.envBase
	e.NowMs = c.MeshMs(now)
	if c.stale.on {
		c.staleScale(&e)
	}
	if !c.gated && c.reclaimScale.fromMs != 0 {
		c.reclaimScale.apply(l.Rule(), &e)
	}
	return e
}

// setup is a request made ready to decide (Core.setUp).
type setup struct {
	l   *limiter.Limiter
	ch  limiter.Check
	env limiter.Env // with a reclaim's scale applied, unless gated
}

// setUp is the set-up every decision shares: it looks up rule's limiter,
// resolves key and req (for a lease: key and req.Class) and takes the
// env at now, a reclaim's scale included (env). A gated member decides
// nothing: its caller answers c.gate(s, now). Allow's hot path takes
// the look-up and the env alone, and lets Limiter.AllowInto resolve the
// request as it decides it.
func (c *Core) setUp(s *setup, now time.Time, rule, key string, req *limiter.Request, lease bool) error {
	if err := c.resolve(s, rule, key, req, lease); err != nil {
		return err
	}
	s.env = c.env(now, s.l)
	return nil
}

// resolve is setUp's first half: the limiter and the resolved check.
func (c *Core) resolve(s *setup, rule, key string, req *limiter.Request, lease bool) error {
	l, err := c.limiter(rule)
	if err != nil {
		return err
	}
	s.l = l
	if lease {
		s.ch, err = l.ResolveLease(key, req.Class)
	} else {
		s.ch, err = l.Resolve(key, *req)
	}
	return err
}

func (c *Core) limiter(rule string) (*limiter.Limiter, error) {
	if l := c.lookupLimiter(rule); l != nil {
		return l, nil
	}
	return nil, unknownRule(rule)
}

// lookupLimiter returns the limiter of rule, or nil. Requests mostly name
// the rule of the request before, and a batch's entries the rule of the
// entry before: compare the name before hashing it (SetRules clears the
// cache).
func (c *Core) lookupLimiter(rule string) *limiter.Limiter {
	if c.lastLim != nil && rule == c.lastRule {
		return c.lastLim
	}
	l := c.limiters[rule]
	if l != nil {
		c.lastRule, c.lastLim = rule, l
	}
	return l
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
// hot path (see limiter.Limiter.AllowInto). It takes setUp's steps with
// the request resolved last, by AllowInto as it decides it (a Limiter that
// resolved apart from deciding was 9 % slower in BenchmarkAllow).
func (c *Core) allowInto(d *limiter.Decision, now time.Time, rule, key string, req *limiter.Request) error {
	l, err := c.limiter(rule)
	if err != nil {
		*d = limiter.Decision{}
		return err
	}
	env := c.env(now, l)
	if c.gated {
		s := setup{l: l, env: env}
		if s.ch, err = l.Resolve(key, *req); err != nil {
			*d = limiter.Decision{}
			return err
		}
		*d = c.gate(&s, now)
		return nil
	}
	// Limiter.AllowInto resolves, decides and records in one pass,
	// finding the key's window once.
	if err := l.AllowInto(d, key, req, &env); err != nil {
		return err
	}
	c.staleReason(d)
	c.count(d)
	c.noteRequest(l, d, req)
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
func (c *Core) gate(s *setup, now time.Time) limiter.Decision {
	d := s.l.Rule().Decide(s.ch.Limit, 0, limiter.Usage{}, s.env, 0)
	d.Allowed, d.Shadow, d.Remaining = false, false, 0
	switch {
	case !c.join.joined:
		d.Reason = limiter.ReasonJoining
		d.RetryAfter = max(c.join.left(now, c.cfg.JoinTimeout), time.Millisecond)
	case c.members.fenced:
		d.Reason = limiter.ReasonFenced
		d.RetryAfter = c.cfg.Heartbeat
	default:
		d.Reason = limiter.ReasonStale
		d.RetryAfter = c.cfg.Heartbeat
	}
	d.RetryAfter = (d.RetryAfter + time.Millisecond - 1) / time.Millisecond * time.Millisecond
	c.count(&d)
	return d
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
	// setUp in its two halves: every check resolved before any env.
	ss := make([]setup, len(checks))
	for i := range checks {
		if err := c.resolve(&ss[i], checks[i].Rule, checks[i].Key, &checks[i].Request, false); err != nil {
			return false, nil, &CheckError{Index: i, Err: err}
		}
	}
	ds = make([]limiter.Decision, len(checks))
	allowed = true
	for i := range checks {
		s := &ss[i]
		s.env = c.env(now, s.l)
		if c.gated {
			ds[i] = c.gate(s, now)
		} else {
			ds[i] = s.l.Decide(s.ch, s.env)
			c.staleReason(&ds[i])
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
		s := &ss[i]
		switch {
		case ds[i].Reason == limiter.ReasonKeyCap:
		case counted == nil:
			s.l.Record(s.ch, allowed, s.env.NowMs)
			if allowed {
				c.noteRequest(s.l, &ds[i], &checks[i].Request)
			}
		default:
			counted[i] = s.l.RecordRetry(s.ch, allowed, s.env.NowMs, counted[i])
			if allowed {
				c.count(&ds[i])
				c.noteRequest(s.l, &ds[i], &checks[i].Request)
			}
		}
		if !allowed && ds[i].Allowed {
			// It would have passed alone; as part of the whole it did not.
			ds[i].Allowed = false
			ds[i].Remaining = min(ds[i].Remaining+s.ch.Cost, ds[i].Limit)
		}
	}
	return allowed, ds, nil
}

// Earliest returns how long from now until the request could first be
// admitted as far as this member can tell (0 if now), or limiter.Never.
// Wait sleeps this long between attempts.
func (c *Core) Earliest(now time.Time, rule, key string, req limiter.Request) (time.Duration, error) {
	var s setup
	if err := c.setUp(&s, now, rule, key, &req, false); err != nil {
		return 0, err
	}
	if !c.join.joined {
		return max(c.join.left(now, c.cfg.JoinTimeout), 0), nil
	}
	if c.gated {
		return c.cfg.Heartbeat, nil
	}
	return s.l.Earliest(s.ch, s.env), nil
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
	return c.usage(now, rule, key, nil)
}

// UsageOfWindow reports the merged usage of (rule, key) in the rule's
// window of index window rather than the current one: what this member
// still holds of it (a window is collected two windows after it ends). For
// a concurrency rule, which has no windows, it is Usage. Reading the
// window before the current one gives each member's final count of it, so
// a test or a harness can count what the mesh admitted in a window at the
// servers.
func (c *Core) UsageOfWindow(now time.Time, rule, key string, window int64) (UsageReport, error) {
	return c.usage(now, rule, key, &window)
}

func (c *Core) usage(now time.Time, rule, key string, window *int64) (UsageReport, error) {
	l, err := c.limiter(rule)
	if err != nil {
		return UsageReport{}, err
	}
	r := l.Rule()
	rep := UsageReport{Rule: rule, Key: key, WindowMs: r.WindowMs(), QuotaMs: r.QuotaMs()}
	s := l.Set().Series(key)
	if r.Leased() {
		if s != nil {
			rep.Total = uint64(s.Leases().ValueWhere(c.liveSlot))
			s.Leases().P.Each(func(id crdt.SlotID, p uint64) {
				if !c.liveSlot(id) {
					return
				}
				sl := c.slots.Slot(id)
				n := s.Leases().N.Get(id)
				rep.Slots = append(rep.Slots, SlotUsage{Peer: sl.Peer, Incarnation: sl.Incarnation, Admitted: p - min(n, p), Attempted: p})
			})
		}
	} else {
		nowMs := c.MeshMs(now)
		rep.Window = nowMs / rep.WindowMs
		if window != nil {
			rep.Window = *window
		}
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
