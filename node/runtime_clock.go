package node

import (
	"time"
)

// The decision clock. Reading Clock costs 50 to 100 ns on many virtual
// machines, as much as a decision itself, so at high rates decisions share
// readings: once the last tick interval saw at least fastRate decisions per
// second, up to shareReadings decisions in a row take the same reading. A
// decision is then late by at most the time shareReadings decisions take —
// about a millisecond at fastRate, microseconds above — and never by more
// than SyncInterval, after which the next tick reads Clock again. Below
// fastRate every decision reads Clock. Readings are taken under mu, so the
// core never sees time go backwards unless Clock does.
const (
	fastRate      = 50_000 // decisions per second
	shareReadings = 64
)

// readClock reads Clock for the core. mu must be held.
func (n *Node) readClock() time.Time {
	n.last, n.shared = n.clock(), 0
	return n.last
}

// decisionTime returns the time of one decision, and tells the run loop
// that the decision may leave a change to publish. mu must be held. Its
// common path is small enough to inline.
func (n *Node) decisionTime() time.Time {
	n.decisions++
	if n.shared < n.share && n.pubArmed {
		n.shared++
		return n.last
	}
	return n.decisionTimeSlow()
}

// decisionTimeSlow is the rest of decisionTime, kept out of line so that
// decisionTime inlines: it wakes the run loop unless it is woken already,
// and reads Clock unless the decision may share the last reading.
//
//go:noinline
func (n *Node) decisionTimeSlow() time.Time {
	if !n.pubArmed {
		n.armPublish()
	}
	if n.shared < n.share {
		n.shared++
		return n.last
	}
	return n.readClock()
}

// retune switches shared readings on or off by the decision rate since
// the last tick at now. mu must be held.
func (n *Node) retune(now time.Time) {
	if el := now.Sub(n.lastTick); el > 0 {
		n.share = 0
		if float64(n.decisions) >= fastRate*el.Seconds() {
			n.share = shareReadings - 1
		}
		n.decisions, n.lastTick = 0, now
	}
}
