package simulator

import (
	"math"
	"sort"

	"github.com/ratemesh/ratemesh/crdt"
	"github.com/ratemesh/ratemesh/limiter"
)

// keyAcc accumulates one key in its current true window.
type keyAcc struct {
	win              int64
	offReq, admReq   uint64
	offCred, admCred uint64
	refCred          uint64 // credits the key's limiter.Reference admitted (rules with one)
}

// winAgg is one rule's window over all its keys.
type winAgg struct {
	Keys             uint64
	OffReq, AdmReq   uint64
	OffCred, AdmCred uint64
	LimitSum, CapSum uint64
	OvershootMax     float64
}

type ruleAcc struct {
	name        string
	rule        limiter.Rule
	wms         int64
	firstWin    int64
	keys        []keyAcc
	limits      []uint64 // per key; 0 = unlimited class
	wellBehaved []bool

	offered, admitted uint64 // requests
	falseRej          uint64
	windows           uint64 // key-windows with offered requests
	limited           uint64 // of which with a finite limit
	overs             []float64
	sumAdm, sumCap    float64
	series            []winAgg
	inWindow          []uint64 // admitted credits per 50 ms of the window (inwindow.go)
	keyClass          []string // per key: its workload's class (credits.go)
	classes           map[string]*classAcc
	conv              []int64
	lr                *leaseRule          // a concurrency rule's lease accounting (leases.go); nil for windowed rules
	refs              []limiter.Reference // per key, of a rule that has one (a token bucket); nil otherwise
	key0              string              // the rule's first key (its first workload's k0), profiled alone in inWindowKey
	inWindowKey       []uint64            // key0's admitted credits per 50 ms of the window (inwindow.go)

	// Per side of the first partition (sides.go); nil without one.
	sides      *sideState
	sideKeys   []sideKey // per key, per side: the key's current window
	sideSeries []sideAgg // per window (as series), per side
}

// windowLimit returns key k's limit in its closing window acc: the rule's
// (0: unlimited), or for a rule with a limiter.Reference (a token bucket)
// what the key's reference admitted (at least 1).
func (ra *ruleAcc) windowLimit(k int, acc *keyAcc) uint64 {
	if lim := ra.limits[k]; lim == 0 || ra.refs == nil {
		return lim
	}
	return max(acc.refCred, 1)
}

// flush closes key k's current window into the rule's totals.
func (ra *ruleAcc) flush(k int) {
	acc := &ra.keys[k]
	if acc.offReq > 0 {
		ra.noteClass(k, acc) // credits.go
		ra.windows++
		ra.offered += acc.offReq
		ra.admitted += acc.admReq
		var agg *winAgg
		off := acc.win - ra.firstWin
		if off >= 0 && off < int64(len(ra.series)) {
			agg = &ra.series[off]
			agg.Keys++
			agg.OffReq += acc.offReq
			agg.AdmReq += acc.admReq
			agg.OffCred += acc.offCred
			agg.AdmCred += acc.admCred
		}
		lim := ra.windowLimit(k, acc)
		if agg == nil {
			off = -1
		}
		ra.flushSides(k, acc, off, lim) // sides.go
		if lim > 0 {
			ra.limited++
			over := float64(acc.admCred)/float64(lim) - 1
			if over > 0 {
				ra.overs = append(ra.overs, over)
			}
			capacity := min(acc.offCred, lim)
			ra.sumAdm += float64(acc.admCred)
			ra.sumCap += float64(capacity)
			if agg != nil {
				agg.LimitSum += lim
				agg.CapSum += capacity
				agg.OvershootMax = max(agg.OvershootMax, max(over, 0))
			}
		}
	} else {
		ra.flushSides(k, acc, -1, 0)
	}
	*acc = keyAcc{win: math.MinInt64}
}

// sample follows one published batch's values of one rule until every
// receiver that was up and reachable at publish time has merged them.
type sample struct {
	rule      int
	from      int
	t0        int64
	b         *crdt.Batch
	entries   []crdt.WindowEntry
	pending   []uint16 // per receiver: entries still missing
	remaining int
	full      uint16
}

