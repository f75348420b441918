package simulator

import (
	"container/heap"
	"errors"
	"fmt"
	"io"
	"math"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/ratemesh/ratemesh/limiter"
	"github.com/ratemesh/ratemesh/node"
)

// Lease workloads (concurrency rules).
//
// Each arrival of a concurrency rule's workload is a client: it draws a key
// (key_dist), a node (node_dist), a hold time (exponential, mean
// workload.hold, at least 1 ms) and whether it crashes (probability
// workload.crash). It asks its node's real core to Acquire a lease; a denied
// Acquire is a rejected request. An admitted client renews its lease at its
// owner every lease_ttl/3 while it holds it and releases it when its hold
// ends; a crashing client instead vanishes at the end of its hold without
// releasing, so its lease lives on until it expires at its owner, lease_ttl
// after the last renewal (the owner's Tick releases it). A node that
// crashes or leaves takes its leases with it; a node that learns it was
// evicted drops the leases of its old incarnation (the core does; the
// simulator follows). The clients of a lost lease do not retry elsewhere.
//
// The simulator keeps its own account of every lease (held = acquired, not
// released, not expired at its owner, owner up), and checks it against the
// cores: once per virtual second each node's Core.Leases() must hold exactly
// the leases the simulator counts at that node, or the run fails.

// callOp is what a queued core call does.
type callOp uint8

const (
	opAllow callOp = iota
	opAcquire
	opRenew
	opRelease
)

// leaseBucketMs is the grain of the lease series (leases.csv, leases.svg).
const leaseBucketMs = 100

// maxTrackedKeys is how many keys of each concurrency rule get a series.
const maxTrackedKeys = 8

// buildLease reads a workload's lease fields: hold and crash belong to a
// concurrency rule's workload, cost, type, units and well_behaved to a
// windowed rule's.
func buildLease(field string, rw rawWorkload, r *limiter.Rule, w *Workload) error {
	if !r.Leased() {
		if rw.Hold != "" {
			return errf(field+".hold", "applies to a concurrency rule's workload; rule %q is %s", r.Name, r.Algorithm)
		}
		if rw.Crash != nil {
			return errf(field+".crash", "applies to a concurrency rule's workload; rule %q is %s", r.Name, r.Algorithm)
		}
		return nil
	}
	windowed := []struct {
		name string
		set  bool
	}{{"cost", rw.Cost != nil}, {"type", rw.Type != ""}, {"units", rw.Units != nil}, {"well_behaved", rw.WellBehaved}}
	for _, f := range windowed {
		if f.set {
			return errf(field+"."+f.name, "applies to windowed rules only; rule %q is a concurrency rule", r.Name)
		}
	}
	if rw.Hold == "" {
		return errf(field+".hold", "must be set on a concurrency rule's workload: the mean time a client holds its lease, for example 5s")
	}
	d, err := parseDur(field+".hold", rw.Hold, 0, false)
	if err != nil {
		return err
	}
	if d%time.Millisecond != 0 || d > 24*time.Hour {
		return errf(field+".hold", "%v must be whole milliseconds, at most 24h", d)
	}
	w.Hold = d
	if rw.Crash != nil {
		if w.Crash = *rw.Crash; !(w.Crash >= 0 && w.Crash <= 1) {
			return errf(field+".crash", "%v must be within 0 and 1 (the fraction of clients that crash without releasing)", w.Crash)
		}
	}
	return nil
}

// client is one arrival of a lease workload.
type client struct {
	ws        *workloadState
	lr        *leaseRule
	gk        int // key index in the rule
	node      int // -1: no node was up
	id        string
	end       int64 // virtual ms the hold ends
	crash     bool  // vanishes at end without releasing
	held      bool  // its owner holds the lease
	useful    bool  // held, and the client is still within its hold
	leaked    bool  // held after the client vanished
	done      bool  // the hold ended: no more renewals
	expNs     int64 // the lease's expiry on the owner's clock, ns since epoch
	renewedAt int64 // virtual ms of the last successful Acquire or Renew
	idx       int   // position in leaseState.byNode[node]
}

// clientAction is a client's next step: a renewal, or the end of its hold.
type clientAction struct {
	at  int64
	seq uint64
	cl  *client
	end bool
}

type actionQueue []clientAction

