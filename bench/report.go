package main

import (
	"fmt"
	"io"
	"slices"
	"strings"
)

// report is everything a run found; --json prints it whole.
type report struct {
	Mode        string       `json:"mode"`
	Ratemesh    string       `json:"ratemesh"`
	Gubernator  string       `json:"gubernator"`
	CPUs        int          `json:"cpus"`
	Concurrency int          `json:"concurrency"`
	Rounds      int          `json:"rounds"`
	PhaseSec    float64      `json:"phase_seconds"`
	Keys        int          `json:"keys"`
	MemKeys     int          `json:"mem_keys,omitempty"`
	MeshWorkers int          `json:"mesh_workers,omitempty"` // memory-mesh's fill
	GuberCache  int          `json:"gubernator_cache_size_memory,omitempty"`
	Scenarios   []string     `json:"scenarios"`
	Command     string       `json:"command"`
	Runs        []roundRun   `json:"rounds_run"`
	Summary     []summaryRow `json:"summary"`
	Interrupted bool         `json:"interrupted,omitempty"`
	Error       string       `json:"error,omitempty"`
}

// roundRun is one round: its phases in the order they ran, and the
// memory scenario's results.
type roundRun struct {
	Round  int         `json:"round"`
	Phases []phase     `json:"phases"`
	Memory []memResult `json:"memory,omitempty"`
}

// round returns run r's record (1-based), adding rounds as needed.
func (rep *report) round(r int) *roundRun {
	for len(rep.Runs) < r {
		rep.Runs = append(rep.Runs, roundRun{Round: len(rep.Runs) + 1})
	}
	return &rep.Runs[r-1]
}

// stat is min, median and max over rounds.
type stat struct {
	N      int     `json:"n"`
	Min    float64 `json:"min"`
	Median float64 `json:"median"`
	Max    float64 `json:"max"`
}