// sampleSet is the samples of one batch (one per rule it carries).
type sampleSet []*sample

func (ss sampleSet) add(r int) {
	for _, smp := range ss {
		smp.pending[r] = smp.full
		smp.remaining++
	}
}

func (s *sim) maybeSample(from int, b *crdt.Batch) sampleSet {
	if len(b.Windows) == 0 || b.Has(crdt.FlagLeaving) {
		return nil
	}
	n := s.nodes[from]
	n.sampleN++
	if (n.sampleN+uint64(from))%s.sampleK != 0 {
		return nil
	}
	var ss sampleSet
	// Only fresh entries: a repeat tagged as a repair (crdt.Repair) is
	// an old value, which the receivers that merged its batch skip.
	for i := range b.Fresh() {
		e := b.Windows[i]
		ri, ok := s.ruleIdx[e.Rule]
		if !ok {
			continue
		}
		var smp *sample
		for _, x := range ss {
			if x.rule == ri {
				smp = x
			}
		}
		if smp == nil {
			smp = &sample{rule: ri, from: from, t0: s.now, b: b, pending: make([]uint16, len(s.nodes))}
			ss = append(ss, smp)
		}
		if len(smp.entries) < sampleEntries {
			smp.full |= 1 << len(smp.entries)
			smp.entries = append(smp.entries, e)
		}
	}
	for _, smp := range ss {
		s.open[from] = append(s.open[from], smp)
		s.nOpen++
	}
	return ss
}

// noteDelivery records that receiver r merged b from sender from.
func (s *sim) noteDelivery(from, r int, b *crdt.Batch) {
	list := s.open[from]
	for _, smp := range list {
		m := smp.pending[r]
		if m == 0 {
			continue
		}
		if b == smp.b {
			m = 0
		} else {
			for j, e := range smp.entries {
				if m&(1<<j) == 0 {
					continue
				}
				for k := range b.Windows {
					w := &b.Windows[k]
					if w.Slot == 0 && w.Window == e.Window && w.WindowMs == e.WindowMs && w.Admitted >= e.Admitted &&
						w.Attempted >= e.Attempted && w.Key == e.Key && w.Rule == e.Rule && s.merges(r, b, k) {
						m &^= 1 << j
						break
					}
				}
			}
		}
		smp.pending[r] = m
		if m == 0 {
			smp.remaining--
		}
	}
	s.closeDone(from)
}

// merges reports whether receiver r merges window entry k of b: a fresh
// entry always, an entry tagged as a repair (crdt.Repair) only when r has
// not merged the batch it repairs (node.Core.Merged), counting a batch r
// holds among its pending deliveries as merged, since r steps it first.
func (s *sim) merges(r int, b *crdt.Batch, k int) bool {
	end := b.Fresh()
	if k < end {
		return true
	}
	var seq uint64
	for _, rp := range b.Repairs {
		if end += int(rp.N); k < end {
			seq = rp.Seq
			break
		}
	}
	for _, pb := range s.pending[r] {
		if pb.Seq == seq && pb.From == b.From && !pb.Has(crdt.FlagFull) {
			return false
		}
	}
	return !s.nodes[r].core.Merged(b.From, seq)
}

func (s *sim) closeDone(from int) {
	list := s.open[from]
	kept := list[:0]
	for _, smp := range list {
		if smp.remaining == 0 {
			s.rules[smp.rule].conv = append(s.rules[smp.rule].conv, s.now-smp.t0)
			s.nOpen--
			continue
		}
		kept = append(kept, smp)
	}
	clear(list[len(kept):])
	s.open[from] = kept
}

// dropSender drops the open samples of a sender that went down.
func (s *sim) dropSender(i int) {
	s.nOpen -= len(s.open[i])
	clear(s.open[i])
	s.open[i] = s.open[i][:0]
}