func (q actionQueue) Len() int { return len(q) }
func (q actionQueue) Less(i, j int) bool {
	if q[i].at != q[j].at {
		return q[i].at < q[j].at
	}
	return q[i].seq < q[j].seq
}
func (q actionQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *actionQueue) Push(x any)   { *q = append(*q, x.(clientAction)) }
func (q *actionQueue) Pop() any {
	old := *q
	x := old[len(old)-1]
	*q = old[:len(old)-1]
	return x
}

// leaseState is the engine's lease clients.
type leaseState struct {
	actions   actionQueue
	seq       uint64
	byNode    [][]*client // leases held, per owner node
	checkedAt []int64     // per node: the virtual second of the last check against the core
}

// leaseKey is one key of a concurrency rule on true time.
type leaseKey struct {
	limit                int64
	held, useful, demand int64
	last                 int64 // virtual ms the integrals run to
	maxHeld              int64
	heldMs, usefulMs     int64 // ∫ held dt, ∫ useful dt (lease-ms)
	capMs                int64 // ∫ min(demand, limit) dt
	sec                  int64 // the open key-second
	secMax               int64
	secActive            bool
	offered, admitted    uint64
	heldB, demandB       []int32 // max per leaseBucketMs (tracked keys only)
}

// leaseRule is a concurrency rule's lease accounting.
type leaseRule struct {
	name          string
	limit         uint64
	ttlMs         int64
	renewMs       int64
	keys          []leaseKey
	keyNames      []string
	windows       uint64    // active key-seconds
	overs         []float64 // their positive overshoots
	leakExpired   uint64
	leakMin       int64
	leakMax       int64
	leakSum       int64
	liveExpired   uint64 // leases of clients still holding them that expired (renewal too late)
	renewFail     uint64
	releaseFail   uint64
	lostCrash     uint64
	lostLeave     uint64
	lostReinc     uint64
	leakedAtCrash uint64 // leaked leases lost with their node before expiring
	probes        []*freeProbe
	open          []*freeProbe
}

// freeProbe follows the capacity freed by a node crash on one key.
type freeProbe struct {
	gk        int
	node      int
	at        int64 // virtual ms of the crash
	atNode    int64 // leases of the key the node held
	before    int64 // the key's held leases just before the crash
	first     int64 // ms after the crash until held > threshold; −1 never
	full      int64 // ms after the crash until held ≥ 0.95·min(before, limit); −1 never
	threshold int64
}

func (s *sim) initLeaseRule(ra *ruleAcc) {
	lr := &leaseRule{name: ra.name, limit: ra.rule.Limit, ttlMs: ra.rule.LeaseTTL.Milliseconds(), leakMin: math.MaxInt64}
	lr.renewMs = max(lr.ttlMs/3, 1)
	lr.keys = make([]leaseKey, len(ra.keys))
	for _, ws := range s.wls {
		if s.rules[ws.rule] == ra {
			lr.keyNames = append(lr.keyNames, ws.keys...)
		}
	}
	buckets := int(s.durMs/leaseBucketMs) + 1
	for k := range lr.keys {
		lk := &lr.keys[k]
		lk.limit = int64(ra.limits[k])
		if ra.limits[k] == 0 { // an unlimited class: never over
			lk.limit = math.MaxInt64 / 4
		}
		if k < maxTrackedKeys {
			lk.heldB = make([]int32, buckets)
			lk.demandB = make([]int32, buckets)
		}
	}
	ra.lr = lr
	if s.lease.byNode == nil {
		s.lease.byNode = make([][]*client, len(s.nodes))
		s.lease.checkedAt = make([]int64, len(s.nodes))
	}
}

// advance integrates key k's state up to virtual ms now (exclusive).
func (lr *leaseRule) advance(k *leaseKey, now int64) {
	if now <= k.last {
		return
	}
	dt := now - k.last
	k.heldMs += k.held * dt
	k.usefulMs += k.useful * dt
	k.capMs += min(k.demand, k.limit) * dt
	active := k.held > 0 || k.demand > 0
	for sec := k.last / 1000; sec <= (now-1)/1000; sec++ {
		if sec != k.sec {
			lr.closeSec(k)
			k.sec = sec
		}
		if active {
			k.secActive = true
			k.secMax = max(k.secMax, k.held)
		}
	}
	if k.heldB != nil {
		for b := k.last / leaseBucketMs; b <= (now-1)/leaseBucketMs && b < int64(len(k.heldB)); b++ {
			k.heldB[b] = max(k.heldB[b], int32(k.held))
			k.demandB[b] = max(k.demandB[b], int32(k.demand))
		}
	}
	k.last = now
}

