package crdt

import "math"

// Where a series waits for Collect (Series.where; at most whereBits).
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
	// time: a dirty mark kept an expired window of it, or kept it with
	// nothing left, last time.
	inNext
	// isNew: the series is new and has no window yet: the next Collect
	// looks at it (and deletes it if it still has none and no lease
	// counts), unless a window queues it first.
	isNew
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
	fresh   []*Series           // new series, for the next Collect
	again   []*Series           // series a mark kept, for this round
	later   []*Series           // series a mark kept, for the next round
	behind  bool                // the last CollectSome left some due
	looked  uint64              // series looked at, for tests
	skipped uint64              // stale entries skipped, for tests
}

// push queues s in the bucket of time at.
func (q *expiryQueue) push(s *Series, at int64) {
	s.setWhere(inBucket) // at is s.due(nil): see queueWindow and collectSeries
	b, ok := q.buckets[at]
	if !ok {
		if q.buckets == nil {
			q.buckets = make(map[int64][]*Series)
		}
		q.heapPush(at)
	}
	q.buckets[at] = append(b, s)
}

// pushNew queues the new series s for the next Collect.
func (q *expiryQueue) pushNew(s *Series) {
	s.setWhere(isNew)
	q.fresh = append(q.fresh, s)
}

// pushLater queues s, which a mark kept, for the next round: the next
// Collect that is not one finishing what a bounded one left (so that calls
// at one time end).
func (q *expiryQueue) pushLater(s *Series) {
	s.setWhere(inNext)
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

// staleCost is how many stale entries a bounded Collect skips for one
// series it may look at: skipping one reads a word of the series, where
// looking at it walks its windows and may delete it from a map. A series
// leaves a stale entry when a window moves it to an earlier bucket, and a
// new one when it gets its first window after another series was made,
// so skipping them must not hold back the collection of the keys that did
// expire.
const staleCost = 16

// queueWindow makes sure the new window w of s is found by Collect when it
// becomes collectable.
func (c *Container) queueWindow(s *Series, w *Window) {
	at := w.CollectAt()
	switch s.where() {
	case isNew:
		// With a window the series need not be looked at before the
		// window expires. Its entry for the next Collect turns stale; it
		// is mostly the last one (a key is made to hold a window at
		// once), and then goes, so a burst of new keys leaves nothing to
		// skip.
		if q := &c.expiry; len(q.fresh) > 0 && q.fresh[len(q.fresh)-1] == s {
			q.fresh[len(q.fresh)-1] = nil
			q.fresh = q.fresh[:len(q.fresh)-1]
		}
		c.expiry.push(s, at)
	case notQueued:
		c.expiry.push(s, at)
	case inBucket:
		if at < s.due(w) {
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
// series (any number if most < 0; a stale entry skipped counts 1/16 of
// one), earliest due first, and reports whether some due at nowMs are
// left. Calls that leave some are a round with the next calls, up to one
// that leaves none: the round does what one Collect at that call's time
// would have (but for marks taken during the round: a series a dirty mark
// kept is looked at again in the next round, not in this one, so that a
// round at one time ends), reaching the series in the same order in every
// run that does the same things.
//
// The series it looks at are those made or kept by a dirty mark since the
// last round that have no window queued, and those that have a window
// whose CollectAt is at or before nowMs. Every other series has no
// expired window and at least one window, so Collect would change nothing
// in it.
func (c *Container) CollectSome(nowMs int64, most int) (dropped int, more bool) {
	q := &c.expiry
	if !q.behind {
		// A new round: the series kept last round are looked at again.
		q.again = append(q.again, q.later...)
		clear(q.later)
		q.later = q.later[:0]
	}
	left := math.MaxInt
	if most >= 0 {
		left = most * staleCost
	}
	var n int
	n, q.again = c.collectList(q.again, inNext, nowMs, &left)
	dropped += n
	n, q.fresh = c.collectList(q.fresh, isNew, nowMs, &left)
	dropped += n
	for left > 0 && q.due(nowMs) {
		at := q.times[0]
		b := q.buckets[at]
		j := 0
		for ; j < len(b) && left > 0; j++ {
			s := b[j]
			b[j] = nil
			if s.where() == inBucket && s.due(nil) == at {
				left -= q.spend(true)
				dropped += c.collectSeries(s, nowMs)
			} else {
				left -= q.spend(false)
			}
		}
		if j < len(b) {
			q.buckets[at] = b[j:]
			break
		}
		delete(q.buckets, at)
		q.heapPop()
	}
	q.behind = len(q.again) > 0 || len(q.fresh) > 0 || q.due(nowMs)
	return dropped, q.behind
}

// collectList looks at the series of list still waiting there (where),
// while left lasts, and returns the windows dropped and what is left of
// the list.
func (c *Container) collectList(list []*Series, where uint8, nowMs int64, left *int) (int, []*Series) {
	dropped, i := 0, 0
	for ; i < len(list) && *left > 0; i++ {
		s := list[i]
		list[i] = nil
		if s.where() == where {
			*left -= c.expiry.spend(true)
			dropped += c.collectSeries(s, nowMs)
		} else {
			*left -= c.expiry.spend(false)
		}
	}
	switch {
	case i < len(list):
		return dropped, list[i:]
	case cap(list) > 1024:
		return dropped, nil // a burst of new keys is over: free its array
	}
	return dropped, list[:0]
}

// spend counts an entry taken from the queue and returns its cost to a
// bounded Collect's budget.
func (q *expiryQueue) spend(live bool) int {
	if live {
		q.looked++
		return staleCost
	}
	q.skipped++
	return 1
}

// collectSeries drops s's windows expired at nowMs and not dirty, deletes
// s from its rule if nothing is left of it, else queues it again, and
// returns how many windows it dropped.
func (c *Container) collectSeries(s *Series, nowMs int64) int {
	ws := s.Windows()
	kept := ws[:0]
	earliest, again := int64(math.MaxInt64), false
	for _, w := range ws {
		if w.Expired(nowMs) {
			if !w.Dirty() {
				continue
			}
			again = true // dropped once its mark is taken
		} else {
			earliest = min(earliest, w.CollectAt())
		}
		kept = append(kept, w)
	}
	dropped := len(ws) - len(kept)
	s.rule.windows -= dropped
	clear(ws[len(kept):])
	s.setWindows(kept)
	noLeases := !s.hasLeases() || s.Leases().P.Len() == 0 && s.Leases().N.Len() == 0
	switch {
	case len(kept) == 0 && noLeases && !s.leasesDirty():
		s.rule.keys.del(s.Key)
		c.keys--
		c.charged[s.charge]--
		s.setWhere(gone)
	case again || (len(kept) == 0 && noLeases):
		c.expiry.pushLater(s)
	case len(kept) > 0:
		c.expiry.push(s, earliest)
	default:
		s.setWhere(notQueued)
	}
	return dropped
}
