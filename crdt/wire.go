package crdt

// Room to grow: how a decoder of this version reads a batch written by a
// later one. See "Wire compatibility" in docs/design.md.
//
// The CBOR decoder (decMode) no longer refuses unknown fields: the library
// skips a map key that names no field. What it would also skip — or worse,
// match — is checked here, after it decoded: every key of the batch's map
// and of the maps nested in it (the From slot, nacks, slots, window and
// lease entries, evicted slots) must be an unsigned integer (a text key
// "2" would match the field Seq, whose tag is "2"), and one map may carry
// at most MaxUnknownKeys keys this version does not know. Entries encoded
// as arrays (MemberEntry, Echo, Repair) take up to MaxExtraElements
// elements after the ones they know (unmarshalArray).
//
// What an unknown value costs is bounded by what bounds every value: the
// batch's MaxBatchBytes, the decoder's nesting (maxNesting levels in all),
// array (MaxEntries elements) and map (maxMapPairs pairs) limits, and its
// refusal of tags and indefinite lengths, all checked for well-formedness
// before anything is decoded; the library skips it without allocating.

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
// and nested names the known keys whose values hold maps to check too.
type mapShape struct {
	fields uint64
	nested map[uint64]nestedShape
}

type nestedShape struct {
	name  string // the field's name in errors
	array bool   // an array of such maps, not one map
	shape *mapShape
}

// The shapes of this version's maps. Read-only.
var (
	slotShape   = &mapShape{fields: 2}
	nackShape   = &mapShape{fields: 2, nested: map[uint64]nestedShape{0: {name: "slot", shape: slotShape}}}
	windowShape = &mapShape{fields: 7}
	leaseShape  = &mapShape{fields: 5}
	batchShape  = &mapShape{fields: 16, nested: map[uint64]nestedShape{
		1:  {name: "from", shape: slotShape},
		7:  {name: "nacks", array: true, shape: nackShape},
		9:  {name: "slots", array: true, shape: slotShape},
		10: {name: "windows", array: true, shape: windowShape},
		11: {name: "leases", array: true, shape: leaseShape},
		12: {name: "evicted", array: true, shape: slotShape},
	}}
)

var errTruncated = errors.New("truncated CBOR item")

// walker reads CBOR the decoder has already found well formed, definite
// lengths only. It checks bounds anyway and returns errTruncated rather
// than panic.
type walker struct {
	data []byte
	off  int
	path [4]pathElem // where the walk is, for errors
	n    int
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

// skip moves past one item. depth bounds the recursion (the decoder has
// bounded nesting already; this is the belt to its braces).
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
// the decoder has refused it already.
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
			return fmt.Errorf("%s: key %d is a %s, not an unsigned integer", w.where(), i, majorNames[kmajor])
		}
		if key >= s.fields {
			if unknown++; unknown > MaxUnknownKeys {
				return fmt.Errorf("%s: more than %d unknown keys", w.where(), MaxUnknownKeys)
			}
			if err := w.skip(w.n + 1); err != nil {
				return err
			}
			continue
		}
		nest, ok := s.nested[key]
		if !ok {
			if err := w.skip(w.n + 1); err != nil {
				return err
			}
			continue
		}
		if err := w.checkNested(nest); err != nil {
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

// checkKeys checks a decoded batch's encoding (see the file's comment).
func checkKeys(data []byte) error {
	w := walker{data: data}
	return w.checkMap(batchShape)
}

// unmarshalArray decodes data, one array-encoded entry of fields elements,
// into v (a pointer to a type without this method, so the decoder's
// strict mode applies), ignoring up to MaxExtraElements trailing elements
// a later version added.
func unmarshalArray(data []byte, what string, fields int, v any) error {
	w := walker{data: data}
	major, n, err := w.head()
	if err != nil || major != majorArray || n <= uint64(fields) {
		// The decoder says what is wrong, if anything.
		if err := decMode.Unmarshal(data, v); err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		return nil
	}
	if n > uint64(fields+MaxExtraElements) {
		return fmt.Errorf("%s: %d elements, more than %d known and %d unknown", what, n, fields, MaxExtraElements)
	}
	body := w.off
	for i := 0; i < fields; i++ {
		if err := w.skip(1); err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
	}
	known := w.off
	for i := fields; i < int(n); i++ {
		if err := w.skip(1); err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
	}
	if w.off != len(data) {
		return fmt.Errorf("%s: %d bytes after the array", what, len(data)-w.off)
	}
	trimmed := make([]byte, 0, 1+known-body)
	trimmed = append(trimmed, majorArray<<5|byte(fields)) // fields < 24
	trimmed = append(trimmed, data[body:known]...)
	if err := decMode.Unmarshal(trimmed, v); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}

type (
	memberEntryWire MemberEntry
	echoWire        Echo
	repairWire      Repair
)

// UnmarshalCBOR decodes a MemberEntry strictly, ignoring elements a later
// version appended (at most MaxExtraElements).
func (m *MemberEntry) UnmarshalCBOR(data []byte) error {
	return unmarshalArray(data, "member entry", 4, (*memberEntryWire)(m))
}

// UnmarshalCBOR decodes an Echo strictly, ignoring elements a later
// version appended (at most MaxExtraElements).
func (e *Echo) UnmarshalCBOR(data []byte) error {
	return unmarshalArray(data, "echo", 3, (*echoWire)(e))
}

// UnmarshalCBOR decodes a Repair strictly, ignoring elements a later
// version appended (at most MaxExtraElements).
func (r *Repair) UnmarshalCBOR(data []byte) error {
	return unmarshalArray(data, "repair", 2, (*repairWire)(r))
}
