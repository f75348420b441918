package crdt_test

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"

	"github.com/ratemesh/ratemesh/crdt"
)

var updateWire = flag.Bool("update-wire", false, "rewrite the hand-made future batches in testdata/wire")

// wireDir holds the golden corpus: <commit>-<kind>.cbor, a batch encoded by
// that commit's crdt package (or, for commit "future", built by hand
// below), and <commit>-<kind>.json, the same batch's known fields as
// encoding/json wrote them.
const wireDir = "testdata/wire"

// wireCommits are the commits whose batches the corpus must hold: the
// first wire (c06d2c4), fdd4fa5's (Echoes, no member table), 8758fb6's
// (the member table), 821b92d's (Repairs), afeebb3's, d03b090's (a node
// core's own output announcing FlagSkipsUnknown, and its full state
// without the table for a peer not heard from), and the hand-made future.
var wireCommits = []string{"c06d2c4", "fdd4fa5", "8758fb6", "821b92d", "afeebb3", "d03b090", "future"}

// futureBatches returns batches as a later version could write them: the
// known fields of want, and fields and elements nobody knows yet, at the
// top level and in nested entries. The returned map is kind -> (encoding,
// the batch of its known fields).
func futureBatches(t testing.TB) map[string]struct {
	data []byte
	want *crdt.Batch
} {
	t.Helper()
	out := map[string]struct {
		data []byte
		want *crdt.Batch
	}{}

	// A full state.
	full := fullBatch()
	full.Echoes = nil
	full.Flags |= 1 << 40 // a flag nobody knows: flags never fail a decode
	full.Members = []crdt.MemberEntry{
		{Peer: "12D3KooWdef", Incarnation: 9, State: crdt.MemberAlive, Addrs: []string{"/ip4/10.0.0.2/tcp/4001"}},
		{Peer: "12D3KooWjkl", Incarnation: 3, State: crdt.MemberSuspect},
	}
	m := generic(t, full)
	// A future top-level field: an array of maps, as Members or Windows.
	m[uint64(16)] = []any{map[any]any{uint64(0): "zone-a", uint64(1): []any{uint64(1), uint64(2)}}}
	// And a scalar one, far ahead.
	m[uint64(63)] = uint64(7)
	// Future nested fields: in window and lease entries, nacks, a nack's
	// slot, the From slot, the relayed slots, the evicted slots.
	m[uint64(1)].(map[any]any)[uint64(2)] = "eu-west"
	win := m[uint64(10)].([]any)
	win[0].(map[any]any)[uint64(7)] = uint64(12)                              // say, a denied count
	win[2].(map[any]any)[uint64(8)] = map[any]any{uint64(0): []any{"x", "y"}} // a nested map
	m[uint64(11)].([]any)[1].(map[any]any)[uint64(5)] = int64(-5)
	nack := m[uint64(7)].([]any)[0].(map[any]any)
	nack[uint64(2)] = true
	nack[uint64(0)].(map[any]any)[uint64(3)] = []byte{1, 2, 3}
	m[uint64(9)].([]any)[1].(map[any]any)[uint64(2)] = uint64(0)
	m[uint64(12)].([]any)[0].(map[any]any)[uint64(9)] = "why"
	// Member entries with trailing elements: a zone, a weight.
	mem := m[uint64(14)].([]any)
	mem[0] = append(mem[0].([]any), "zone-a", uint64(3))
	mem[1] = append(mem[1].([]any), []any{"nested", map[any]any{uint64(0): uint64(1)}})
	out["full"] = struct {
		data []byte
		want *crdt.Batch
	}{encodeSorted(t, m), full}

	// A gossip batch with echoes and repairs of more elements.
	g := heartbeat()
	g.Seq = 9
	g.Flags = crdt.FlagEcho | crdt.FlagRepairs | crdt.FlagSkipsUnknown | 1<<30
	g.Windows = windows(3)
	g.Echoes = []crdt.Echo{{Peer: crdt.PeerTag("q"), Ago: 40, Held: 7}}
	g.Repairs = []crdt.Repair{{Seq: 3, N: 2}}
	m = generic(t, g)
	ech := m[uint64(13)].([]any)
	ech[0] = append(ech[0].([]any), uint64(99))
	rep := m[uint64(15)].([]any)
	rep[0] = append(rep[0].([]any), "why", uint64(1))
	m[uint64(10)].([]any)[1].(map[any]any)[uint64(7)] = uint64(1)
	m[uint64(20)] = map[any]any{uint64(0): "future"}
	out["gossip"] = struct {
		data []byte
		want *crdt.Batch
	}{encodeSorted(t, m), g}
	return out
}

