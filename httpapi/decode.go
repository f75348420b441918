package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"
)

// A request body is decoded in two passes over its bytes, with no
// map[string]any between them: valid checks the syntax (as json.Valid
// would, without its per-byte state machine), then a scanner notes where each known field's value lies (object), and
// fieldReader turns the values into the request's types, naming the
// field at fault. A body that is not valid JSON, over MaxBodyBytes or
// cut short by a read error is read again by readObjectError, which runs
// it through encoding/json's Decoder as the API always has, so that its
// error is the same text; errors are the slow path.

// field indexes body.fields; fieldNames is in sorted order, so that the
// first unknown field reported is the least by name.
type field int

const (
	fChecks field = iota
	fClass
	fCost
	fKey
	fLeaseID
	fMaxWait
	fRule
	fType
	fUnits
	numFields
)

var fieldNames = [numFields]string{"checks", "class", "cost", "key", "lease_id", "max_wait_ms", "rule", "type", "units"}

// fieldSet is a set of fields, one bit each: those an object may carry.
type fieldSet uint16

const (
	checkFields   fieldSet = 1<<fRule | 1<<fKey | 1<<fCost | 1<<fType | 1<<fUnits | 1<<fClass
	singleFields           = checkFields | 1<<fMaxWait
	multiFields   fieldSet = 1<<fChecks | 1<<fMaxWait
	acquireFields fieldSet = 1<<fRule | 1<<fKey | 1<<fClass | 1<<fMaxWait
	leaseFields   fieldSet = 1 << fLeaseID
)

// kind is a JSON value's kind.
type kind uint8

const (
	kindNull kind = iota
	kindBool
	kindNumber
	kindString
	kindArray
	kindObject
)

// String says "got …" the way the API always has.
func (k kind) String() string {
	return [...]string{"null", "a boolean", "a number", "a string", "an array", "an object"}[k]
}

// value is one field of an object as the body gave it: raw is its
// literal (a string's with the quotes), pointing into the body.
type value struct {
	given bool // the key was there, null included
	kind  kind
	raw   []byte
}

// object is one JSON object's fields: the known ones by index, and the
// least of the others by name.
type object struct {
	fields     [numFields]value
	hasUnknown bool
	unknown    string
}

// element is one element of "checks": an object, or the kind it is
// instead.
type element struct {
	kind kind
	obj  object
}

// body is one request body and what scan found in it. Bodies are pooled
// (bodies): the buffer and the elements are kept for the next request.
type body struct {
	buf    bytes.Buffer
	top    object
	kind   kind      // the top-level value's
	checks []element // the elements of "checks", at most MaxChecks
	nCheck int       // how many elements "checks" has
}

// maxPooledBody is the largest buffer put back in the pool: a body near
// MaxBodyBytes is rare, and keeping its buffer would hold the memory.
const maxPooledBody = 16 << 10

var bodies = sync.Pool{New: func() any { return new(body) }}

// wholeBody is a request body read whole before the API sees it, as
// cmd/ratemesh's server reads every body: Bytes returns its unread bytes
// (as *bytes.Buffer's does), which stay as they are until the handler
// returns.
type wholeBody interface{ Bytes() []byte }

// readBody reads r's body and decodes it: in place when the body is a
// wholeBody within MaxBodyBytes, else copied into the pooled buffer. The
// caller hands the result back with release once it has read its fields,
// before it returns: their raw bytes point into the body's bytes.
func readBody(w http.ResponseWriter, r *http.Request) (*body, error) {
	b := bodies.Get().(*body)
	var data []byte
	if wb, ok := r.Body.(wholeBody); ok && len(wb.Bytes()) <= MaxBodyBytes {
		data = wb.Bytes()
	} else {
		// MaxBytesReader also closes the connection after the answer
		// of a body over the cap.
		b.buf.Reset()
		_, err := b.buf.ReadFrom(http.MaxBytesReader(w, r.Body, MaxBodyBytes))
		data = b.buf.Bytes()
		if err != nil {
			err := readObjectError(data, err)
			b.release()
			return nil, err
		}
	}
	if !valid(data) {
		err := readObjectError(data, nil)
		b.release()
		return nil, err
	}
	b.scan(data)
	if b.kind != kindObject {
		k := b.kind
		b.release()
		return nil, bad("body: must be a JSON object, got %s", k)
	}
	return b, nil
}

func (b *body) release() {
	if b.buf.Cap() > maxPooledBody {
		return
	}
	b.top = object{}
	clear(b.checks)
	b.checks, b.nCheck = b.checks[:0], 0
	bodies.Put(b)
}

// errReader returns err, what the body's reader returned after the
// bytes it gave.
type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }

