// Package persistence is ratemesh's node.Store on go-datastore: pebble on
// disk (Open) and go-datastore's in-memory map for tests (NewMemory).
//
// The runtime drives it like this:
//
//	st, err := persistence.Open(dataDir, persistence.WithLogger(log)) // fails fast: locked, corrupt, unreadable
//	key, err := st.LoadIdentity(ctx)     // nil on a fresh directory
//	if key == nil {
//		priv, _, _ := crypto.GenerateEd25519Key(rand.Reader)
//		key, _ = crypto.MarshalPrivateKey(priv)
//		err = st.SaveIdentity(ctx, key)
//	}
//	priv, err := crypto.UnmarshalPrivateKey(key) // libp2p's core/crypto
//	…                                            // mesh.Config.PrivKey = priv
//	cfg := node.DefaultConfig()
//	cfg.Store = st // the node owns it now: Close closes it
//	n, err := node.Start(ctx, cfg)
//
// # What is stored
//
//   - the identity: the marshalled libp2p private key, so the peer ID (the
//     member's counter slot) survives restarts;
//   - the incarnation, written and synced by node.Start before the member
//     serves: a restart takes max(persisted + 1, unix ms);
//   - the merged state (every slot's admitted and attempted credits) of the
//     windows of rules whose window is at least node.Config.PersistMinWindow
//     (1 minute by default), written every node.Config.FlushInterval (1 s)
//     in one batch and synced, and once more at a graceful Close;
//   - the leases the member owns, with their expiry;
//   - nothing else: shorter windows end before a restart could matter, and
//     other members' leases are theirs to keep.
//
// Windows whose window and the next one have ended are deleted at the next
// flush (their keys sort by that moment, so collection reads only what it
// deletes).
//
// # Restart semantics
//
// A restarted member takes a new incarnation (a new slot), loads the merged
// state, and announces itself. Its peers retire the older incarnation's
// concurrency slots at once; the leases the member owned come back in its
// new slot, with their IDs and expiry, so their clients renew and release
// them as before. The older incarnation's window counts go on counting
// until their windows end — merged by per-slot max, so nothing is counted
// twice and nothing goes backwards.
//
// # Guarantees
//
//   - A graceful Close loses nothing: its last flush is synced.
//   - A SIGKILL (or power loss) loses locally at most one FlushInterval of
//     this member's own usage: what it admitted since its last synced flush.
//     After the restart the member counts that much less of its own old
//     slot than it admitted.
//   - Cluster-wide, peers that were up hold what the member published, so
//     the mesh's merged usage lost at most the admissions the member had
//     not yet published: one sync_interval (20 ms by default). (The
//     restarted member itself still sees its old slot as its disk had it:
//     anti-entropy carries each member's own current slot only.)
//   - The incarnation is synced before the member serves, so a member
//     never writes a slot value lower than one it wrote before.
//
// # Formats and older data directories
//
// Every store carries its format under /meta/format (ratemesh-store-2
// now). A store of format 1 — every version before this one, fdd4fa5's
// among them — has the same records but may come from before the members
// a node knew were saved (/meta/peers), and a node that took its silence
// for "no members" would be ready at once and decide alone beside its
// peers. Open migrates a format 1 store that holds saved members; one
// that holds none only with UpgradeUnknownMembers (ratemesh serve passes
// it when it joins through --bootstrap), and refuses it otherwise with
// ErrOldStore, an error naming the path and what to do. A store of a newer
// format is refused (ErrNotStore), never opened as if empty.
// testdata/fdd4fa5-datadir is such a data directory.
//
// # Bad disks
//
// Open refuses, with an error naming the path and the cause and never a
// panic: a path that is not a directory or cannot be created, a permission
// error, a directory locked by another running member (in this process or
// another), a directory that holds something other than a ratemesh store,
// and a store pebble cannot open (a truncated or garbage MANIFEST, OPTIONS
// or table). A record that cannot be decoded fails the load that reads it,
// naming its key, and so fails node.Start.
//
// While running, a failed flush is not fatal: the node logs it at error
// level, counts it in node.Stats.PersistErrors, and keeps serving from
// memory with every decision unchanged; the next flush writes everything
// again (values merge by max on disk, so rewriting is harmless). Until a
// flush succeeds, a crash loses what the failing flushes did not write.
//
// A data directory removed or replaced while the store is open fails every
// write with ErrGone (pebble would go on writing into unlinked files), and
// Close abandons such a store instead of closing it. pebble's own error
// lines (it retries a failed memtable flush in a tight loop) are logged at
// most once per ErrorLogInterval, with the count held back. A condition
// pebble treats as fatal after Open breaks the store (ErrBroken) and parks
// the goroutine that met it rather than crash the process; node.Close
// bounds its wait for the store (node.Config.StoreTimeout).
package persistence
