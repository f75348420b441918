package crdt_test

import (
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"reflect"
	"strings"
	"testing"

	"github.com/fxamacker/cbor/v2"

	"github.com/ratemesh/ratemesh/crdt"
)

// fullBatch returns a valid batch with every field set.
func fullBatch() *crdt.Batch {
	return &crdt.Batch{
		Version:   crdt.Version,
		From:      crdt.Slot{Peer: "12D3KooWabc", Incarnation: 1_700_000_000_000},
		Seq:       42,
		Sent:      1_700_000_123_456,
		Clock:     1_700_000_123_300,
		RulesHash: 0xdeadbeefcafef00d,
		Ack:       1_700_000_123_000,
		Nacks: []crdt.Nack{
			{Slot: crdt.Slot{Peer: "12D3KooWdef", Incarnation: 9}, Seq: 17},
			{Slot: crdt.Slot{Peer: "12D3KooWghi", Incarnation: 1}, Seq: math.MaxUint64},
		},
		Flags: crdt.FlagFull | crdt.FlagLast | crdt.FlagEcho,
		Slots: []crdt.Slot{
			{Peer: "12D3KooWdef", Incarnation: 9},
			{Peer: "12D3KooWjkl", Incarnation: 3},
		},
		Windows: []crdt.WindowEntry{
			{Slot: 0, Rule: "api", Key: "acct:1", WindowMs: 1000, Window: 1_700_000_123, Admitted: 5, Attempted: 7},
			{Slot: 1, Rule: "api", Key: "acct:2", WindowMs: 1000, Window: 1_700_000_123, Admitted: 0, Attempted: 3},
			{Slot: 2, Rule: "login", Key: "ip:10.0.0.1", WindowMs: 60_000, Window: 28_333_335, Admitted: crdt.MaxValue, Attempted: crdt.MaxValue},
		},
		Leases: []crdt.LeaseEntry{
			{Slot: 0, Rule: "uploads", Key: "user:7", Acquired: 10, Released: 4},
			{Slot: 2, Rule: "uploads", Key: "user:8", Acquired: 3, Released: 3},
		},
		Evicted: []crdt.Slot{{Peer: "12D3KooWold", Incarnation: 2}},
		Echoes: []crdt.Echo{
			{Peer: crdt.PeerTag("12D3KooWdef"), Ago: 31, Held: 12},
			{Peer: 0, Ago: -crdt.MaxValue, Held: crdt.MaxEchoHeldMs},
			{Peer: math.MaxUint32, Ago: crdt.MaxValue, Held: 0},
		},
	}
}

// heartbeat returns a valid batch with only the mandatory fields.
func heartbeat() *crdt.Batch {
	return &crdt.Batch{Version: crdt.Version, From: crdt.Slot{Peer: "p", Incarnation: 7}, Seq: 3, Sent: 1000, Clock: 1001}
}

// rawEncode encodes v as CBOR without any validation, to build inputs the
// encoder of the package would refuse.
func rawEncode(t testing.TB, v any) []byte {
	t.Helper()
	em, err := cbor.CoreDetEncOptions().EncMode()
	if err != nil {
		t.Fatal(err)
	}
	data, err := em.Marshal(v)
	if err != nil {
		t.Fatalf("raw encode %T: %v", v, err)
	}
	return data
}

// gossip returns a mutation of fullBatch into a gossip batch (no full
// state, no member table) carrying repairs.
func gossip(repairs ...crdt.Repair) func(b *crdt.Batch) {
	return func(b *crdt.Batch) {
		b.Flags, b.Members, b.Slots = crdt.FlagEcho|crdt.FlagRepairs, nil, nil
		for i := range b.Windows {
			b.Windows[i].Slot = 0
		}
		for i := range b.Leases {
			b.Leases[i].Slot = 0
		}
		b.Repairs = repairs
	}
}

// mutated returns the raw encoding of fullBatch after f changed it.
func mutated(t testing.TB, f func(b *crdt.Batch)) []byte {
	t.Helper()
	b := fullBatch()
	f(b)
	return rawEncode(t, b)
}

// replaceOnce replaces the single occurrence of old in data.
func replaceOnce(t testing.TB, data []byte, old, new string) []byte {
	t.Helper()
	if n := bytes.Count(data, []byte(old)); n != 1 {
		t.Fatalf("%q occurs %d times in the encoding, want 1", old, n)
	}
	return bytes.Replace(data, []byte(old), []byte(new), 1)
}

// mustEncode encodes b, failing the test on error.
func mustEncode(t testing.TB, b *crdt.Batch) []byte {
	t.Helper()
	data, err := b.Encode()
	if err != nil {
		t.Fatalf("Encode: %v", err)
	}
	return data
}

