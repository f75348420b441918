package simulator

import (
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/ratemesh/ratemesh/limiter"
)

// buildType reads a workload's type and units: each request is Units units
// of the rule's cost Type (crate 002's costs, e.g. query {per: 10} of its
// limit parameter, publish {each: 100} per message), resolved by the rule
// as the core resolves it.
func buildType(field string, rw rawWorkload, r *limiter.Rule, w *Workload) error {
	if rw.Type == "" {
		if rw.Units != nil {
			return errf(field+".units", "needs type")
		}
		return nil
	}
	if rw.Cost != nil {
		return errf(field+".type", "set cost or type, not both")
	}
	if _, ok := r.Costs[rw.Type]; !ok {
		return errf(field+".type", "%q is not a cost of rule %q", rw.Type, r.Name)
	}
	if rw.Units == nil || *rw.Units < 1 {
		return errf(field+".units", "must be set to at least 1 with type")
	}
	w.Type, w.Units = rw.Type, uint64(*rw.Units)
	cost, err := r.CostOf(limiter.Request{Type: w.Type, Units: w.Units})
	if err != nil {
		return errf(field+".units", "%v", err)
	}
	if cost < 1 || cost > r.Limit*1000 {
		return errf(field+".units", "%d units of %q cost %d credits: at least 1 and not absurdly above the limit", w.Units, w.Type, cost)
	}
	w.Cost = cost
	return nil
}

// classAcc is one class's key-windows of one rule.
type classAcc struct {
	windows          uint64
	offCred, admCred uint64
	sumCap           uint64 // Σ min(offered, limit) over limited key-windows
	overMax          float64
	ratioMax         float64 // max admitted/limit of one key-window
	limit            uint64  // the class's limit of the rule's plain keys (0: unlimited)
}

// ClassRow is one class of one rule over the run, on true windows: its
// key-windows' limit is the rule's limit times the class's multiplier.
type ClassRow struct {
	Rule, Class string
	// Limit is the class's limit per key (0: unlimited).
	Limit   uint64
	Windows uint64
	// OfferedCredits and AdmittedCredits sum the class's key-windows.
	OfferedCredits, AdmittedCredits uint64
	// OvershootMax is the largest admitted/limit − 1 of one key-window
	// (floored at 0); RatioMax the largest admitted/limit; Utilisation
	// Σ admitted / Σ min(offered, limit). An unlimited class has none of
	// them: its AdmittedCredits should equal OfferedCredits.
	OvershootMax, RatioMax, Utilisation float64
}

// noteClass adds key k's closing window to its class (engine hook in
// ruleAcc.flush).
func (ra *ruleAcc) noteClass(k int, acc *keyAcc) {
	if k >= len(ra.keyClass) {
		return
	}
	if ra.classes == nil {
		ra.classes = map[string]*classAcc{}
	}
	name := ra.keyClass[k]
	ca := ra.classes[name]
	if ca == nil {
		ca = &classAcc{}
		if lim, unlimited, err := ra.rule.LimitFor("", name); err == nil && !unlimited {
			ca.limit = lim
		}
		ra.classes[name] = ca
	}
	ca.windows++
	ca.offCred += acc.offCred
	ca.admCred += acc.admCred
	if lim := ra.windowLimit(k, acc); lim > 0 {
		r := float64(acc.admCred) / float64(lim)
		ca.ratioMax = max(ca.ratioMax, r)
		ca.overMax = max(ca.overMax, r-1)
		ca.sumCap += min(acc.offCred, lim)
	}
}

// classRows returns every rule's classes, rules in order, classes by name
// ("" is the plain class).
func (s *sim) classRows() []ClassRow {
	var rows []ClassRow
	for _, ra := range s.rules {
		for _, name := range sortedKeys(ra.classes) {
			ca := ra.classes[name]
			row := ClassRow{Rule: ra.name, Class: name, Limit: ca.limit, Windows: ca.windows,
				OfferedCredits: ca.offCred, AdmittedCredits: ca.admCred,
				OvershootMax: round(ca.overMax, 4), RatioMax: round(ca.ratioMax, 4)}
			if ca.sumCap > 0 {
				row.Utilisation = round(float64(ca.admCred)/float64(ca.sumCap), 4)
			}
			rows = append(rows, row)
		}
	}
	return rows
}

// writeClasses writes the class table when some workload has a class.
func writeClasses(w io.Writer, rows []ClassRow) {
	named := false
	for _, r := range rows {
		named = named || r.Class != ""
	}
	if !named {
		return
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "rule\tclass\tlimit/key\twindows\toffered cr\tadmitted cr\tovershoot max\tutilisation\t")
	for _, r := range rows {
		class, lim := r.Class, fmt.Sprint(r.Limit)
		if class == "" {
			class = "-"
		}
		if r.Limit == 0 {
			lim = "unlimited"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\t%.4f\t%.4f\t\n", r.Rule, class, lim, r.Windows, r.OfferedCredits, r.AdmittedCredits, r.OvershootMax, r.Utilisation)
	}
	tw.Flush()
}
