package simulator

import (
	"container/heap"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ratemesh/ratemesh/crdt"
	"github.com/ratemesh/ratemesh/limiter"
	"github.com/ratemesh/ratemesh/node"
)

// epoch is virtual time 0: aligned to every window.
var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func newRand(a, b uint64) *rand.Rand { return rand.New(rand.NewPCG(a, b^0x5eed5eed5eed5eed)) }

// Options tune one run; the zero value runs the scenario as written.
type Options struct {
	// Seed, when not nil, replaces the scenario's seed.
	Seed *uint64
	// Progress, when not nil, receives a progress line every tenth of the
	// virtual duration once a run has taken more than two wall seconds.
	Progress io.Writer
	// Workers is how many goroutines step receivers in parallel (default
	// 1). It changes the wall time only, never the result.
	Workers int

	parallelMin int  // tests lower it to exercise the parallel path
	eager       bool // tests: step every delivery when it happens
}

type simNode struct {
	peer     string
	core     *node.Core
	up       bool // running
	exists   bool // joined at some point
	gone     bool // left gracefully: never comes back
	inc      uint64
	skewNs   int64
	group    int
	nextTick int64 // virtual ms of the next Tick
	edge     int   // the seq of its leading edge scheduled in sim.edges, 0 when none (edge.go)
	bytes    uint64
	msgs     uint64
	sampleN  uint64 // entry-carrying batches published (for sampling)
}

// inMsg is one batch due at one receiver.
type inMsg struct {
	b        *crdt.Batch
	from, to int32
	nacks    bool // b may nack a batch of the receiver: it names its peer
}

// pendRun is one millisecond's batches in a receiver's pending list: how
// many, the receiver's local clock at their delivery, and the virtual ms.
type pendRun struct {
	n     int
	nowNs int64 // local clock at delivery, in ns since epoch
	at    int64 // virtual ms of the delivery
}

// stepError is a Step that failed, with the virtual ms of its delivery
// (a receiver steps its deliveries later than they happen; see sim.work).
type stepError struct {
	at  int64
	err error
}

func (e *stepError) Error() string { return e.err.Error() }
func (e *stepError) Unwrap() error { return e.err }

// parallelMin is the number of pending deliveries in one millisecond from
// which Workers > 1 steps receivers in parallel.
const parallelMin = 512

// allowCall is one request of the current millisecond, drawn by generate
// and decided by its node in sim.work.
type allowCall struct {
	ws      *workloadState
	ra      *ruleAcc
	k, gk   int
	node    int
	allowed bool
	op      callOp  // what the call does: Allow, or a lease operation (leases.go)
	cl      *client // the lease's client (lease operations)
	lease   string  // Acquire: the lease ID granted
	expNs   int64   // Acquire, Renew: the lease's expiry on the owner's clock, ns since epoch
	err     error   // Renew, Release: the core's refusal
	held    bool    // Allow: denied for its share and held (hold.go); its outcome counts later
}

type simEvent struct {
	at   int64
	seq  int
	kind EventKind // scripted kinds, or "churn" / "churn-restart"
	ev   *Event
	node int
	inc  uint64 // evDial: the incarnation that dials
	seed int    // evDial: the seed it exchanged with already
}

type eventQueue []simEvent

func (q eventQueue) Len() int { return len(q) }
func (q eventQueue) Less(i, j int) bool {
	if q[i].at != q[j].at {
		return q[i].at < q[j].at
	}
	return q[i].seq < q[j].seq
}
func (q eventQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *eventQueue) Push(x any)   { *q = append(*q, x.(simEvent)) }
func (q *eventQueue) Pop() any {
	old := *q
	x := old[len(old)-1]
	*q = old[:len(old)-1]
	return x
}

const (
	evChurn        EventKind = "churn"
	evChurnRestart EventKind = "churn-restart"
	evDial         EventKind = "dial" // a joiner dials the members its seed's full state named
	evEdge         EventKind = "edge" // a node's leading edge, on sim.edges (edge.go)
	sampleEntries            = 16
	sampleMaxAgeMs           = 10_000
)