// windows returns n valid window entries.
func windows(n int) []crdt.WindowEntry {
	ws := make([]crdt.WindowEntry, n)
	for i := range ws {
		ws[i] = crdt.WindowEntry{Rule: "r", Key: fmt.Sprint("k", i), WindowMs: 1000, Window: int64(i), Admitted: 1, Attempted: 1}
	}
	return ws
}

// leases returns n valid lease entries.
func leases(n int) []crdt.LeaseEntry {
	ls := make([]crdt.LeaseEntry, n)
	for i := range ls {
		ls[i] = crdt.LeaseEntry{Rule: "r", Key: fmt.Sprint("k", i), Acquired: 1}
	}
	return ls
}

func slots(n int) []crdt.Slot {
	ss := make([]crdt.Slot, n)
	for i := range ss {
		ss[i] = crdt.Slot{Peer: fmt.Sprint("p", i), Incarnation: uint64(i)}
	}
	return ss
}

func TestBatchRoundTrip(t *testing.T) {
	tests := []struct {
		name  string
		batch func() *crdt.Batch
	}{
		{"full", fullBatch},
		{"heartbeat", heartbeat},
		{"zero header", func() *crdt.Batch { return &crdt.Batch{Version: crdt.Version, From: crdt.Slot{Peer: "p"}} }},
		{"negative times", func() *crdt.Batch {
			b := heartbeat()
			b.Sent, b.Clock, b.Ack = -5, math.MinInt64, -1
			return b
		}},
		{"all flags", func() *crdt.Batch {
			b := heartbeat()
			b.Flags = crdt.FlagFull | crdt.FlagLeaving | crdt.FlagLast | crdt.FlagEcho | 1<<63
			return b
		}},
		{"most echoes", func() *crdt.Batch {
			b := heartbeat()
			b.Flags = crdt.FlagEcho
			b.Echoes = make([]crdt.Echo, crdt.MaxEchoes)
			for i := range b.Echoes {
				b.Echoes[i] = crdt.Echo{Peer: uint32(i) * 0x9e3779b9, Ago: int64(i) - 8, Held: uint32(i)}
			}
			return b
		}},
		{"limits", func() *crdt.Batch {
			b := heartbeat()
			b.From.Peer = strings.Repeat("p", crdt.MaxPeerLen)
			b.Slots = slots(crdt.MaxSlots)
			b.Windows = windows(crdt.MaxEntries - 1)
			b.Windows[0].Key = strings.Repeat("k", crdt.MaxKeyLen)
			b.Windows[0].Rule = strings.Repeat("r", crdt.MaxRuleLen)
			b.Windows[0].Slot = crdt.MaxSlots
			b.Leases = leases(1)
			return b
		}},
		{"repairs", func() *crdt.Batch {
			b := fullBatch()
			gossip(crdt.Repair{Seq: 40, N: 1}, crdt.Repair{Seq: math.MaxUint32 + 1, N: 1})(b)
			b.Seq = math.MaxUint32 + 9
			return b
		}},
		{"unicode", func() *crdt.Batch {
			b := heartbeat()
			b.Windows = []crdt.WindowEntry{{Rule: "règle", Key: "clé:日本🙂", WindowMs: 1, Window: 1 << 62}}
			return b
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			want := tt.batch()
			data := mustEncode(t, want)
			got, err := crdt.DecodeBatch(data)
			if err != nil {
				t.Fatalf("DecodeBatch: %v", err)
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("round trip changed the batch:\n got %+v\nwant %+v", got, want)
			}
			// Encoding is deterministic: the same batch, a fresh copy of
			// it and its decoded twin all encode to the same bytes.
			for i, b := range []*crdt.Batch{want, tt.batch(), got} {
				if again := mustEncode(t, b); !bytes.Equal(again, data) {
					t.Errorf("encoding %d differs:\n%x\n%x", i, again, data)
				}
			}
		})
	}
}

// TestBatchGolden pins the wire format of a heartbeat: a change here breaks
// compatibility with every deployed peer.
func TestBatchGolden(t *testing.T) {
	// {0: 1, 1: {0: "p", 1: 7}, 2: 3, 3: 1000, 4: 1001}
	const want = "a5" + "0001" + "01a2006170" + "0107" + "0203" + "031903e8" + "041903e9"
	data := mustEncode(t, heartbeat())
	if got := hex.EncodeToString(data); got != want {
		t.Errorf("heartbeat encodes to %s, want %s", got, want)
	}
}

