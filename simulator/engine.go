package simulator

import (
	"container/heap"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"sort"
	"sync"
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

	parallelMin int // tests lower it to exercise the parallel path
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
	bytes    uint64
	msgs     uint64
	sampleN  uint64 // entry-carrying batches published (for sampling)
}

// inMsg is one batch due at one receiver.
type inMsg struct {
	b    *crdt.Batch
	from int32
}

// parallelMin is the number of deliveries in one millisecond from which
// Workers > 1 steps receivers in parallel.
const parallelMin = 512

type simEvent struct {
	at   int64
	seq  int
	kind EventKind // scripted kinds, or "churn" / "churn-restart"
	ev   *Event
	node int
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
	sampleEntries            = 16
	sampleMaxAgeMs           = 10_000
)

type workloadState struct {
	w       Workload
	rule    int // index into sim.rules
	keyBase int // first key of the workload in the rule's key table
	keys    []string
	cdf     []float64 // zipf: cumulative probabilities
	expNeg  float64   // exp(−rate per ms)
	perMs   float64
	req     limiter.Request
	pool    []int // nil: every present node
	upPool  []int
	upVer   int
}

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

	inbox       [][][]inMsg // [ms slot][receiver]
	mask        int64
	workers     int
	parallelMin int
	events      eventQueue
	evSeq       int
	rules       []*ruleAcc
	ruleIdx     map[string]int
	wls         []*workloadState

	open      [][]*sample // per sender node: open convergence samples
	nOpen     int
	sampleK   uint64
	partStart int64
	downStart []int64
	shades    []Shade
	seconds   []SecondRow
	nodeMs    uint64
	totMsgs   uint64
	totBytes  uint64
	skipped   int
	requests  uint64
}

// Run simulates sc and returns its result.
func Run(sc *Scenario, opt Options) (*Result, error) {
	wallStart := time.Now()
	s, err := newSim(sc, opt)
	if err != nil {
		return nil, err
	}
	nextReport := s.durMs / 10
	for s.now = 0; s.now < s.durMs; s.now++ {
		if err := s.step(); err != nil {
			return nil, fmt.Errorf("simulator: scenario %s, seed %d, at %v: %w", sc.Name, s.seed, time.Duration(s.now)*time.Millisecond, err)
		}
		if opt.Progress != nil && s.now >= nextReport {
			nextReport += s.durMs / 10
			if el := time.Since(wallStart); el > 2*time.Second {
				fmt.Fprintf(opt.Progress, "sim %s: %d%% (%v of %v virtual) after %.1fs\n", sc.Name,
					s.now*100/s.durMs, time.Duration(s.now)*time.Millisecond, sc.Duration, el.Seconds())
			}
		}
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
		partStart: -1,
	}
	maxDelay := (s.latNs+s.jitNs)/int64(time.Millisecond) + 2
	size := int64(1)
	for size < maxDelay+1 {
		size <<= 1
	}
	total := sc.total()
	s.inbox = make([][][]inMsg, size)
	for i := range s.inbox {
		s.inbox[i] = make([][]inMsg, total)
	}
	s.mask = size - 1
	s.workers = max(opt.Workers, 1)
	s.parallelMin = parallelMin
	if opt.parallelMin > 0 {
		s.parallelMin = opt.parallelMin
	}

	width := len(fmt.Sprint(total - 1))
	s.nodes = make([]*simNode, total)
	for i := range s.nodes {
		s.nodes[i] = &simNode{peer: fmt.Sprintf("n%0*d", width, i)}
	}
	s.open = make([][]*sample, total)
	s.downStart = make([]int64, total)
	for i := range s.downStart {
		s.downStart[i] = -1
	}
	s.sampleK = uint64(max(1, sc.Nodes/20))

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
			lim, unlimited, err := ra.rule.LimitFor(ws.keys[k], w.Class)
			if err != nil {
				return nil, err
			}
			if unlimited {
				lim = 0
			}
			ra.keys = append(ra.keys, keyAcc{win: math.MinInt64})
			ra.limits = append(ra.limits, lim)
			ra.wellBehaved = append(ra.wellBehaved, w.WellBehaved)
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
		ws.req.Class = w.Class
		s.wls = append(s.wls, ws)
	}
	for _, ra := range s.rules {
		nw := s.durMs/ra.wms + 2
		ra.series = make([]winAgg, nw)
		ra.firstWin = epoch.UnixMilli() / ra.wms
	}
	s.seconds = make([]SecondRow, (s.durMs+999)/1000)

	// Initial nodes: they form the mesh before time 0.
	for i := 0; i < sc.Nodes; i++ {
		if err := s.startNode(i, false); err != nil {
			return nil, err
		}
	}
	s.refreshUp()
	states := make([][]*crdt.Batch, sc.Nodes)
	for i := 0; i < sc.Nodes; i++ {
		states[i] = s.nodes[i].core.FullState(s.local(i))
	}
	for j := 0; j < sc.Nodes; j++ {
		for i := 0; i < sc.Nodes; i++ {
			if i == j {
				continue
			}
			for _, b := range states[i] {
				if err := s.nodes[j].core.Step(s.local(j), b); err != nil {
					return nil, err
				}
			}
		}
	}

	for k := range sc.Events {
		e := &sc.Events[k]
		s.push(simEvent{at: e.At.Milliseconds(), kind: e.Kind, ev: e})
	}
	if sc.Churn != nil {
		s.push(simEvent{at: sc.Churn.Every.Milliseconds(), kind: evChurn})
	}
	return s, nil
}