// sim is one run of a scenario: the nodes and their cores, the simulated
// network between them, the workloads, and everything measured, advanced
// one virtual millisecond at a time by step (the loop of the package doc).
// newSim builds it (the zero value is not usable), Run drives it, finish
// turns it into a Result. It serves one run and is not safe for concurrent
// use: one goroutine drives it, which fans the cores' own work out to
// workers in runJobs (see Determinism, below).
//
// Its fields, in groups:
//
//   - The run: the scenario, its seed and the one rand every draw of the
//     engine comes from (rng: delays, losses, arrivals, keys, nodes,
//     churn, skews); the nodes by index (a node keeps its index through
//     crashes and restarts); now, virtual time in ms (0 at epoch); the
//     scenario's duration, sync interval and network figures.
//   - Who is there: present holds the indices of the nodes that exist and
//     have not left, ascending; upList those of them that are up, in the
//     same order, rebuilt by refreshUp after every change, which bumps
//     upVer (the workloads' cached pools compare it).
//   - Delivery: inbox is a timing wheel of len(inbox) = mask+1 (a power
//     of two beyond the largest delay) per-millisecond slots of the
//     copies scheduled for it (receiver and batch, in the order
//     scheduled), slot now&mask due now; pending holds, per
//     receiver, the batches delivered and not yet stepped, nPending
//     their total. A receiver's pending batches are stepped before
//     anything reads or drives its core: its requests and Tick (job),
//     every event (flushAll), the end of the run.
//   - The millisecond's work, scratch rebuilt every millisecond: calls
//     (the requests generate drew), jobs (the nodes driven), jobCalls
//     (per node, its calls), due (the nodes whose Tick is due), readies
//     (their Ticks' outputs, which tick publishes); between milliseconds
//     calls, jobCalls and readies are empty and isJob and isDue all
//     false. workers, parallelMin and eager say how work runs the jobs
//     (Options).
//   - Scripted time: events, a heap by (at, seq), evSeq its counter.
//     The leading edges (edge.go): edges, the same kind of heap, its
//     seqs from evSeq too, and gap, the scenario's PublishGap.
//   - What is offered: rules (accumulators by the scenario's rule order,
//     ruleIdx by name) and wls, the workloads; lease holds the lease
//     clients of concurrency rules (leases.go), held the Allows each
//     node holds for share_wait (hold.go).
//   - What is measured: the convergence samples open per sender (open,
//     nOpen = their total, one batch in sampleK sampled); partStart (≥ 0
//     while a partition is on) and downStart (per node, ≥ 0 while it is
//     down) open the shades that shades collects; reincs; traffic per
//     second, per node-ms up and in total (seconds, nodeMs, totMsgs,
//     totBytes); skipped event actions and offered requests; subs
//     (subintervals.go) and sides (sides.go).
//
// Determinism: only serial code draws from rng or writes what nodes
// share. The jobs of different nodes (work, flushAll, edgesDue) may run in
// parallel (Options.Workers); a job touches only its node's core and its
// node's slots (pending[r], jobCalls[r], readies[r], edgeWait[r], held[r],
// sides.tick[r] and its own calls), and the serial code after it reads them in node order,
// so no output depends on Workers.
type sim struct {
	sc      *Scenario
	seed    uint64
	rng     *rand.Rand
	nodes   []*simNode
	present []int // existing, not gone; ascending
	upList  []int32
	upVer   int
	now     int64 // virtual ms
	durMs   int64
	syncMs  int64
	latNs   int64
	jitNs   int64
	loss    float64

	inbox       [][]inMsg        // [ms slot]: in the order scheduled
	byTo        []inMsg          // deliver's scratch: the slot's batches by receiver
	toCount     []int32          // deliver's scratch: per receiver, then where its run ends
	pending     [][]*crdt.Batch  // per receiver: delivered, not stepped yet
	runs        [][]pendRun      // per receiver: its pending batches' deliveries
	peerIdx     map[string]int32 // node index by peer
	nackMark    []bool           // per node: named by the nacks of the batch being published
	marked      []int32          // markNacks's scratch
	nPending    int
	calls       []allowCall
	due         []int32         // nodes whose Tick is due now, in upList order
	readies     []node.Ready    // per node: the Ready of its Tick or edge this ms
	edgeWait    []time.Duration // per node: how long its last batch holds its edge off (edgesDue)
	edgeOrder   []int32         // the edges due this ms, in heap order (edgesDue)
	forming     [][]*crdt.Batch // per initial node: its full state, while the mesh forms (handle)
	jobs        []int32         // nodes stepped this ms
	jobCalls    [][]int32       // per node: its calls this ms, in order
	isJob       []bool          // per node: listed in jobs
	isDue       []bool          // per node: listed in due
	mask        int64
	workers     int
	parallelMin int
	eager       bool
	events      eventQueue
	evSeq       int
	edges       eventQueue    // leading edges (edge.go)
	gap         time.Duration // Scenario.PublishGap: 0 the runtime's default, < 0 no leading edge
	rules       []*ruleAcc
	ruleIdx     map[string]int
	wls         []*workloadState

	open      [][]*sample // per sender node: open convergence samples
	nOpen     int
	sampleK   uint64
	partStart int64
	downStart []int64
	shades    []Shade
	reincs    []Reincarnation // every incarnation a node took on learning it was evicted
	seconds   []SecondRow
	nodeMs    uint64
	totMsgs   uint64
	totBytes  uint64
	skipped   int
	requests  uint64
	subs      subIntervals // admitted per workload per SubMs (subintervals.go)
	lease     leaseState   // lease clients of concurrency rules (leases.go)
	held      [][]heldCall // per node: Allows held for share_wait (hold.go)
	sides     sideState    // the sides of the first partition and their scales (sides.go)
}