// TestEchoGolden pins the wire format of an echo: key 13, an array of
// three-element arrays [peer tag, ago, held].
func TestEchoGolden(t *testing.T) {
	b := heartbeat()
	b.Flags = crdt.FlagEcho
	b.Echoes = []crdt.Echo{{Peer: 0x01020304, Ago: 23, Held: 300}, {Peer: 7, Ago: -2, Held: 0}}
	// heartbeat, 8: 8, 13: [[0x01020304, 23, 300], [7, -2, 0]]
	const want = "a7" + "0001" + "01a2006170" + "0107" + "0203" + "031903e8" + "041903e9" + "0808" +
		"0d82" + "831a010203041719012c" + "83072100"
	data := mustEncode(t, b)
	if got := hex.EncodeToString(data); got != want {
		t.Errorf("echo batch encodes to %s, want %s", got, want)
	}
}

// TestPeerTag pins PeerTag to FNV-1a (32 bits): peers of every version
// must compute the same tags.
func TestPeerTag(t *testing.T) {
	for _, tt := range []struct {
		peer string
		want uint32
	}{
		{"", 0x811c9dc5},
		{"a", 0xe40c292c},
		{"foobar", 0xbf9cf968},
	} {
		if got := crdt.PeerTag(tt.peer); got != tt.want {
			t.Errorf("PeerTag(%q) = %#x, want %#x", tt.peer, got, tt.want)
		}
	}
}

func TestBatchAccessors(t *testing.T) {
	b := fullBatch()
	for i, want := range []crdt.Slot{b.From, b.Slots[0], b.Slots[1]} {
		if got := b.SlotOf(uint32(i)); got != want {
			t.Errorf("SlotOf(%d) = %v, want %v", i, got, want)
		}
	}
	for _, tt := range []struct {
		flag uint64
		want bool
	}{{crdt.FlagFull, true}, {crdt.FlagLeaving, false}, {crdt.FlagLast, true}, {crdt.FlagEcho, true}} {
		if got := b.Has(tt.flag); got != tt.want {
			t.Errorf("Has(%d) = %v, want %v", tt.flag, got, tt.want)
		}
	}
}

// badBatch is one input DecodeBatch must refuse.
type badBatch struct {
	name string
	data func(t testing.TB) []byte
	// msg are substrings the error must contain, naming the offending
	// field where the check can know it. Errors from the CBOR layer name a
	// field by its top-level CBOR key ("crdt.Batch.10" is Windows) or not
	// at all (unknown field, duplicate key, UTF-8, nesting).
	msg []string
}

