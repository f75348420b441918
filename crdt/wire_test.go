package crdt_test

import (
	"reflect"
	"testing"

	"github.com/fxamacker/cbor/v2"

	"github.com/ratemesh/ratemesh/crdt"
)

// generic re-encodes b as CBOR maps and arrays a test can add to: maps as
// map[any]any with uint64 keys, arrays as []any.
func generic(t testing.TB, b *crdt.Batch) map[any]any {
	t.Helper()
	var m map[any]any
	if err := cbor.Unmarshal(mustEncode(t, b), &m); err != nil {
		t.Fatal(err)
	}
	return m
}

// encodeSorted encodes v with sorted map keys, so a generic map encodes
// the same bytes every time.
func encodeSorted(t testing.TB, v any) []byte {
	t.Helper()
	em, err := cbor.EncOptions{Sort: cbor.SortCanonical}.EncMode()
	if err != nil {
		t.Fatal(err)
	}
	data, err := em.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// TestDecodeBatchSkipsUnknown adds one unknown key or element at a time
// to a valid batch: each decodes to the batch without it.
func TestDecodeBatchSkipsUnknown(t *testing.T) {
	base := fullBatch()
	base.Members = []crdt.MemberEntry{{Peer: "12D3KooWdef", Incarnation: 9, Addrs: []string{"/ip4/10.0.0.2/tcp/1"}}}
	gossip := heartbeat()
	gossip.Seq, gossip.Flags, gossip.Windows = 9, crdt.FlagRepairs, windows(2)
	gossip.Repairs = []crdt.Repair{{Seq: 3, N: 1}}
	type edit func(m map[any]any)
	at := func(m map[any]any, key uint64, i int) map[any]any {
		return m[key].([]any)[i].(map[any]any)
	}
	appendTo := func(m map[any]any, key uint64, i int, extra ...any) {
		m[key].([]any)[i] = append(m[key].([]any)[i].([]any), extra...)
	}
	for _, tt := range []struct {
		name string
		b    *crdt.Batch
		edit edit
	}{
		{"batch key 16", base, func(m map[any]any) { m[uint64(16)] = uint64(1) }},
		{"batch key 2^64-1", base, func(m map[any]any) { m[^uint64(0)] = "x" }},
		{"eight batch keys", base, func(m map[any]any) {
			for k := uint64(16); k < 24; k++ {
				m[k] = []any{k, map[any]any{uint64(0): k}}
			}
		}},
		{"from key", base, func(m map[any]any) { m[uint64(1)].(map[any]any)[uint64(2)] = "x" }},
		{"nack key", base, func(m map[any]any) { at(m, 7, 1)[uint64(5)] = uint64(1) }},
		{"nack slot key", base, func(m map[any]any) { at(m, 7, 0)[uint64(0)].(map[any]any)[uint64(2)] = uint64(1) }},
		{"slots key", base, func(m map[any]any) { at(m, 9, 1)[uint64(2)] = uint64(1) }},
		{"window key", base, func(m map[any]any) { at(m, 10, 2)[uint64(7)] = []any{uint64(1), "two"} }},
		{"eight window keys", base, func(m map[any]any) {
			for k := uint64(7); k < 15; k++ {
				at(m, 10, 0)[k] = k
			}
		}},
		{"lease key", base, func(m map[any]any) { at(m, 11, 0)[uint64(5)] = uint64(1) }},
		{"evicted key", base, func(m map[any]any) { at(m, 12, 0)[uint64(2)] = uint64(1) }},
		{"echo element", base, func(m map[any]any) { appendTo(m, 13, 2, uint64(1)) }},
		{"member elements", base, func(m map[any]any) { appendTo(m, 14, 0, "zone", uint64(1), []any{}) }},
		{"eight member elements", base, func(m map[any]any) {
			appendTo(m, 14, 0, uint64(1), uint64(2), uint64(3), uint64(4), uint64(5), uint64(6), uint64(7), uint64(8))
		}},
		{"repair element", gossip, func(m map[any]any) { appendTo(m, 15, 0, "why") }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			m := generic(t, tt.b)
			tt.edit(m)
			data := encodeSorted(t, m)
			got, err := crdt.DecodeBatch(data)
			if err != nil {
				t.Fatalf("DecodeBatch: %v", err)
			}
			if n1, n2 := normalized(got), normalized(tt.b); !reflect.DeepEqual(n1, n2) {
				t.Fatalf("decoded\n got %+v\nwant %+v", n1, n2)
			}
		})
	}
}