// Run simulates sc and returns its result.
func Run(sc *Scenario, opt Options) (*Result, error) {
	wallStart := time.Now()
	s, err := newSim(sc, opt)
	if err != nil {
		return nil, err
	}
	nextReport := s.durMs / 10
	fail := func(err error) error {
		at := s.now
		if se := (*stepError)(nil); errors.As(err, &se) {
			at = se.at
		}
		return fmt.Errorf("simulator: scenario %s, seed %d, at %v: %w", sc.Name, s.seed, time.Duration(at)*time.Millisecond, err)
	}
	for s.now = 0; s.now < s.durMs; s.now++ {
		if err := s.step(); err != nil {
			return nil, fail(err)
		}
		if opt.Progress != nil && s.now >= nextReport {
			nextReport += s.durMs / 10
			if el := time.Since(wallStart); el > 2*time.Second {
				fmt.Fprintf(opt.Progress, "sim %s: %d%% (%v of %v virtual) after %.1fs\n", sc.Name,
					s.now*100/s.durMs, time.Duration(s.now)*time.Millisecond, sc.Duration, el.Seconds())
			}
		}
	}
	// Step what is still pending: nothing reads it any more, but a Step
	// that fails fails the run as it would have when delivered.
	if err := s.flushAll(); err != nil {
		return nil, fail(err)
	}
	res := s.finish()
	res.Summary.WallSeconds = math.Round(time.Since(wallStart).Seconds()*1000) / 1000
	return res, nil
}

