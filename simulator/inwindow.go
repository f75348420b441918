package simulator

import (
	"fmt"
	"io"
)

// InWindowMs is the bin of the in-window profile: admitted credits per
// 50 ms of the window they fall in (LINE's figure of pacing: unpaced, a
// flooded window's quota goes in its first bin; paced, evenly).
const InWindowMs = 50

// maxInWindowBins bounds the profile: rules whose window holds more 50 ms
// bins (windows over 10 s) get none.
const maxInWindowBins = 200

// InWindowRow is one rule's admitted credits in one 50 ms bin of its
// window, [OffsetMs, OffsetMs+InWindowMs) after each window's start,
// summed over the run's keys and windows; PerWindow is that sum over the
// run's whole windows (a partial last window counts in Admitted, not in
// the division).
type InWindowRow struct {
	Rule      string
	WindowMs  int64
	OffsetMs  int64
	Admitted  uint64
	PerWindow float64
}

// noteInWindow counts cost credits of rule ra admitted at virtual ms now
// (true time, which starts aligned to every window) in its window's bin.
func (ra *ruleAcc) noteInWindow(now int64, cost uint64) {
	if ra.wms <= 0 || ra.wms > maxInWindowBins*InWindowMs {
		return
	}
	if ra.inWindow == nil {
		ra.inWindow = make([]uint64, (ra.wms+InWindowMs-1)/InWindowMs)
	}
	if k := (now % ra.wms) / InWindowMs; k >= 0 {
		ra.inWindow[k] += cost
	}
}

// inWindowRows returns every profiled rule's bins, by rule, then offset.
func (s *sim) inWindowRows() []InWindowRow {
	var rows []InWindowRow
	for _, ra := range s.rules {
		if ra.wms <= 0 || ra.wms > maxInWindowBins*InWindowMs {
			continue
		}
		windows := float64(s.durMs / ra.wms)
		for k := int64(0); k*InWindowMs < ra.wms; k++ {
			row := InWindowRow{Rule: ra.name, WindowMs: ra.wms, OffsetMs: k * InWindowMs}
			if ra.inWindow != nil {
				row.Admitted = ra.inWindow[k]
			}
			if windows > 0 {
				row.PerWindow = round(float64(row.Admitted)/windows, 2)
			}
			rows = append(rows, row)
		}
	}
	return rows
}

// writeInWindowCSV writes inwindow.csv: admitted credits per rule per 50 ms
// bin of the window, in all and per window.
func (r *Result) writeInWindowCSV(w io.Writer) error {
	fmt.Fprintln(w, "rule,window_ms,offset_ms,admitted_credits,per_window")
	for _, row := range r.InWindow {
		fmt.Fprintf(w, "%s,%d,%d,%d,%s\n", row.Rule, row.WindowMs, row.OffsetMs, row.Admitted, ftoa(row.PerWindow, 2))
	}
	return nil
}

// writeInWindowSVG plots inwindow.csv: one panel per profiled rule,
// admitted credits per 50 ms bin per window beside an even pace (the
// limit spread evenly over the window).
func (r *Result) writeInWindowSVG(w io.Writer) error {
	var names []string
	for _, row := range r.InWindow {
		if len(names) == 0 || names[len(names)-1] != row.Rule {
			names = append(names, row.Rule)
		}
	}
	var p plot
	p.header(max(len(names), 1), fmt.Sprintf("%s (seed %d): admitted credits per %d ms inside the window, per window", r.Summary.Scenario, r.Summary.Seed, InWindowMs))
	for i, name := range names {
		var xs, adm, even []float64
		ymax, wms, limit := 0.0, int64(0), 0.0
		for _, rs := range r.Summary.Rules {
			if rs.Name == name {
				limit = float64(rs.Limit)
			}
		}
		for _, row := range r.InWindow {
			if row.Rule != name {
				continue
			}
			wms = row.WindowMs
			xs = append(xs, float64(row.OffsetMs+InWindowMs/2)/1000)
			adm = append(adm, row.PerWindow)
			ymax = max(ymax, row.PerWindow)
		}
		pace := limit * InWindowMs / float64(max(wms, 1))
		for range xs {
			even = append(even, pace)
		}
		p.panel(i, fmt.Sprintf("rule %s: admitted credits per %d ms bin of its %d ms window, mean over windows", name, InWindowMs, wms), float64(wms)/1000, max(ymax, pace), nil)
		p.line(xs, even, "#d62828", true, "the limit spread evenly", 0)
		p.line(xs, adm, "#1d3557", false, "admitted", 1)
	}
	_, err := io.WriteString(w, p.done())
	return err
}
