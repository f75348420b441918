package simulator

import "time"

// skewFromStart applies the skew events at 0s before the initial nodes
// start: their clocks are off from the start, the cores are created on
// their skewed clocks and the initial full-state exchange carries them, so
// every core estimates its offset to the mesh at its first Tick. (Applied
// at 0s after the mesh formed instead, every clock would jump at once and
// the first window would open on the old estimates.) Such events are not
// queued again (see newSim).
func (s *sim) skewFromStart() {
	for k := range s.sc.Events {
		e := &s.sc.Events[k]
		if !skewsFromStart(e) {
			continue
		}
		for _, i := range e.Nodes {
			if i >= s.sc.Nodes {
				s.skipped++
				continue
			}
			s.nodes[i].skewNs = s.drawSkew(e)
		}
	}
}

// skewsFromStart reports whether e is a skew event that skewFromStart
// applies.
func skewsFromStart(e *Event) bool { return e.Kind == EvSkew && e.At == 0 }

// drawSkew returns a skew event's offset for one node: By, or a uniform
// whole-millisecond draw within ±Spread.
func (s *sim) drawSkew(e *Event) int64 {
	if e.HasBy {
		return int64(e.By)
	}
	ms := e.Spread.Milliseconds()
	return (s.rng.Int64N(2*ms+1) - ms) * int64(time.Millisecond)
}