func (ws *workloadState) setRate(rate float64) {
	ws.w.Rate = rate
	ws.perMs = rate / 1000
	ws.expNeg = math.Exp(-ws.perMs)
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
	cfg.Rand = newRand(s.rng.Uint64(), s.rng.Uint64())
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
	for len(s.events) > 0 && s.events[0].at <= s.now {
		e := heap.Pop(&s.events).(simEvent)
		if err := s.apply(e); err != nil {
			return err
		}
	}
	if err := s.deliver(); err != nil {
		return err
	}
	s.generate()
	if err := s.tick(); err != nil {
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

// deliver hands the batches due now to their receivers, receiver by
// receiver (each core's inputs stay in order, and its state stays in cache
// across its batches). Cores share nothing, so with Workers > 1 disjoint
// receiver ranges are stepped in parallel; every core still sees exactly
// the same calls in the same order, so the result does not depend on it.
func (s *sim) deliver() error {
	box := s.inbox[s.now&s.mask]
	total := 0
	for _, msgs := range box {
		total += len(msgs)
	}
	if total == 0 {
		return nil
	}
	var err error
	if s.workers > 1 && total >= s.parallelMin {
		errs := make([]error, s.workers)
		var wg sync.WaitGroup
		chunk := (len(box) + s.workers - 1) / s.workers
		for w := range s.workers {
			lo, hi := w*chunk, min((w+1)*chunk, len(box))
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[w] = s.stepRange(box, lo, hi)
			}()
		}
		wg.Wait()
		err = errors.Join(errs...)
	} else {
		err = s.stepRange(box, 0, len(box))
	}
	if err != nil {
		return err
	}
	for r, msgs := range box {
		n := s.nodes[r]
		for k, m := range msgs {
			if s.nOpen > 0 && len(s.open[m.from]) > 0 && n.up && n.group == s.nodes[m.from].group {
				s.noteDelivery(int(m.from), r, m.b)
			}
			msgs[k] = inMsg{}
		}
		box[r] = msgs[:0]
	}
	return nil
}

// stepRange steps receivers lo to hi−1 through their inbound batches.
func (s *sim) stepRange(box [][]inMsg, lo, hi int) error {
	for r := lo; r < hi; r++ {
		msgs := box[r]
		if len(msgs) == 0 {
			continue
		}
		n := s.nodes[r]
		if !n.up {
			continue
		}
		now := s.local(r)
		for _, m := range msgs {
			if n.group != s.nodes[m.from].group {
				continue // cut while in flight
			}
			if err := n.core.Step(now, m.b); err != nil {
				return fmt.Errorf("node %d: %w", r, err)
			}
		}
	}
	return nil
}

func (s *sim) schedule(from int, to int32, b *crdt.Batch, delayMs int64) {
	slot := (s.now + delayMs) & s.mask
	s.inbox[slot][to] = append(s.inbox[slot][to], inMsg{b: b, from: int32(from)})
}

func (s *sim) delayMs() int64 {
	ns := s.latNs
	if s.jitNs > 0 {
		ns += s.rng.Int64N(s.jitNs)
	}
	ms := (ns + int64(time.Millisecond) - 1) / int64(time.Millisecond)
	return max(ms, 1)
}

func (s *sim) account(from int, b *crdt.Batch, copies uint64) error {
	data, err := b.Encode()
	if err != nil {
		return fmt.Errorf("node %d built a batch that does not encode: %w", from, err)
	}
	n := s.nodes[from]
	bytes := uint64(len(data)) * copies
	n.bytes += bytes
	n.msgs += copies
	s.totBytes += bytes
	s.totMsgs += copies
	sec := &s.seconds[s.now/1000]
	sec.Bytes += bytes
	sec.Messages += copies
	return nil
}

// publish gossips b from node from to every up node in its group.
func (s *sim) publish(from int, b *crdt.Batch) error {
	if err := s.account(from, b, 1); err != nil {
		return err
	}
	g := s.nodes[from].group
	smp := s.maybeSample(from, b)
	for _, r := range s.upList {
		if int(r) == from || s.nodes[r].group != g {
			continue
		}
		if smp != nil {
			smp.add(int(r))
		}
		if s.loss > 0 && s.rng.Float64() < s.loss {
			continue
		}
		s.schedule(from, r, b, s.delayMs())
	}
	if smp != nil {
		s.closeDone(from)
	}
	return nil
}

// direct sends batches from node from to node to alone (anti-entropy),
// never lost.
func (s *sim) direct(from, to int, bs []*crdt.Batch) {
	d := s.delayMs()
	for _, b := range bs {
		s.schedule(from, int32(to), b, d)
	}
}

func (s *sim) tick() error {
	for _, r := range s.upList {
		n := s.nodes[r]
		if n.nextTick > s.now || !n.up {
			continue
		}
		rd := n.core.Tick(s.local(int(r)))
		for _, b := range rd.Messages {
			if err := s.publish(int(r), b); err != nil {
				return err
			}
		}
		if rd.NewIncarnation != 0 {
			n.inc = rd.NewIncarnation
		}
		next := n.core.NextTick().Sub(epoch) - time.Duration(n.skewNs)
		ms := int64((next + time.Millisecond - 1) / time.Millisecond)
		n.nextTick = min(max(ms, s.now+1), s.now+s.syncMs)
	}
	return nil
}

func (s *sim) pickNode(ws *workloadState) int {
	pool := ws.pool
	var i int
	switch nd := ws.w.NodeDist; nd.Kind {
	case "single":
		if nd.Node >= 0 {
			i = nd.Node
		} else if pool != nil {
			i = pool[0]
		} else {
			i = 0
		}
	case "skew":
		size := len(s.present)
		if pool != nil {
			size = len(pool)
		}
		var pos int
		if s.rng.Float64() < nd.Fraction || size == nd.K {
			pos = s.rng.IntN(nd.K)
		} else {
			pos = nd.K + s.rng.IntN(size-nd.K)
		}
		if pool != nil {
			i = pool[pos]
		} else {
			i = s.present[pos]
		}
	default:
		if pool != nil {
			i = pool[s.rng.IntN(len(pool))]
		} else if len(s.present) > 0 {
			i = s.present[s.rng.IntN(len(s.present))]
		}
	}
	if n := s.nodes[i]; n.up {
		return i
	}
	// A load balancer sends it to a live node of the pool instead.
	if pool == nil {
		if len(s.upList) == 0 {
			return -1
		}
		return int(s.upList[s.rng.IntN(len(s.upList))])
	}
	if ws.upVer != s.upVer || ws.upPool == nil {
		ws.upPool = ws.upPool[:0]
		for _, p := range pool {
			if s.nodes[p].up {
				ws.upPool = append(ws.upPool, p)
			}
		}
		ws.upVer = s.upVer
	}
	if len(ws.upPool) == 0 {
		return -1
	}
	return ws.upPool[s.rng.IntN(len(ws.upPool))]
}

func (s *sim) arrivals(ws *workloadState) int {
	m := ws.perMs
	switch {
	case m <= 0:
		return 0
	case m < 30:
		k, p := 0, 1.0
		for {
			p *= s.rng.Float64()
			if p <= ws.expNeg {
				return k
			}
			k++
		}
	}
	x := math.Round(m + math.Sqrt(m)*s.rng.NormFloat64())
	if x < 0 {
		return 0
	}
	return int(x)
}

func (s *sim) generate() {
	nowMs := epoch.UnixMilli() + s.now
	for _, ws := range s.wls {
		n := s.arrivals(ws)
		if n == 0 {
			continue
		}
		ra := s.rules[ws.rule]
		win := nowMs / ra.wms
		cost := ws.w.Cost
		for range n {
			k := 0
			if ws.cdf != nil {
				u := s.rng.Float64()
				k = sort.SearchFloat64s(ws.cdf, u)
				if k >= len(ws.cdf) {
					k = len(ws.cdf) - 1
				}
			} else if len(ws.keys) > 1 {
				k = s.rng.IntN(len(ws.keys))
			}
			gk := ws.keyBase + k
			acc := &ra.keys[gk]
			if acc.win != win {
				ra.flush(gk)
				acc.win = win
			}
			if ws.w.WellBehaved && ra.limits[gk] > 0 && acc.offCred+cost > ra.limits[gk] {
				continue // a well-behaved client keeps within its limit
			}
			acc.offReq++
			acc.offCred += cost
			s.requests++
			i := s.pickNode(ws)
			if i < 0 {
				if ws.w.WellBehaved {
					ra.falseRej++
				}
				continue
			}
			d, err := s.nodes[i].core.Allow(s.local(i), ws.w.Rule, ws.keys[k], ws.req)
			if err != nil {
				panic(fmt.Sprintf("simulator: a validated request was refused: %v", err))
			}
			if d.Allowed {
				acc.admReq++
				acc.admCred += cost
			} else if ws.w.WellBehaved {
				ra.falseRej++
			}
		}
	}
}

func (s *sim) finish() *Result {
	for _, ra := range s.rules {
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
