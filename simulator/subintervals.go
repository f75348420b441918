package simulator

import (
	"fmt"
	"io"
	"strconv"
)

// SubMs is the length of a sub-interval: the finer grain, below the rule
// windows, at which Result.Subintervals counts admissions (Ably's figure
// of how steadily a flooded key is admitted).
const SubMs = 100

// SubRow is one workload's admitted credits in one sub-interval of true
// time, [StartMs, StartMs+SubMs) since the start of the run: over all its
// keys, and of its first key alone beside that key's limit.
type SubRow struct {
	Workload int
	Rule     string
	StartMs  int64
	Admitted uint64 // over all the workload's keys
	Keys     int    // how many keys the workload has
	// Key is the workload's first key ("w<i>-k0": under zipf its most
	// requested), KeyAdmitted its admitted credits, and KeyLimit its limit
	// per sub-interval (the limit spread evenly over the window, or a
	// token bucket's refill; 0 when its class is unlimited).
	Key         string
	KeyAdmitted uint64
	KeyLimit    float64
}

// subIntervals counts admitted credits per workload and sub-interval. The
// zero value counts nothing until the first admission sizes it.
type subIntervals struct {
	admitted [][]uint64 // per workload, per sub-interval
	key      [][]uint64 // per workload, per sub-interval: its first key alone
}

// noteSub counts cost credits of key k of workload ws admitted at s.now.
func (s *sim) noteSub(ws *workloadState, k int, cost uint64) {
	sub := &s.subs
	if sub.admitted == nil {
		n := int(s.durMs/SubMs) + 1
		sub.admitted = make([][]uint64, len(s.wls))
		sub.key = make([][]uint64, len(s.wls))
		for i := range sub.admitted {
			sub.admitted[i] = make([]uint64, n)
			sub.key[i] = make([]uint64, n)
		}
	}
	for i, w := range s.wls {
		if w == ws {
			if j := s.now / SubMs; j >= 0 && j < int64(len(sub.admitted[i])) {
				sub.admitted[i][j] += cost
				if k == 0 {
					sub.key[i][j] += cost
				}
			}
			return
		}
	}
}

// keyRate returns key gk's limit in credits per ms of true time
// (limiter.Rule.RatePerMs); 0 when the key's class is unlimited or the
// rule has no window (concurrency).
func (ra *ruleAcc) keyRate(gk int) float64 {
	if gk >= len(ra.limits) || ra.limits[gk] == 0 || ra.wms <= 0 {
		return 0
	}
	return ra.rule.RatePerMs(ra.limits[gk])
}

// subRows returns every workload's sub-intervals that lie within the run,
// by workload, then time.
func (s *sim) subRows() []SubRow {
	var rows []SubRow
	n := s.durMs / SubMs
	for i, ws := range s.wls {
		ra := s.rules[ws.rule]
		key, limit := "", 0.0
		if len(ws.keys) > 0 {
			key, limit = ws.keys[0], round(ra.keyRate(ws.keyBase)*SubMs, 2)
		}
		for k := int64(0); k < n; k++ {
			row := SubRow{Workload: i, Rule: ws.w.Rule, StartMs: k * SubMs, Keys: len(ws.keys), Key: key, KeyLimit: limit}
			if s.subs.admitted != nil {
				row.Admitted, row.KeyAdmitted = s.subs.admitted[i][k], s.subs.key[i][k]
			}
			rows = append(rows, row)
		}
	}
	return rows
}

// writeSubCSV writes subintervals.csv: admitted credits per workload per
// sub-interval of SubMs, over all its keys, then its first key's admitted
// credits and limit per sub-interval.
func (r *Result) writeSubCSV(w io.Writer) error {
	fmt.Fprintln(w, "workload,rule,start_ms,admitted_credits,keys,key,key_admitted_credits,key_limit_credits")
	for _, row := range r.Subintervals {
		fmt.Fprintf(w, "%d,%s,%d,%d,%d,%s,%d,%s\n", row.Workload, row.Rule, row.StartMs, row.Admitted,
			row.Keys, row.Key, row.KeyAdmitted, strconv.FormatFloat(row.KeyLimit, 'f', -1, 64))
	}
	return nil
}

// writeSubSVG plots subintervals.csv: one panel per workload, its first
// key's admitted credits per sub-interval beside that key's limit per
// sub-interval (an empty panel for a concurrency rule's workload). A limit is a key's, so it is drawn against one key's
// admissions, never against the sum over the workload's keys (which
// subintervals.csv gives).
func (r *Result) writeSubSVG(w io.Writer) error {
	var p plot
	nw := 0
	for _, row := range r.Subintervals {
		nw = max(nw, row.Workload+1)
	}
	p.header(max(nw, 1), fmt.Sprintf("%s (seed %d): one key's admitted credits per %d ms of true time, per workload", r.Summary.Scenario, r.Summary.Seed, SubMs))
	xmax := float64(r.DurationMs) / 1000
	leaseRules := map[string]bool{} // admit no credits (leases.go)
	for _, f := range r.Leases {
		leaseRules[f.Rule] = true
	}
	for wl := 0; wl < nw; wl++ {
		var xs, adm []float64
		var first SubRow
		ymax := 0.0
		for _, row := range r.Subintervals {
			if row.Workload != wl {
				continue
			}
			if len(xs) == 0 {
				first = row
			}
			xs = append(xs, float64(row.StartMs+SubMs/2)/1000)
			adm = append(adm, float64(row.KeyAdmitted))
			ymax = max(ymax, float64(row.KeyAdmitted))
		}
		of := "its only key"
		if first.Keys > 1 {
			of = fmt.Sprintf("the first of its %d keys", first.Keys)
		}
		title := fmt.Sprintf("workload %d (rule %s): key %s, %s: admitted credits per %d ms", wl, first.Rule, first.Key, of, SubMs)
		if leaseRules[first.Rule] {
			p.panel(wl, fmt.Sprintf("workload %d (rule %s): a concurrency rule, whose leases leases.svg plots", wl, first.Rule), xmax, 0, r.Shades)
			continue
		}
		p.limitPanel(wl, title, xmax, r.Shades, xs, adm, ymax, first.KeyLimit,
			fmt.Sprintf("%s's limit per %d ms", first.Key, SubMs), fmt.Sprintf("%s admitted", first.Key))
	}
	_, err := io.WriteString(w, p.done())
	return err
}
