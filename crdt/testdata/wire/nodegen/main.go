// Command nodegen writes, for crdt/testdata/wire, the batches a node core
// of the commit it is built in sends — a gossip batch, a full state with
// and without the member table, a relay — as <commit>-<kind>.cbor and
// .json. Unlike wiregen's hand-made batches these are the core's own
// output, flags and all: since issue 25 every batch announces
// FlagSkipsUnknown, and a full state carries the member table only to a
// peer that announced it decodes one.
//
//	go run ./crdt/testdata/wire/nodegen crdt/testdata/wire <commit>
//
// (run from the module root: a directory under testdata is ignored by
// ./... but builds when named).
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/ratemesh/ratemesh/crdt"
	"github.com/ratemesh/ratemesh/limiter"
	"github.com/ratemesh/ratemesh/node"
)

const (
	self     = "12D3KooWAlpha"
	peer     = "12D3KooWBeta"  // this release
	old      = "12D3KooWGamma" // 821b92d's flags: decodes the member table, skips nothing
	stranger = "12D3KooWDelta" // not heard from yet
)

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: nodegen DIR COMMIT")
		os.Exit(2)
	}
	out, commit := os.Args[1], os.Args[2]
	if err := run(out, commit); err != nil {
		fmt.Fprintln(os.Stderr, "nodegen:", err)
		os.Exit(1)
	}
}

func run(out, commit string) error {
	t0 := time.UnixMilli(1764240000000)
	cfg := node.DefaultCoreConfig()
	cfg.Peer, cfg.Incarnation = self, node.NextIncarnation(0, t0)
	cfg.Rules = []limiter.Rule{
		{Name: "api", Algorithm: limiter.FixedWindow, Limit: 1000, Window: time.Minute},
		{Name: "conc", Algorithm: limiter.Concurrency, Limit: 10, LeaseTTL: time.Minute},
	}
	c, err := node.NewCore(cfg, t0)
	if err != nil {
		return err
	}
	// Each peer's first batch: its admissions on user:1, which a relay
	// passes on.
	heard := func(from string, inc uint64, flags uint64, at time.Time) error {
		return c.Step(at, &crdt.Batch{Version: crdt.Version, From: crdt.Slot{Peer: from, Incarnation: inc}, Seq: 1,
			Sent: at.UnixMilli(), Clock: at.UnixMilli() - 3, Flags: flags,
			Windows: []crdt.WindowEntry{{Rule: "api", Key: "user:1", WindowMs: 60000, Window: at.UnixMilli() / 60000, Admitted: 5, Attempted: 6}}})
	}
	if err := heard(peer, 1764239990000, crdt.FlagEcho|crdt.FlagRepairs|crdt.FlagSkipsUnknown, t0); err != nil {
		return err
	}
	if err := heard(old, 1764239980000, crdt.FlagEcho|crdt.FlagRepairs, t0); err != nil {
		return err
	}
	c.Tick(t0)
	c.Ready() // the first sync's batch is not one of the corpus's
	now := t0.Add(5 * time.Millisecond)
	for _, key := range []string{"user:1", "user:1", "clé:🙂"} {
		if _, err := c.Allow(now, "api", key, limiter.Request{}); err != nil {
			return err
		}
	}
	if _, _, err := c.Acquire(now, "conc", "db", ""); err != nil {
		return err
	}
	batches := map[string]*crdt.Batch{}
	now = t0.Add(20 * time.Millisecond)
	c.Tick(now)
	rd := c.Ready()
	if len(rd.Messages) != 1 {
		return fmt.Errorf("the tick published %d batches, want 1", len(rd.Messages))
	}
	batches["gossip"] = rd.Messages[0]
	c.AntiEntropy(now, peer, stranger)
	for _, d := range c.Ready().Direct {
		if len(d.To) != 1 || len(d.Batches) != 1 {
			return fmt.Errorf("a full state of %d batches to %v, want one to one peer", len(d.Batches), d.To)
		}
		switch d.To[0] {
		case peer:
			batches["full"] = d.Batches[0]
		case stranger:
			batches["full-unheard"] = d.Batches[0]
		}
	}
	// The peer asks for our whole view; the next tick relays it.
	want := &crdt.Batch{Version: crdt.Version, From: crdt.Slot{Peer: peer, Incarnation: 1764239990000}, Seq: 0,
		Sent: now.UnixMilli(), Clock: now.UnixMilli() - 3,
		Flags: crdt.FlagFull | crdt.FlagWant | crdt.FlagLast | crdt.FlagEcho | crdt.FlagRepairs | crdt.FlagSkipsUnknown}
	if err := c.Step(now, want); err != nil {
		return err
	}
	now = now.Add(20 * time.Millisecond)
	c.Tick(now)
	for _, d := range c.Ready().Direct {
		if len(d.To) == 1 && d.To[0] == peer && len(d.Batches) == 1 {
			batches["relay"] = d.Batches[0]
		}
	}
	for _, kind := range []string{"gossip", "full", "full-unheard", "relay"} {
		b := batches[kind]
		if b == nil {
			return fmt.Errorf("no %s batch", kind)
		}
		if err := write(out, commit, kind, b); err != nil {
			return err
		}
	}
	return nil
}

func write(out, commit, kind string, b *crdt.Batch) error {
	data, err := b.Encode()
	if err != nil {
		return fmt.Errorf("%s: %w", kind, err)
	}
	name := filepath.Join(out, commit+"-"+kind)
	if err := os.WriteFile(name+".cbor", data, 0o644); err != nil {
		return err
	}
	js, err := json.MarshalIndent(b, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(name+".json", append(js, '\n'), 0o644)
}