// badBatches returns the refused inputs; the fuzz test seeds from them too.
func badBatches() []badBatch {
	// A batch with a single window entry, for byte-level surgery.
	one := func(t testing.TB) []byte {
		b := heartbeat()
		b.Windows = []crdt.WindowEntry{{Rule: "RULE", Key: "KEYX", WindowMs: 1000, Window: 1, Admitted: 1, Attempted: 2}}
		return mustEncode(t, b)
	}
	entry := map[int]any{1: "r", 2: "k", 3: 1000, 4: 1}
	header := func(extra map[int]any) map[int]any {
		m := map[int]any{0: 1, 1: map[int]any{0: "p", 1: 1}}
		for k, v := range extra {
			m[k] = v
		}
		return m
	}
	fromBytes := func(b []byte) func(testing.TB) []byte { return func(testing.TB) []byte { return b } }
	mut := func(f func(b *crdt.Batch)) func(testing.TB) []byte {
		return func(t testing.TB) []byte { return mutated(t, f) }
	}
	raw := func(v any) func(testing.TB) []byte {
		return func(t testing.TB) []byte { return rawEncode(t, v) }
	}
	return []badBatch{
		// Header.
		{"wrong version", mut(func(b *crdt.Batch) { b.Version = 2 }), []string{"version 2"}},
		{"missing version", raw(map[int]any{1: map[int]any{0: "p"}}), []string{"version 0"}},
		{"empty from peer", mut(func(b *crdt.Batch) { b.From.Peer = "" }), []string{"from: empty peer"}},
		{"missing from", raw(map[int]any{0: 1}), []string{"from: empty peer"}},
		{"long from peer", mut(func(b *crdt.Batch) { b.From.Peer = strings.Repeat("p", crdt.MaxPeerLen+1) }), []string{"from: peer of 129 bytes"}},
		{"empty slot peer", mut(func(b *crdt.Batch) { b.Slots[1].Peer = "" }), []string{"slots[1]: empty peer"}},
		{"empty nack peer", mut(func(b *crdt.Batch) { b.Nacks[1].Slot.Peer = "" }), []string{"nacks[1]: empty peer"}},
		{"empty evicted peer", mut(func(b *crdt.Batch) { b.Evicted[0].Peer = "" }), []string{"evicted[0]: empty peer"}},
		{"too many slots", mut(func(b *crdt.Batch) { b.Slots = slots(crdt.MaxSlots + 1) }), []string{"257 slots"}},
		{"too many nacks", mut(func(b *crdt.Batch) {
			b.Nacks = make([]crdt.Nack, crdt.MaxNacks+1)
			for i := range b.Nacks {
				b.Nacks[i].Slot.Peer = "p"
			}
		}), []string{"1025 nacks"}},
		{"too many evicted", mut(func(b *crdt.Batch) { b.Evicted = slots(crdt.MaxEvicted + 1) }), []string{"1025 evicted"}},

		// Repairs.
		{"repair of seq 0", mut(gossip(crdt.Repair{Seq: 0, N: 1})), []string{"repairs[0]: seq 0"}},
		{"repair of a later seq", mut(gossip(crdt.Repair{Seq: 7, N: 1}, crdt.Repair{Seq: 42, N: 1})), []string{"repairs[1]: seq 42"}},
		{"empty repair", mut(gossip(crdt.Repair{Seq: 7, N: 0})), []string{"repairs[0]: repairs no entry"}},
		{"repairs beyond the entries", mut(gossip(crdt.Repair{Seq: 7, N: 2}, crdt.Repair{Seq: 8, N: 2})), []string{"repairs[1]: tags 4 entries in all, more than the batch's 3"}},
		{"repairs in a full state", mut(func(b *crdt.Batch) { b.Repairs = []crdt.Repair{{Seq: 7, N: 1}} }), []string{"full-state batch carries no repairs"}},
		{"too many repairs", mut(func(b *crdt.Batch) {
			gossip()(b)
			b.Repairs = make([]crdt.Repair, crdt.MaxRepairs+1)
		}), []string{"1025 repairs"}},

		// CBOR strictness.
		// Unknown integer keys are skipped (TestDecodeBatchSkipsUnknown),
		// but only so many, and only integer ones.
		{"text key", raw(map[any]any{0: 1, 1: map[int]any{0: "p"}, "extra": 1}), []string{"batch: key 2 is a text string, not an unsigned integer"}},
		{"text key naming a field", raw(map[any]any{0: 1, 1: map[int]any{0: "p"}, "2": 1}), []string{"batch: key 2 is a text string"}},
		{"negative key", raw(header(map[int]any{-1: 1})), []string{"batch: key 2 is a negative integer"}},
		{"byte string key", raw(map[any]any{0: 1, 1: map[int]any{0: "p"}, cbor.ByteString("k"): 1}), []string{"batch: key 2 is a byte string, not an unsigned integer"}},
		{"text key in an entry", raw(header(map[int]any{10: []any{entry, map[any]any{1: "r", 2: "k", 3: 1000, 4: 1, "x": 9}}})), []string{"windows[1]: key 4 is a text string"}},
		{"text key in a nack's slot", raw(header(map[int]any{7: []any{map[int]any{0: map[any]any{0: "q", "x": 1}, 1: 3}}})), []string{"nacks[0].slot: key 1 is a text string"}},
		{"text key in from", raw(map[int]any{0: 1, 1: map[any]any{0: "p", "x": 1}}), []string{"from: key 1 is a text string"}},
		{"too many unknown header keys", raw(header(map[int]any{16: 1, 17: 1, 18: 1, 19: 1, 20: 1, 21: 1, 22: 1, 23: 1, 24: 1})), []string{"batch: more than 8 unknown keys"}},
		{"too many unknown entry keys", raw(header(map[int]any{11: []any{map[int]any{1: "r", 2: "k", 3: 1, 7: 0, 8: 0, 9: 0, 10: 0, 11: 0, 12: 0, 13: 0, 14: 0, 15: 0}}})), []string{"leases[0]: more than 8 unknown keys"}},
		{"unknown value nested too deep", raw(header(map[int]any{16: []any{[]any{[]any{[]any{[]any{[]any{1}}}}}}})), []string{"exceeded max nested level"}},
		{"unknown value with a tag", raw(header(map[int]any{16: cbor.Tag{Number: 100, Content: 1}})), []string{"tag"}},
		{"duplicate unknown key", fromBytes([]byte{0xa4, 0x00, 0x01, 0x01, 0xa1, 0x00, 0x61, 'p', 0x10, 0x01, 0x10, 0x02}), []string{"duplicate map key 16"}},
		{"duplicate header key", fromBytes([]byte{0xa3, 0x00, 0x01, 0x01, 0xa1, 0x00, 0x61, 'p', 0x00, 0x01}), []string{"duplicate map key 0"}},
		{"duplicate nested key", fromBytes([]byte{0xa2, 0x00, 0x01, 0x01, 0xa2, 0x00, 0x61, 'p', 0x00, 0x61, 'q'}), []string{"duplicate map key 0"}},
		{"duplicate key int and text", fromBytes([]byte{0xa3, 0x00, 0x01, 0x01, 0xa1, 0x00, 0x61, 'p', 0x61, '0', 0x01}), []string{"batch: key 2 is a text string"}},
		{"indefinite-length array", func(t testing.TB) []byte {
			b := append([]byte{0xa3}, rawEncode(t, 0)...)
			b = append(b, rawEncode(t, 1)...)
			b = append(b, 0x01, 0xa1, 0x00, 0x61, 'p')
			b = append(b, 0x0a, 0x9f)
			b = append(b, rawEncode(t, entry)...)
			return append(b, 0xff)
		}, []string{"indefinite-length array"}},
		{"indefinite-length map", fromBytes([]byte{0xbf, 0x00, 0x01, 0x01, 0xa1, 0x00, 0x61, 'p', 0xff}), []string{"indefinite-length map"}},
		{"indefinite-length text", fromBytes([]byte{0xa2, 0x00, 0x01, 0x01, 0xa1, 0x00, 0x7f, 0x61, 'p', 0xff}), []string{"indefinite-length UTF-8 text string"}},
		{"self-describe tag", func(t testing.TB) []byte { return append([]byte{0xd9, 0xd9, 0xf7}, mustEncode(t, heartbeat())...) }, []string{"tag"}},
		{"tagged field", fromBytes([]byte{0xa3, 0x00, 0x01, 0x01, 0xa1, 0x00, 0x61, 'p', 0x03, 0xc1, 0x01}), []string{"tag"}},
		{"wrong type", raw(header(map[int]any{2: "seq"})), []string{"crdt.Batch.2 of type uint64"}},
		{"float for int", raw(header(map[int]any{3: 1.5})), []string{"crdt.Batch.3 of type int64"}},
		{"byte string for text", raw(map[int]any{0: 1, 1: map[int]any{0: []byte("p")}}), []string{"crdt.Batch.1 of type string"}},
		{"slot index overflows uint32", raw(header(map[int]any{10: []any{map[int]any{0: uint64(1) << 32, 1: "r", 2: "k", 3: 1000, 4: 1}}})), []string{"crdt.Batch.10 of type uint32"}},
		{"not a map", raw([]any{1, 2}), []string{"cannot unmarshal"}},
		{"trailing data", func(t testing.TB) []byte { return append(mustEncode(t, heartbeat()), 0x00) }, []string{"extraneous data"}},
		{"empty input", fromBytes(nil), []string{"EOF"}},
		{"truncated", func(t testing.TB) []byte { d := mustEncode(t, fullBatch()); return d[:len(d)-1] }, []string{"EOF"}},
		{"deeply nested", func(testing.TB) []byte {
			return append(bytes.Repeat([]byte{0x81}, 1000), 0x00)
		}, []string{"max nested level"}},
		{"deeply nested field", func(t testing.TB) []byte {
			var v any = 0
			for range 10 {
				v = []any{v}
			}
			return rawEncode(t, header(map[int]any{10: v}))
		}, []string{"max nested level"}},
		{"invalid UTF-8 rule", func(t testing.TB) []byte { return replaceOnce(t, one(t), "RULE", "RU\xffE") }, []string{"UTF-8"}},
		{"invalid UTF-8 key", func(t testing.TB) []byte { return replaceOnce(t, one(t), "KEYX", "KE\xc3\x28") }, []string{"UTF-8"}},
		{"invalid UTF-8 peer", func(t testing.TB) []byte {
			return rawEncode(t, map[int]any{0: 1, 1: map[int]any{0: "\xed\xa0\x80"}}) // a surrogate
		}, []string{"UTF-8"}},
		{"over MaxBatchBytes", func(t testing.TB) []byte {
			// A valid prefix padded far beyond the cap: refused on size
			// before any parsing.
			return append(mustEncode(t, heartbeat()), make([]byte, crdt.MaxBatchBytes)...)
		}, []string{"bytes, over the 1048576-byte cap"}},

		// Echoes.
		{"too many echoes", mut(func(b *crdt.Batch) { b.Echoes = make([]crdt.Echo, crdt.MaxEchoes+1) }), []string{"17 echoes"}},
		{"echo held over the maximum", mut(func(b *crdt.Batch) { b.Echoes[1].Held = crdt.MaxEchoHeldMs + 1 }), []string{"echoes[1]", "held 60001 ms"}},
		{"echo ago too far back", mut(func(b *crdt.Batch) { b.Echoes[2].Ago = crdt.MaxValue + 1 }), []string{"echoes[2]", "ago 9007199254740993 ms out of range"}},
		{"echo ago too far ahead", mut(func(b *crdt.Batch) { b.Echoes[0].Ago = math.MinInt64 }), []string{"echoes[0]", "out of range"}},
		{"echo of two elements", raw(header(map[int]any{13: []any{[]any{1, 2}}})), []string{"crdt.Echo", "different number of elements"}},
		{"echo of twelve elements", raw(header(map[int]any{13: []any{[]any{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}}})), []string{"echoes[0]: 12 elements, more than 3 known and 8 unknown"}},
		{"echo as a map", raw(header(map[int]any{13: []any{map[int]any{0: 1, 1: 2, 2: 3}}})), []string{"crdt.Echo", "cannot decode CBOR map to struct with toarray option"}},
		{"member entry's state as text with an extra", raw(header(map[int]any{8: crdt.FlagFull, 14: []any{[]any{"q", 1, "alive", []any{}, "zone"}}})), []string{"crdt.Batch.14", "uint8"}},
		{"member entry of three elements", raw(header(map[int]any{8: crdt.FlagFull, 14: []any{[]any{"q", 1, 0}}})), []string{"crdt.MemberEntry", "different number of elements"}},
		{"repair of eleven elements", raw(header(map[int]any{15: []any{[]any{1, 1, 3, 4, 5, 6, 7, 8, 9, 10, 11}}})), []string{"repairs[0]: 11 elements, more than 2 known and 8 unknown"}},
		{"echo's known element of a wrong type with an extra", raw(header(map[int]any{13: []any{[]any{1, "two", 3, 4}}})), []string{"crdt.Batch.13", "int64"}},
		{"echo tag overflows uint32", raw(header(map[int]any{13: []any{[]any{uint64(1) << 32, 2, 3}}})), []string{"uint32"}},
		{"echo held negative", raw(header(map[int]any{13: []any{[]any{1, 2, -3}}})), []string{"uint32"}},
		{"echo held overflows uint32", raw(header(map[int]any{13: []any{[]any{1, 2, uint64(1) << 32}}})), []string{"uint32"}},
		{"echoes not an array", raw(header(map[int]any{13: 5})), []string{"crdt.Batch.13"}},

		// Entries.
		{"entries over MaxEntries in one array", mut(func(b *crdt.Batch) { b.Windows, b.Leases = windows(crdt.MaxEntries+1), nil }), []string{"max number of elements"}},
		{"entries over MaxEntries in total", mut(func(b *crdt.Batch) {
			b.Windows, b.Leases = windows(crdt.MaxEntries/2), leases(crdt.MaxEntries/2+1)
		}), []string{"4097 entries"}},
		{"key of 257 bytes", mut(func(b *crdt.Batch) { b.Windows[1].Key = strings.Repeat("k", crdt.MaxKeyLen+1) }), []string{"windows[1]", "key of 257 bytes"}},
		{"lease key of 257 bytes", mut(func(b *crdt.Batch) { b.Leases[0].Key = strings.Repeat("k", crdt.MaxKeyLen+1) }), []string{"leases[0]", "key of 257 bytes"}},
		{"empty key", mut(func(b *crdt.Batch) { b.Windows[0].Key = "" }), []string{"windows[0]", "empty key"}},
		{"empty lease key", mut(func(b *crdt.Batch) { b.Leases[1].Key = "" }), []string{"leases[1]", "empty key"}},
		{"empty rule", mut(func(b *crdt.Batch) { b.Windows[2].Rule = "" }), []string{"windows[2]", "empty rule"}},
		{"empty lease rule", mut(func(b *crdt.Batch) { b.Leases[0].Rule = "" }), []string{"leases[0]", "empty rule"}},
		{"rule of 129 bytes", mut(func(b *crdt.Batch) { b.Windows[0].Rule = strings.Repeat("r", crdt.MaxRuleLen+1) }), []string{"windows[0]", "rule of 129 bytes"}},
		{"slot index beyond slots", mut(func(b *crdt.Batch) { b.Windows[0].Slot = 3 }), []string{"windows[0]", "slot 3"}},
		{"slot index with no slots", mut(func(b *crdt.Batch) {
			b.Slots = nil
			b.Windows = b.Windows[:1]
			b.Leases[0].Slot, b.Leases[1].Slot = 0, 1
		}), []string{"leases[1]", "slot 1"}},
		{"slot index max uint32", mut(func(b *crdt.Batch) { b.Leases[0].Slot = math.MaxUint32 }), []string{"leases[0]", "slot 4294967295"}},
		{"attempted below admitted", mut(func(b *crdt.Batch) { b.Windows[1].Admitted = 4 }), []string{"windows[1]", "attempted 3 below admitted 4"}},
		{"released above acquired", mut(func(b *crdt.Batch) { b.Leases[1].Released = 4 }), []string{"leases[1]", "released 4 above acquired 3"}},
		{"window_ms zero", mut(func(b *crdt.Batch) { b.Windows[0].WindowMs = 0 }), []string{"windows[0]", "window_ms 0"}},
		{"window_ms negative", mut(func(b *crdt.Batch) { b.Windows[2].WindowMs = -1000 }), []string{"windows[2]", "window_ms -1000"}},
		{"window_ms over a year", mut(func(b *crdt.Batch) { b.Windows[0].WindowMs = crdt.MaxWindowMs + 1 }), []string{"windows[0]", "window_ms 31622400001"}},
		{"attempted over MaxValue", mut(func(b *crdt.Batch) { b.Windows[0].Attempted = crdt.MaxValue + 1 }), []string{"windows[0]", "attempted 9007199254740993 over the maximum"}},
		{"acquired over MaxValue", mut(func(b *crdt.Batch) { b.Leases[1].Acquired = crdt.MaxValue + 1; b.Leases[1].Released = 0 }), []string{"leases[1]", "acquired 9007199254740993 over the maximum"}},
		{"negative window", mut(func(b *crdt.Batch) { b.Windows[0].Window = -1 }), []string{"windows[0]", "window -1"}},
		{"window out of range", mut(func(b *crdt.Batch) { b.Windows[0].WindowMs, b.Windows[0].Window = 1000, math.MaxInt64/1000 }), []string{"windows[0]", "out of range"}},
	}
}