// closeSec counts key k's open second.
func (lr *leaseRule) closeSec(k *leaseKey) {
	if k.secActive {
		lr.windows++
		if over := float64(k.secMax)/float64(k.limit) - 1; over > 0 {
			lr.overs = append(lr.overs, over)
		}
	}
	k.secActive, k.secMax = false, 0
}

// note records key k's state after a change at now (already advanced).
func (lr *leaseRule) note(k *leaseKey, now int64) {
	if sec := now / 1000; sec != k.sec {
		lr.closeSec(k)
		k.sec = sec
	}
	if k.held > 0 || k.demand > 0 {
		k.secActive = true
		k.secMax = max(k.secMax, k.held)
	}
	k.maxHeld = max(k.maxHeld, k.held)
	if k.heldB != nil {
		if b := now / leaseBucketMs; b < int64(len(k.heldB)) {
			k.heldB[b] = max(k.heldB[b], int32(k.held))
			k.demandB[b] = max(k.demandB[b], int32(k.demand))
		}
	}
}

func (s *sim) pushAction(a clientAction) {
	s.lease.seq++
	a.seq = s.lease.seq
	heap.Push(&s.lease.actions, a)
}

// arriveClients draws n clients of lease workload ws at s.now and queues
// their Acquire calls.
func (s *sim) arriveClients(ws *workloadState, ra *ruleAcc, n int) {
	lr := ra.lr
	holdMs := float64(ws.w.Hold.Milliseconds())
	for range n {
		k := 0
		if ws.cdf != nil {
			k = sort.SearchFloat64s(ws.cdf, s.rng.Float64())
			if k >= len(ws.cdf) {
				k = len(ws.cdf) - 1
			}
		} else if len(ws.keys) > 1 {
			k = s.rng.IntN(len(ws.keys))
		}
		gk := ws.keyBase + k
		hold := max(int64(math.Round(s.rng.ExpFloat64()*holdMs)), 1)
		crash := ws.w.Crash > 0 && s.rng.Float64() < ws.w.Crash
		lk := &lr.keys[gk]
		lr.advance(lk, s.now)
		lk.demand++
		lk.offered++
		lr.note(lk, s.now)
		s.requests++
		cl := &client{ws: ws, lr: lr, gk: gk, node: -1, end: s.now + hold, crash: crash, idx: -1}
		s.pushAction(clientAction{at: cl.end, cl: cl, end: true})
		i := s.pickNode(ws)
		if i < 0 {
			continue // offered, not admitted: no node is up
		}
		cl.node = i
		s.calls = append(s.calls, allowCall{ws: ws, ra: ra, k: k, gk: gk, node: i, op: opAcquire, cl: cl})
	}
}

// clientActions queues the renewals and releases due now, and ends the
// holds that end now.
func (s *sim) clientActions() {
	q := &s.lease.actions
	for len(*q) > 0 && (*q)[0].at <= s.now {
		a := heap.Pop(q).(clientAction)
		cl := a.cl
		if a.end {
			lk := &cl.lr.keys[cl.gk]
			cl.lr.advance(lk, s.now)
			lk.demand--
			cl.done = true
			if cl.useful {
				cl.useful = false
				lk.useful--
				if cl.crash {
					cl.leaked = true // vanishes: the lease waits for its TTL
				} else {
					s.calls = append(s.calls, allowCall{ws: cl.ws, gk: cl.gk, node: cl.node, op: opRelease, cl: cl})
				}
			}
			cl.lr.note(lk, s.now)
			continue
		}
		if cl.done || !cl.held {
			continue
		}
		s.calls = append(s.calls, allowCall{ws: cl.ws, gk: cl.gk, node: cl.node, op: opRenew, cl: cl})
	}
}

// leaseCall runs one lease operation on core c at its local time now. It
// runs in sim.job, possibly in parallel with other nodes' jobs: it touches
// only the call.
func (s *sim) leaseCall(c *node.Core, now time.Time, call *allowCall) {
	switch call.op {
	case opAcquire:
		ls, d, err := c.Acquire(now, call.ws.w.Rule, call.ws.keys[call.k], call.ws.w.Class)
		if err != nil {
			panic(fmt.Sprintf("simulator: a validated Acquire was refused: %v", err))
		}
		call.allowed = d.Allowed && ls.ID != ""
		call.lease, call.expNs = ls.ID, int64(ls.Expires.Sub(epoch))
	case opRenew:
		ttl, err := c.Renew(now, call.cl.id)
		call.allowed, call.err = err == nil, err
		call.expNs = int64(now.Add(ttl).Sub(epoch))
	case opRelease:
		err := c.Release(now, call.cl.id)
		call.allowed, call.err = err == nil, err
	}
}

