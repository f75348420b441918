package simulator

import (
	"fmt"
	"io"
)

// PartitionReport is one rule's figures around the first partition of a
// run, from its true windows (Result.Windows, windows.csv). A window's
// utilisation is its admitted credits over Σ min(offered, limit) of its
// keys (CapSum); windows that straddle the split or the heal belong to no
// phase.
type PartitionReport struct {
	Rule string
	// From and To are the partition, in virtual ms since the start (To is
	// the heal, or the end of the run).
	From, To int64
	// Before, During and After are the utilisation of the windows wholly
	// before the split, wholly within it, and wholly after the heal.
	Before, During, After float64
	// OvershootDuring is the largest key overshoot of the windows that
	// overlap the partition (straddling windows included).
	OvershootDuring float64
	// RecoveryMs is the time from the heal until the start of the first
	// window from which every later window reaches Threshold (0 if the
	// first window ending after the heal already does; window resolution);
	// −1 if utilisation never returns (or nothing was healed).
	RecoveryMs int64
	// Threshold is the utilisation that counts as full.
	Threshold float64
}

// PartitionFigures computes rule's PartitionReport for the first
// partition of r; threshold is the utilisation that counts as full (0.95
// is steady's floor). ok is false when the run had no partition or the
// rule no windows.
func (r *Result) PartitionFigures(rule string, threshold float64) (rep PartitionReport, ok bool) {
	rep = PartitionReport{Rule: rule, RecoveryMs: -1, Threshold: threshold}
	found := false
	for _, sh := range r.Shades {
		if sh.Kind == "partition" {
			rep.From, rep.To, found = sh.From, sh.To, true
			break
		}
	}
	if !found {
		return rep, false
	}
	var rows []WindowRow
	for _, w := range r.Windows {
		if w.Rule == rule {
			rows = append(rows, w)
		}
	}
	if len(rows) == 0 {
		return rep, false
	}
	var adm, cap [3]uint64
	for _, w := range rows {
		end := w.StartMs + w.WindowMs
		switch {
		case end <= rep.From:
			adm[0], cap[0] = adm[0]+w.AdmCred, cap[0]+w.CapSum
		case w.StartMs >= rep.From && end <= rep.To:
			adm[1], cap[1] = adm[1]+w.AdmCred, cap[1]+w.CapSum
		case w.StartMs >= rep.To:
			adm[2], cap[2] = adm[2]+w.AdmCred, cap[2]+w.CapSum
		}
		if w.StartMs < rep.To && end > rep.From {
			rep.OvershootDuring = max(rep.OvershootDuring, w.OvershootMax)
		}
	}
	ratio := func(a, c uint64) float64 {
		if c == 0 {
			return 0
		}
		return round(float64(a)/float64(c), 4)
	}
	rep.Before, rep.During, rep.After = ratio(adm[0], cap[0]), ratio(adm[1], cap[1]), ratio(adm[2], cap[2])
	rep.OvershootDuring = round(rep.OvershootDuring, 4)
	if rep.To < r.DurationMs {
		rep.RecoveryMs = recoveryMs(rows, rep.To, threshold)
	}
	return rep, true
}

// recoveryMs returns the time from heal until the start of the first
// window from which every later window (ending after heal) reaches
// threshold, at least 0; −1 if none does. rows are in time order.
func recoveryMs(rows []WindowRow, heal int64, threshold float64) int64 {
	rec := int64(-1)
	for _, w := range rows {
		end := w.StartMs + w.WindowMs
		if end <= heal {
			continue
		}
		full := w.CapSum > 0 && float64(w.AdmCred) >= threshold*float64(w.CapSum)
		switch {
		case !full:
			rec = -1
		case rec < 0:
			rec = max(w.StartMs-heal, 0)
		}
	}
	return rec
}

// WritePartition writes rep as one line.
func (rep PartitionReport) WritePartition(w io.Writer) {
	rec := "never"
	if rep.RecoveryMs >= 0 {
		rec = fmt.Sprintf("%dms", rep.RecoveryMs)
	}
	fmt.Fprintf(w, "partition %s [%dms, %dms): utilisation before %.4f, during %.4f, after %.4f; overshoot during %.4f; full (≥ %.2f) again %s after the heal\n",
		rep.Rule, rep.From, rep.To, rep.Before, rep.During, rep.After, rep.OvershootDuring, rep.Threshold, rec)
}
