package simulator

import (
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"

	"github.com/ratemesh/ratemesh/node"
)

// The sides of a partition. A run with a partition event also counts
// what each side of its first partition was offered and admitted, per
// rule and true window, beside the limit that side's nodes applied: the
// strict policy scales every limit by alive/(alive + suspect) and a
// fenced minority admits nothing, while under available each side may
// use the whole limit (docs/design.md, "Partitions and crashes"). The
// totals over all nodes cannot show that each side keeps its own share;
// these can (sides.csv, and the per-side panels of admitted.svg).

// sideState assigns every node to a side of the run's first partition
// and samples the partition scale each side's nodes apply. The zero value
// (a run without a partition) counts nothing.
type sideState struct {
	of    []int       // per node index: its side
	names []string    // per side: its nodes, as ranges ("0-24")
	sizes []int       // per side: how many nodes
	tick  []float64   // per node: the scale after its latest Tick (job writes, tick reads)
	scale [][]float64 // per side, per SubMs of true time: the largest scale a node of the side applied after a Tick
}

// initSides sets up the sides of the first partition event of s.sc, if
// any: side i is the event's group i, and the nodes it names in no group
// are one more side, as the partition itself treats them.
func (s *sim) initSides() {
	var first *Event
	for k := range s.sc.Events {
		e := &s.sc.Events[k]
		if e.Kind == EvPartition && (first == nil || e.At < first.At) {
			first = e
		}
	}
	if first == nil {
		return
	}
	total := len(s.nodes)
	ss := &s.sides
	ss.of = make([]int, total)
	for i := range ss.of {
		ss.of[i] = -1
	}
	for g, grp := range first.Groups {
		for _, i := range grp {
			ss.of[i] = g
		}
		ss.names = append(ss.names, nodeRanges(grp))
		ss.sizes = append(ss.sizes, len(grp))
	}
	var rest []int
	for i, g := range ss.of {
		if g < 0 {
			ss.of[i] = len(first.Groups)
			rest = append(rest, i)
		}
	}
	if len(rest) > 0 {
		ss.names = append(ss.names, nodeRanges(rest))
		ss.sizes = append(ss.sizes, len(rest))
	}
	ss.tick = make([]float64, total)
	ss.scale = make([][]float64, len(ss.names))
	for i := range ss.scale {
		ss.scale[i] = make([]float64, s.durMs/SubMs+1)
	}
}

// nodeRanges writes node indices (ascending) as inclusive ranges:
// "0-24", "0-2,5".
func nodeRanges(idx []int) string {
	var b strings.Builder
	for i := 0; i < len(idx); {
		j := i
		for j+1 < len(idx) && idx[j+1] == idx[j]+1 {
			j++
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(idx[i]))
		if j > i {
			fmt.Fprintf(&b, "-%d", idx[j])
		}
		i = j + 1
	}
	return b.String()
}

// partitionScale is what core c multiplies every limit by: its partition
// scale (alive/(alive + suspect) under strict, else 1), or 0 while it is
// fenced.
func partitionScale(c *node.Core) float64 {
	if c.Fenced() {
		return 0
	}
	_, scale := c.Members()
	return scale
}

// noteTick records node r's scale after its Tick (in job, possibly in
// parallel with other nodes: each writes its own slot).
func (ss *sideState) noteTick(r int, c *node.Core) {
	if ss.of != nil {
		ss.tick[r] = partitionScale(c)
	}
}

// foldTick adds node r's scale after its Tick at virtual ms now to its
// side's sample (in tick, in node order).
func (ss *sideState) foldTick(r int, now int64) {
	if ss.of == nil {
		return
	}
	sc := ss.scale[ss.of[r]]
	if k := now / SubMs; k >= 0 && k < int64(len(sc)) {
		sc[k] = max(sc[k], ss.tick[r])
	}
}

// scaleIn returns the largest scale a node of side applied after a Tick
// within [fromMs, toMs) of true time; 0 when none of its nodes ticked (none
// was up to admit anything).
func (ss *sideState) scaleIn(side int, fromMs, toMs int64) float64 {
	sc := ss.scale[side]
	v := 0.0
	for k := max(fromMs/SubMs, 0); k*SubMs < toMs && k < int64(len(sc)); k++ {
		v = max(v, sc[k])
	}
	return v
}

// sideKey is one key's credits on one side in its current true window.
type sideKey struct{ off, adm uint64 }

// sideAgg is one rule's true window on one side, over its keys.
type sideAgg struct {
	OffCred, AdmCred uint64
	CapSum           uint64
	Scale            float64
}

// initSideRule sizes rule ra's per-side accounting.
func (s *sim) initSideRule(ra *ruleAcc) {
	if s.sides.of == nil || ra.wms <= 0 {
		return
	}
	n := len(s.sides.names)
	ra.sides = &s.sides
	ra.sideKeys = make([]sideKey, len(ra.keys)*n)
	ra.sideSeries = make([]sideAgg, len(ra.series)*n)
}

