// Command wiregen encodes representative batches with the crdt package of
// the commit it is built in, for crdt/testdata/wire. Fields a commit's Batch
// lacks (Echoes, Members, Repairs) are set by reflection only where present.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"

	"github.com/ratemesh/ratemesh/crdt"
)

func has(b *crdt.Batch, field string) bool {
	_, ok := reflect.TypeOf(b).Elem().FieldByName(field)
	return ok
}

// set fills the slice field named field with elements built from vals (each
// a list of values for the element's exported fields, in order).
func set(b *crdt.Batch, field string, vals [][]any) {
	f := reflect.ValueOf(b).Elem().FieldByName(field)
	et := f.Type().Elem()
	s := reflect.MakeSlice(f.Type(), 0, len(vals))
	for _, v := range vals {
		e := reflect.New(et).Elem()
		i := 0
		for j := 0; j < et.NumField(); j++ {
			if !et.Field(j).IsExported() {
				continue
			}
			e.Field(j).Set(reflect.ValueOf(v[i]).Convert(et.Field(j).Type))
			i++
		}
		s = reflect.Append(s, e)
	}
	f.Set(s)
}

func base() *crdt.Batch {
	return &crdt.Batch{
		Version:   crdt.Version,
		From:      crdt.Slot{Peer: "12D3KooWAlpha", Incarnation: 1764240000000},
		Seq:       42,
		Sent:      1764240001234,
		Clock:     1764240001200,
		RulesHash: 0x5eed5eed,
	}
}

func main() {
	out, commit := os.Args[1], os.Args[2]
	batches := map[string]*crdt.Batch{}

	hb := base()
	hb.Ack = 1764240001000
	batches["heartbeat"] = hb

	g := base()
	g.Ack = 1764240001100
	g.Nacks = []crdt.Nack{{Slot: crdt.Slot{Peer: "12D3KooWBeta", Incarnation: 7}, Seq: 9}}
	g.Windows = []crdt.WindowEntry{
		{Rule: "api", Key: "user:1", WindowMs: 60000, Window: 29404000, Admitted: 10, Attempted: 12},
		{Rule: "règle", Key: "clé:🙂", WindowMs: 1000, Window: 1764240001, Attempted: 3},
	}
	g.Leases = []crdt.LeaseEntry{{Rule: "conc", Key: "db", Acquired: 5, Released: 2}}
	if has(g, "Echoes") {
		g.Flags |= 1 << 3 // FlagEcho
		set(g, "Echoes", [][]any{{peerTag("12D3KooWBeta"), int64(40), uint32(7)}, {uint32(1), int64(-3), uint32(0)}})
	}
	batches["gossip"] = g

	if has(g, "Repairs") {
		r := base()
		r.Seq = 9
		r.Flags = 1<<3 | 1<<6 // FlagEcho | FlagRepairs
		r.Windows = []crdt.WindowEntry{
			{Rule: "api", Key: "a", WindowMs: 60000, Window: 29404000, Admitted: 1, Attempted: 1},
			{Rule: "api", Key: "b", WindowMs: 60000, Window: 29404000, Admitted: 2, Attempted: 2},
			{Rule: "api", Key: "c", WindowMs: 60000, Window: 29404000, Admitted: 3, Attempted: 3},
		}
		set(r, "Repairs", [][]any{{uint64(3), uint32(1)}, {uint64(8), uint32(1)}})
		batches["repairs"] = r
	}

	f := base()
	f.Flags = 1 | 1<<2 // FlagFull | FlagLast
	f.Slots = []crdt.Slot{{Peer: "12D3KooWBeta", Incarnation: 7}, {Peer: "12D3KooWAlpha", Incarnation: 3}}
	f.Windows = []crdt.WindowEntry{
		{Rule: "api", Key: "user:1", WindowMs: 60000, Window: 29404000, Admitted: 10, Attempted: 12},
		{Slot: 1, Rule: "api", Key: "user:1", WindowMs: 60000, Window: 29404000, Admitted: 4, Attempted: 4},
		{Slot: 2, Rule: "api", Key: "user:2", WindowMs: 60000, Window: 29404000, Admitted: 1, Attempted: 1},
	}
	f.Leases = []crdt.LeaseEntry{{Rule: "conc", Key: "db", Acquired: 5, Released: 2}, {Slot: 1, Rule: "conc", Key: "db", Acquired: 1}}
	f.Evicted = []crdt.Slot{{Peer: "12D3KooWGamma", Incarnation: 2}}
	if has(f, "Members") {
		set(f, "Members", [][]any{
			{"12D3KooWBeta", uint64(7), uint8(0), []string{"/ip4/10.0.0.2/tcp/4001"}},
			{"12D3KooWGamma", uint64(2), uint8(2), []string(nil)},
		})
	}
	batches["full"] = f

	for kind, b := range batches {
		data, err := b.Encode()
		if err != nil {
			fmt.Fprintln(os.Stderr, kind, err)
			os.Exit(1)
		}
		name := filepath.Join(out, commit+"-"+kind)
		if err := os.WriteFile(name+".cbor", data, 0o644); err != nil {
			panic(err)
		}
		js, _ := json.MarshalIndent(b, "", "  ")
		if err := os.WriteFile(name+".json", append(js, '\n'), 0o644); err != nil {
			panic(err)
		}
	}
}

// peerTag is crdt.PeerTag (FNV-1a), which early commits lack.
func peerTag(peer string) uint32 {
	h := uint32(2166136261)
	for i := 0; i < len(peer); i++ {
		h ^= uint32(peer[i])
		h *= 16777619
	}
	return h
}