func statOf(v []float64) stat {
	if len(v) == 0 {
		return stat{}
	}
	s := slices.Clone(v)
	slices.Sort(s)
	med := s[len(s)/2]
	if len(s)%2 == 0 {
		med = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return stat{N: len(s), Min: s[0], Median: med, Max: s[len(s)-1]}
}

// summaryRow compares ratemesh with one Gubernator variant on one
// metric: each over the rounds, and the per-round ratio ratemesh ÷ it.
type summaryRow struct {
	Scenario string `json:"scenario"`
	Metric   string `json:"metric"`
	Unit     string `json:"unit"` // how to print the values: "rate", "ms", "bytes", "ratio", "cores", "seconds"
	Ratemesh stat   `json:"ratemesh"`
	Against  string `json:"against"`
	Other    stat   `json:"other"`
	Ratio    stat   `json:"ratio"`
	// Flagged counts the phases flagged lg-bound or starved, "ratemesh:
	// lg-bound 3 of 3; gubernator: starved 1 of 3"; empty when none was.
	Flagged string `json:"flagged,omitempty"`
}

// pairs collects, per round, a value of ratemesh and of the other system,
// and the ratio where both exist.
type pairs struct {
	rm, other, ratio []float64
	// Phases seen and flagged, of ratemesh and of the other.
	rmN, otN             int
	rmBound, otBound     int
	rmStarved, otStarved int
}

func (p *pairs) add(rm, other float64, rmOK, otherOK bool) {
	if rmOK {
		p.rm = append(p.rm, rm)
	}
	if otherOK {
		p.other = append(p.other, other)
	}
	if rmOK && otherOK && other != 0 {
		p.ratio = append(p.ratio, rm/other)
	}
}

// addAll adds values of ratemesh against one of the other (a mesh's
// members against a lone node), each value with its ratio.
func (p *pairs) addAll(rm []float64, other float64, otherOK bool) {
	p.rm = append(p.rm, rm...)
	if !otherOK {
		return
	}
	p.other = append(p.other, other)
	for _, v := range rm {
		if other != 0 {
			p.ratio = append(p.ratio, v/other)
		}
	}
}

func (p *pairs) row(scenario, metric, unit, against string) summaryRow {
	r := summaryRow{Scenario: scenario, Metric: metric, Unit: unit, Against: against,
		Ratemesh: statOf(p.rm), Other: statOf(p.other), Ratio: statOf(p.ratio)}
	var parts []string
	for _, x := range []struct {
		name             string
		n, bound, starve int
	}{{"ratemesh", p.rmN, p.rmBound, p.rmStarved}, {against, p.otN, p.otBound, p.otStarved}} {
		var f []string
		if x.bound > 0 {
			f = append(f, fmt.Sprintf("lg-bound %d", x.bound))
		}
		if x.starve > 0 {
			f = append(f, fmt.Sprintf("starved %d", x.starve))
		}
		if len(f) > 0 {
			parts = append(parts, fmt.Sprintf("%s: %s of %d", x.name, strings.Join(f, ", "), x.n))
		}
	}
	r.Flagged = strings.Join(parts, "; ")
	return r
}

// scenarioTitle names a scenario in the summary.
func scenarioTitle(s string, o *options) string {
	switch s {
	case "hot":
		return "1 node, hot key, HTTP"
	case "keys":
		return fmt.Sprintf("1 node, %s keys, HTTP", count(o.Keys))
	case "healthz":
		return "1 node, health, HTTP"
	case "grpc":
		return fmt.Sprintf("1 node, %s keys, gRPC", count(o.Keys))
	case "cluster":
		return "3 nodes, 1 key flood, HTTP"
	case "memory":
		return fmt.Sprintf("1 node, %s keys once", count(o.MemKeys))
	case "memory-mesh":
		return fmt.Sprintf("3 members, %s keys once", count(o.MemKeys))
	}
	return s
}

// summarize builds the summary rows from the rounds.
func summarize(rep *report, o *options) []summaryRow {
	find := func(rr roundRun, scenario, system string) (phase, bool) {
		for _, p := range rr.Phases {
			if p.Scenario == scenario && p.System == system && p.Requests > 0 {
				return p, true
			}
		}
		return phase{}, false
	}
	usable := func(p phase, ok bool) bool { return ok && !(o.SkipFlagged && p.flagged()) }
	var rows []summaryRow
	for _, s := range o.Scenarios {
		switch s {
		case "hot", "keys", "grpc", "healthz":
			var rate, p99 pairs
			for _, rr := range rep.Runs {
				a, aok := find(rr, s, "ratemesh")
				b, bok := find(rr, s, "gubernator")
				countBound(&rate, a, aok, b, bok)
				aok, bok = usable(a, aok), usable(b, bok)
				rate.add(a.PerSecond, b.PerSecond, aok, bok)
				p99.add(a.P99Ms, b.P99Ms, aok, bok)
			}
			metric := "decisions/s"
			if s == "healthz" {
				metric = "health requests/s"
			}
			rows = append(rows, rate.row(scenarioTitle(s, o), metric, "rate", "gubernator"))
			if s == "healthz" {
				var frac pairs
				for _, rr := range rep.Runs {
					ak, akok := find(rr, "keys", "ratemesh")
					ah, ahok := find(rr, "healthz", "ratemesh")
					bk, bkok := find(rr, "keys", "gubernator")
					bh, bhok := find(rr, "healthz", "gubernator")
					aok := usable(ak, akok) && usable(ah, ahok) && ah.PerSecond > 0
					bok := usable(bk, bkok) && usable(bh, bhok) && bh.PerSecond > 0
					frac.add(ak.PerSecond/max(ah.PerSecond, 1e-9), bk.PerSecond/max(bh.PerSecond, 1e-9), aok, bok)
				}
				rows = append(rows, frac.row(scenarioTitle(s, o), "decisions ÷ health (keys)", "ratio", "gubernator"))
				continue
			}
			rows = append(rows, p99.row(scenarioTitle(s, o), "p99 latency", "ms", "gubernator"))
		case "cluster":
			for _, other := range []string{"gubernator", "gubernator GLOBAL"} {
				var rate, maxr, first pairs
				for _, rr := range rep.Runs {
					a, aok := find(rr, s, "ratemesh")
					b, bok := find(rr, s, other)
					countBound(&rate, a, aok, b, bok)
					aok, bok = usable(a, aok), usable(b, bok)
					rate.add(a.PerSecond, b.PerSecond, aok, bok)
					aacc := aok && a.Accuracy != nil && len(a.Accuracy.PerWindow) > 0
					bacc := bok && b.Accuracy != nil && len(b.Accuracy.PerWindow) > 0
					var am, af, bm, bf float64
					if aacc {
						am, af = a.Accuracy.MaxRatio, a.Accuracy.FirstRatio
					}
					if bacc {
						bm, bf = b.Accuracy.MaxRatio, b.Accuracy.FirstRatio
					}
					maxr.add(am, bm, aacc, bacc)
					first.add(af, bf, aacc, bacc)
				}
				rows = append(rows, rate.row(scenarioTitle(s, o), "decisions/s", "rate", other))
				rows = append(rows, maxr.row(scenarioTitle(s, o), "busiest window ÷ limit", "ratio", other))
				rows = append(rows, first.row(scenarioTitle(s, o), "first window ÷ limit", "ratio", other))
			}
		case "memory":
			t := scenarioTitle(s, o)
			for _, x := range memMetrics {
				var p pairs
				for _, rr := range rep.Runs {
					a, aok := rr.memory(s, "ratemesh")
					b, bok := rr.memory(s, "gubernator")
					av, aval := x.get(a.memNode)
					bv, bval := x.get(b.memNode)
					p.add(av, bv, aok && aval, bok && bval)
				}
				rows = append(rows, p.row(t, x.metric, x.unit, "gubernator"))
			}
			var fill pairs
			for _, rr := range rep.Runs {
				a, aok := rr.memory(s, "ratemesh")
				b, bok := rr.memory(s, "gubernator")
				fill.add(a.FillPerSecond, b.FillPerSecond, aok, bok)
			}
			rows = append(rows, fill.row(t, "fill, keys/s (batches of 64)", "rate", "gubernator"))
		case "memory-mesh":
			rows = append(rows, meshRows(rep, scenarioTitle(s, o))...)
		}
	}
	return rows
}

// memMetrics are the memory scenarios' figures of a node: get returns
// one and whether the node has it (the heap is not always read).
var memMetrics = []struct {
	metric, unit string
	get          func(n memNode) (float64, bool)
}{
	{"RSS growth per key", "bytes", func(n memNode) (float64, bool) { return n.RSSPerKey, true }},
	{"… after --mem-idle", "bytes", func(n memNode) (float64, bool) { return n.RSSPerKeyIdle, true }},
	{"Go heap in use per key", "bytes", func(n memNode) (float64, bool) { return n.HeapPerKey, n.HeapPerKey > 0 }},
	{"idle CPU, keys held", "cores", func(n memNode) (float64, bool) { return n.IdleCores, true }},
}

// meshRows summarizes memory-mesh: each figure of the member that decided
// the keys and of the members that merged them (both members of each
// round, pooled), against Gubernator's lone node of memory in the same
// round when memory ran too, and how long the merges took.
func meshRows(rep *report, title string) []summaryRow {
	roles := []struct {
		name  string
		nodes func(m memResult) []memNode
	}{
		{"deciding member", func(m memResult) []memNode { return []memNode{m.memNode} }},
		{"merging members", func(m memResult) []memNode { return m.Merged }},
	}
	var rows []summaryRow
	for _, role := range roles {
		for _, x := range memMetrics {
			var p pairs
			for _, rr := range rep.Runs {
				a, aok := rr.memory("memory-mesh", "ratemesh")
				g, gok := rr.memory("memory", "gubernator")
				var vs []float64
				if aok {
					for _, n := range role.nodes(a) {
						if v, ok := x.get(n); ok {
							vs = append(vs, v)
						}
					}
				}
				gv, gval := x.get(g.memNode)
				p.addAll(vs, gv, gok && gval)
			}
			rows = append(rows, p.row(title, x.metric+", "+role.name, x.unit, "gubernator lone node"))
		}
	}
	var merge, resent pairs
	for _, rr := range rep.Runs {
		a, aok := rr.memory("memory-mesh", "ratemesh")
		merge.add(a.MergeSeconds, 0, aok, false)
		resent.add(float64(a.Resent), 0, aok, false)
	}
	return append(rows, merge.row(title, "every member holds them, s later", "seconds", ""),
		resent.row(title, "batches denied (fenced …) and sent again", "count", ""))
}

// memory returns round rr's memory result of system in scenario, and
// whether it has one without an error.
func (rr roundRun) memory(scenario, system string) (memResult, bool) {
	for _, m := range rr.Memory {
		if m.Scenario == scenario && m.System == system && m.Err == "" {
			return m, true
		}
	}
	return memResult{}, false
}

func countBound(p *pairs, a phase, aok bool, b phase, bok bool) {
	b2i := func(b bool) int {
		if b {
			return 1
		}
		return 0
	}
	if aok {
		p.rmN++
		p.rmBound += b2i(a.Bound)
		p.rmStarved += b2i(a.Starved)
	}
	if bok {
		p.otN++
		p.otBound += b2i(b.Bound)
		p.otStarved += b2i(b.Starved)
	}
}

// count prints n as 10k, 1M.
func count(n int) string {
	switch {
	case n >= 1_000_000 && n%1_000_000 == 0:
		return fmt.Sprintf("%dM", n/1_000_000)
	case n >= 1000 && n%1000 == 0:
		return fmt.Sprintf("%dk", n/1000)
	}
	return fmt.Sprint(n)
}

// format prints v in unit's way.
func format(v float64, unit string) string {
	switch unit {
	case "rate":
		switch {
		case v >= 100_000:
			return fmt.Sprintf("%.0fk", v/1000)
		case v >= 1000:
			return fmt.Sprintf("%.1fk", v/1000)
		}
		return fmt.Sprintf("%.0f", v)
	case "ms":
		return fmt.Sprintf("%.1f", v)
	case "bytes":
		return fmt.Sprintf("%.0f", v)
	case "ratio":
		return fmt.Sprintf("%.3f", v)
	case "ratio2":
		return fmt.Sprintf("%.2f", v)
	case "cores":
		return fmt.Sprintf("%.3f", v)
	case "seconds":
		return fmt.Sprintf("%.1f", v)
	case "count":
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprint(v)
}

// triple prints min/median/max, or "—" when no round gave a value.
func triple(s stat, unit string) string {
	if s.N == 0 {
		return "—"
	}
	if s.N == 1 || s.Min == s.Max {
		return format(s.Median, unit)
	}
	return format(s.Min, unit) + " / " + format(s.Median, unit) + " / " + format(s.Max, unit)
}

// writeText prints the rounds and the summary for people.
func (rep *report) writeText(w io.Writer) {
	mesh := ""
	if rep.MeshWorkers > 0 {
		mesh = fmt.Sprintf(" (%d for memory-mesh's fill)", rep.MeshWorkers)
	}
	fmt.Fprintf(w, "ratemesh %s vs Gubernator %s, side by side on loopback: %s mode, %d round(s), %d CPUs, %d workers%s\n",
		rep.Ratemesh, rep.Gubernator, rep.Mode, rep.Rounds, rep.CPUs, rep.Concurrency, mesh)
	fmt.Fprintf(w, "command: %s\n", rep.Command)
	for _, rr := range rep.Runs {
		fmt.Fprintf(w, "\nround %d\n", rr.Round)
		if len(rr.Phases) > 0 {
			fmt.Fprintf(w, "  %-8s %-18s %10s %8s %8s %8s %7s %7s %7s %7s %6s  %s\n",
				"scenario", "system", "per sec", "p50 ms", "p99 ms", "max ms", "errors", "lg cpu", "srv cpu", "idle", "other", "flags")
		}
		for _, p := range rr.Phases {
			flags := p.flags()
			fmt.Fprintf(w, "  %-8s %-18s %10.0f %8.2f %8.2f %8.1f %7d %7.2f %7.2f %7.2f %6.2f  %s\n",
				p.Scenario, p.System, p.PerSecond, p.P50Ms, p.P99Ms, p.MaxMs, p.Errors, p.CPU.Loadgen, p.CPU.Server, p.CPU.IdleSys, p.CPU.Other, flags)
			if p.FirstErr != "" {
				fmt.Fprintf(w, "      first error: %.300s\n", p.FirstErr)
			}
			if a := p.Accuracy; a != nil {
				fmt.Fprintf(w, "      admitted per whole window (limit %d per %d ms): %v; busiest %.3f, first %.3f of the limit; %d over; %d in partial windows",
					a.Limit, a.WindowMs, a.PerWindow, a.MaxRatio, a.FirstRatio, a.Over, a.Partial)
				if a.Unattributed > 0 {
					fmt.Fprintf(w, "; %d too slow to tell their window", a.Unattributed)
				}
				fmt.Fprintln(w)
			}
		}
		for _, m := range rr.Memory {
			for _, line := range m.lines() {
				fmt.Fprintf(w, "  %s %s\n", m.Scenario, line)
			}
		}
	}
	fmt.Fprintf(w, "\nsummary: min / median / max over the rounds; the ratio is ratemesh ÷ the other, round by round\n")
	fmt.Fprintf(w, "  %-27s %-40s %-26s %-20s %-26s %s\n", "scenario", "metric", "ratemesh", "against", "other", "ratemesh ÷ other")
	for _, r := range rep.Summary {
		fmt.Fprintf(w, "  %-27s %-40s %-26s %-20s %-26s %s\n", r.Scenario, r.Metric, triple(r.Ratemesh, r.Unit), r.Against, triple(r.Other, r.Unit), triple(r.Ratio, "ratio2"))
		if r.Flagged != "" {
			fmt.Fprintf(w, "  %-27s   flagged phases: %s\n", "", r.Flagged)
		}
	}
	if rep.Interrupted {
		fmt.Fprintln(w, "\ninterrupted: the figures above are of the rounds that ran")
	}
	if rep.Error != "" {
		fmt.Fprintf(w, "\nerror: %s\n", rep.Error)
	}
}

func mib(b uint64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }
