package node

import (
	"time"

	"github.com/ratemesh/ratemesh/limiter"
)

// A stale view (docs/design.md, "What the margins assume"). The margins
// that let a majority reclaim a silent member's capacity assume that the
// member stops deciding before the majority reclaims it: it fences once it
// stops hearing them. Two things break that, and both are noticed here.
//
//   - The member's own process stalled (a pause, a frozen VM): its first
//     Tick after the stall turns the silent members suspect and fences,
//     but a decision may run before that Tick. Every decision path checks
//     the time since the last Tick (Core.env) and runs the membership
//     pass of a wake-up first (wake).
//   - Its batches stop reaching the others while it still hears them (an
//     overloaded host queueing its output, a one-way slow link): nothing
//     makes it fence, and the majority can reclaim it while it decides as
//     one of N. So every Tick it asks which of the members it hears have
//     acknowledged it lately (restale); when those that have not are half
//     the live members or more, its view is stale. Under strict it then
//     denies every decision (limiter.ReasonStale, like a fence); under
//     available it decides as if the others had spent their shares: its
//     limit is scaled to 1/N, and the denials that causes say stale.
//
// A member has acknowledged us lately if its acknowledgement watermark
// (Batch.Ack) is less than staleAfter behind ours, or it echoed our clock
// (a round trip, crdt.Echo) within that time. The watermark alone is not
// enough: it is the least over every member the peer holds alive, and
// once the peer turns us suspect, or evicts us, it moves on without us.
// A peer echoes only members it steps, each at least every n − 1 of its
// batches, so a peer that has echoed us before but not within
// (n − 1)·heartbeat + staleAfter no longer counts us, whatever its
// watermark says; and once stale, only an echo since clears a member
// (both while every live member understands echoes).

// staleState is whether this member's view is stale, since when, and
// what the last staleChange reported. The zero value is not stale.
type staleState struct {
	on      bool
	sinceMs int64 // our raw clock when it turned stale
	seen    bool  // on as of the last staleChange
	lagging int   // members heard lately that had not acknowledged us, as of restale
}

// StaleChange is a change of this member's view (Ready.Stale): Stale
// tells whether it turned stale or fresh again; Lagging members it hears
// had not acknowledged its batches lately, of Live members (self
// included).
type StaleChange struct {
	Stale         bool
	Lagging, Live int
}

// staleAfter is how long the members this member hears may leave its
// batches unacknowledged before its view is stale: two heartbeats (an
// idle peer acknowledges once a heartbeat, and its watermark may be a
// heartbeat old), two sync intervals and max_skew (delivery), and never
// more than suspect_after, after which the majority stops awaiting us.
func (c *MeshConfig) staleAfter() time.Duration {
	return min(2*c.Heartbeat+2*c.SyncInterval+c.MaxSkew, c.SuspectAfter)
}

// Stale reports whether this member's view is stale (see restale).
func (c *Core) Stale() bool { return c.stale.on }

// wake runs the membership pass of a Tick after a stall of this member's
// own at now: no member's silence counts from before it, and the members
// not heard for suspect_after turn suspect (under strict, this member
// fences if they are the majority). A decision that comes first after the
// stall runs it (Core.env), so it never decides on the membership of
// before the stall; the Tick then goes on as usual.
func (c *Core) wake(now time.Time) {
	c.members.wokeAt = now
	c.members.quietUntil = time.Time{}
	c.lastTick = now
	c.updateMembers(now)
	c.noteFence(now)
	c.restale(now)
}

// restale decides at now whether this member's view is stale: whether
// the members it heard within staleAfter that have not acknowledged it
// lately are half its live members or more. Members it has not heard
// lately are left to the membership rules (suspect, fence).
func (c *Core) restale(now time.Time) {
	ms := &c.members
	after := c.cfg.staleAfter()
	nowMs := now.UnixMilli()
	ourW := watermark(ms.order)
	afterMs := after.Milliseconds()
	// A member echoes each member it hears at least every n − 1 of its
	// batches, and sends one at least every heartbeat (meshClock).
	echoMs := int64(ms.n-1)*c.cfg.Heartbeat.Milliseconds() + afterMs
	lagging := 0
	if ms.n > 1 {
		for _, m := range ms.order {
			if m.state != Alive || m.evicted || now.Sub(m.lastHeard) >= after {
				continue
			}
			if !c.ackedBy(m, nowMs, ourW, afterMs, echoMs) {
				lagging++
			}
		}
	}
	on := ms.n > 1 && 2*lagging >= ms.n
	if on && !c.stale.on {
		c.stale.sinceMs = nowMs
	}
	c.stale.lagging = lagging
	if on != c.stale.on {
		c.stale.on = on
		c.regate()
	}
}

// ackedBy reports whether m has acknowledged this member lately, at our
// raw time nowMs: its watermark is less than afterMs behind ours (ourW),
// or it echoed our clock within afterMs; and, if it ever echoed our
// clock, it did so within echoMs, every member's longest gap between two
// echoes of one member it hears (while every live member understands
// echoes, and has for echoMs). Once stale, only an echo since the view
// turned stale counts.
//
// A watermark is the least over every member its author holds alive, so
// it lags for a member that fell silent to everyone (a partition), not
// only for us; ours lags with it then, and comparing the two leaves only
// what m has not heard of us. But a member that turned us suspect, or
// evicted us, moves its watermark on without us: only its echoes, which
// it sends only to members it steps, show that it still counts us. A
// member that has heard nobody yet (watermark 0) is not awaited.
func (c *Core) ackedBy(m *member, nowMs, ourW, afterMs, echoMs int64) bool {
	echoed := func(within int64) bool { return m.heardUsMs != 0 && nowMs-m.heardUsMs < within }
	// Echoes count once every member has had echoMs to echo us since
	// they became possible: a member of a release before FlagEcho that
	// just left leaves everyone's last echo as old as its stay.
	if c.clock.all(capEcho) && nowMs-c.clock.echoSinceMs >= echoMs {
		if c.stale.on {
			return m.heardUsMs > c.stale.sinceMs
		}
		if m.heardUsMs != 0 && !echoed(echoMs) {
			return false
		}
	}
	return m.ackW == 0 || ourW-m.ackW < afterMs || echoed(afterMs)
}

// staleChange returns the change of the view's staleness since the last
// call that returned one (initially: fresh), or nil.
func (c *Core) staleChange() *StaleChange {
	if c.stale.on != c.stale.seen {
		c.stale.seen = c.stale.on
		return &StaleChange{Stale: c.stale.on, Lagging: c.stale.lagging, Live: c.members.n}
	}
	return nil
}

// staleScale scales env to this member's share while its view is stale
// (under available; under strict it denies, see regate).
func (c *Core) staleScale(env *limiter.Env) {
	s := env.Scale
	if s == 0 {
		s = 1
	}
	env.Scale = s / float64(max(env.Members, 1))
}

// staleReason says stale for a denial made while the view is stale by
// the limit or the share that the stale scale narrowed.
func (c *Core) staleReason(d *limiter.Decision) {
	if c.stale.on && !d.Allowed && (d.Reason == limiter.ReasonLimit || d.Reason == limiter.ReasonShare) {
		d.Reason = limiter.ReasonStale
		d.RetryAfter = max(d.RetryAfter, c.cfg.Heartbeat)
	}
}