// leaseOutcome accounts one decided lease call, in call order.
func (s *sim) leaseOutcome(c *allowCall) error {
	cl := c.cl
	lr := cl.lr
	lk := &lr.keys[cl.gk]
	if c.err != nil && !errors.Is(c.err, node.ErrUnknownLease) {
		return fmt.Errorf("node %d: %s of lease %s: %w", cl.node, map[callOp]string{opRenew: "Renew", opRelease: "Release"}[c.op], cl.id, c.err)
	}
	switch c.op {
	case opAcquire:
		if !c.allowed {
			return nil
		}
		lr.advance(lk, s.now)
		cl.id, cl.expNs, cl.renewedAt = c.lease, c.expNs, s.now
		cl.held = true
		lk.held++
		lk.admitted++
		// The hold ends at least 1 ms after the arrival, so it is still on.
		cl.useful = true
		lk.useful++
		s.pushRenew(cl)
		list := &s.lease.byNode[cl.node]
		cl.idx = len(*list)
		*list = append(*list, cl)
		lr.note(lk, s.now)
		lr.checkProbes(cl.gk, lk, s.now)
	case opRenew:
		if !cl.held {
			return nil
		}
		if c.allowed {
			cl.expNs, cl.renewedAt = c.expNs, s.now
			s.pushRenew(cl)
			return nil
		}
		lr.renewFail++ // the core no longer has it (expired, or dropped)
		s.endLease(cl)
	case opRelease:
		if !cl.held {
			return nil
		}
		if !c.allowed {
			lr.releaseFail++
		}
		s.endLease(cl)
	}
	return nil
}

// pushRenew schedules cl's next renewal, if its hold lasts that long.
func (s *sim) pushRenew(cl *client) {
	if next := s.now + cl.lr.renewMs; next < cl.end {
		s.pushAction(clientAction{at: next, cl: cl})
	}
}

// endLease ends cl's lease at s.now.
func (s *sim) endLease(cl *client) {
	if !cl.held {
		return
	}
	lk := &cl.lr.keys[cl.gk]
	cl.lr.advance(lk, s.now)
	lk.held--
	if cl.useful {
		cl.useful = false
		lk.useful--
	}
	cl.held = false
	list := s.lease.byNode[cl.node]
	last := len(list) - 1
	list[cl.idx] = list[last]
	list[cl.idx].idx = cl.idx
	list[last] = nil
	s.lease.byNode[cl.node] = list[:last]
	cl.idx = -1
	cl.lr.note(lk, s.now)
}

// expireNodeLeases ends the leases that node r's Tick just expired (the
// core releases a lease at its first Tick at or after its expiry), and
// once per virtual second checks the simulator's account against the core.
func (s *sim) expireNodeLeases(r int) error {
	if s.lease.byNode == nil {
		return nil
	}
	nowNs := int64(s.local(r).Sub(epoch))
	list := s.lease.byNode[r]
	for j := len(list) - 1; j >= 0; j-- {
		cl := list[j]
		if nowNs < cl.expNs {
			continue
		}
		lr := cl.lr
		if cl.leaked {
			lr.leakExpired++
			life := s.now - cl.renewedAt
			lr.leakMin, lr.leakMax = min(lr.leakMin, life), max(lr.leakMax, life)
			lr.leakSum += life
		} else {
			lr.liveExpired++
		}
		s.endLease(cl)
		list = s.lease.byNode[r]
	}
	if sec := s.now / 1000; s.lease.checkedAt[r] != sec+1 {
		s.lease.checkedAt[r] = sec + 1
		if got, want := len(s.nodes[r].core.Leases()), len(s.lease.byNode[r]); got != want {
			return fmt.Errorf("node %d owns %d leases, its clients hold %d: the simulator's lease account and the core disagree", r, got, want)
		}
	}
	return nil
}

