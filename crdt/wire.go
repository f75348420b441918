package crdt

// Room to grow: how a decoder of this version reads a batch written by a
// later one. See "Wire compatibility" in docs/design.md.
//
// The CBOR decoder (decMode) no longer refuses unknown fields: the library
// skips a map key that names no field. Before it decodes, DecodeBatch walks
// the encoding once (walker) and checks what the library would also skip,
// or worse, match: every key of the batch's map and of the maps nested in
// it (the From slot, nacks and their slots, slots, window and lease
// entries, evicted slots) must be an unsigned integer (a text key "2"
// would match the field Seq, whose tag is "2"), and one map may carry at
// most MaxUnknownKeys keys this version does not know. Entries encoded as
// arrays (MemberEntry, Echo, Repair), which the library decodes only when
// their length is exact, may carry up to MaxExtraElements elements after
// the ones this version knows: the walk notes them, and the decoder reads
// a copy of the batch without them (trimmed). A batch that has none — every
// batch of this version — is decoded as it is, without a copy.
//
// What an unknown value costs is bounded by what bounds every value: the
// batch's MaxBatchBytes, the decoder's nesting (maxNesting levels in all),
// array (MaxEntries elements) and map (maxMapPairs pairs) limits, and its
// refusal of tags and indefinite lengths, all checked for well-formedness
// before anything is decoded; the walk and the library skip it without
// allocating. Trimming costs one copy of the batch, only when it is needed.

import (
	"errors"
	"fmt"
)

const (
	// MaxUnknownKeys bounds the map keys one map of a batch (the batch
	// itself, or one of its entries) may carry that this version does not
	// know: a later version adds at most this many fields to one map
	// before it is no longer read by this one.
	MaxUnknownKeys = 8
	// MaxExtraElements bounds the elements an array-encoded entry
	// (MemberEntry, Echo, Repair) may carry after the ones this version
	// knows.
	MaxExtraElements = 8
	// maxMapPairs is the decoder's cap on the pairs of any map: the
	// batch's 16 known keys and MaxUnknownKeys more, with room to spare.
	maxMapPairs = 32
)

// CBOR major types.
const (
	majorUint   = 0
	majorNint   = 1
	majorBytes  = 2
	majorText   = 3
	majorArray  = 4
	majorMap    = 5
	majorTag    = 6
	majorSimple = 7
)

var majorNames = [8]string{"unsigned integer", "negative integer", "byte string", "text string", "array", "map", "tag", "simple value or float"}

// mapShape describes one map of the wire: keys 0 to fields-1 are known,
// and nested, indexed by key, describes the known keys whose values hold
// maps or array-encoded entries to check too (a zero name: none).
type mapShape struct {
	fields uint64
	nested []nestedShape
}

type nestedShape struct {
	name  string // the field's name in errors
	array bool   // an array of such maps (or entries), not one map
	shape *mapShape
	// elems, if not 0, makes the field an array of array-encoded
	// entries of elems known elements (shape is nil).
	elems int
}

// The shapes of this version's maps. Read-only.
var (
	slotShape   = &mapShape{fields: 2}
	nackShape   = &mapShape{fields: 2, nested: []nestedShape{0: {name: "slot", shape: slotShape}}}
	windowShape = &mapShape{fields: 7}
	leaseShape  = &mapShape{fields: 5}
	batchShape  = &mapShape{fields: 16, nested: []nestedShape{
		1:  {name: "from", shape: slotShape},
		7:  {name: "nacks", array: true, shape: nackShape},
		9:  {name: "slots", array: true, shape: slotShape},
		10: {name: "windows", array: true, shape: windowShape},
		11: {name: "leases", array: true, shape: leaseShape},
		12: {name: "evicted", array: true, shape: slotShape},
		13: {name: "echoes", array: true, elems: 3},
		14: {name: "members", array: true, elems: 4},
		15: {name: "repairs", array: true, elems: 2},
	}}
)

var errTruncated = errors.New("truncated CBOR item")

// walker reads a batch's CBOR before the decoder has: any input, checking
// bounds, never panicking, its work linear in the input's length. A
// malformed input ends the walk with an error that is not a *policyError,
// and the decoder then says what is wrong.
type walker struct {
	data  []byte
	off   int
	path  [4]pathElem // where the walk is, for errors
	n     int
	trims []trim // array-encoded entries with elements this version does not know
}

// policyError is a refusal of well-formed CBOR: a key that is not an
// unsigned integer, too many unknown keys or elements.
type policyError struct{ msg string }

func (e *policyError) Error() string { return e.msg }

func (w *walker) refuse(format string, args ...any) error {
	return &policyError{w.where() + ": " + fmt.Sprintf(format, args...)}
}

// trim is one array-encoded entry at data[head:end] whose known elements
// are data[body:known]; the elements after them are dropped.
type trim struct {
	head, body, known, end int
	elems                  int
}

type pathElem struct {
	name string
	idx  int // -1: not an array element
}

func (w *walker) where() string {
	if w.n == 0 {
		return "batch"
	}
	s := ""
	for i, p := range w.path[:w.n] {
		if i > 0 {
			s += "."
		}
		s += p.name
		if p.idx >= 0 {
			s += fmt.Sprintf("[%d]", p.idx)
		}
	}
	return s
}

