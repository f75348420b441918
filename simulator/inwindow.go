package simulator

import (
	"fmt"
	"io"
	"strconv"
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
// the division). The Key fields profile the rule's first key alone.
type InWindowRow struct {
	Rule      string
	WindowMs  int64
	OffsetMs  int64
	Admitted  uint64
	PerWindow float64
	// Key is the rule's first key (its first workload's "w<i>-k0": under
	// zipf the workload's most requested); KeyAdmitted and KeyPerWindow
	// are its credits as Admitted and PerWindow are the rule's, and
	// KeyLimit its limit per bin (spread evenly over the window; 0 when
	// its class is unlimited).
	Key          string
	KeyAdmitted  uint64
	KeyPerWindow float64
	KeyLimit     float64
}

// noteInWindow counts cost credits of key gk of rule ra admitted at
// virtual ms now (true time, which starts aligned to every window) in its
// window's bin.
func (ra *ruleAcc) noteInWindow(now int64, gk int, cost uint64) {
	if ra.wms <= 0 || ra.wms > maxInWindowBins*InWindowMs {
		return
	}
	if ra.inWindow == nil {
		ra.inWindow = make([]uint64, (ra.wms+InWindowMs-1)/InWindowMs)
		ra.inWindowKey = make([]uint64, len(ra.inWindow))
	}
	if k := (now % ra.wms) / InWindowMs; k >= 0 {
		ra.inWindow[k] += cost
		if gk == 0 {
			ra.inWindowKey[k] += cost
		}
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
		limit := round(ra.keyRate(0)*InWindowMs, 2) // subintervals.go
		for k := int64(0); k*InWindowMs < ra.wms; k++ {
			row := InWindowRow{Rule: ra.name, WindowMs: ra.wms, OffsetMs: k * InWindowMs, Key: ra.key0, KeyLimit: limit}
			if ra.inWindow != nil {
				row.Admitted, row.KeyAdmitted = ra.inWindow[k], ra.inWindowKey[k]
			}
			if windows > 0 {
				row.PerWindow = round(float64(row.Admitted)/windows, 2)
				row.KeyPerWindow = round(float64(row.KeyAdmitted)/windows, 2)
			}
			rows = append(rows, row)
		}
	}
	return rows
}

// writeInWindowCSV writes inwindow.csv: admitted credits per rule per 50 ms
// bin of the window, in all and per window, then the same of the rule's
// first key and that key's limit per bin.
func (r *Result) writeInWindowCSV(w io.Writer) error {
	fmt.Fprintln(w, "rule,window_ms,offset_ms,admitted_credits,per_window,key,key_admitted_credits,key_per_window,key_limit_credits")
	for _, row := range r.InWindow {
		fmt.Fprintf(w, "%s,%d,%d,%d,%s,%s,%d,%s,%s\n", row.Rule, row.WindowMs, row.OffsetMs, row.Admitted, ftoa(row.PerWindow, 2),
			row.Key, row.KeyAdmitted, ftoa(row.KeyPerWindow, 2), strconv.FormatFloat(row.KeyLimit, 'f', -1, 64))
	}
	return nil
}

// writeInWindowSVG plots inwindow.csv: one panel per profiled rule, its
// first key's admitted credits per 50 ms bin per window beside that key's
// limit spread evenly over the window (the pace). The limit is one key's,
// so it is drawn against one key's admissions, never the rule's sum over
// keys (which inwindow.csv gives).
func (r *Result) writeInWindowSVG(w io.Writer) error {
	var names []string
	for _, row := range r.InWindow {
		if len(names) == 0 || names[len(names)-1] != row.Rule {
			names = append(names, row.Rule)
		}
	}
	var p plot
	p.header(max(len(names), 1), fmt.Sprintf("%s (seed %d): one key's admitted credits per %d ms inside the window, mean per window", r.Summary.Scenario, r.Summary.Seed, InWindowMs))
	for i, name := range names {
		var xs, adm []float64
		var first InWindowRow
		ymax := 0.0
		for _, row := range r.InWindow {
			if row.Rule != name {
				continue
			}
			if len(xs) == 0 {
				first = row
			}
			xs = append(xs, float64(row.OffsetMs+InWindowMs/2)/1000)
			adm = append(adm, row.KeyPerWindow)
			ymax = max(ymax, row.KeyPerWindow)
		}
		if first.Key == "" {
			p.panel(i, fmt.Sprintf("rule %s: no workload offers it", name), float64(first.WindowMs)/1000, 0, nil)
			continue
		}
		title := fmt.Sprintf("rule %s, key %s: admitted credits per %d ms bin of its %d ms window, mean over the windows", name, first.Key, InWindowMs, first.WindowMs)
		p.limitPanel(i, title, float64(first.WindowMs)/1000, nil, xs, adm, ymax, first.KeyLimit,
			fmt.Sprintf("%s's limit spread evenly", first.Key), fmt.Sprintf("%s admitted", first.Key))
	}
	_, err := io.WriteString(w, p.done())
	return err
}