func newSim(sc *Scenario, opt Options) (*sim, error) {
	seed := sc.Seed
	if opt.Seed != nil {
		seed = *opt.Seed
	}
	s := &sim{
		sc: sc, seed: seed, rng: newRand(seed, seed),
		durMs:     sc.Duration.Milliseconds(),
		syncMs:    sc.Mesh.SyncInterval.Milliseconds(),
		latNs:     int64(sc.Network.Latency),
		jitNs:     int64(sc.Network.Jitter),
		loss:      sc.Network.Loss,
		ruleIdx:   map[string]int{},
		peerIdx:   map[string]int32{},
		partStart: -1,
		gap:       sc.PublishGap,
	}
	maxDelay := (s.latNs+s.jitNs)/int64(time.Millisecond) + 2
	size := int64(1)
	for size < maxDelay+1 {
		size <<= 1
	}
	total := sc.total()
	s.inbox = make([][]inMsg, size)
	s.toCount = make([]int32, total)
	s.pending = make([][]*crdt.Batch, total)
	s.runs = make([][]pendRun, total)
	s.nackMark = make([]bool, total)
	s.readies = make([]node.Ready, total)
	s.edgeWait = make([]time.Duration, total)
	s.jobCalls = make([][]int32, total)
	s.isJob = make([]bool, total)
	s.isDue = make([]bool, total)
	s.held = make([][]heldCall, total)
	s.mask = size - 1
	s.workers = max(opt.Workers, 1)
	s.parallelMin = parallelMin
	if opt.parallelMin > 0 {
		s.parallelMin = opt.parallelMin
	}
	s.eager = opt.eager

	width := len(fmt.Sprint(total - 1))
	s.nodes = make([]*simNode, total)
	for i := range s.nodes {
		s.nodes[i] = &simNode{peer: fmt.Sprintf("n%0*d", width, i)}
		s.peerIdx[s.nodes[i].peer] = int32(i)
	}
	s.open = make([][]*sample, total)
	s.downStart = make([]int64, total)
	for i := range s.downStart {
		s.downStart[i] = -1
	}
	s.sampleK = uint64(max(1, sc.Nodes/20))
	s.initSides() // sides.go

	for i, r := range sc.Rules {
		nr := r
		if err := nr.Normalize(); err != nil {
			return nil, err
		}
		s.ruleIdx[r.Name] = i
		s.rules = append(s.rules, &ruleAcc{name: r.Name, rule: nr, wms: nr.WindowMs()})
	}
	for i, w := range sc.Workloads {
		ws := &workloadState{w: w, rule: s.ruleIdx[w.Rule], pool: w.Nodes}
		ra := s.rules[ws.rule]
		ws.keyBase = len(ra.keys)
		ws.keys = make([]string, w.Keys)
		for k := range ws.keys {
			ws.keys[k] = fmt.Sprintf("w%d-k%d", i, k)
			if ws.keyBase+k == 0 {
				ra.key0 = ws.keys[k] // inwindow.go
			}
			lim, unlimited, err := ra.rule.LimitFor(ws.keys[k], w.Class)
			if err != nil {
				return nil, err
			}
			if unlimited {
				lim = 0
			}
			ra.keys = append(ra.keys, keyAcc{win: math.MinInt64})
			ra.limits = append(ra.limits, lim)
			if ref, ok := ra.rule.Reference(lim); ok {
				ra.refs = append(ra.refs, ref)
			}
			ra.wellBehaved = append(ra.wellBehaved, w.WellBehaved)
			ra.keyClass = append(ra.keyClass, w.Class) // credits.go
		}
		if w.KeyDist.Zipf && w.Keys > 1 {
			ws.cdf = make([]float64, w.Keys)
			sum := 0.0
			for k := range ws.cdf {
				sum += math.Pow(float64(k+1), -w.KeyDist.S)
				ws.cdf[k] = sum
			}
			for k := range ws.cdf {
				ws.cdf[k] /= sum
			}
		}
		ws.setRate(w.Rate)
		if w.Cost != 1 {
			ws.req = limiter.Request{Cost: w.Cost, HasCost: true}
		}
		if w.Type != "" {
			ws.req = limiter.Request{Type: w.Type, Units: w.Units}
		}
		ws.req.Class = w.Class
		s.wls = append(s.wls, ws)
	}
	for _, ra := range s.rules {
		if ra.wms <= 0 {
			s.initLeaseRule(ra) // a concurrency rule (leases.go)
			continue
		}
		nw := s.durMs/ra.wms + 2
		ra.series = make([]winAgg, nw)
		ra.firstWin = epoch.UnixMilli() / ra.wms
		s.initSideRule(ra) // sides.go
	}
	s.seconds = make([]SecondRow, (s.durMs+999)/1000)

	// Initial nodes: they form the mesh before time 0, on clocks skewed
	// from the start (skew_start.go).
	s.skewFromStart()
	for i := 0; i < sc.Nodes; i++ {
		if err := s.startNode(i, false); err != nil {
			return nil, err
		}
	}
	s.refreshUp()
	states := make([][]*crdt.Batch, sc.Nodes)
	s.forming = states
	for i := 0; i < sc.Nodes; i++ {
		others := make([]string, 0, sc.Nodes-1)
		for j := 0; j < sc.Nodes; j++ {
			if j != i {
				others = append(others, s.nodes[j].peer)
			}
		}
		c := s.nodes[i].core
		c.AntiEntropy(s.local(i), others...)
		if err := s.handle(i, c.Ready()); err != nil {
			return nil, err
		}
	}
	s.forming = nil
	// Every node steps every other's state; nodes share nothing, so the
	// workers take them in parallel (the error is the lowest node's).
	errs := make([]error, sc.Nodes)
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(s.workers, sc.Nodes) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := int(next.Add(1) - 1); j < sc.Nodes; j = int(next.Add(1) - 1) {
				errs[j] = s.stepStates(j, states)
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}

	for k := range sc.Events {
		e := &sc.Events[k]
		if skewsFromStart(e) {
			continue // applied before the mesh formed
		}
		s.push(simEvent{at: e.At.Milliseconds(), kind: e.Kind, ev: e})
	}
	if sc.Churn != nil {
		s.push(simEvent{at: sc.Churn.Every.Milliseconds(), kind: evChurn})
	}
	return s, nil
}