func TestDecodeBatchRefuses(t *testing.T) {
	for _, tt := range badBatches() {
		t.Run(tt.name, func(t *testing.T) {
			data := tt.data(t)
			var (
				b   *crdt.Batch
				err error
			)
			func() {
				defer func() {
					if r := recover(); r != nil {
						t.Fatalf("DecodeBatch panicked: %v", r)
					}
				}()
				b, err = crdt.DecodeBatch(data)
			}()
			if err == nil {
				t.Fatalf("DecodeBatch succeeded with %+v, want an error", b)
			}
			if b != nil {
				t.Errorf("DecodeBatch returned a batch with its error")
			}
			if !errors.Is(err, crdt.ErrMalformed) {
				t.Errorf("error %q does not wrap ErrMalformed", err)
			}
			for _, m := range tt.msg {
				if !strings.Contains(err.Error(), m) {
					t.Errorf("error %q does not mention %q", err, m)
				}
			}
		})
	}
}

// TestDecodeBatchTruncated checks that every proper prefix of a valid
// encoding is refused.
func TestDecodeBatchTruncated(t *testing.T) {
	data := mustEncode(t, fullBatch())
	for n := range len(data) {
		if _, err := crdt.DecodeBatch(data[:n]); !errors.Is(err, crdt.ErrMalformed) {
			t.Fatalf("prefix of %d/%d bytes: err = %v, want ErrMalformed", n, len(data), err)
		}
	}
}