// head reads one item's head: its major type and argument (a length, a
// count or a value).
func (w *walker) head() (major byte, arg uint64, err error) {
	if w.off >= len(w.data) {
		return 0, 0, errTruncated
	}
	b := w.data[w.off]
	w.off++
	major, ai := b>>5, b&0x1f
	switch {
	case ai < 24:
		return major, uint64(ai), nil
	case ai <= 27:
		n := 1 << (ai - 24)
		if len(w.data)-w.off < n {
			return 0, 0, errTruncated
		}
		for _, c := range w.data[w.off : w.off+n] {
			arg = arg<<8 | uint64(c)
		}
		w.off += n
		return major, arg, nil
	}
	return 0, 0, fmt.Errorf("indefinite length or reserved head 0x%02x", b)
}

// skip moves past one item. depth bounds the recursion: a deeper input
// is malformed (the decoder's limit is maxNesting) and costs no stack.
func (w *walker) skip(depth int) error {
	if depth > maxNesting+2 {
		return fmt.Errorf("nesting over %d levels", maxNesting+2)
	}
	major, arg, err := w.head()
	if err != nil {
		return err
	}
	switch major {
	case majorBytes, majorText:
		if arg > uint64(len(w.data)-w.off) {
			return errTruncated
		}
		w.off += int(arg)
	case majorArray, majorMap:
		if arg > uint64(len(w.data)) { // every item takes a byte at least
			return errTruncated
		}
		n := int(arg)
		if major == majorMap {
			n *= 2
		}
		for i := 0; i < n; i++ {
			if err := w.skip(depth + 1); err != nil {
				return err
			}
		}
	case majorTag:
		return w.skip(depth + 1)
	}
	return nil
}

// checkMap checks the map at the walker's offset against s: unsigned
// integer keys only, at most MaxUnknownKeys unknown ones, and the same
// for the maps its known keys hold. A value of the wrong type is skipped:
// the decoder refuses it.
func (w *walker) checkMap(s *mapShape) error {
	start := w.off
	major, pairs, err := w.head()
	if err != nil {
		return err
	}
	if major != majorMap {
		w.off = start
		return w.skip(w.n)
	}
	unknown := 0
	for i := uint64(0); i < pairs; i++ {
		kmajor, key, err := w.head()
		if err != nil {
			return err
		}
		if kmajor != majorUint {
			return w.refuse("key %d is a %s, not an unsigned integer", i, majorNames[kmajor])
		}
		if key >= s.fields {
			if unknown++; unknown > MaxUnknownKeys {
				return w.refuse("more than %d unknown keys", MaxUnknownKeys)
			}
			if err := w.skip(w.n + 1); err != nil {
				return err
			}
			continue
		}
		if key >= uint64(len(s.nested)) || s.nested[key].name == "" {
			if err := w.skip(w.n + 1); err != nil {
				return err
			}
			continue
		}
		if err := w.checkNested(s.nested[key]); err != nil {
			return err
		}
	}
	return nil
}

func (w *walker) checkNested(nest nestedShape) error {
	if w.n == len(w.path) {
		return w.skip(w.n)
	}
	w.path[w.n] = pathElem{name: nest.name, idx: -1}
	w.n++
	defer func() { w.n-- }()
	if !nest.array {
		return w.checkMap(nest.shape)
	}
	if nest.elems > 0 {
		return w.checkEntries(nest.elems)
	}
	start := w.off
	major, n, err := w.head()
	if err != nil {
		return err
	}
	if major != majorArray {
		w.off = start
		return w.skip(w.n)
	}
	for i := uint64(0); i < n; i++ {
		w.path[w.n-1].idx = int(i)
		if err := w.checkMap(nest.shape); err != nil {
			return err
		}
	}
	return nil
}

// checkEntries walks an array of array-encoded entries of elems known
// elements, noting those with more (at most MaxExtraElements more). An
// entry that is not an array, or is shorter, is left to the decoder.
func (w *walker) checkEntries(elems int) error {
	start := w.off
	major, n, err := w.head()
	if err != nil {
		return err
	}
	if major != majorArray {
		w.off = start
		return w.skip(w.n)
	}
	for i := uint64(0); i < n; i++ {
		w.path[w.n-1].idx = int(i)
		head := w.off
		emajor, count, err := w.head()
		if err != nil {
			return err
		}
		if emajor != majorArray || count <= uint64(elems) {
			w.off = head
			if err := w.skip(w.n); err != nil {
				return err
			}
			continue
		}
		if count > uint64(elems+MaxExtraElements) {
			return w.refuse("%d elements, more than %d known and %d unknown", count, elems, MaxExtraElements)
		}
		t := trim{head: head, body: w.off, elems: elems}
		for j := uint64(0); j < count; j++ {
			if j == uint64(elems) {
				t.known = w.off
			}
			if err := w.skip(w.n + 1); err != nil {
				return err
			}
		}
		t.end = w.off
		w.trims = append(w.trims, t)
	}
	return nil
}

// trimmed returns a copy of the walked data without the elements the
// trims drop.
func (w *walker) trimmed() []byte {
	out := make([]byte, 0, len(w.data))
	prev := 0
	for _, t := range w.trims {
		out = append(out, w.data[prev:t.head]...)
		out = append(out, majorArray<<5|byte(t.elems)) // elems < 24
		out = append(out, w.data[t.body:t.known]...)
		prev = t.end
	}
	return append(out, w.data[prev:]...)
}

// prepare walks a batch's encoding before the decoder reads it. It returns
// the bytes to decode (data, or a trimmed copy) and a *policyError if the
// batch breaks a rule the decoder does not check; any other error means
// the walk met malformed CBOR, which the decoder refuses with its own
// error.
func prepare(data []byte) ([]byte, error) {
	w := walker{data: data}
	if err := w.checkMap(batchShape); err != nil {
		return data, err
	}
	if w.off != len(data) {
		return data, errors.New("extra data after the batch")
	}
	if len(w.trims) == 0 {
		return data, nil
	}
	return w.trimmed(), nil
}