// stepStates steps node j through the full states of every other initial
// node, in node order.
func (s *sim) stepStates(j int, states [][]*crdt.Batch) error {
	for i := range states {
		if i == j {
			continue
		}
		for _, b := range states[i] {
			if err := s.nodes[j].core.Step(s.local(j), b); err != nil {
				return err
			}
		}
	}
	return nil
}

func (s *sim) push(e simEvent) {
	if e.at >= s.durMs {
		return
	}
	s.evSeq++
	e.seq = s.evSeq
	heap.Push(&s.events, e)
}

// local returns node i's local clock at the current virtual time.
func (s *sim) local(i int) time.Time {
	return epoch.Add(time.Duration(s.now)*time.Millisecond + time.Duration(s.nodes[i].skewNs))
}

func (s *sim) startNode(i int, join bool) error {
	n := s.nodes[i]
	cfg := s.sc.Mesh
	cfg.Peer = n.peer
	cfg.Rules = s.sc.Rules
	cfg.Join = join
	cfg.Incarnation = node.NextIncarnation(n.inc, s.local(i))
	c, err := node.NewCore(cfg, s.local(i))
	if err != nil {
		return err
	}
	n.core, n.up, n.inc = c, true, cfg.Incarnation
	if !n.exists {
		n.exists = true
		s.present = append(s.present, i)
		sort.Ints(s.present)
	}
	n.nextTick = s.now
	n.edge = 0
	if s.downStart[i] >= 0 {
		s.shades = append(s.shades, Shade{Kind: "down", From: s.downStart[i], To: s.now})
		s.downStart[i] = -1
	}
	return nil
}

func (s *sim) refreshUp() {
	s.upList = s.upList[:0]
	for _, i := range s.present {
		if s.nodes[i].up {
			s.upList = append(s.upList, int32(i))
		}
	}
	s.upVer++
}

func (s *sim) step() error {
	if len(s.events) > 0 && s.events[0].at <= s.now {
		// Events read and replace cores: they see every delivery so far.
		if err := s.flushAll(); err != nil {
			return err
		}
	}
	for len(s.events) > 0 && s.events[0].at <= s.now {
		e := heap.Pop(&s.events).(simEvent)
		if err := s.apply(e); err != nil {
			return err
		}
	}
	s.deliver()
	if s.eager {
		if err := s.flushAll(); err != nil {
			return err
		}
	}
	s.clientActions() // leases.go
	s.generate()
	if err := s.work(); err != nil {
		return err
	}
	if err := s.tick(); err != nil {
		return err
	}
	if err := s.edgesDue(); err != nil { // edge.go
		return err
	}
	s.nodeMs += uint64(len(s.upList))
	sec := &s.seconds[s.now/1000]
	sec.NodeMs += uint64(len(s.upList))
	if s.now%1000 == 999 {
		s.expireSamples()
	}
	return nil
}