// TestFutureWireFiles checks that the future batches in testdata/wire are
// the ones futureBatches builds (go test -run TestFutureWireFiles
// -update-wire ./crdt/ rewrites them).
func TestFutureWireFiles(t *testing.T) {
	for kind, f := range futureBatches(t) {
		name := filepath.Join(wireDir, "future-"+kind)
		js, err := json.MarshalIndent(f.want, "", "  ")
		if err != nil {
			t.Fatal(err)
		}
		js = append(js, '\n')
		if *updateWire {
			if err := os.WriteFile(name+".cbor", f.data, 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(name+".json", js, 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		for _, c := range []struct {
			path string
			want []byte
		}{{name + ".cbor", f.data}, {name + ".json", js}} {
			got, err := os.ReadFile(c.path)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, c.want) {
				t.Errorf("%s is not what futureBatches builds; rerun with -update-wire", c.path)
			}
		}
	}
}

// TestWireGolden decodes every batch of the corpus with today's decoder:
// each must decode, to the fields its JSON twin lists, and an old
// version's batch must re-encode to its very bytes (the encoding of a
// known field never changes). A future batch decodes with its unknown
// fields skipped, and re-encodes without them.
func TestWireGolden(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(wireDir, "*.cbor"))
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(files)
	seen := map[string]bool{}
	for _, file := range files {
		base := strings.TrimSuffix(filepath.Base(file), ".cbor")
		commit, kind, ok := strings.Cut(base, "-")
		if !ok {
			t.Errorf("%s: want <commit>-<kind>.cbor", file)
			continue
		}
		seen[commit] = true
		t.Run(base, func(t *testing.T) {
			data, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			js, err := os.ReadFile(strings.TrimSuffix(file, ".cbor") + ".json")
			if err != nil {
				t.Fatal(err)
			}
			var want crdt.Batch
			dec := json.NewDecoder(bytes.NewReader(js))
			dec.DisallowUnknownFields() // a renamed field fails here
			if err := dec.Decode(&want); err != nil {
				t.Fatalf("%s.json: %v", base, err)
			}
			got, err := crdt.DecodeBatch(data)
			if err != nil {
				t.Fatalf("today's decoder refuses %s: %v", base, err)
			}
			if n1, n2 := normalized(got), normalized(&want); !reflect.DeepEqual(n1, n2) {
				t.Fatalf("decoded %s:\n got %+v\nwant %+v", base, n1, n2)
			}
			enc, err := got.Encode()
			if err != nil {
				t.Fatal(err)
			}
			if commit != "future" {
				if !bytes.Equal(enc, data) {
					t.Fatalf("%s re-encodes to other bytes:\n got %x\nwant %x", base, enc, data)
				}
				return
			}
			if len(enc) >= len(data) {
				t.Fatalf("future %s re-encodes to %d bytes, not fewer than its %d: the unknown fields were kept?", kind, len(enc), len(data))
			}
			again, err := crdt.DecodeBatch(enc)
			if err != nil || !reflect.DeepEqual(normalized(again), normalized(got)) {
				t.Fatalf("future %s's round trip: %+v, %v", kind, again, err)
			}
		})
	}
	for _, c := range wireCommits {
		if !seen[c] {
			t.Errorf("testdata/wire holds no batch of %s", c)
		}
	}
}
