package node_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/ratemesh/ratemesh/crdt"
	"github.com/ratemesh/ratemesh/limiter"
	"github.com/ratemesh/ratemesh/node"
	"github.com/ratemesh/ratemesh/node/nodetest"
)

// TestCoreAcksReleaseTheShare: with 2 cores and 5 ms delay, a few sync
// intervals after traffic stops u is 0 (every own credit acknowledged),
// so at one instant a core admits exactly its half of the headroom,
// (L − P)/2; round after round it reaches the limit and never passes it.
// With the peer cut, u only grows and the core stops at (L − P)/N; once
// the peer is suspect its acknowledgements are no longer awaited (u = 0)
// and, under strict, the limit is scaled to 1/2.
func TestCoreAcksReleaseTheShare(t *testing.T) {
	const (
		seed  = 21
		limit = 100
	)
	reportSeed(t, seed)
	rules := []limiter.Rule{{Name: "api", Algorithm: limiter.FixedWindow, Limit: limit, Window: 20 * time.Second}}
	net := cluster(t, 2, seed, rules, nil)
	net.Delay = 5 * time.Millisecond
	settle := func() { run(t, net, 5*20*time.Millisecond, nil) } // five sync intervals
	settle()

	if got := allowN(t, net, 0, "api", "k", 30); got != 30 {
		t.Fatalf("admitted %d of the first 30", got)
	}
	if u := unacked(t, net.Core(0), net.Local(0), "api", "k"); u != 30 {
		t.Errorf("u right after admitting 30 = %d, want 30", u)
	}
	settle()
	if u := unacked(t, net.Core(0), net.Local(0), "api", "k"); u != 0 {
		t.Fatalf("u a few sync intervals after the traffic stopped = %d, want 0", u)
	}
	if got := total(t, net.Core(1), net.Local(1), "api", "k"); got != 30 {
		t.Fatalf("the peer's total %d, want 30", got)
	}
	// P = 30, u = 0, N = 2: the share is exactly (100 − 30)/2 = 35.
	if got := allowN(t, net, 0, "api", "k", 100); got != 35 {
		t.Errorf("at one instant with u = 0 admitted %d, want (L−P)/N = 35", got)
	}
	var rounds []int
	for range 12 {
		settle()
		rounds = append(rounds, allowN(t, net, 0, "api", "k", 100))
	}
	settle()
	got := total(t, net.Core(0), net.Local(0), "api", "k")
	t.Logf("admitted per round after the first 65: %v; total %d", rounds, got)
	if got > limit || got < limit-1 { // the last credit is a lottery with a share of 1/2
		t.Errorf("total after rounds of acknowledgements = %d, want %d (or %d: the last credit's lottery)", got, limit, limit-1)
	}
	if peer := total(t, net.Core(1), net.Local(1), "api", "k"); peer != got {
		t.Errorf("the peer's total %d, ours %d", peer, got)
	}

	// Cut: u only grows, and admission stops at (L − P)/N.
	net.Cut(0, 1)
	var maxU uint64
	admitted := 0
	cut := net.Now()
	run(t, net, 1500*time.Millisecond, func(time.Time) {
		admitted += allowN(t, net, 0, "api", "k2", 1)
		u := unacked(t, net.Core(0), net.Local(0), "api", "k2")
		if u < maxU {
			t.Fatalf("u fell from %d to %d with the peer cut, %v after the cut", maxU, u, net.Now().Sub(cut))
		}
		maxU = u
	})
	if admitted != limit/2 || maxU != limit/2 {
		t.Errorf("cut, before suspect: admitted %d, u %d; want both (L−P)/N = %d", admitted, maxU, limit/2)
	}
	// Past suspect_after: no acknowledgement awaited, u = 0; strict
	// scales the limit to 1/2, which the 50 already fill.
	run(t, net, time.Second, func(time.Time) { admitted += allowN(t, net, 0, "api", "k2", 1) })
	if u := unacked(t, net.Core(0), net.Local(0), "api", "k2"); u != 0 {
		t.Errorf("u with the peer suspect = %d, want 0", u)
	}
	if n, scale := net.Core(0).Members(); n != 2 || scale != 0.5 {
		t.Errorf("Members() with the peer suspect = %d, %v; want 2, 0.5", n, scale)
	}
	if admitted != limit/2 {
		t.Errorf("strict, peer suspect: admitted %d in all, want still %d", admitted, limit/2)
	}
}

// nackCluster returns 3 cores, 5 ms apart, that have heard each other,
// with repairs off: only nacks can bring back a lost batch.
func nackCluster(t *testing.T, seed uint64) *nodetest.Network {
	t.Helper()
	reportSeed(t, seed)
	rules := []limiter.Rule{{Name: "api", Algorithm: limiter.FixedWindow, Limit: 1000, Window: 20 * time.Second}}
	net := cluster(t, 3, seed, rules, func(c *node.CoreConfig) { c.RepairInterval = time.Hour })
	net.Delay = 5 * time.Millisecond
	run(t, net, 100*time.Millisecond, nil)
	return net
}