// deliver hands the batches due now to their receivers. A receiver steps
// them only when something next reads or drives its core (a request, its
// Tick, an event; see work): its Step calls stay exactly the same, in the
// same order, with the same clock readings, between the same other calls,
// but tens of milliseconds of a receiver's batches are stepped together
// while its state is in cache, instead of every core's state passing
// through the cache every millisecond.
func (s *sim) deliver() {
	box := s.inbox[s.now&s.mask]
	if len(box) == 0 {
		return
	}
	// By receiver, each receiver's in the order scheduled (a counting
	// sort): a slot is filled sender by sender, and appending each copy
	// to its receiver's list when it is scheduled would miss the cache
	// on every copy.
	counts := s.toCount
	for _, m := range box {
		counts[m.to]++
	}
	end := int32(0)
	for r, c := range counts {
		end += c
		counts[r] = end
	}
	byTo := slices.Grow(s.byTo[:0], len(box))[:len(box)]
	for i := len(box) - 1; i >= 0; i-- {
		m := box[i]
		counts[m.to]--
		byTo[counts[m.to]] = m
	}
	clear(box)
	s.inbox[s.now&s.mask] = box[:0]
	clear(counts)
	for lo := 0; lo < len(byTo); {
		r := int(byTo[lo].to)
		hi := lo + 1
		for hi < len(byTo) && int(byTo[hi].to) == r {
			hi++
		}
		msgs := byTo[lo:hi]
		lo = hi
		n := s.nodes[r]
		if n.up {
			nacked := false
			k := len(s.pending[r])
			for _, m := range msgs {
				if n.group != s.nodes[m.from].group {
					continue // cut while in flight
				}
				s.pending[r] = append(s.pending[r], m.b)
				nacked = nacked || s.gap >= 0 && m.nacks && nacks(m.b, n.core.Self())
			}
			if k = len(s.pending[r]) - k; k > 0 {
				s.runs[r] = append(s.runs[r], pendRun{n: k, nowNs: int64(s.local(r).Sub(epoch)), at: s.now})
				s.nPending += k
			}
			if nacked {
				s.arm(r) // edge.go: the runtime publishes a nack's repair on its leading edge
			}
		}
		for _, m := range msgs {
			if s.nOpen > 0 && len(s.open[m.from]) > 0 && n.up && n.group == s.nodes[m.from].group {
				s.noteDelivery(int(m.from), r, m.b)
			}
		}
	}
	clear(byTo)
	s.byTo = byTo[:0]
}

// flush steps receiver r through its pending deliveries.
func (s *sim) flush(r int) error {
	bs, runs := s.pending[r], s.runs[r]
	if len(bs) == 0 {
		return nil
	}
	run, end := 0, runs[0].n // the run of batch i, and where it ends
	i, err := s.nodes[r].core.StepMany(len(bs), func(i int) (time.Time, time.Time, *crdt.Batch) {
		for i >= end {
			run++
			end += runs[run].n
		}
		at := epoch.Add(time.Duration(runs[run].nowNs))
		return at, at, bs[i]
	})
	if err != nil {
		for run, end = 0, runs[0].n; i >= end; end += runs[run].n {
			run++
		}
		return &stepError{at: runs[run].at, err: fmt.Errorf("node %d: %w", r, err)}
	}
	clear(bs)
	s.pending[r], s.runs[r] = bs[:0], runs[:0]
	return nil
}

// flushAll steps every receiver through its pending deliveries.
func (s *sim) flushAll() error {
	if s.nPending == 0 {
		return nil
	}
	s.jobs = s.jobs[:0]
	for r, msgs := range s.pending {
		if len(msgs) > 0 {
			s.jobs = append(s.jobs, int32(r))
		}
	}
	return s.runJobs(s.nPending, s.flush)
}

