package crdt

import "math"

// Where a series waits for Collect (Series.where).
const (
	// notQueued: the series is in no queue. It has no window, and its
	// lease counter holds a value, so it is kept for good until a window
	// is added (which queues it).
	notQueued uint8 = iota
	// inBucket: the series waits in the bucket of Series.due, the earliest
	// time one of its windows becomes collectable (CollectAt). Older
	// entries of it in later buckets are stale and skipped.
	inBucket
	// inNext: the series is looked at by the next Collect whatever the
	// time: it is new (it may have no window at all), or a dirty mark
	// kept an expired window or an empty series last time.
	inNext
	// gone: Collect deleted the series from its rule.
	gone
)

// expiryQueue holds every series that Collect may have to look at, so that
// a Collect touches the series whose windows may have expired and no
// other. Each series with a window waits in the bucket of the earliest
// CollectAt of its windows; Collect pops the buckets due, looks at each
// series once, drops what expired and queues the series again at the
// earliest CollectAt of the windows left. A window added to a series
// before that time moves it to an earlier bucket, and its old entry turns
// stale (Series.due no longer names the bucket).
//
// Every order here is the order of pushes and of bucket times, never a
// map's, so what a bounded Collect reaches first is the same in every run
// that does the same things.
type expiryQueue struct {
	times   []int64             // min-heap of the times of non-empty buckets
	buckets map[int64][]*Series // by time; each in push order
	next    []*Series           // series for the next Collect, in push order
	later   []*Series           // series a mark kept, for the Collect after this one
	behind  bool                // the last CollectSome left some due
	looked  uint64              // entries taken from the queue, stale or not (for tests)
}

// push queues s in the bucket of time at.
func (q *expiryQueue) push(s *Series, at int64) {
	s.where, s.due = inBucket, at
	b, ok := q.buckets[at]
	if !ok {
		if q.buckets == nil {
			q.buckets = make(map[int64][]*Series)
		}
		q.heapPush(at)
	}
	q.buckets[at] = append(b, s)
}

// pushNext queues the new series s for the next Collect.
func (q *expiryQueue) pushNext(s *Series) {
	s.where = inNext
	q.next = append(q.next, s)
}

// pushLater queues s, which a mark kept, for the next Collect that is not
// one finishing what a bounded one left: calls at the same time must end.
func (q *expiryQueue) pushLater(s *Series) {
	s.where = inNext
	q.later = append(q.later, s)
}

// due reports whether a bucket is due at nowMs.
func (q *expiryQueue) due(nowMs int64) bool { return len(q.times) > 0 && q.times[0] <= nowMs }

func (q *expiryQueue) heapPush(t int64) {
	h := append(q.times, t)
	i := len(h) - 1
	for i > 0 {
		p := (i - 1) / 2
		if h[p] <= h[i] {
			break
		}
		h[p], h[i] = h[i], h[p]
		i = p
	}
	q.times = h
}

func (q *expiryQueue) heapPop() {
	h := q.times
	n := len(h) - 1
	h[0] = h[n]
	h = h[:n]
	i := 0
	for {
		l, small := 2*i+1, i
		if l < n && h[l] < h[small] {
			small = l
		}
		if r := l + 1; r < n && h[r] < h[small] {
			small = r
		}
		if small == i {
			break
		}
		h[i], h[small] = h[small], h[i]
		i = small
	}
	q.times = h
}

// queueWindow makes sure the new window w of s is found by Collect when it
// becomes collectable.
func (c *Container) queueWindow(s *Series, w *Window) {
	at := w.CollectAt()
	switch s.where {
	case notQueued:
		c.expiry.push(s, at)
	case inBucket:
		if at < s.due {
			c.expiry.push(s, at)
		}
	}
	// inNext: the next Collect looks at every window of s and queues it
	// by them. gone: s is no longer its rule's; nothing finds it again.
}

// Collect drops every window that is Expired at nowMs, and every series left
// with no window and no lease counts, and returns how many windows it
// dropped. Dead and departed members' counts keep counting until their
// windows are collected like everyone else's. A series whose lease counter
// ever held a value is kept, because the owner's slot must never restart
// from zero while peers remember a larger value. A window marked dirty
// (and a series whose lease counter is) is kept until its mark is taken.
//
// Its work is in proportion to the series it finds due (see
// CollectSome), not to the series held.
func (c *Container) Collect(nowMs int64) int {
	dropped, _ := c.CollectSome(nowMs, -1)
	return dropped
}

// CollectSome does what Collect does, but looks at no more than most
// series (any number if most < 0), earliest due first, and reports
// whether some due at nowMs are left for the next call. A call that
// leaves none has done exactly what Collect(nowMs) would have; calls that
// do leave some reach the rest, in the same order, on the next calls.
//
// The series it looks at are those new or kept by a dirty mark since the
// last call, and those that have a window whose CollectAt is at or
// before nowMs. Every other series has no expired window and at least
// one window, so Collect would change nothing in it.
func (c *Container) CollectSome(nowMs int64, most int) (dropped int, more bool) {
	q := &c.expiry
	if !q.behind {
		q.next = append(q.next, q.later...)
		clear(q.later)
		q.later = q.later[:0]
	}
	dropped, q.behind = c.collectSome(nowMs, most)
	return dropped, q.behind
}

func (c *Container) collectSome(nowMs int64, most int) (dropped int, more bool) {
	q := &c.expiry
	left := most
	next := q.next
	q.next = nil
	i := 0
	for ; i < len(next) && left != 0; i++ {
		s := next[i]
		next[i] = nil
		left--
		q.looked++
		if s.where == inNext {
			dropped += c.collectSeries(s, nowMs)
		}
	}
	if i < len(next) {
		q.next = append(next[i:], q.next...)
		return dropped, true
	}
	for left != 0 && q.due(nowMs) {
		at := q.times[0]
		b := q.buckets[at]
		j := 0
		for ; j < len(b) && left != 0; j++ {
			s := b[j]
			b[j] = nil
			left--
			q.looked++
			if s.where == inBucket && s.due == at {
				dropped += c.collectSeries(s, nowMs)
			}
		}
		if j < len(b) {
			q.buckets[at] = b[j:]
			return dropped, true
		}
		delete(q.buckets, at)
		q.heapPop()
	}
	return dropped, q.due(nowMs)
}

// collectSeries drops s's windows expired at nowMs and not dirty, deletes
// s from its rule if nothing is left of it, else queues it again, and
// returns how many windows it dropped.
func (c *Container) collectSeries(s *Series, nowMs int64) int {
	kept := s.Windows[:0]
	earliest, again := int64(math.MaxInt64), false
	for _, w := range s.Windows {
		if w.Expired(nowMs) {
			if !w.dirty {
				continue
			}
			again = true // dropped once its mark is taken
		} else {
			earliest = min(earliest, w.CollectAt())
		}
		kept = append(kept, w)
	}
	dropped := len(s.Windows) - len(kept)
	for i := len(kept); i < len(s.Windows); i++ {
		s.Windows[i] = nil
	}
	s.Windows = kept
	if dropped > 0 {
		s.last = nil
	}
	noLeases := s.Leases.P.Len() == 0 && s.Leases.N.Len() == 0
	switch {
	case len(kept) == 0 && noLeases && !s.leasesDirty:
		delete(s.rule.keys, s.Key)
		s.where = gone
	case again || (len(kept) == 0 && noLeases):
		c.expiry.pushLater(s)
	case len(kept) > 0:
		c.expiry.push(s, earliest)
	default:
		s.where = notQueued
	}
	return dropped
}