// TestCoreNackResendsAtOnce drops exactly one batch to one receiver: the
// receiver finds the gap in the sequence and nacks it, the author re-sends
// the entries, and the receiver converges long before any repair.
func TestCoreNackResendsAtOnce(t *testing.T) {
	const seed = 22
	net := nackCluster(t, seed)

	dropped := 0
	var droppedSeq uint64
	net.Filter = func(from, to int, b *crdt.Batch) bool {
		if from == 0 && to == 1 && dropped == 0 {
			for _, e := range b.Windows {
				if e.Key == "lost" {
					dropped++
					droppedSeq = b.Seq
					return false
				}
			}
		}
		return true
	}
	if got := allowN(t, net, 0, "api", "lost", 3); got != 3 {
		t.Fatalf("admitted %d of 3", got)
	}
	run(t, net, 30*time.Millisecond, nil)
	if dropped != 1 {
		t.Fatalf("dropped %d batches, want 1", dropped)
	}
	if got := total(t, net.Core(1), net.Local(1), "api", "lost"); got != 0 {
		t.Fatalf("member 1 knows %d of the lost batch", got)
	}
	// Member 0's next batch reveals the gap.
	if got := allowN(t, net, 0, "api", "other", 1); got != 1 {
		t.Fatal("not admitted")
	}
	start := net.Now()
	for net.Now().Sub(start) < 200*time.Millisecond && total(t, net.Core(1), net.Local(1), "api", "lost") != 3 {
		run(t, net, time.Millisecond, nil)
	}
	took := net.Now().Sub(start)
	if got := total(t, net.Core(1), net.Local(1), "api", "lost"); got != 3 {
		t.Fatalf("member 1 knows %d of the lost batch's 3 after %v", got, took)
	}
	t.Logf("batch seq %d dropped; member 1 had its entries again %v after the next batch", droppedSeq, took)
	if took > 4*20*time.Millisecond {
		t.Errorf("the nack round trip took %v, want within a few sync intervals", took)
	}
	s0, s1, s2 := net.Core(0).Stats(), net.Core(1).Stats(), net.Core(2).Stats()
	if s1.NacksSent != 1 || s0.NacksReceived != 1 || s2.NacksSent != 0 || s2.NacksReceived != 0 {
		t.Errorf("nacks: member 1 sent %d, member 0 received %d, member 2 sent %d and received %d; want 1, 1, 0, 0",
			s1.NacksSent, s0.NacksReceived, s2.NacksSent, s2.NacksReceived)
	}
	run(t, net, 200*time.Millisecond, nil)
	if u := unacked(t, net.Core(0), net.Local(0), "api", "lost"); u != 0 {
		t.Errorf("u of the re-sent entries = %d, want 0 once acknowledged", u)
	}
	if d := converged(t, net, []string{"lost", "other"}); d != "" {
		t.Errorf("not converged:\n%s", d)
	}
}

// TestCoreAckTailOnIdleMesh: after a single burst on an otherwise idle
// mesh, the author's u returns to 0 within a few sync intervals at any
// size, not only at the next heartbeat (with 3 or more members a
// member's watermark passes the burst only after the others' acknowledging
// batches arrive, so it owes one more batch), and an idle mesh still sends
// nothing but heartbeats.
func TestCoreAckTailOnIdleMesh(t *testing.T) {
	for _, n := range []int{2, 3, 5, 10} {
		t.Run(fmt.Sprintf("%d_cores", n), func(t *testing.T) {
			const seed = 23
			reportSeed(t, seed)
			rules := []limiter.Rule{{Name: "api", Algorithm: limiter.FixedWindow, Limit: 1000, Window: 30 * time.Second}}
			net := cluster(t, n, seed, rules, nil)
			net.Delay, net.Jitter = 5*time.Millisecond, 3*time.Millisecond
			run(t, net, time.Second, nil)
			sent := func() (s uint64) {
				for i := range n {
					s += net.Core(i).Stats().BatchesSent
				}
				return s
			}
			idle0 := sent()
			run(t, net, 5*time.Second, nil)
			idle := sent() - idle0
			if max := uint64(n) * (5*2 + 1); idle > max { // heartbeats every 500 ms
				t.Errorf("an idle mesh of %d sent %d batches in 5 s, want at most %d (heartbeats)", n, idle, max)
			}
			if got := allowN(t, net, 0, "api", "k", 10); got != 10 {
				t.Fatalf("admitted %d of 10", got)
			}
			start, before := net.Now(), sent()
			for unacked(t, net.Core(0), net.Local(0), "api", "k") != 0 && net.Now().Sub(start) < time.Second {
				run(t, net, time.Millisecond, nil)
			}
			took := net.Now().Sub(start)
			if took > 4*20*time.Millisecond {
				t.Errorf("u of a burst returned to 0 after %v, want within 4 sync intervals", took)
			}
			run(t, net, 5*time.Second-took, nil)
			if extra := sent() - before; extra > idle+3*uint64(n) {
				t.Errorf("5 s after one burst the mesh sent %d batches, idle %d: the acknowledgements ping-pong", extra, idle)
			}
			t.Logf("u back to 0 after %v; batches in 5 s: idle %d, with the burst %d", took, idle, sent()-before)
		})
	}
}