// work does the millisecond's core work after deliver and generate: each
// node that a request or its Tick reads now first steps its pending
// deliveries, then decides its requests in order, then ticks if due.
// Nodes share nothing, so with Workers > 1 they run in parallel; every
// core still sees exactly the same calls in the same order.
func (s *sim) work() error {
	s.jobs = s.jobs[:0]
	for i := range s.calls {
		r := s.calls[i].node
		if !s.isJob[r] {
			s.isJob[r] = true
			s.jobs = append(s.jobs, int32(r))
		}
		s.jobCalls[r] = append(s.jobCalls[r], int32(i))
	}
	s.due = s.due[:0]
	for _, r := range s.upList {
		if n := s.nodes[r]; n.nextTick <= s.now && n.up {
			s.due = append(s.due, r)
			s.isDue[r] = true
			if !s.isJob[r] {
				s.isJob[r] = true
				s.jobs = append(s.jobs, r)
			}
		}
	}
	load := 0
	for _, r := range s.jobs {
		load += len(s.pending[r])
	}
	err := s.runJobs(load, s.job)
	for _, r := range s.jobs {
		s.isJob[r] = false
		s.jobCalls[r] = s.jobCalls[r][:0]
	}
	if err != nil {
		return err
	}
	// The leading edge of what the calls and the held calls decided again
	// changed (edge.go), in call order, then node order.
	for i := range s.calls {
		s.arm(s.calls[i].node)
	}
	for _, r := range s.due {
		if len(s.held[r]) > 0 {
			s.arm(int(r))
		}
	}
	for i := range s.calls {
		c := &s.calls[i]
		if c.op != opAllow {
			if err := s.leaseOutcome(c); err != nil { // leases.go
				return err
			}
			continue
		}
		if !c.held {
			s.allowOutcome(c)
		}
	}
	s.settleHeld() // hold.go
	clear(s.calls)
	s.calls = s.calls[:0]
	return nil
}

// allowOutcome counts the outcome of an Allow.
func (s *sim) allowOutcome(c *allowCall) {
	if c.allowed {
		acc := &c.ra.keys[c.gk]
		acc.admReq++
		acc.admCred += c.ws.w.Cost
		c.ra.noteInWindow(s.now, c.gk, c.ws.w.Cost)  // inwindow.go
		s.noteSub(c.ws, c.k, c.ws.w.Cost)            // subintervals.go
		c.ra.sideAdmitted(c.gk, c.node, c.ws.w.Cost) // sides.go
	} else if c.ws.w.WellBehaved {
		c.ra.falseRej++
	}
}

// job is node r's work of the millisecond (see work).
func (s *sim) job(r int) error {
	if err := s.flush(r); err != nil {
		return err
	}
	n := s.nodes[r]
	now := s.local(r)
	for _, ci := range s.jobCalls[r] {
		c := &s.calls[ci]
		if c.op != opAllow {
			s.leaseCall(n.core, now, c) // leases.go
			continue
		}
		d, err := n.core.Allow(now, c.ws.w.Rule, c.ws.keys[c.k], c.ws.req)
		if err != nil {
			panic(fmt.Sprintf("simulator: a validated request was refused: %v", err))
		}
		c.allowed = d.Allowed
		if s.holdable(c, d) {
			s.hold(r, c, n) // hold.go
		}
	}
	if s.isDue[r] {
		n.core.Tick(now)
		s.sides.noteTick(r, n.core) // sides.go
		if len(s.held[r]) > 0 {
			s.retryHeld(r, n) // hold.go
		}
		s.readies[r] = n.core.Ready() // handled by tick, in upList order
	}
	return nil
}