// readObjectError returns the error encoding/json's Decoder finds in
// data, the bytes read of the body before readErr (a *MaxBytesError past
// MaxBodyBytes; nil at the end), read as the API has always read a body:
// one value, then nothing but space.
func readObjectError(data []byte, readErr error) error {
	var r io.Reader = bytes.NewReader(data)
	if readErr != nil {
		r = io.MultiReader(r, errReader{readErr})
	}
	dec := json.NewDecoder(r)
	dec.UseNumber()
	var v any
	var tooBig *http.MaxBytesError
	if err := dec.Decode(&v); err != nil {
		switch {
		case errors.As(err, &tooBig):
			return bad("body: over %d bytes", MaxBodyBytes)
		case errors.Is(err, io.EOF):
			return bad("body: empty; send a JSON object")
		}
		return bad("body: malformed JSON: %s", strings.TrimPrefix(err.Error(), "json: "))
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		if errors.As(err, &tooBig) {
			return bad("body: over %d bytes", MaxBodyBytes)
		}
		return bad("body: data after the JSON object")
	}
	// Not reached: readBody sends here only a body that is not valid
	// JSON, or one whose reading failed, which Token reports.
	return bad("body: malformed JSON")
}

// scan notes the fields of data, which json.Valid accepted: the top
// level's kind, its fields and, under "checks", each element's.
func (b *body) scan(data []byte) {
	s := scanner{data: data}
	s.space()
	b.kind = s.kind()
	if b.kind == kindObject {
		s.object(&b.top, b)
	}
}

// scanner walks JSON that is known to be valid, so it checks nothing.
type scanner struct {
	data []byte
	i    int
}