// pruneSamples takes receivers that went down or out of reach off every
// open sample.
func (s *sim) pruneSamples() {
	if s.nOpen == 0 {
		return
	}
	for from, list := range s.open {
		if len(list) == 0 {
			continue
		}
		g := s.nodes[from].group
		for _, smp := range list {
			for r, m := range smp.pending {
				if m != 0 && (!s.nodes[r].up || s.nodes[r].group != g) {
					smp.pending[r] = 0
					smp.remaining--
				}
			}
		}
		s.closeDone(from)
	}
}

func (s *sim) expireSamples() {
	if s.nOpen == 0 {
		return
	}
	for from, list := range s.open {
		kept := list[:0]
		for _, smp := range list {
			if s.now-smp.t0 > sampleMaxAgeMs {
				s.nOpen--
				continue
			}
			kept = append(kept, smp)
		}
		clear(list[len(kept):])
		s.open[from] = kept
	}
}

// p99 returns the nearest-rank 99th percentile of n values of which the
// ones not in pos are 0.
func p99(pos []float64, n uint64) float64 {
	if n == 0 {
		return 0
	}
	sort.Float64s(pos)
	rank := int64(math.Ceil(0.99*float64(n))) - 1
	zeros := int64(n) - int64(len(pos))
	if rank < zeros {
		return 0
	}
	return pos[rank-zeros]
}

func round(x float64, digits int) float64 {
	p := math.Pow(10, float64(digits))
	return math.Round(x*p) / p
}

func (s *sim) result() *Result {
	virt := float64(s.durMs) / 1000
	nodeSec := float64(s.nodeMs) / 1000
	res := &Result{Shades: s.shades, DurationMs: s.durMs, Subintervals: s.subRows()}
	res.InWindow = s.inWindowRows()
	res.Sides = s.sideRows() // sides.go
	res.PartitionPolicy = string(s.sc.Mesh.Policy)
	res.Classes = s.classRows() // credits.go
	res.Clocks = s.clockRows()  // clocks.go
	res.Summary = Summary{
		Scenario: s.sc.Name, Seed: s.seed, Nodes: s.sc.Nodes, VirtualSeconds: virt,
		Reincarnations: s.reincs,
	}
	var msgs, bytes float64
	if nodeSec > 0 {
		msgs = round(float64(s.totMsgs)/nodeSec, 2)
		bytes = round(float64(s.totBytes)/nodeSec, 1)
	}
	for _, ra := range s.rules {
		rs := RuleSummary{
			Name: ra.name, Offered: ra.offered, Admitted: ra.admitted, Limit: ra.rule.Limit,
			Windows: ra.windows, FalseRejections: ra.falseRej,
			MessagesPerNodePerS: msgs, BytesPerNodePerS: bytes,
		}
		for _, o := range ra.overs {
			rs.OvershootMax = max(rs.OvershootMax, o)
		}
		rs.OvershootMax = round(rs.OvershootMax, 4)
		rs.OvershootP99 = round(p99(ra.overs, ra.limited), 4)
		if ra.sumCap > 0 {
			rs.Utilisation = round(ra.sumAdm/ra.sumCap, 4)
		}
		if len(ra.conv) > 0 {
			conv := make([]float64, len(ra.conv))
			for i, c := range ra.conv {
				conv[i] = float64(c)
			}
			rs.ConvergenceP99Ms = p99(conv, uint64(len(conv)))
		}
		if ra.lr != nil {
			s.leaseSummary(ra, &rs, res) // leases.go
		}
		res.Summary.Rules = append(res.Summary.Rules, rs)
		for off, agg := range ra.series {
			if agg.Keys == 0 {
				continue
			}
			res.Windows = append(res.Windows, WindowRow{
				Rule: ra.name, StartMs: (ra.firstWin+int64(off))*ra.wms - epoch.UnixMilli(), WindowMs: ra.wms, winAgg: agg,
			})
		}
	}
	res.Seconds = s.seconds
	for i, n := range s.nodes {
		if n.exists {
			res.Nodes = append(res.Nodes, NodeRow{Index: i, Peer: n.peer, Messages: n.msgs, Bytes: n.bytes})
		}
	}
	res.Requests = s.requests
	res.Skipped = s.skipped
	return res
}