// runJobs runs f for every node in s.jobs, in parallel when Workers > 1
// and the load (pending deliveries) is worth it, and returns the error of
// the earliest failing delivery (ties: the lowest node).
func (s *sim) runJobs(load int, f func(r int) error) error {
	jobs := s.jobs
	for _, r := range jobs {
		s.nPending -= len(s.pending[r])
	}
	if s.workers <= 1 || load < s.parallelMin || len(jobs) < 2 {
		var first error
		for _, r := range jobs {
			first = earlier(first, f(int(r)))
		}
		return first
	}
	// Longest first: the workers take the next job as they finish, so the
	// millisecond ends with short jobs instead of one worker on a long one.
	slices.SortStableFunc(jobs, func(a, b int32) int { return len(s.pending[b]) - len(s.pending[a]) })
	workers := min(s.workers, len(jobs))
	errs := make([]error, workers)
	var next atomic.Int64
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= len(jobs) {
					return
				}
				errs[w] = earlier(errs[w], f(int(jobs[i])))
			}
		}()
	}
	wg.Wait()
	var first error
	for _, err := range errs {
		first = earlier(first, err)
	}
	return first
}

// earlier returns the error of the earlier delivery of a and b (either may
// be nil), so that which error a run reports does not depend on Workers.
func earlier(a, b error) error {
	if a == nil {
		return b
	}
	if b == nil {
		return a
	}
	var sa, sb *stepError
	if errors.As(a, &sa) && errors.As(b, &sb) && sb.at < sa.at {
		return b
	}
	return a
}

// tick hands, in upList order, the Readies of the Ticks of the nodes due
// now (run by work) to handle, and ends the leases those Ticks expired.
func (s *sim) tick() error {
	for _, r := range s.due {
		s.isDue[r] = false
		rd := s.readies[r]
		s.readies[r] = node.Ready{}
		s.sides.foldTick(int(r), s.now) // sides.go
		if err := s.handle(int(r), rd); err != nil {
			return err
		}
		if err := s.expireNodeLeases(int(r)); err != nil { // leases.go
			return err
		}
	}
	return nil
}

// handle acts on rd, the whole of a Ready node r's core handed over: the
// one place the simulator takes a core's output. It publishes Messages to
// r's partition group, sends each Direct to the peers it names that are
// up in r's group (while the initial mesh forms, before time 0, into
// s.forming instead, which the nodes step at once), notes a new
// incarnation, and schedules r's next Tick when rd holds a Tick's output
// (NextTick).
func (s *sim) handle(r int, rd node.Ready) error {
	n := s.nodes[r]
	for _, b := range rd.Messages {
		if err := s.publish(r, b); err != nil {
			return err
		}
	}
	for _, d := range rd.Direct {
		if s.forming != nil {
			s.forming[r] = d.Batches
			continue
		}
		for _, p := range d.To {
			if err := s.relay(r, p, d.Batches); err != nil {
				return err
			}
		}
	}
	if rd.NewIncarnation != 0 {
		s.dropStaleLeases(r, rd.NewIncarnation) // leases.go: the core dropped its old leases
		n.inc = rd.NewIncarnation
		s.reincs = append(s.reincs, Reincarnation{Node: r, AtS: float64(s.now) / 1000})
	}
	if !rd.NextTick.IsZero() {
		next := rd.NextTick.Sub(epoch) - time.Duration(n.skewNs)
		ms := int64((next + time.Millisecond - 1) / time.Millisecond)
		n.nextTick = min(max(ms, s.now+1), s.now+s.syncMs)
	}
	return nil
}

func (s *sim) finish() *Result {
	for _, ra := range s.rules {
		if ra.lr != nil {
			s.closeLeases(ra) // leases.go
			continue
		}
		for k := range ra.keys {
			ra.flush(k)
		}
	}
	for i, st := range s.downStart {
		if st >= 0 {
			s.shades = append(s.shades, Shade{Kind: "down", From: st, To: s.durMs})
			s.downStart[i] = -1
		}
	}
	if s.partStart >= 0 {
		s.shades = append(s.shades, Shade{Kind: "partition", From: s.partStart, To: s.durMs})
	}
	sort.SliceStable(s.shades, func(i, j int) bool {
		if s.shades[i].From != s.shades[j].From {
			return s.shades[i].From < s.shades[j].From
		}
		return s.shades[i].Kind < s.shades[j].Kind
	})
	return s.result()
}
