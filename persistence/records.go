package persistence

// The keys and values the store writes: window and lease records, and the
// varint decoder that reads them back with errors naming the field.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"

	ds "github.com/ipfs/go-datastore"

	"github.com/ratemesh/ratemesh/crdt"
	"github.com/ratemesh/ratemesh/node"
)

// windowKey is /w/<collectAt, 16 hex digits>/<identity, base64url>.
func windowKey(r node.WindowRecord) ds.Key {
	id := make([]byte, 0, 32+len(r.Rule)+len(r.Key)+len(r.Slot.Peer))
	id = appendString(id, r.Rule)
	id = appendString(id, r.Key)
	id = binary.AppendVarint(id, r.WindowMs)
	id = binary.AppendVarint(id, r.Window)
	id = appendString(id, r.Slot.Peer)
	id = binary.AppendUvarint(id, r.Slot.Incarnation)
	at := uint64(max(r.CollectAt(), 0))
	var sb strings.Builder
	sb.Grow(20 + b64.EncodedLen(len(id)))
	sb.WriteString(prefixWindows + "/")
	hex := strconv.FormatUint(at, 16)
	sb.WriteString(strings.Repeat("0", 16-len(hex)))
	sb.WriteString(hex)
	sb.WriteByte('/')
	sb.WriteString(b64.EncodeToString(id))
	return ds.RawKey(sb.String())
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

func collectAtOf(key string) (int64, error) {
	rest, ok := strings.CutPrefix(key, prefixWindows+"/")
	if !ok || len(rest) < 17 || rest[16] != '/' {
		return 0, fmt.Errorf("%w: window key %q", ErrCorrupt, key)
	}
	at, err := strconv.ParseUint(rest[:16], 16, 64)
	if err != nil || at > math.MaxInt64 {
		return 0, fmt.Errorf("%w: window key %q", ErrCorrupt, key)
	}
	return int64(at), nil
}

// decodeWindow decodes one window record, strictly: every byte must be
// accounted for, and the key's collection time must match its identity.
func decodeWindow(key string, val []byte) (node.WindowRecord, error) {
	bad := func(what string) (node.WindowRecord, error) {
		return node.WindowRecord{}, fmt.Errorf("%w: window record %q: %s", ErrCorrupt, key, what)
	}
	at, err := collectAtOf(key)
	if err != nil {
		return node.WindowRecord{}, err
	}
	id, err := b64.DecodeString(key[len(prefixWindows)+18:])
	if err != nil {
		return bad("identity is not base64url")
	}
	var r node.WindowRecord
	d := decoder{b: id}
	r.Rule, r.Key = d.str(limitRule), d.str(limitKey)
	r.WindowMs, r.Window = d.varint(), d.varint()
	r.Slot.Peer, r.Slot.Incarnation = d.str(crdt.MaxPeerLen), d.uvarint()
	if d.err != nil || len(d.b) != 0 {
		return bad("malformed identity")
	}
	if r.WindowMs <= 0 || r.Rule == "" || r.Key == "" || r.Slot.Peer == "" || uint64(max(r.CollectAt(), 0)) != uint64(at) {
		return bad("identity out of range")
	}
	if r.Admitted, r.Attempted, err = decodeCounts(val); err != nil {
		return bad(err.Error())
	}
	return r, nil
}

const (
	limitRule = 1 << 10
	limitKey  = 1 << 10
)

func encodeCounts(admitted, attempted uint64) []byte {
	b := []byte{recordVersion}
	b = binary.AppendUvarint(b, admitted)
	return binary.AppendUvarint(b, attempted)
}

func decodeCounts(v []byte) (admitted, attempted uint64, err error) {
	if len(v) == 0 || v[0] != recordVersion {
		return 0, 0, fmt.Errorf("%w: counts of an unknown version", ErrCorrupt)
	}
	d := decoder{b: v[1:]}
	admitted, attempted = d.uvarint(), d.uvarint()
	if d.err != nil || len(d.b) != 0 {
		return 0, 0, fmt.Errorf("%w: malformed counts", ErrCorrupt)
	}
	return admitted, attempted, nil
}

// leaseKey is /l/<lease ID, base64url>.
func leaseKey(id string) ds.Key {
	return ds.RawKey(prefixLeases + "/" + b64.EncodeToString([]byte(id)))
}

func encodeLease(l node.Lease) []byte {
	b := []byte{recordVersion}
	b = appendString(b, l.Rule)
	b = appendString(b, l.Key)
	return binary.AppendVarint(b, l.Expires.UnixNano())
}

func decodeLease(key string, v []byte) (node.Lease, error) {
	bad := func(what string) (node.Lease, error) {
		return node.Lease{}, fmt.Errorf("%w: lease record %q: %s", ErrCorrupt, key, what)
	}
	rest, ok := strings.CutPrefix(key, prefixLeases+"/")
	if !ok {
		return bad("bad key")
	}
	id, err := b64.DecodeString(rest)
	if err != nil || len(id) == 0 {
		return bad("ID is not base64url")
	}
	if len(v) == 0 || v[0] != recordVersion {
		return bad("unknown version")
	}
	d := decoder{b: v[1:]}
	l := node.Lease{ID: string(id), Rule: d.str(limitRule), Key: d.str(limitKey)}
	ns := d.varint()
	if d.err != nil || len(d.b) != 0 || l.Rule == "" || l.Key == "" {
		return bad("malformed value")
	}
	l.Expires = time.Unix(0, ns)
	return l, nil
}

func sortLeases(ls []node.Lease) {
	sort.Slice(ls, func(i, j int) bool { return ls[i].ID < ls[j].ID })
}

// decoder reads length-prefixed fields, remembering the first error.
type decoder struct {
	b   []byte
	err error
}

var errShort = errors.New("short or malformed field")

func (d *decoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.err = errShort
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) varint() int64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.err = errShort
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) str(limit int) string {
	n := d.uvarint()
	if d.err != nil {
		return ""
	}
	if n > uint64(limit) || n > uint64(len(d.b)) {
		d.err = errShort
		return ""
	}
	s := string(d.b[:n])
	d.b = d.b[n:]
	return s
}