// TestEncodeRefuses checks that Encode validates: it refuses what
// DecodeBatch would refuse, so what it encodes always decodes.
func TestEncodeRefuses(t *testing.T) {
	tests := []struct {
		name string
		f    func(b *crdt.Batch)
		msg  string
	}{
		{"zero version", func(b *crdt.Batch) { b.Version = 0 }, "version 0"},
		{"empty from peer", func(b *crdt.Batch) { b.From.Peer = "" }, "from: empty peer"},
		{"empty key", func(b *crdt.Batch) { b.Windows[0].Key = "" }, "windows[0]: empty key"},
		{"slot index beyond slots", func(b *crdt.Batch) { b.Leases[1].Slot = 3 }, "leases[1]: slot 3"},
		{"attempted below admitted", func(b *crdt.Batch) { b.Windows[0].Attempted = 1 }, "windows[0]: attempted 1 below admitted 5"},
		{"too many entries", func(b *crdt.Batch) { b.Windows, b.Leases = windows(crdt.MaxEntries), leases(1) }, "4097 entries"},
		{"invalid UTF-8 rule", func(b *crdt.Batch) { b.Leases[0].Rule = "\xff" }, "leases[0]: rule is not UTF-8"},
		{"invalid UTF-8 key", func(b *crdt.Batch) { b.Windows[1].Key = "acct:\xff" }, "windows[1]: key is not UTF-8"},
		{"invalid UTF-8 lease key", func(b *crdt.Batch) { b.Leases[1].Key = "\xc3\x28" }, "leases[1]: key is not UTF-8"},
		{"invalid UTF-8 from peer", func(b *crdt.Batch) { b.From.Peer = "\x12\x20\xff" }, "from: peer is not UTF-8"},
		{"invalid UTF-8 slot peer", func(b *crdt.Batch) { b.Slots[0].Peer = "\xff" }, "slots[0]: peer is not UTF-8"},
		{"invalid UTF-8 nack peer", func(b *crdt.Batch) { b.Nacks[0].Slot.Peer = "\xff" }, "nacks[0]: peer is not UTF-8"},
		{"invalid UTF-8 evicted peer", func(b *crdt.Batch) { b.Evicted[0].Peer = "\xff" }, "evicted[0]: peer is not UTF-8"},
		{"too many echoes", func(b *crdt.Batch) { b.Echoes = make([]crdt.Echo, crdt.MaxEchoes+1) }, "17 echoes"},
		{"echo held over the maximum", func(b *crdt.Batch) { b.Echoes[0].Held = math.MaxUint32 }, "echoes[0]: held 4294967295 ms"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := fullBatch()
			tt.f(b)
			data, err := b.Encode()
			if err == nil {
				_, derr := crdt.DecodeBatch(data)
				t.Fatalf("Encode succeeded (and DecodeBatch of its output says %v), want an error", derr)
			}
			if !errors.Is(err, crdt.ErrMalformed) {
				t.Errorf("error %q does not wrap ErrMalformed", err)
			}
			if !strings.Contains(err.Error(), tt.msg) {
				t.Errorf("error %q does not mention %q", err, tt.msg)
			}
			if data != nil {
				t.Errorf("Encode returned %d bytes with its error", len(data))
			}
			// Validate says the same.
			if verr := b.Validate(); verr == nil || !strings.Contains(verr.Error(), tt.msg) {
				t.Errorf("Validate = %v, want an error mentioning %q", verr, tt.msg)
			}
		})
	}
}