// dropNodeLeases ends every lease node i owns as it crashes or leaves
// (why: "crashed" or "left"); a crash opens a free probe per key.
func (s *sim) dropNodeLeases(i int, why string) {
	if s.lease.byNode == nil || len(s.lease.byNode[i]) == 0 {
		return
	}
	list := append([]*client(nil), s.lease.byNode[i]...)
	if why == "crashed" {
		type ref struct {
			lr *leaseRule
			gk int
		}
		count := map[ref]int64{}
		var refs []ref
		for _, cl := range list {
			r := ref{cl.lr, cl.gk}
			if count[r] == 0 {
				refs = append(refs, r)
			}
			count[r]++
		}
		for _, r := range refs {
			lk := &r.lr.keys[r.gk]
			p := &freeProbe{gk: r.gk, node: i, at: s.now, atNode: count[r], before: lk.held, first: -1, full: -1,
				threshold: max(lk.limit, lk.held) - count[r] + max(2, lk.limit/50)}
			r.lr.probes = append(r.lr.probes, p)
			r.lr.open = append(r.lr.open, p)
		}
	}
	for _, cl := range list {
		switch why {
		case "crashed":
			cl.lr.lostCrash++
			if cl.leaked {
				cl.lr.leakedAtCrash++
			}
		case "left":
			cl.lr.lostLeave++
		}
		s.endLease(cl)
	}
}

// dropStaleLeases ends node i's leases of incarnations other than inc: the
// core dropped them when it learned it was evicted.
func (s *sim) dropStaleLeases(i int, inc uint64) {
	if s.lease.byNode == nil {
		return
	}
	mark := "~" + strconv.FormatUint(inc, 36) + "~"
	for _, cl := range append([]*client(nil), s.lease.byNode[i]...) {
		if !strings.Contains(cl.id, mark) {
			cl.lr.lostReinc++
			s.endLease(cl)
		}
	}
}

// checkProbes notes when a key's held leases pass the open probes'
// thresholds after a new lease.
func (lr *leaseRule) checkProbes(gk int, lk *leaseKey, now int64) {
	if len(lr.open) == 0 {
		return
	}
	kept := lr.open[:0]
	for _, p := range lr.open {
		if p.gk == gk && now > p.at {
			if p.first < 0 && lk.held > p.threshold {
				p.first = now - p.at
			}
			if p.full < 0 && 20*lk.held >= 19*min(p.before, lk.limit) {
				p.full = now - p.at
			}
		}
		if p.first < 0 || p.full < 0 {
			kept = append(kept, p)
		}
	}
	clear(lr.open[len(kept):])
	lr.open = kept
}

// closeLeases integrates every key of ra to the end of the run.
func (s *sim) closeLeases(ra *ruleAcc) {
	lr := ra.lr
	for k := range lr.keys {
		lk := &lr.keys[k]
		lr.advance(lk, s.durMs)
		lr.closeSec(lk)
	}
}

// LeaseKeyRow is one key of a concurrency rule over the run, on true time.
type LeaseKeyRow struct {
	Key   string
	Limit uint64
	// MaxHeld is the most leases held at once (held: acquired, not
	// released, not expired at its owner, owner up).
	MaxHeld uint64
	// Offered and Admitted count Acquire calls.
	Offered, Admitted uint64
	// MeanHeld is the time-average of held leases; Utilisation is
	// ∫ useful held / ∫ min(demand, limit) (see LeaseFigures).
	MeanHeld, Utilisation float64
}

// FreedRow is the capacity a node crash freed on one key: how long until
// another node's Acquire used it.
type FreedRow struct {
	Key  string
	Node int
	// AtMs is the crash; AtNode the leases of the key the node held then;
	// Before the key's held leases just before.
	AtMs, AtNode, Before int64
	// FirstMs is the time from the crash until the key held more than
	// max(limit, Before) − AtNode leases (what the others could hold while
	// they still counted the crashed node's leases) plus the equal-share
	// lottery's slack of max(2, limit/50) leases: freed slots are in use
	// again. FullMs is the time until it held 95 % of
	// min(Before, limit) again (the partition figures' "full again"). −1:
	// never within the run.
	FirstMs, FullMs int64
}

// LeaseSample is one tracked key's leases in one leaseBucketMs of true time.
type LeaseSample struct {
	Key     string
	StartMs int64
	// HeldMax and DemandMax are the most held leases and the most clients
	// wanting one at any instant of the interval.
	HeldMax, DemandMax int64
	Limit              uint64
}

