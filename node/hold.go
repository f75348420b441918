package node

import (
	"time"

	"github.com/ratemesh/ratemesh/limiter"
)

// Share holds, the core's part (the runtime holds the requests:
// runtime_hold.go): how long a share denial is held (ShareWait), the
// window a held request's attempt counts in (WindowIndex), and deciding
// it again (Retry).

// ShareWait returns how long a share denial of rule is held: the rule's
// share_wait at this member's acknowledgement delay and the delay its
// batches' acknowledgements took lately (see limiter.Rule.ShareWaitFor),
// 0 for an unknown rule.
func (c *Core) ShareWait(rule string) time.Duration {
	l, err := c.limiter(rule)
	if err != nil {
		return 0
	}
	return l.Rule().ShareWaitFor(c.envBase.AckDelay, c.out.ackDelay())
}

// WindowIndex returns the index of rule's window at the local time now (0
// for a concurrency rule or an unknown one).
func (c *Core) WindowIndex(rule string, now time.Time) int64 {
	l, err := c.limiter(rule)
	if err != nil {
		return 0
	}
	return l.WindowIndex(c.MeshMs(now))
}

// Retry decides again, at now, a request of rule for key that Allow
// denied for its share and its owner holds (see limiter.Rule.ShareWait),
// and counts it if admitted. Its attempt counts once per window: counted
// is the window it counts in (WindowIndex at the first decision), and
// Retry returns it updated. Only admissions count in the stats.
func (c *Core) Retry(now time.Time, rule, key string, req limiter.Request, counted int64) (limiter.Decision, int64, error) {
	var d limiter.Decision
	err := c.retryAllow(&d, now, rule, key, &req, &counted)
	return d, counted, err
}

// retryAllow is Retry writing into *d and counted.
func (c *Core) retryAllow(d *limiter.Decision, now time.Time, rule, key string, req *limiter.Request, counted *int64) error {
	var s setup
	if err := c.setUp(&s, now, rule, key, req, false); err != nil {
		return err
	}
	if c.gated {
		*d = c.gate(&s, now)
		return nil
	}
	*d = s.l.Decide(s.ch, s.env)
	c.staleReason(d)
	if d.Reason != limiter.ReasonKeyCap {
		*counted = s.l.RecordRetry(s.ch, d.Allowed, s.env.NowMs, *counted)
	}
	if d.Allowed {
		c.count(d)
		c.noteRequest(s.l, d, req)
	}
	return nil
}
