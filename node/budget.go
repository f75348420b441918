package node

import "github.com/ratemesh/ratemesh/limiter"

// The publish budget (docs/design.md, "What a kill loses"). A member
// publishes its admissions in batches, so a SIGKILL loses what it admitted
// since its last batch: the others never learn of it, and the window goes
// over by that much. On a busy host the batches come late and that grows
// with the load. So the core counts, per rule, the credits admitted since
// the last batch, and once one rule's count reaches its budget —
// MeshConfig.PublishBudget of the member's share, limit / live members —
// OverBudget tells the runtime to publish (Core.Flush) before it answers
// the decision that reached it. Every decision answered without a publish
// left the count below the budget, so a kill loses less than the budget
// of answered admissions, per rule, whatever the load. (It published past
// the budget once, so a unit-cost request over it was answered unpublished
// too: a SIGKILL in a rolling restart of 5 processes under two busy loops
// took a window to 1021 of 1000, the budget of 20 plus that one.) The
// simulator publishes on its ticks and leading edges and does not consult
// it.

// unpublished is the credits of one rule admitted since the last batch
// (credits), and those in batches built but not yet handed to the
// Transport (built: a batch is built under the node's mutex and published
// after it is released, and a kill in between loses it too).
type unpublished struct {
	credits uint64
	built   uint64
}

// noteRequest is noteAdmitted for a decision on req.
func (c *Core) noteRequest(l *limiter.Limiter, d *limiter.Decision, req *limiter.Request) {
	if !d.Allowed || c.cfg.publishBudget() == 0 {
		return
	}
	cost, err := l.Rule().CostOf(*req)
	if err != nil {
		return
	}
	c.noteAdmitted(l, d, cost)
}

// noteAdmitted counts an admission of cost credits of l's rule towards
// its budget. Only admissions that count against the limit count: shadow
// admissions and unlimited classes do not.
func (c *Core) noteAdmitted(l *limiter.Limiter, d *limiter.Decision, cost uint64) {
	f := c.cfg.publishBudget()
	if f == 0 || !d.Allowed || d.Shadow || d.Reason != limiter.ReasonAdmitted {
		return
	}
	u := c.unpub[l]
	if u == nil {
		if c.unpub == nil {
			c.unpub = make(map[*limiter.Limiter]*unpublished)
		}
		u = &unpublished{}
		c.unpub[l] = u
	}
	u.credits += cost
	if c.reaches(l, u.credits+u.built) {
		c.overBudget = true
	}
}

// reaches reports whether credits reach l's rule's publish budget: the
// configured fraction of the member's share.
func (c *Core) reaches(l *limiter.Limiter, credits uint64) bool {
	return float64(credits) >= c.cfg.publishBudget()*float64(l.Rule().Limit)/float64(max(c.members.n, 1))
}

// OverBudget reports whether some rule's credits admitted and not handed
// to the Transport — since the last batch, or in batches built and not
// yet Handed — reach its publish budget: the runtime publishes (Flush)
// before it answers, and when a batch is on its way already, waits for it.
func (c *Core) OverBudget() bool { return c.overBudget }

// Handed tells the core that the batches it built so far (the Messages of
// the Readies taken) are handed to the Transport: their credits leave the
// budgets. A runtime that consults OverBudget calls it after publishing,
// before it lets anyone else build; one that does not (the simulator)
// needs not.
func (c *Core) Handed() {
	c.overBudget = false
	for l, u := range c.unpub {
		u.built = 0
		if c.reaches(l, u.credits) {
			c.overBudget = true
		}
	}
}

// builtBudgets moves the credits admitted so far into the batch being
// built (flush): they count against the budget until Handed.
func (c *Core) builtBudgets() {
	for _, u := range c.unpub {
		u.built += u.credits
		u.credits = 0
	}
	c.overBudget = false
}
