package crdt

import "hash/maphash"

// Bounds of a keyTable's segments.
const (
	// segMax is the most slots a segment holds: a full one splits in two
	// rather than doubling, so that an insertion rehashes at most segMax
	// series, whatever the table holds (a million keys never stall a
	// decision on one rehash of them all).
	segMax = 1024
	// segMin is the slots a new table's one segment starts with.
	segMin = 8
	// depthMax bounds the bits of the hash a segment's keys share: a
	// segment that deep doubles instead of splitting (only keys whose
	// hashes agree on 48 bits would take it there).
	depthMax = 48
)

// keyTable is a rule's series by key: a hash table of *Series that keeps
// each key once, in its series, where a map[string]*Series keeps the
// key's string header again in every slot (24 bytes a slot against 9
// here: a pointer and a tag byte).
//
// It is extendible hashing over open-addressing segments: the top bits of
// a key's hash pick an entry of the directory, which points to a segment;
// a segment probes linearly from the hash's low bits, comparing tag bytes
// (seven more bits of the hash, and a bit that says the slot is used)
// before it reads a series' key. A segment is at most seven eighths
// full: one below segMax slots doubles, a full one splits in two by the
// next bit of the hash, doubling the directory when it must. A deletion
// shifts the entries after it back, so there are no tombstones.
//
// Its order is that of the hashes, which are seeded per table at random
// (as a map's are, against keys chosen to collide): callers that need a
// deterministic order sort.
type keyTable struct {
	seed  maphash.Seed
	dir   []*keySeg // 1 << depth entries
	depth uint8     // bits of the hash that pick a directory entry
	n     int
	// last is the series get found or put added last: a hot key is
	// found again without hashing it. del clears it.
	last *Series
}

// keySeg is one segment: len(slots) is a power of two; tags[i] is 0 for
// an empty slot, else 0x80 | seven bits of the hash of slots[i].Key.
type keySeg struct {
	slots []*Series
	tags  []uint8
	n     int
	depth uint8 // the directory entries pointing here share this many top bits
}

func newKeyTable() keyTable {
	return keyTable{
		seed: maphash.MakeSeed(),
		dir:  []*keySeg{{slots: make([]*Series, segMin), tags: make([]uint8, segMin)}},
	}
}

func (t *keyTable) hash(key string) uint64 { return maphash.String(t.seed, key) }

// seg returns the segment of hash h.
func (t *keyTable) seg(h uint64) *keySeg {
	if t.depth == 0 {
		return t.dir[0]
	}
	return t.dir[h>>(64-t.depth)]
}

// tagOf returns the tag of hash h: bits the directory (the top ones, up
// to about 30 for a billion keys) and the slot index (the low ones, at
// most 10) do not use.
func tagOf(h uint64) uint8 { return 0x80 | uint8(h>>24)&0x7f }

// get returns the series of key, or nil.
func (t *keyTable) get(key string) *Series {
	if e := t.last; e != nil && e.Key == key {
		return e
	}
	return t.find(key)
}

// find is get without the last series.
func (t *keyTable) find(key string) *Series {
	h := t.hash(key)
	s := t.seg(h)
	mask := len(s.slots) - 1
	tag := tagOf(h)
	for i := int(h) & mask; ; i = (i + 1) & mask {
		switch s.tags[i] {
		case 0:
			return nil
		case tag:
			if e := s.slots[i]; e.Key == key {
				t.last = e
				return e
			}
		}
	}
}

// put adds e, whose key the table does not hold.
func (t *keyTable) put(e *Series) {
	h := t.hash(e.Key)
	s := t.seg(h)
	if 8*(s.n+1) > 7*len(s.slots) {
		t.grow(s, h)
		s = t.seg(h)
	}
	s.insert(e, h)
	t.n++
	t.last = e
}

func (s *keySeg) insert(e *Series, h uint64) {
	mask := len(s.slots) - 1
	i := int(h) & mask
	for s.tags[i] != 0 {
		i = (i + 1) & mask
	}
	s.slots[i], s.tags[i] = e, tagOf(h)
	s.n++
}

// grow makes room in s, the segment of hash h: it doubles s below segMax
// slots (or at depthMax), and otherwise splits it.
func (t *keyTable) grow(s *keySeg, h uint64) {
	if len(s.slots) < segMax || s.depth >= depthMax {
		old := *s
		s.slots, s.tags, s.n = make([]*Series, 2*len(old.slots)), make([]uint8, 2*len(old.tags)), 0
		for i, e := range old.slots {
			if old.tags[i] != 0 {
				s.insert(e, t.hash(e.Key))
			}
		}
		return
	}
	if s.depth == t.depth {
		// Every entry splits in two, pointing where it pointed.
		dir := make([]*keySeg, 2*len(t.dir))
		for i, d := range t.dir {
			dir[2*i], dir[2*i+1] = d, d
		}
		t.dir, t.depth = dir, t.depth+1
	}
	// s's entries share its top depth bits; the next bit parts them.
	bit := 63 - s.depth
	lo := &keySeg{slots: make([]*Series, len(s.slots)), tags: make([]uint8, len(s.tags)), depth: s.depth + 1}
	hi := &keySeg{slots: make([]*Series, len(s.slots)), tags: make([]uint8, len(s.tags)), depth: s.depth + 1}
	for i, e := range s.slots {
		if s.tags[i] != 0 {
			eh := t.hash(e.Key)
			if eh>>bit&1 == 0 {
				lo.insert(e, eh)
			} else {
				hi.insert(e, eh)
			}
		}
	}
	// The directory entries that pointed to s are a run of 1 << (depth −
	// s.depth) starting at h's top s.depth bits followed by zeros: the
	// first half goes to lo, the second to hi.
	run := 1 << (t.depth - s.depth)
	first := int(h>>(64-t.depth)) &^ (run - 1)
	for i := range run {
		if i < run/2 {
			t.dir[first+i] = lo
		} else {
			t.dir[first+i] = hi
		}
	}
}

// del removes key's series, if held.
func (t *keyTable) del(key string) {
	if t.last != nil && t.last.Key == key {
		t.last = nil
	}
	h := t.hash(key)
	s := t.seg(h)
	mask := len(s.slots) - 1
	tag := tagOf(h)
	i := int(h) & mask
	for {
		switch s.tags[i] {
		case 0:
			return
		case tag:
			if s.slots[i].Key == key {
				s.remove(i, t)
				t.n--
				return
			}
		}
		i = (i + 1) & mask
	}
}

// remove empties slot i and shifts back the entries after it that
// probed past it, so that every entry stays reachable from its home slot
// without a tombstone.
func (s *keySeg) remove(i int, t *keyTable) {
	mask := len(s.slots) - 1
	for j := (i + 1) & mask; s.tags[j] != 0; j = (j + 1) & mask {
		home := int(t.hash(s.slots[j].Key)) & mask
		// The entry at j may move to i when i lies on its probe path:
		// cyclically in [home, j).
		if (j-home)&mask >= (j-i)&mask {
			s.slots[i], s.tags[i] = s.slots[j], s.tags[j]
			i = j
		}
	}
	s.slots[i], s.tags[i] = nil, 0
	s.n--
}

// each calls f for every series, in the table's order.
func (t *keyTable) each(f func(*Series)) {
	for i, s := range t.dir {
		if i > 0 && t.dir[i-1] == s {
			continue // a run of entries points to one segment
		}
		for j, e := range s.slots {
			if s.tags[j] != 0 {
				f(e)
			}
		}
	}
}
