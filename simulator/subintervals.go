package simulator

import (
	"fmt"
	"io"
)

// SubMs is the length of a sub-interval: the finer grain, below the rule
// windows, at which Result.Subintervals counts admissions (Ably's figure
// of how steadily a flooded key is admitted).
const SubMs = 100

// SubRow is one workload's admitted credits in one sub-interval of true
// time, [StartMs, StartMs+SubMs) since the start of the run.
type SubRow struct {
	Workload int
	Rule     string
	StartMs  int64
	Admitted uint64
}

// subIntervals counts admitted credits per workload and sub-interval. The
// zero value counts nothing until the first admission sizes it.
type subIntervals struct {
	admitted [][]uint64 // per workload, per sub-interval
}

// noteSub counts cost credits of workload ws admitted at s.now.
func (s *sim) noteSub(ws *workloadState, cost uint64) {
	sub := &s.subs
	if sub.admitted == nil {
		n := int(s.durMs/SubMs) + 1
		sub.admitted = make([][]uint64, len(s.wls))
		for i := range sub.admitted {
			sub.admitted[i] = make([]uint64, n)
		}
	}
	for i, w := range s.wls {
		if w == ws {
			if k := s.now / SubMs; k >= 0 && k < int64(len(sub.admitted[i])) {
				sub.admitted[i][k] += cost
			}
			return
		}
	}
}

// subRows returns every workload's sub-intervals that lie within the run,
// by workload, then time.
func (s *sim) subRows() []SubRow {
	var rows []SubRow
	n := s.durMs / SubMs
	for i, ws := range s.wls {
		for k := int64(0); k < n; k++ {
			var adm uint64
			if s.subs.admitted != nil {
				adm = s.subs.admitted[i][k]
			}
			rows = append(rows, SubRow{Workload: i, Rule: ws.w.Rule, StartMs: k * SubMs, Admitted: adm})
		}
	}
	return rows
}

// writeSubCSV writes subintervals.csv: admitted credits per workload per
// sub-interval of SubMs.
func (r *Result) writeSubCSV(w io.Writer) error {
	fmt.Fprintln(w, "workload,rule,start_ms,admitted_credits")
	for _, row := range r.Subintervals {
		fmt.Fprintf(w, "%d,%s,%d,%d\n", row.Workload, row.Rule, row.StartMs, row.Admitted)
	}
	return nil
}

// writeSubSVG plots subintervals.csv: one panel per workload, admitted
// credits per sub-interval beside the rule's limit per sub-interval (the
// limit spread evenly over its window).
func (r *Result) writeSubSVG(w io.Writer) error {
	var p plot
	nw := 0
	for _, row := range r.Subintervals {
		nw = max(nw, row.Workload+1)
	}
	p.header(max(nw, 1), fmt.Sprintf("%s (seed %d): admitted credits per %d ms of true time, per workload", r.Summary.Scenario, r.Summary.Seed, SubMs))
	xmax := float64(r.DurationMs) / 1000
	for wl := 0; wl < nw; wl++ {
		var xs, adm, lim []float64
		ymax, rule, perSub := 0.0, "", 0.0
		for _, row := range r.Subintervals {
			if row.Workload != wl {
				continue
			}
			rule = row.Rule
			xs = append(xs, float64(row.StartMs+SubMs/2)/1000)
			adm = append(adm, float64(row.Admitted))
			ymax = max(ymax, float64(row.Admitted))
		}
		for _, rs := range r.Summary.Rules {
			if rs.Name == rule {
				for _, row := range r.Windows {
					if row.Rule == rule && row.WindowMs > 0 {
						perSub = float64(rs.Limit) * SubMs / float64(row.WindowMs)
						break
					}
				}
			}
		}
		p.panel(wl, fmt.Sprintf("workload %d (rule %s): admitted credits per %d ms, over all its keys", wl, rule, SubMs), xmax, max(ymax, perSub), r.Shades)
		if perSub > 0 {
			for range xs {
				lim = append(lim, perSub)
			}
			p.line(xs, lim, "#d62828", true, "one key's limit per sub-interval", 0)
		}
		p.line(xs, adm, "#1d3557", false, "admitted", 1)
	}
	_, err := io.WriteString(w, p.done())
	return err
}