// TestEncodeTooLarge checks that a batch within every count and length
// bound but encoding beyond MaxBatchBytes is refused by Encode, though
// Validate passes it.
func TestEncodeTooLarge(t *testing.T) {
	b := heartbeat()
	b.Windows = windows(crdt.MaxEntries)
	for i := range b.Windows {
		b.Windows[i].Key = fmt.Sprintf("%0256d", i)
	}
	if err := b.Validate(); err != nil {
		t.Fatalf("Validate = %v, want nil", err)
	}
	data, err := b.Encode()
	if !errors.Is(err, crdt.ErrMalformed) || !strings.Contains(err.Error(), "over the 1048576-byte cap") {
		t.Errorf("Encode = %d bytes, %v; want ErrMalformed over the cap", len(data), err)
	}
}

// BenchmarkDecodeBatch measures decoding a batch of 64 window entries, a
// busy node's sync interval.
func BenchmarkDecodeBatch(b *testing.B) {
	batch := heartbeat()
	batch.Windows = windows(64)
	for i := range batch.Windows {
		batch.Windows[i].Key = fmt.Sprintf("acct:%06d", i)
	}
	data := mustEncode(b, batch)
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		got, err := crdt.DecodeBatch(data)
		if err != nil {
			b.Fatalf("DecodeBatch: %v", err)
		}
		if len(got.Windows) != 64 {
			b.Fatalf("DecodeBatch = %d windows, want 64", len(got.Windows))
		}
	}
}

