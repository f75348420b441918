// Package simulator runs a ratemesh mesh of real node.Core state machines
// under a virtual clock and a simulated network, and measures how well the
// mesh keeps its limits. It reads the scenario files and writes the summary
// that docs/simulator.md describes ("Scenarios", "Flags and outputs").
//
// A run is a seed: the same scenario and seed give byte-identical JSON
// (except wall_seconds), CSV and SVG. One *rand.Rand (PCG) seeded from the
// scenario seed drives everything; each core's own rand is seeded from it
// as the core is created, and nothing reads the wall clock except the
// wall_seconds figure and the progress lines on the Progress writer.
//
// The driving loop, one virtual millisecond at a time:
//
//	for t := 0; t < duration; t++ {
//		apply the events due at t        // partitions, crashes, joins, rate changes, churn
//		deliver the batches due at t     // core.Step(local clock, batch) per receiver
//		generate the requests of t       // core.Allow per request, Poisson arrivals
//		tick the nodes due at t          // core.Tick, then core.Ready to handle: publish Messages, send Direct, next tick at NextTick
//		publish the edges due at t       // the leading edge: core.Flush, then core.Ready to handle, as the runtime does (edge.go)
//	}
//
// That is what every core sees. The engine runs it faster: a receiver's
// deliveries wait in a queue, with their clock readings, and the core steps
// them only just before it is next driven (a request, its Tick, an event),
// so a core's state passes through the CPU cache once per tens of
// milliseconds instead of every millisecond; and the cores driven in one
// millisecond run in parallel (Options.Workers). Each core still gets the
// same calls with the same arguments in the same order, so the outputs are
// the same byte for byte.
//
// A decision, a lease operation or a nack to serve arms the node's leading
// edge as it wakes the runtime's run loop (node.Config.PublishGap;
// mesh.publish_gap; by default half the sync interval, stretched toward
// the whole interval in a mesh of more than node.EdgeInbound × interval/2
// members: node.PublishGap): the node publishes its own changes at once
// when its last batch is at least the gap old, and otherwise the gap
// after that batch, with every change made meanwhile (Core.Flush); the
// sync tick still publishes heartbeats, acknowledgements and whatever is
// pending. mesh.publish_gap: tick turns it off.
//
// Each node's local clock is virtual time plus its skew offset. Time starts
// at 2026-01-01T00:00:00Z, aligned to every window. Skew events at 0s apply
// before the mesh forms (clocks off from the start); later ones step the
// clocks then. mesh.local_clock: true (node.CoreConfig.LocalClock) turns
// mesh time off, so every node opens windows on its own clock: the
// baseline for what the offset correction buys.
//
// Result.Classes (and the table's class rows, when a workload has a class)
// gives each class's overshoot against the rule's limit times its
// multiplier.
//
// Result.PartitionFigures (and the table's "partition" line) gives a
// rule's utilisation before, during and after the first partition and the
// time from the heal until its windows are at full utilisation again.
// Result.Sides (sides.csv, and admitted.svg's panel per side) gives each
// side of the first partition's credits per rule and true window beside
// what the partition policy let that side use: each key's limit times the
// largest scale its nodes applied (alive/(alive + suspect) under strict,
// 0 when fenced, else 1), capped at what the side was offered.
//
// # Network
//
// A published batch is encoded once with its real CBOR encoding (the bytes
// are what bytes_per_node_per_s counts; one publish is one message) and the
// same *crdt.Batch value is delivered to every receiver that is up and in
// the sender's partition group, each after latency plus a uniform jitter
// draw rounded up to whole milliseconds, unless a per-receiver loss draw
// drops it. A delivery whose endpoints were partitioned apart while it was
// in flight is lost. Anti-entropy (each side's Core.AntiEntropy, direct, never
// lost) runs between newly connected pairs on heal, and between a joining or
// restarted node and every reachable node. The nodes present at the start
// form their mesh before time 0: each receives every other's full state at
// once, so nobody starts on an empty view.
//
// # Workloads
//
// Requests arrive as a Poisson process per workload (drawn per millisecond)
// and go to a node drawn from node_dist; a request drawn for a node that is
// down goes to a uniformly drawn live node of the workload's pool, as a load
// balancer would (with none live it is offered and not admitted). Keys are
// named "w<i>-k<j>" (workload i, key j), so workloads never share keys;
// overrides in a scenario name keys that way. Besides DESIGN's fields a
// workload may set cost (credits per request), or type and units (each
// request is units of the rule's cost type, resolved by the core as in
// production: credits.go), class, and nodes (a node set
// the requests go to; node_dist picks within it, and "single:N" names node
// N). A rate event may name a workload by index and change its node_dist as
// well as its rate. A well_behaved workload never offers a key more than its
// limit within one true window.
//
// # Metrics
//
// Every accuracy figure is measured on true virtual time, over the whole
// run (no warm-up is excluded). A key-window is one key in one window
// aligned to the epoch on true time, [k·w, (k+1)·w); for sliding_window
// rules too, whose admissions within any aligned window can never exceed the
// limit either. Only key-windows with offered requests count.
// overshoot_max and overshoot_p99 are over admitted credits/limit − 1
// (floored at 0; the limit after override and class, before partition
// scaling); utilisation is Σ admitted / Σ min(offered, limit) in credits;
// false_rejections are the rejected requests of well_behaved workloads.
// convergence_p99_ms samples published batches (per rule): the time from
// publish until every node that was up and reachable at publish time has
// merged the sample's values (from that batch or a later one of the same
// sender); receivers that crash or are cut off leave the sample, and
// samples open after 10 s are dropped. messages_per_node_per_s and
// bytes_per_node_per_s count gossip and anti-entropy sends over node-seconds
// up; they are mesh-wide (one batch carries every rule), so every rule
// reports the same figures.
//
// # Leases
//
// A workload of a concurrency rule drives leases instead of requests
// (leases.go): each arrival is a client that Acquires a lease at its node,
// holds it for an exponential time of mean hold (workload field hold,
// required), renews it every lease_ttl/3 and releases it; the fraction
// crash of the clients vanish at the end of their hold without releasing,
// so the lease expires at its owner. cost, type, units and well_behaved
// are refused on such a workload, hold and crash on a windowed rule's.
// For a concurrency rule the summary's fields mean: offered and admitted,
// Acquire calls; held, leases acquired, not released, not expired at their
// owner, whose owner is up, on true time; overshoot_max, max over keys and
// instants of held/limit − 1 (floored at 0); windows, key-seconds with a
// lease held or wanted, and overshoot_p99 over their maxima; utilisation,
// ∫ held by clients still within their hold / ∫ min(demand, limit), demand
// counting every client, admitted or not, during its hold. Result.Leases
// adds per-key figures, the crashed clients' lease lifetimes and, for every
// node crash, how long until the capacity it freed is used (FreedRow);
// --out writes leases.csv and leases.svg. The engine checks its lease
// account against each core's Leases() once per virtual second.
//
// # Speed
//
// Requests are generated inline, per millisecond, never queued; deliveries
// wait in a timing wheel of per-millisecond inboxes, are handed to their
// receivers by receiver when due, and each receiver is stepped through what
// it was handed in one go. Options.Workers > 1 steps
// disjoint ranges of receivers in parallel within one millisecond: cores
// share nothing and each still sees the same calls in the same order, so the
// outputs do not change (a test checks this under the race detector). The
// cost of a run is dominated by Core.Step: every published batch is merged
// by every other node, so a mesh of n nodes publishing m batches per second
// each costs n·(n−1)·m merges per virtual second.
package simulator