// TestCoreNackFirstBatchAfterConnect: the first gossip batch an author
// sends after the anti-entropy exchange of a connect (or of its restart),
// carrying requests it admitted at once, is lost to one receiver; the full
// state told the receiver where the author's sequence stood, so the next
// batch reveals the gap and the receiver nacks it instead of waiting for a
// repair.
func TestCoreNackFirstBatchAfterConnect(t *testing.T) {
	for _, restarted := range []bool{false, true} {
		t.Run(fmt.Sprintf("restarted_%v", restarted), func(t *testing.T) {
			const seed = 24
			reportSeed(t, seed)
			rules := []limiter.Rule{{Name: "api", Algorithm: limiter.FixedWindow, Limit: 1000, Window: 30 * time.Second}}
			mut := func(c *node.CoreConfig) { c.RepairInterval = time.Hour }
			net := cluster(t, 2, seed, rules, mut)
			net.Delay = 5 * time.Millisecond
			run(t, net, time.Second, nil)
			var a int
			if restarted {
				a = 1
				net.Crash(a)
				run(t, net, 100*time.Millisecond, nil)
				restart(t, net, a, seed*7)
			} else {
				a = net.Add(newCore(t, "n02", net.Now(), rules, mut))
			}
			lost := 0
			net.Filter = func(from, to int, b *crdt.Batch) bool {
				if from == a && to == 0 && lost == 0 && len(b.Windows) > 0 {
					lost++
					return false
				}
				return true
			}
			if got := allowN(t, net, a, "api", "k", 4); got != 4 {
				t.Fatalf("admitted %d of 4", got)
			}
			run(t, net, 25*time.Millisecond, nil)
			if lost != 1 {
				t.Fatalf("dropped %d batches", lost)
			}
			allowN(t, net, a, "api", "k2", 1) // the next batch reveals the gap
			run(t, net, 150*time.Millisecond, nil)
			if got := total(t, net.Core(0), net.Local(0), "api", "k"); got != 4 {
				t.Errorf("member 0 knows %d of the lost batch's 4 (nacks sent %d): it did not notice the gap", got, net.Core(0).Stats().NacksSent)
			}
		})
	}
}

// TestCoreNackOfEmptyBatchResendsNothing: losing a batch that carried no
// entries (a heartbeat or a bare acknowledgement, the most common batch
// of an idle member) gets it nacked, but there is nothing to send again:
// the author must not re-publish all its live slots.
func TestCoreNackOfEmptyBatchResendsNothing(t *testing.T) {
	const (
		seed = 25
		keys = 300
	)
	reportSeed(t, seed)
	rules := []limiter.Rule{{Name: "api", Algorithm: limiter.FixedWindow, Limit: 1000, Window: time.Minute}}
	net := clusterAt(t, 2, seed, tMid, rules, func(c *node.CoreConfig) { c.RepairInterval = time.Hour })
	net.Delay = 5 * time.Millisecond
	for k := range keys {
		allowN(t, net, 0, "api", fmt.Sprintf("k%03d", k), 1)
	}
	run(t, net, time.Second, nil) // published, acknowledged; idle since
	if got := total(t, net.Core(1), net.Local(1), "api", "k299"); got != 1 {
		t.Fatalf("member 1 knows %d of k299", got)
	}
	before := net.Core(0).Stats()
	dropped := 0
	net.Filter = func(from, to int, b *crdt.Batch) bool {
		if from == 0 && to == 1 && dropped == 0 {
			if len(b.Windows)+len(b.Leases) > 0 {
				t.Fatalf("an idle member sent entries: %+v", b)
			}
			dropped++
			return false
		}
		return true
	}
	run(t, net, 1200*time.Millisecond, nil) // two heartbeats: the second reveals the gap
	after := net.Core(0).Stats()
	if dropped != 1 || after.NacksReceived != before.NacksReceived+1 {
		t.Fatalf("dropped %d heartbeats, nacks received %d -> %d", dropped, before.NacksReceived, after.NacksReceived)
	}
	if sent := after.EntriesSent - before.EntriesSent; sent != 0 {
		t.Errorf("a nacked heartbeat made the author re-send %d entries, want 0", sent)
	}
}