// sideOffered counts cost credits of key gk of ra offered to node i.
func (ra *ruleAcc) sideOffered(gk, i int, cost uint64) {
	if ra.sideKeys != nil {
		ra.sideKeys[gk*len(ra.sides.names)+ra.sides.of[i]].off += cost
	}
}

// sideAdmitted counts cost credits of key gk of ra admitted by node i.
func (ra *ruleAcc) sideAdmitted(gk, i int, cost uint64) {
	if ra.sideKeys != nil {
		ra.sideKeys[gk*len(ra.sides.names)+ra.sides.of[i]].adm += cost
	}
}

// flushSides closes key k's window acc on every side into the rule's
// per-side series (from flush, before acc is reset; off is acc's index in
// ra.series, −1 if out of it or if the key was offered nothing). A side's capacity for the key is
// min(offered to it, ⌊lim × the side's scale in the window⌋).
func (ra *ruleAcc) flushSides(k int, acc *keyAcc, off int64, lim uint64) {
	if ra.sideKeys == nil {
		return
	}
	n := len(ra.sides.names)
	keys := ra.sideKeys[k*n : (k+1)*n]
	if off >= 0 {
		from := acc.win*ra.wms - epoch.UnixMilli()
		for side, sk := range keys {
			agg := &ra.sideSeries[int(off)*n+side]
			agg.OffCred += sk.off
			agg.AdmCred += sk.adm
			if lim > 0 {
				scale := ra.sides.scaleIn(side, from, from+ra.wms)
				agg.CapSum += min(sk.off, uint64(math.Floor(float64(lim)*scale+1e-9)))
			}
		}
	}
	clear(keys)
}

// SideRow is one rule's true window on one side of the run's first
// partition (sides.csv): the credits offered to and admitted by the side's
// nodes, summed over the keys offered, and what the partition policy let
// the side use.
type SideRow struct {
	Rule     string
	Side     int    // the first partition event's group (the nodes it names in none: one more)
	Nodes    string // the side's node indices as ranges, "0-24"
	NodeN    int    // how many
	StartMs  int64  // since the start of the run
	WindowMs int64
	// Scale is the largest factor on the limit any of the side's nodes
	// applied after a Tick in the window: 1, alive/(alive + suspect)
	// under strict while members are suspect, 0 when fenced (or when none
	// of its nodes was up).
	Scale float64
	// OffCred and AdmCred are the credits offered to and admitted by the
	// side's nodes; CapSum is Σ over keys of min(offered to the side,
	// ⌊limit × Scale⌋).
	OffCred, AdmCred, CapSum uint64
}

// sideRows returns every windowed rule's per-side windows, by rule, side,
// then time; only windows the rule's totals list (offered keys).
func (s *sim) sideRows() []SideRow {
	var rows []SideRow
	ss := &s.sides
	for _, ra := range s.rules {
		if ra.sideSeries == nil {
			continue
		}
		n := len(ss.names)
		for side := range n {
			for off, agg := range ra.series {
				if agg.Keys == 0 {
					continue
				}
				start := (ra.firstWin+int64(off))*ra.wms - epoch.UnixMilli()
				sa := ra.sideSeries[off*n+side]
				rows = append(rows, SideRow{
					Rule: ra.name, Side: side, Nodes: ss.names[side], NodeN: ss.sizes[side],
					StartMs: start, WindowMs: ra.wms, Scale: round(ss.scaleIn(side, start, start+ra.wms), 4),
					OffCred: sa.OffCred, AdmCred: sa.AdmCred, CapSum: sa.CapSum,
				})
			}
		}
	}
	return rows
}

// writeSidesCSV writes sides.csv: per rule, side of the first partition
// and true window, the credits offered to and admitted by the side's
// nodes and the side's capacity under its scale.
func (r *Result) writeSidesCSV(w io.Writer) error {
	fmt.Fprintln(w, "rule,side,nodes,window_start_ms,window_ms,scale,offered_credits,admitted_credits,capacity")
	for _, row := range r.Sides {
		fmt.Fprintf(w, "%s,%d,%s,%d,%d,%s,%d,%d,%d\n", row.Rule, row.Side, csvField(row.Nodes), row.StartMs, row.WindowMs,
			strconv.FormatFloat(row.Scale, 'f', -1, 64), row.OffCred, row.AdmCred, row.CapSum)
	}
	return nil
}

// csvField quotes f for CSV when it holds a comma or a quote.
func csvField(f string) string {
	if !strings.ContainsAny(f, ",\"") {
		return f
	}
	return `"` + strings.ReplaceAll(f, `"`, `""`) + `"`
}