// LeaseFigures is a concurrency rule's lease figures (leases.go).
type LeaseFigures struct {
	Rule  string
	Limit uint64
	TTLMs int64
	Keys  []LeaseKeyRow
	Freed []FreedRow
	// LeakExpired counts the leases of crashed clients that expired at
	// their owner; LeakMinMs and LeakMaxMs bound the time from their last
	// Acquire or Renew to the expiry (lease_ttl, plus up to one Tick).
	LeakExpired          uint64
	LeakMinMs, LeakMaxMs int64
	LeakMeanMs           float64
	// LeakedAtCrash counts crashed clients' leases lost with their node
	// before they expired.
	LeakedAtCrash uint64
	// LiveExpired counts leases that expired while their client still
	// renewed them (should be 0); RenewFailures and ReleaseFailures calls
	// the owner refused (unknown or expired lease).
	LiveExpired, RenewFailures, ReleaseFailures uint64
	// LostCrash, LostLeave and LostReincarnation count leases that ended
	// with their owner: crashed, left, or evicted and back under a new
	// incarnation.
	LostCrash, LostLeave, LostReincarnation uint64
	Series                                  []LeaseSample
}

// leaseSummary fills a concurrency rule's summary and figures.
func (s *sim) leaseSummary(ra *ruleAcc, rs *RuleSummary, res *Result) {
	lr := ra.lr
	f := LeaseFigures{Rule: lr.name, Limit: lr.limit, TTLMs: lr.ttlMs, LeakExpired: lr.leakExpired,
		LeakedAtCrash: lr.leakedAtCrash, LiveExpired: lr.liveExpired, RenewFailures: lr.renewFail,
		ReleaseFailures: lr.releaseFail, LostCrash: lr.lostCrash, LostLeave: lr.lostLeave, LostReincarnation: lr.lostReinc}
	if lr.leakExpired > 0 {
		f.LeakMinMs, f.LeakMaxMs = lr.leakMin, lr.leakMax
		f.LeakMeanMs = round(float64(lr.leakSum)/float64(lr.leakExpired), 1)
	}
	var offered, admitted uint64
	var useful, capacity int64
	over := 0.0
	for k := range lr.keys {
		lk := &lr.keys[k]
		offered += lk.offered
		admitted += lk.admitted
		useful += lk.usefulMs
		capacity += lk.capMs
		over = max(over, float64(lk.maxHeld)/float64(lk.limit)-1)
		row := LeaseKeyRow{Key: lr.keyNames[k], Limit: uint64(lk.limit), MaxHeld: uint64(lk.maxHeld),
			Offered: lk.offered, Admitted: lk.admitted}
		if s.durMs > 0 {
			row.MeanHeld = round(float64(lk.heldMs)/float64(s.durMs), 2)
		}
		if lk.capMs > 0 {
			row.Utilisation = round(float64(lk.usefulMs)/float64(lk.capMs), 4)
		}
		f.Keys = append(f.Keys, row)
		for b := range lk.heldB {
			if st := int64(b) * leaseBucketMs; st < s.durMs {
				f.Series = append(f.Series, LeaseSample{Key: row.Key, StartMs: st, HeldMax: int64(lk.heldB[b]),
					DemandMax: int64(lk.demandB[b]), Limit: row.Limit})
			}
		}
	}
	for _, p := range lr.probes {
		f.Freed = append(f.Freed, FreedRow{Key: lr.keyNames[p.gk], Node: p.node, AtMs: p.at, AtNode: p.atNode,
			Before: p.before, FirstMs: p.first, FullMs: p.full})
	}
	rs.Offered, rs.Admitted, rs.Limit = offered, admitted, lr.limit
	rs.Windows = lr.windows
	rs.OvershootMax = round(max(over, 0), 4)
	rs.OvershootP99 = round(p99(lr.overs, lr.windows), 4)
	rs.Utilisation = 0
	if capacity > 0 {
		rs.Utilisation = round(float64(useful)/float64(capacity), 4)
	}
	res.Leases = append(res.Leases, f)
}