// TestCoreLostNackIsRepeated drops a batch to one receiver and then the
// receiver's first nack of it. The receiver's acknowledgement passes the
// gap at once, so with a single nack the author would count the lost
// batch acknowledged and never send it again (repairs off here); the nack
// is repeated in the receiver's next batches, the author serves the first
// copy that arrives and ignores the rest.
func TestCoreLostNackIsRepeated(t *testing.T) {
	const seed = 23
	net := nackCluster(t, seed)

	droppedBatch, droppedNacks := 0, 0
	net.Filter = func(from, to int, b *crdt.Batch) bool {
		if from == 0 && to == 1 && droppedBatch == 0 && slices.ContainsFunc(b.Windows, func(e crdt.WindowEntry) bool { return e.Key == "lost" }) {
			droppedBatch++
			return false
		}
		if from == 1 && to == 0 && droppedNacks == 0 && len(b.Nacks) > 0 {
			droppedNacks++
			return false
		}
		return true
	}
	if got := allowN(t, net, 0, "api", "lost", 3); got != 3 {
		t.Fatalf("admitted %d of 3", got)
	}
	run(t, net, 30*time.Millisecond, nil)
	if got := allowN(t, net, 0, "api", "other", 1); got != 1 { // reveals the gap
		t.Fatal("not admitted")
	}
	start := net.Now()
	for net.Now().Sub(start) < 500*time.Millisecond && total(t, net.Core(1), net.Local(1), "api", "lost") != 3 {
		run(t, net, time.Millisecond, nil)
	}
	if droppedBatch != 1 || droppedNacks != 1 {
		t.Fatalf("dropped %d batches and %d nacks, want 1 and 1", droppedBatch, droppedNacks)
	}
	if got := total(t, net.Core(1), net.Local(1), "api", "lost"); got != 3 {
		t.Fatalf("member 1 knows %d of the lost batch's 3 after its nack was lost too", got)
	}
	t.Logf("converged %v after the gap was revealed", net.Now().Sub(start))
	run(t, net, 200*time.Millisecond, nil) // every repeat delivered
	s0, s1 := net.Core(0).Stats(), net.Core(1).Stats()
	if s1.NacksSent != 1 || s0.NacksReceived != 1 {
		t.Errorf("nacks: member 1 sent %d, member 0 served %d; want 1 and 1 (repeats are not counted or served twice)", s1.NacksSent, s0.NacksReceived)
	}
}

// TestRepairSkipsAcknowledgedWindows: the periodic repair repeats only the
// windows whose own values some live member has not acknowledged, while
// every live member has our rules; when one's rules differ (it may have
// dropped entries of a rule it lacks and acknowledged the batch anyway),
// it repeats every window changed, as before. Before, a burst of 5,000 new
// keys went out twice whatever the acknowledgements (a million keys: 0.2
// of a core for the 10 s after the burst, a lone node too).
func TestRepairSkipsAcknowledgedWindows(t *testing.T) {
	const keys = 5000
	for _, differ := range []bool{false, true} {
		t.Run(fmt.Sprintf("rules differ %v", differ), func(t *testing.T) {
			rules := apiRule(limiter.FixedWindow, 1_000_000)
			rules[0].Window = time.Minute // nothing expires during the test
			net := nodetest.New(91, t0)
			for i := range 3 {
				rs := rules
				if differ && i == 2 {
					rs = append(slices.Clone(rules), limiter.Rule{Name: "other", Algorithm: limiter.FixedWindow, Limit: 10, Window: time.Second})
				}
				net.Add(newCore(t, fmt.Sprintf("n%02d", i), t0, rs, nil))
			}
			run(t, net, 2*time.Second, nil)
			for k := range keys {
				if allowN(t, net, 0, "api", fmt.Sprintf("k%04d", k), 1) != 1 {
					t.Fatalf("key %d denied", k)
				}
			}
			run(t, net, time.Second, nil) // published and acknowledged
			before := net.Core(0).Stats().EntriesSent
			run(t, net, 6*time.Second, nil) // past a repair (every 5 s)
			sent := net.Core(0).Stats().EntriesSent - before
			switch {
			case !differ && sent != 0:
				t.Errorf("the repair repeated %d entries, want none: every window was acknowledged", sent)
			case differ && sent < keys:
				t.Errorf("the repair repeated %d entries, want every one of the %d windows: a member's rules differ", sent, keys)
			}
			for i := range 3 {
				if u, err := net.Core(i).UsageOfWindow(net.Now(), "api", "k4999", net.Now().UnixMilli()/60000); err != nil || u.Total != 1 {
					t.Errorf("member %d counts %d for the last key (%v)", i, u.Total, err)
				}
			}
		})
	}
}
