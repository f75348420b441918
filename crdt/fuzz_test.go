package crdt_test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/ratemesh/ratemesh/crdt"
)

// FuzzDecodeBatch feeds DecodeBatch arbitrary bytes. It must never panic,
// must wrap ErrMalformed in every error, and whatever it accepts must
// re-encode, decode back to the same batch, and re-encode to the same bytes.
//
// Run it with
//
//	go test -run=^$ -fuzz=FuzzDecodeBatch -fuzztime=60s ./crdt/
func FuzzDecodeBatch(f *testing.F) {
	// Valid batches.
	full := fullBatch()
	hb := heartbeat()
	leaving := heartbeat()
	leaving.Flags = crdt.FlagLeaving
	many := heartbeat()
	many.Windows = windows(20)
	many.Leases = leases(5)
	edge := heartbeat()
	edge.Windows = []crdt.WindowEntry{{Rule: "règle", Key: "clé:🙂", WindowMs: 1, Window: 1 << 62}}
	echoes := heartbeat()
	echoes.Flags = crdt.FlagEcho
	echoes.Echoes = []crdt.Echo{{Peer: crdt.PeerTag("q"), Ago: 40, Held: 7}, {Peer: 1, Ago: -3}}
	repairs := heartbeat()
	repairs.Seq, repairs.Flags, repairs.Windows = 9, crdt.FlagRepairs, windows(4)
	repairs.Repairs = []crdt.Repair{{Seq: 3, N: 2}, {Seq: 8, N: 1}}
	for _, b := range []*crdt.Batch{full, hb, leaving, many, edge, echoes, repairs} {
		f.Add(mustEncode(f, b))
	}
	// The golden corpus: every wire version's batches and the future ones
	// (TestWireGolden).
	files, err := filepath.Glob(filepath.Join(wireDir, "*.cbor"))
	if err != nil || len(files) == 0 {
		f.Fatalf("no golden batches in %s: %v", wireDir, err)
	}
	for _, file := range files {
		data, err := os.ReadFile(file)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	// An explicit empty array: decodes to an empty slice, re-encodes to
	// nothing.
	f.Add([]byte{0xa3, 0x00, 0x01, 0x01, 0xa1, 0x00, 0x61, 'p', 0x0a, 0x80})
	// Refused ones, except the huge.
	for _, bad := range badBatches() {
		if data := bad.data(f); len(data) <= 4096 {
			f.Add(data)
		}
	}

	f.Fuzz(func(t *testing.T, data []byte) {
		b, err := crdt.DecodeBatch(data)
		if err != nil {
			if !errors.Is(err, crdt.ErrMalformed) {
				t.Fatalf("error %q does not wrap ErrMalformed", err)
			}
			if b != nil {
				t.Fatalf("DecodeBatch returned a batch with its error %q", err)
			}
			return
		}
		enc, err := b.Encode()
		if err != nil {
			t.Fatalf("decoded batch %+v does not re-encode: %v", b, err)
		}
		b2, err := crdt.DecodeBatch(enc)
		if err != nil {
			t.Fatalf("re-encoding %x does not decode: %v", enc, err)
		}
		if n1, n2 := normalized(b), normalized(b2); !reflect.DeepEqual(n1, n2) {
			t.Fatalf("round trip changed the batch:\nfirst  %+v\nsecond %+v", n1, n2)
		}
		enc2, err := b2.Encode()
		if err != nil {
			t.Fatalf("second re-encode: %v", err)
		}
		if !bytes.Equal(enc, enc2) {
			t.Fatalf("encoding is not stable:\n%x\n%x", enc, enc2)
		}
	})
}

// normalized returns a copy of b with empty slices made nil: the encoding
// omits empty slices, so an explicit empty array decodes to an empty slice
// the first time and to nil after a round trip, which is the same batch.
func normalized(b *crdt.Batch) crdt.Batch {
	n := *b
	if len(n.Nacks) == 0 {
		n.Nacks = nil
	}
	if len(n.Slots) == 0 {
		n.Slots = nil
	}
	if len(n.Windows) == 0 {
		n.Windows = nil
	}
	if len(n.Leases) == 0 {
		n.Leases = nil
	}
	if len(n.Evicted) == 0 {
		n.Evicted = nil
	}
	if len(n.Echoes) == 0 {
		n.Echoes = nil
	}
	if len(n.Members) == 0 {
		n.Members = nil
	}
	if len(n.Repairs) == 0 {
		n.Repairs = nil
	}
	return n
}
