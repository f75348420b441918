// Package node is one ratemesh peer: a pure core and the interfaces of its
// edges.
//
// The Core is a state machine in the style of raft's RawNode. It decides
// requests, merges the batches peers publish, and gathers every output in
// one Ready, which Core.Ready hands over: the batches to publish, the
// batches to send one peer alone (anti-entropy), membership changes, a
// new incarnation to persist, the join, fence, clock-skew and staleness
// changes, and when to tick next. The inputs that produce output (Tick,
// AntiEntropy, Flush, Leave) return nothing; HasReady tells whether output
// waits. It takes the time as an argument and never touches a clock, a
// socket or a disk, so the simulator drives exactly the code production
// runs. Its owner drives it like this (the runtime, Node, does it for a
// network), acting on every Ready in one place:
//
//	cfg := node.DefaultCoreConfig()
//	cfg.Peer, cfg.Rules = "peer-a", rules
//	cfg.Incarnation = node.NextIncarnation(persisted, time.Now())
//	core, err := node.NewCore(cfg, time.Now())
//	for {
//		select {
//		case in := <-inbound: // from a Transport
//			core.Step(time.Now(), in.Batch)
//		case peer := <-connected: // anti-entropy on connect
//			core.ExpectState(peer)
//			core.AntiEntropy(time.Now(), peer)
//		case <-ticker.C: // at least every SyncInterval (Ready.NextTick)
//			core.Tick(time.Now())
//		case <-flushTicker.C: // with a Persister attached (NewPersister)
//			core.Persist(time.Now())
//		case req := <-requests:
//			d, err := core.Allow(time.Now(), req.Rule, req.Key, req.Request)
//			…
//		}
//		if core.HasReady() {
//			handle(core.Ready())
//		}
//	}
//
//	func handle(rd node.Ready) {
//		for _, b := range rd.Messages {
//			transport.Publish(ctx, b)
//		}
//		for _, d := range rd.Direct {
//			for _, p := range d.To {
//				transport.SendDirect(ctx, p, d.Batches)
//			}
//		}
//		if rd.Persist != nil {
//			err := store.Flush(ctx, *rd.Persist)
//			core.Persisted(rd.Persist, err)
//		}
//		… // rd.Changes, rd.NewIncarnation, rd.Joined, rd.Fence, rd.Skew, rd.Stale, rd.KeyBudget, rd.NextTick
//	}
//
// The core forgets a Ready as it hands it over, so unlike raft there is no
// Advance; the one output whose outcome the core needs, a Flush for the
// Store (Persist, with a Persister attached), is answered by Persisted,
// raft's Advance for that one field.
//
// The core's state is split by concern, each part a type with its
// invariants in a file of its own: membership.go (the member table, and
// reclaims), outbox.go (what it publishes, and the batches awaiting
// acknowledgement), acks.go (the gossip it receives: gaps to nack, the
// acknowledgement watermark), meshclock.go (mesh time and clock echoes),
// join.go (joining and rejoining), leases.go (the leases it owns) and
// decide.go (decisions). docs/design.md describes the design they
// implement.
//
// # Decisions
//
// Each member counts its own admissions in its own CRDT slot and publishes
// their absolute values. It admits a request of cost c iff
//
//	P + N·(u + c) ≤ L
//
// where u is its own usage that not every alive member has acknowledged
// yet, P the merged usage minus u, N the live members and L the limit
// (scaled by alive/(alive+suspect) under the strict partition policy).
//
// # Acknowledgements
//
// Acknowledgements are O(1) per batch: every batch carries Ack, the mesh
// time up to which its sender has merged the gossip of every member it
// holds alive (the least Sent time of their latest batches). A member's
// own batch counts as acknowledged once every alive member's Ack has
// passed its Sent time. Loss is caught by sequence numbers: a receiver
// that sees a gap lists it in its next batch's Nacks, and the author
// publishes the missing batch's entries again and does not count them as
// acknowledged through it. A member that merged a peer's changes answers
// at its next sync tick even when it has nothing of its own to say, so
// acknowledgements return within about two sync intervals plus two
// latencies. A partition stops acknowledgements at once, so each side
// throttles itself to its share of the headroom before anyone turns
// suspect.
//
// # Membership
//
// A member is alive while heard within SuspectAfter, then suspect (still
// holding capacity), then dead after DeadAfter under the available policy,
// or reclaimed after ReclaimAfter (evicted after EvictAfter by an exact
// half) under the strict one. A member exists for this one once a batch it
// signed arrives (or, at start, if it was a member in this one's last run:
// CoreConfig.Known); a peer's member table only suggests peers to dial and
// to await while joining. Evictions are announced; an evicted member that
// comes back takes a new incarnation (Ready.NewIncarnation) and drops its
// leases once a strict majority announces it, and an announced eviction
// of another member is adopted on the same condition. A newer incarnation
// of a peer replaces the older at once: the older slot's leases stop
// counting, its window counts count until their windows end.
//
// # Mesh time
//
// Windows open on mesh time: the local clock plus the median of the live
// members' raw clock offsets (and our own, 0), re-estimated every
// Heartbeat, so a member whose clock runs ahead still opens windows with
// everyone else.
package node