// writeLeases writes the lease lines of the table: per concurrency rule,
// the keys' most concurrent leases against the limit, the crashed clients'
// leases' lifetime after their last renewal, and each node crash's freed
// capacity.
func writeLeases(w io.Writer, figs []LeaseFigures) {
	for _, f := range figs {
		fmt.Fprintf(w, "leases %s: limit %d per key, lease_ttl %v\n", f.Rule, f.Limit, time.Duration(f.TTLMs)*time.Millisecond)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "key\tlimit\tmax held\tmean held\tacquires\tadmitted\tutilisation\t")
		for _, k := range f.Keys {
			fmt.Fprintf(tw, "%s\t%d\t%d\t%.2f\t%d\t%d\t%.4f\t\n", k.Key, k.Limit, k.MaxHeld, k.MeanHeld, k.Offered, k.Admitted, k.Utilisation)
		}
		tw.Flush()
		if f.LeakExpired > 0 {
			fmt.Fprintf(w, "  crashed clients' leases expired at their owner: %d, %d–%d ms after the last renewal (mean %.1f; lease_ttl %d ms)\n",
				f.LeakExpired, f.LeakMinMs, f.LeakMaxMs, f.LeakMeanMs, f.TTLMs)
		}
		fmt.Fprintf(w, "  lost with their node: %d crashed (%d of them leaked), %d left, %d reincarnated; live leases expired %d; renew/release refused %d/%d\n",
			f.LostCrash, f.LeakedAtCrash, f.LostLeave, f.LostReincarnation, f.LiveExpired, f.RenewFailures, f.ReleaseFailures)
		for _, p := range f.Freed {
			fmt.Fprintf(w, "  freed: node %d crashed at %v holding %d of %s's %d leases (limit %d): first reused after %s, back to 95%% after %s\n",
				p.Node, time.Duration(p.AtMs)*time.Millisecond, p.AtNode, p.Key, p.Before, f.Limit, msOrNever(p.FirstMs), msOrNever(p.FullMs))
		}
	}
}

func msOrNever(ms int64) string {
	if ms < 0 {
		return "never"
	}
	return fmt.Sprintf("%d ms", ms)
}

// writeLeasesCSV writes leases.csv: per concurrency rule and tracked key
// (the first 8 of each rule), per 100 ms of true time, the most leases held
// and the most clients wanting one at any instant, and the limit.
func (r *Result) writeLeasesCSV(w io.Writer) error {
	fmt.Fprintln(w, "rule,key,start_ms,held_max,demand_max,limit")
	for _, f := range r.Leases {
		for _, row := range f.Series {
			fmt.Fprintf(w, "%s,%s,%d,%d,%d,%d\n", f.Rule, row.Key, row.StartMs, row.HeldMax, row.DemandMax, row.Limit)
		}
	}
	return nil
}

// writeLeasesSVG plots leases.csv: one panel per tracked key (at most 4
// per rule), held leases against the limit, node crashes shaded.
func (r *Result) writeLeasesSVG(w io.Writer) error {
	type panel struct {
		rule, key string
		rows      []LeaseSample
	}
	var panels []panel
	for _, f := range r.Leases {
		n := 0
		for _, row := range f.Series {
			if len(panels) == 0 || panels[len(panels)-1].key != row.Key || panels[len(panels)-1].rule != f.Rule {
				if n == 4 {
					break
				}
				n++
				panels = append(panels, panel{rule: f.Rule, key: row.Key})
			}
			panels[len(panels)-1].rows = append(panels[len(panels)-1].rows, row)
		}
	}
	var p plot
	p.header(max(len(panels), 1), fmt.Sprintf("%s (seed %d): leases held vs. limit per %d ms of true time; shaded: node down (grey), partition (orange)",
		r.Summary.Scenario, r.Summary.Seed, leaseBucketMs))
	xmax := float64(r.DurationMs) / 1000
	for i, pn := range panels {
		var xs, held, dem, lim []float64
		ymax := 0.0
		for _, row := range pn.rows {
			xs = append(xs, float64(row.StartMs+leaseBucketMs/2)/1000)
			held = append(held, float64(row.HeldMax))
			dem = append(dem, float64(row.DemandMax))
			lim = append(lim, float64(row.Limit))
			ymax = max(ymax, float64(row.HeldMax), 1.5*float64(row.Limit))
		}
		p.panel(i, fmt.Sprintf("rule %s, key %s: most leases held per %d ms", pn.rule, pn.key, leaseBucketMs), xmax, ymax, r.Shades)
		p.line(xs, dem, "#8d99ae", true, "clients wanting a lease (clipped)")
		p.line(xs, lim, "#d62828", true, "limit")
		p.line(xs, held, "#1d3557", false, "held")
	}
	_, err := io.WriteString(w, p.done())
	return err
}
