package node

import "github.com/ratemesh/ratemesh/crdt"

// Capabilities (docs/design.md, "Wire compatibility"). Every batch a
// member sends carries the capability flags of its release: what it
// decodes beyond the first wire. A receiver keeps, per member, the flags
// of that member's latest batch, and sends a field only to members that
// announced they decode it: in gossip once every live member has
// (meshClock.common), in a full state once its one receiver has
// (Core.directs). A peer not heard from yet announced nothing, so it is
// sent the oldest wire this release still meshes with.

// announced are the capability flags this member sets on every batch it
// sends.
const announced = crdt.FlagEcho | crdt.FlagRepairs | crdt.FlagSkipsUnknown

// caps are the capability flags of a member's latest batch, in one byte
// (member keeps its flags together in one word).
type caps uint8

const (
	capEcho    caps = 1 << iota // crdt.FlagEcho: decodes Batch.Echoes
	capRepairs                  // crdt.FlagRepairs: decodes Batch.Repairs
	capSkips                    // crdt.FlagSkipsUnknown: skips what it does not know
)

// capsOf returns the capabilities batch flags announce.
func capsOf(flags uint64) caps {
	var c caps
	if flags&crdt.FlagEcho != 0 {
		c |= capEcho
	}
	if flags&crdt.FlagRepairs != 0 {
		c |= capRepairs
	}
	if flags&crdt.FlagSkipsUnknown != 0 {
		c |= capSkips
	}
	return c
}

// flags returns c as batch flags.
func (c caps) flags() uint64 {
	var f uint64
	if c&capEcho != 0 {
		f |= crdt.FlagEcho
	}
	if c&capRepairs != 0 {
		f |= crdt.FlagRepairs
	}
	if c&capSkips != 0 {
		f |= crdt.FlagSkipsUnknown
	}
	return f
}

// table reports whether a member with c decodes a member table
// (Batch.Members). No flag of its own announces it; FlagRepairs stands
// in: every release that sets it (since cb40638) decodes the table, and
// so does every release that sets FlagSkipsUnknown. Releases before
// 8758fb6 refuse a batch with a member table (an unknown field); those
// from 8758fb6 to cb40638 decode it but announce neither flag, so they
// are sent none.
func (c caps) table() bool { return c&(capRepairs|capSkips) != 0 }

// tableOK reports whether peer's latest batch announced that it decodes a
// member table (caps.table); false for a peer not heard from.
func (c *Core) tableOK(peer string) bool {
	m := c.members.byPeer[peer]
	return m != nil && m.caps.table()
}

// directs returns build's full state for peers, split by what each
// decodes: the peers that decode a member table get one (build(true)),
// the others and those not heard from yet a full state without it
// (build(false)), each counted as sent (Core.direct).
func (c *Core) directs(peers []string, build func(table bool) []*crdt.Batch) []Direct {
	var with, without []string
	for _, p := range peers {
		if c.tableOK(p) {
			with = append(with, p)
		} else {
			without = append(without, p)
		}
	}
	var out []Direct
	if len(with) > 0 {
		out = append(out, c.direct(with, build(true)))
	}
	if len(without) > 0 {
		out = append(out, c.direct(without, build(false)))
	}
	return out
}