func (s *scanner) space() {
	for s.i < len(s.data) {
		switch s.data[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// kind is the kind of the value at s.i.
func (s *scanner) kind() kind {
	switch s.data[s.i] {
	case '{':
		return kindObject
	case '[':
		return kindArray
	case '"':
		return kindString
	case 't', 'f':
		return kindBool
	case 'n':
		return kindNull
	}
	return kindNumber
}

// object scans the object at s.i into o; into b's checks too when b is
// not nil (the top level).
func (s *scanner) object(o *object, b *body) {
	s.i++ // {
	for {
		s.space()
		if s.data[s.i] == '}' {
			s.i++
			return
		}
		if s.data[s.i] == ',' {
			s.i++
			s.space()
		}
		key := s.str()
		s.space()
		s.i++ // :
		s.space()
		k := s.kind()
		f := lookup(key)
		if f == numFields {
			o.unknownField(key)
		}
		if f == fChecks && b != nil && k == kindArray {
			start := s.i
			s.array(b)
			o.fields[f] = value{given: true, kind: k, raw: s.data[start:s.i]}
			continue
		}
		start := s.i
		s.skip()
		if f < numFields {
			o.fields[f] = value{given: true, kind: k, raw: s.data[start:s.i]}
		}
	}
}

// array scans the elements of "checks" at s.i into b, a later "checks"
// replacing an earlier one as it always has.
func (s *scanner) array(b *body) {
	clear(b.checks)
	b.checks, b.nCheck = b.checks[:0], 0
	s.i++ // [
	for {
		s.space()
		switch s.data[s.i] {
		case ']':
			s.i++
			return
		case ',':
			s.i++
			s.space()
		}
		k := s.kind()
		b.nCheck++
		if b.nCheck > MaxChecks {
			s.skip()
			continue
		}
		b.checks = append(b.checks, element{kind: k})
		if k == kindObject {
			s.object(&b.checks[len(b.checks)-1].obj, nil)
		} else {
			s.skip()
		}
	}
}

// str returns the string literal at s.i, quotes included.
func (s *scanner) str() []byte {
	start := s.i
	s.i++
	for s.data[s.i] != '"' {
		if s.data[s.i] == '\\' {
			s.i++
		}
		s.i++
	}
	s.i++
	return s.data[start:s.i]
}

// skip moves past the value at s.i.
func (s *scanner) skip() {
	switch s.data[s.i] {
	case '"':
		s.str()
		return
	case '{', '[':
		depth := 0
		for {
			switch s.data[s.i] {
			case '"':
				s.str()
				continue
			case '{', '[':
				depth++
			case '}', ']':
				depth--
			}
			s.i++
			if depth == 0 {
				return
			}
		}
	}
	for s.i < len(s.data) {
		switch s.data[s.i] {
		case ',', '}', ']', ' ', '\t', '\n', '\r':
			return
		}
		s.i++
	}
}

// lookup returns the known field a key literal names, or numFields.
func lookup(key []byte) field {
	name := key[1 : len(key)-1]
	if !plain(name) {
		s := unquote(key)
		for f, n := range fieldNames {
			if s == n {
				return field(f)
			}
		}
		return numFields
	}
	for f, n := range fieldNames {
		if string(name) == n {
			return field(f)
		}
	}
	return numFields
}

func (o *object) unknownField(key []byte) {
	name := unquote(key)
	if !o.hasUnknown || name < o.unknown {
		o.hasUnknown, o.unknown = true, name
	}
}

// plain reports whether a string literal's contents are its value: no
// escapes, and valid UTF-8 (encoding/json replaces invalid bytes).
func plain(s []byte) bool {
	return bytes.IndexByte(s, '\\') < 0 && utf8.Valid(s)
}

// unquote returns the value of the string literal lit.
func unquote(lit []byte) string {
	if inner := lit[1 : len(lit)-1]; plain(inner) {
		return string(inner)
	}
	var s string
	_ = json.Unmarshal(lit, &s) // lit is a valid literal
	return s
}

// fieldReader takes typed fields out of a scanned object; the first
// problem is kept, naming the field: under checks[index] when index is
// not -1.
type fieldReader struct {
	obj   *object
	index int
	err   error
}

func newFields(obj *object, index int) *fieldReader {
	return &fieldReader{obj: obj, index: index}
}

func (f *fieldReader) name(field string) string {
	if f.index < 0 {
		return field
	}
	return fmt.Sprintf("checks[%d].%s", f.index, field)
}

func (f *fieldReader) fail(fd field, format string, args ...any) {
	if f.err == nil {
		f.err = bad("%s: %s", f.name(fieldNames[fd]), fmt.Sprintf(format, args...))
	}
}

// get returns the field's value; null is absent.
func (f *fieldReader) get(fd field) (value, bool) {
	v := f.obj.fields[fd]
	return v, v.given && v.kind != kindNull
}

// given reports whether the object has the field, null included.
func (f *fieldReader) given(fd field) bool { return f.obj.fields[fd].given }

// str returns a string field; required ones must be non-empty.
func (f *fieldReader) str(fd field, required bool) string {
	v, ok := f.get(fd)
	if !ok {
		if required {
			f.fail(fd, "missing")
		}
		return ""
	}
	if v.kind != kindString {
		f.fail(fd, "must be a string, got %s", v.kind)
		return ""
	}
	s := unquote(v.raw)
	if required && s == "" {
		f.fail(fd, "must not be empty")
	}
	return s
}

// uint returns a whole-number field within [0, maxV]; present reports
// whether it was given. Besides plain digits it takes what a JSON number
// can say of a whole number (2.0, 1e3, -0), as it always has.
func (f *fieldReader) uint(fd field, maxV uint64) (n uint64, present bool) {
	v, ok := f.get(fd)
	if !ok {
		return 0, false
	}
	if v.kind != kindNumber {
		f.fail(fd, "must be a whole number, got %s", v.kind)
		return 0, true
	}
	if u, ok := digits(v.raw); ok {
		if u > maxV {
			f.fail(fd, "%d is over the maximum %d", u, maxV)
		}
		return u, true
	}
	s := string(v.raw)
	if u, err := strconv.ParseUint(s, 10, 64); err == nil {
		if u > maxV {
			f.fail(fd, "%s is over the maximum %d", s, maxV)
		}
		return u, true
	}
	fl, err := strconv.ParseFloat(s, 64)
	switch {
	case strings.HasPrefix(s, "-") && (err != nil || fl != 0):
		f.fail(fd, "must not be negative, got %s", s)
	case err != nil || fl > float64(maxV):
		f.fail(fd, "%s is over the maximum %d", s, maxV)
	case fl != float64(uint64(fl)):
		f.fail(fd, "must be a whole number, got %s", s)
	default:
		return uint64(fl), true
	}
	return 0, true
}

// digits parses a number literal of at most 18 digits (which cannot
// overflow), the common case, without converting it to a string.
func digits(lit []byte) (uint64, bool) {
	if len(lit) == 0 || len(lit) > 18 {
		return 0, false
	}
	var u uint64
	for _, c := range lit {
		if c < '0' || c > '9' {
			return 0, false
		}
		u = u*10 + uint64(c-'0')
	}
	return u, true
}

// done reports the first problem, then the first field, by name, that is
// not in allowed.
func (f *fieldReader) done(allowed fieldSet) error {
	if f.err != nil {
		return f.err
	}
	if name, ok := f.obj.firstUnknown(allowed); ok {
		return bad("%s: unknown field", f.name(name))
	}
	return nil
}

// firstUnknown returns the least name of a field o carries outside
// allowed.
func (o *object) firstUnknown(allowed fieldSet) (string, bool) {
	name, ok := o.unknown, o.hasUnknown
	for fd, v := range o.fields {
		if v.given && allowed&(1<<fd) == 0 && (!ok || fieldNames[fd] < name) {
			name, ok = fieldNames[fd], true
		}
	}
	return name, ok
}

// maxValidDepth is the deepest nesting valid follows itself; a deeper
// body goes to json.Valid, which refuses one past 10,000.
const maxValidDepth = 64

// valid reports what json.Valid(data) does, in one pass over data without
// encoding/json's call of a state function per byte (FuzzValid holds it
// to json.Valid).
func valid(data []byte) bool {
	const (
		wantValue  = iota // a value
		wantKey           // an object's key and its colon
		afterValue        // a comma, a closing bracket, or the end
	)
	var open [maxValidDepth]byte // the open objects' { and arrays' [
	depth, state, i, n := 0, wantValue, 0, len(data)
	for {
		for i < n && (data[i] == ' ' || data[i] == '\t' || data[i] == '\n' || data[i] == '\r') {
			i++
		}
		switch state {
		case wantValue:
			if i == n {
				return false
			}
			state = afterValue
			switch c := data[i]; {
			case c == '{' || c == '[':
				i++
				for i < n && (data[i] == ' ' || data[i] == '\t' || data[i] == '\n' || data[i] == '\r') {
					i++
				}
				if i < n && data[i] == c+2 { // } or ], empty
					i++
					continue
				}
				if depth == maxValidDepth {
					return json.Valid(data)
				}
				open[depth] = c
				depth++
				state = wantValue
				if c == '{' {
					state = wantKey
				}
			case c == '"':
				if i = validString(data, i); i < 0 {
					return false
				}
			case c == '-' || c >= '0' && c <= '9':
				if i = validNumber(data, i); i < 0 {
					return false
				}
			case c == 't' && bytes.HasPrefix(data[i:], []byte("true")), c == 'n' && bytes.HasPrefix(data[i:], []byte("null")):
				i += 4
			case c == 'f' && bytes.HasPrefix(data[i:], []byte("false")):
				i += 5
			default:
				return false
			}
		case wantKey:
			if i == n || data[i] != '"' {
				return false
			}
			if i = validString(data, i); i < 0 {
				return false
			}
			for i < n && (data[i] == ' ' || data[i] == '\t' || data[i] == '\n' || data[i] == '\r') {
				i++
			}
			if i == n || data[i] != ':' {
				return false
			}
			i++
			state = wantValue
		case afterValue:
			if depth == 0 {
				return i == n
			}
			if i == n {
				return false
			}
			switch c := data[i]; {
			case c == ',':
				state = wantValue
				if open[depth-1] == '{' {
					state = wantKey
				}
			case c == open[depth-1]+2: // } closing {, ] closing [
				depth--
			default:
				return false
			}
			i++
		}
	}
}

// validString returns the index past the string literal at data[i], or
// -1 if it is not one: escapes as JSON has them, no control characters
// (any other byte goes, as encoding/json lets invalid UTF-8 through).
func validString(data []byte, i int) int {
	for i++; i < len(data); {
		switch c := data[i]; {
		case c == '"':
			return i + 1
		case c < 0x20:
			return -1
		case c != '\\':
			i++
		case i+1 == len(data):
			return -1
		default:
			switch data[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				if i+6 > len(data) {
					return -1
				}
				for _, h := range data[i+2 : i+6] {
					if !('0' <= h && h <= '9' || 'a' <= h && h <= 'f' || 'A' <= h && h <= 'F') {
						return -1
					}
				}
				i += 6
			default:
				return -1
			}
		}
	}
	return -1
}

// validNumber returns the index past the number literal at data[i], or
// -1 if it is not one: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?.
func validNumber(data []byte, i int) int {
	n := len(data)
	digits := func(i int) int { // past one or more digits, or -1
		if i == n || data[i] < '0' || data[i] > '9' {
			return -1
		}
		for i < n && data[i] >= '0' && data[i] <= '9' {
			i++
		}
		return i
	}
	if data[i] == '-' {
		i++
	}
	if i < n && data[i] == '0' {
		i++
	} else if i = digits(i); i < 0 {
		return -1
	}
	if i < n && data[i] == '.' {
		if i = digits(i + 1); i < 0 {
			return -1
		}
	}
	if i < n && (data[i] == 'e' || data[i] == 'E') {
		i++
		if i < n && (data[i] == '+' || data[i] == '-') {
			i++
		}
		if i = digits(i); i < 0 {
			return -1
		}
	}
	return i
}