// TestBatchMemberTable: a full state's member table round-trips; one
// outside a full state, or with a bad state or address, is refused naming
// the field.
func TestBatchMemberTable(t *testing.T) {
	full := func(ms ...crdt.MemberEntry) *crdt.Batch {
		return &crdt.Batch{Version: crdt.Version, From: crdt.Slot{Peer: "p", Incarnation: 1}, Flags: crdt.FlagFull, Members: ms}
	}
	b := full(crdt.MemberEntry{Peer: "q", Incarnation: 7, State: crdt.MemberSuspect, Addrs: []string{"/ip4/127.0.0.1/tcp/4001"}})
	data, err := b.Encode()
	if err != nil {
		t.Fatal(err)
	}
	got, err := crdt.DecodeBatch(data)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Members) != 1 || got.Members[0].Peer != "q" || got.Members[0].Incarnation != 7 || got.Members[0].State != crdt.MemberSuspect || len(got.Members[0].Addrs) != 1 {
		t.Errorf("decoded members %+v, want %+v", got.Members, b.Members)
	}
	notFull := full(crdt.MemberEntry{Peer: "q", Incarnation: 1})
	notFull.Flags = 0
	for _, tc := range []struct {
		name string
		b    *crdt.Batch
		want string
	}{
		{"outside a full state", notFull, "members: only a full-state batch"},
		{"bad state", full(crdt.MemberEntry{Peer: "q", Incarnation: 1, State: 9}), "members[0]: state 9"},
		{"empty peer", full(crdt.MemberEntry{Incarnation: 1}), "members[0]: empty peer"},
		{"empty addr", full(crdt.MemberEntry{Peer: "q", Incarnation: 1, Addrs: []string{""}}), "members[0].addrs[0]"},
	} {
		if _, err := tc.b.Encode(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: Encode = %v, want an error naming %q", tc.name, err, tc.want)
		}
	}
}
