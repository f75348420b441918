package simulator

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"
)

// Summary is the JSON object `ratemesh sim --json` prints (docs/simulator.md,
// "Flags and outputs").
type Summary struct {
	Scenario       string        `json:"scenario"`
	Seed           uint64        `json:"seed"`
	Nodes          int           `json:"nodes"`
	VirtualSeconds float64       `json:"virtual_seconds"`
	WallSeconds    float64       `json:"wall_seconds"`
	Rules          []RuleSummary `json:"rules"`
	// Reincarnations lists, in order, every new incarnation a node took
	// because it learned it had been evicted (restarts are not listed);
	// absent when none did.
	Reincarnations []Reincarnation `json:"reincarnations,omitempty"`
}

// Reincarnation is one node taking a new incarnation on learning of its
// eviction (node.Ready.NewIncarnation), at AtS virtual seconds.
type Reincarnation struct {
	Node int     `json:"node"`
	AtS  float64 `json:"at_s"`
}

// RuleSummary is one rule's figures; see the package doc for definitions.
type RuleSummary struct {
	Name                string  `json:"name"`
	Offered             uint64  `json:"offered"`
	Admitted            uint64  `json:"admitted"`
	Limit               uint64  `json:"limit"`
	Windows             uint64  `json:"windows"`
	OvershootMax        float64 `json:"overshoot_max"`
	OvershootP99        float64 `json:"overshoot_p99"`
	Utilisation         float64 `json:"utilisation"`
	FalseRejections     uint64  `json:"false_rejections"`
	ConvergenceP99Ms    float64 `json:"convergence_p99_ms"`
	MessagesPerNodePerS float64 `json:"messages_per_node_per_s"`
	BytesPerNodePerS    float64 `json:"bytes_per_node_per_s"`
}

// WindowRow is one rule's true window over all its keys.
type WindowRow struct {
	Rule     string
	StartMs  int64 // since the start of the run
	WindowMs int64
	winAgg
}

// SecondRow is one virtual second of network traffic.
type SecondRow struct {
	Messages, Bytes uint64
	NodeMs          uint64 // Σ nodes up over the second's milliseconds
}

// NodeRow is one node's sends over the run.
type NodeRow struct {
	Index           int
	Peer            string
	Messages, Bytes uint64
}

// Shade is an interval to shade on plots: "partition" or "down" (a node
// crashed), in virtual ms since the start.
type Shade struct {
	Kind     string
	From, To int64
}

// Result is everything a run measured.
type Result struct {
	Summary    Summary
	Windows    []WindowRow
	Seconds    []SecondRow
	Nodes      []NodeRow
	Shades     []Shade
	DurationMs int64
	// Requests is how many requests were offered; Skipped how many
	// scripted event actions found their node in the wrong state.
	Requests uint64
	Skipped  int
	// InWindow is admitted credits per rule per 50 ms bin of its window
	// (inwindow.go).
	InWindow []InWindowRow
	// Subintervals is admitted credits per workload per SubMs.
	Subintervals []SubRow
	// Sides is each windowed rule's windows per side of the run's first
	// partition (sides.go); nil without a partition.
	Sides []SideRow
	// PartitionPolicy is the mesh's (strict or available).
	PartitionPolicy string
	// Classes is each rule's figures per class (credits.go).
	Classes []ClassRow
	Clocks  []ClockRow // each running node's clock at the end (clocks.go)
	// Leases is each concurrency rule's lease figures (leases.go).
	Leases []LeaseFigures
}

// WriteJSON writes the summary as one indented JSON object.
func (r *Result) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r.Summary)
}

// WriteTable writes the summary as a table, one row per rule.
func (r *Result) WriteTable(w io.Writer) error {
	s := r.Summary
	fmt.Fprintf(w, "scenario %s  seed %d  nodes %d  virtual %gs  wall %.2fs  requests %d", s.Scenario, s.Seed, s.Nodes, s.VirtualSeconds, s.WallSeconds, r.Requests)
	if s.WallSeconds > 0 {
		fmt.Fprintf(w, " (%.2fM decided per wall second)", float64(r.Requests)/s.WallSeconds/1e6)
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "rule\toffered\tadmitted\tlimit\twindows\tovershoot max\tp99\tutilisation\tfalse rej\tconv p99 ms\tmsg/node/s\tbytes/node/s\t")
	for _, rs := range s.Rules {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%.4f\t%.4f\t%.4f\t%d\t%.0f\t%.2f\t%.1f\t\n", rs.Name, rs.Offered, rs.Admitted, rs.Limit,
			rs.Windows, rs.OvershootMax, rs.OvershootP99, rs.Utilisation, rs.FalseRejections, rs.ConvergenceP99Ms,
			rs.MessagesPerNodePerS, rs.BytesPerNodePerS)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(s.Reincarnations) > 0 {
		fmt.Fprintf(w, "reincarnations (node@s):")
		for _, ri := range s.Reincarnations {
			fmt.Fprintf(w, " %d@%g", ri.Node, ri.AtS)
		}
		fmt.Fprintln(w)
	}
	writeClasses(w, r.Classes)   // credits.go
	writeLeases(w, r.Leases)     // leases.go
	for _, rs := range s.Rules { // partition_report.go
		if rep, ok := r.PartitionFigures(rs.Name, 0.95); ok {
			rep.WritePartition(w)
		}
	}
	return nil
}

// WriteFiles writes windows.csv, seconds.csv, nodes.csv, admitted.svg,
// bytes.svg, subintervals.csv and subintervals.svg into dir, creating it
// if needed.
func (r *Result) WriteFiles(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	files := []struct {
		name  string
		write func(io.Writer) error
	}{
		{"windows.csv", r.writeWindowsCSV},
		{"seconds.csv", r.writeSecondsCSV},
		{"nodes.csv", r.writeNodesCSV},
		{"admitted.svg", r.writeAdmittedSVG},
		{"bytes.svg", r.writeBytesSVG},
		{"inwindow.csv", r.writeInWindowCSV},
		{"inwindow.svg", r.writeInWindowSVG},
		{"subintervals.csv", r.writeSubCSV},
		{"subintervals.svg", r.writeSubSVG},
		{"clocks.csv", r.writeClocksCSV}, // clocks.go
	}
	if len(r.Sides) > 0 { // sides.go
		files = append(files, struct {
			name  string
			write func(io.Writer) error
		}{"sides.csv", r.writeSidesCSV})
	}
	if len(r.Leases) > 0 { // leases.go
		files = append(files, []struct {
			name  string
			write func(io.Writer) error
		}{{"leases.csv", r.writeLeasesCSV}, {"leases.svg", r.writeLeasesSVG}}...)
	}
	for _, f := range files {
		if err := writeFile(filepath.Join(dir, f.name), f.write); err != nil {
			return err
		}
	}
	return nil
}

func writeFile(path string, write func(io.Writer) error) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	bw := bufio.NewWriter(f)
	if err := write(bw); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := bw.Flush(); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	return f.Close()
}

func ftoa(x float64, prec int) string { return strconv.FormatFloat(x, 'f', prec, 64) }

func (r *Result) writeWindowsCSV(w io.Writer) error {
	fmt.Fprintln(w, "rule,window_start_ms,window_ms,keys,offered,admitted,offered_credits,admitted_credits,limit,capacity,overshoot_max")
	for _, row := range r.Windows {
		fmt.Fprintf(w, "%s,%d,%d,%d,%d,%d,%d,%d,%d,%d,%s\n", row.Rule, row.StartMs, row.WindowMs, row.Keys, row.OffReq, row.AdmReq,
			row.OffCred, row.AdmCred, row.LimitSum, row.CapSum, ftoa(row.OvershootMax, 4))
	}
	return nil
}

func (r *Result) writeSecondsCSV(w io.Writer) error {
	fmt.Fprintln(w, "second,messages,bytes,node_seconds,bytes_per_node")
	for i, row := range r.Seconds {
		fmt.Fprintf(w, "%d,%d,%d,%s,%s\n", i, row.Messages, row.Bytes, ftoa(float64(row.NodeMs)/1000, 3), ftoa(row.perNode(), 1))
	}
	return nil
}

func (row SecondRow) perNode() float64 {
	if row.NodeMs == 0 {
		return 0
	}
	return float64(row.Bytes) / (float64(row.NodeMs) / 1000)
}

func (r *Result) writeNodesCSV(w io.Writer) error {
	fmt.Fprintln(w, "node,peer,messages,bytes")
	for _, n := range r.Nodes {
		fmt.Fprintf(w, "%d,%s,%d,%d\n", n.Index, n.Peer, n.Messages, n.Bytes)
	}
	return nil
}

// plot is a hand-made SVG chart: deterministic text, no dependency.
type plot struct {
	b            strings.Builder
	x0, y0, w, h float64 // the plot area
	xmax, ymax   float64
	legendX      float64 // where the panel's next legend entry starts
}

const (
	svgW    = 900.0
	panelH  = 260.0
	marginL = 70.0
	marginR = 20.0
)

func (p *plot) X(v float64) float64 { return p.x0 + v/p.xmax*p.w }
func (p *plot) Y(v float64) float64 { return p.y0 + p.h - v/p.ymax*p.h }

func (p *plot) header(panels int, title string) {
	height := float64(panels)*panelH + 30
	fmt.Fprintf(&p.b, `<svg xmlns="http://www.w3.org/2000/svg" width="%s" height="%s" viewBox="0 0 %s %s" font-family="sans-serif" font-size="11">`+"\n",
		ftoa(svgW, 0), ftoa(height, 0), ftoa(svgW, 0), ftoa(height, 0))
	fmt.Fprintf(&p.b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&p.b, `<text x="%s" y="18" font-size="14">%s</text>`+"\n", ftoa(marginL, 0), xmlEscape(title))
}

func (p *plot) panel(i int, title string, xmax, ymax float64, shades []Shade) {
	p.x0, p.y0 = marginL, 30+float64(i)*panelH+25
	p.w, p.h = svgW-marginL-marginR, panelH-65
	p.xmax, p.ymax = max(xmax, 1e-9), niceMax(ymax)
	fmt.Fprintf(&p.b, `<text x="%s" y="%s" font-size="12">%s</text>`+"\n", ftoa(p.x0, 1), ftoa(p.y0-8, 1), xmlEscape(title))
	for _, s := range shades {
		color := "#f4a261"
		if s.Kind == "down" {
			color = "#adb5bd"
		}
		x1, x2 := p.X(float64(s.From)/1000), p.X(float64(s.To)/1000)
		fmt.Fprintf(&p.b, `<rect x="%s" y="%s" width="%s" height="%s" fill="%s" fill-opacity="0.3"><title>%s</title></rect>`+"\n",
			ftoa(x1, 1), ftoa(p.y0, 1), ftoa(max(x2-x1, 0.5), 1), ftoa(p.h, 1), color, s.Kind)
	}
	fmt.Fprintf(&p.b, `<rect x="%s" y="%s" width="%s" height="%s" fill="none" stroke="#333"/>`+"\n", ftoa(p.x0, 1), ftoa(p.y0, 1), ftoa(p.w, 1), ftoa(p.h, 1))
	for k := 0; k <= 4; k++ {
		v := p.ymax * float64(k) / 4
		y := p.Y(v)
		fmt.Fprintf(&p.b, `<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="#ddd"/><text x="%s" y="%s" text-anchor="end">%s</text>`+"\n",
			ftoa(p.x0, 1), ftoa(y, 1), ftoa(p.x0+p.w, 1), ftoa(y, 1), ftoa(p.x0-4, 1), ftoa(y+4, 1), short(v))
	}
	step := tickStep(p.xmax)
	for k := 0; float64(k)*step <= p.xmax*(1+1e-9); k++ {
		v := float64(k) * step
		x := p.X(v)
		fmt.Fprintf(&p.b, `<text x="%s" y="%s" text-anchor="middle">%ss</text>`+"\n", ftoa(x, 1), ftoa(p.y0+p.h+14, 1), short(v))
	}
	p.legendX = p.x0 + 10
}

// tickStep returns the step of the x axis's ticks: 1, 2 or 5 times a
// power of ten, the smallest that puts at most 8 steps in xmax.
func tickStep(xmax float64) float64 {
	mag := math.Pow(10, math.Floor(math.Log10(xmax))-1)
	for {
		for _, m := range []float64{1, 2, 5} {
			if xmax/(m*mag) <= 8 {
				return m * mag
			}
		}
		mag *= 10
	}
}

// legendWidth is about how wide label is at font-size 11.
func legendWidth(label string) float64 { return 5.4 * float64(len([]rune(label))) }

// line draws ys against xs with a legend entry; a NaN in ys breaks the
// line (no point there).
func (p *plot) line(xs, ys []float64, color string, dashed bool, label string) {
	if len(xs) == 0 {
		return
	}
	dash := ""
	if dashed {
		dash = ` stroke-dasharray="5,3"`
	}
	var pts strings.Builder
	flush := func() {
		if pts.Len() > 0 {
			fmt.Fprintf(&p.b, `<polyline fill="none" stroke="%s" stroke-width="1.2"%s points="%s"/>`+"\n", color, dash, pts.String())
			pts.Reset()
		}
	}
	for i := range xs {
		if math.IsNaN(ys[i]) {
			flush()
			continue
		}
		if pts.Len() > 0 {
			pts.WriteByte(' ')
		}
		pts.WriteString(ftoa(p.X(xs[i]), 1))
		pts.WriteByte(',')
		pts.WriteString(ftoa(p.Y(min(ys[i], p.ymax)), 1))
	}
	flush()
	lx := p.legendX
	ly := p.y0 + p.h + 30
	fmt.Fprintf(&p.b, `<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="%s"%s/><text x="%s" y="%s">%s</text>`+"\n",
		ftoa(lx, 1), ftoa(ly-4, 1), ftoa(lx+20, 1), ftoa(ly-4, 1), color, dash, ftoa(lx+24, 1), ftoa(ly, 1), xmlEscape(label))
	p.legendX += 24 + legendWidth(label) + 24
}

// note adds a legend entry without a line: text about the panel.
func (p *plot) note(text string) {
	fmt.Fprintf(&p.b, `<text x="%s" y="%s" fill="#555">%s</text>`+"\n", ftoa(p.legendX, 1), ftoa(p.y0+p.h+30, 1), xmlEscape(text))
	p.legendX += legendWidth(text) + 24
}

// limitPanel draws panel i: one key's admitted credits (adm, at xs)
// beside that key's limit per point (limit, constant; 0 when unlimited),
// labelled limLabel and admLabel. A limit more than 4 times the largest
// admission is named in the legend instead of drawn, so that the
// admissions keep the panel's scale.
func (p *plot) limitPanel(i int, title string, xmax float64, shades []Shade, xs, adm []float64, ymax, limit float64, limLabel, admLabel string) {
	drawLimit := limit > 0 && (ymax == 0 || limit <= 4*ymax)
	if drawLimit {
		ymax = max(ymax, limit)
	}
	p.panel(i, title, xmax, ymax, shades)
	switch {
	case drawLimit:
		lim := make([]float64, len(xs))
		for k := range lim {
			lim[k] = limit
		}
		p.line(xs, lim, "#d62828", true, limLabel)
	case limit > 0:
		p.note(fmt.Sprintf("%s: %s, above this scale", limLabel, short(limit)))
	default:
		p.note("unlimited class: no limit")
	}
	p.line(xs, adm, "#1d3557", false, admLabel)
}

func (p *plot) done() string {
	p.b.WriteString("</svg>\n")
	return p.b.String()
}

func niceMax(v float64) float64 {
	if v <= 0 {
		return 1
	}
	mag := 1.0
	for mag*10 <= v {
		mag *= 10
	}
	for mag > v {
		mag /= 10
	}
	// Each a quarter of which (a y tick) is short to write.
	for _, m := range []float64{1, 1.2, 1.6, 2, 2.4, 3, 4, 6, 8, 10} {
		if m*mag >= v*1.05 {
			return m * mag
		}
	}
	return 10 * mag
}

func short(v float64) string {
	switch {
	case v >= 1e6:
		return ftoa(v/1e6, 1) + "M"
	case v >= 1e4:
		return ftoa(v/1e3, 0) + "k"
	case v == float64(int64(v)):
		return ftoa(v, 0)
	}
	return strings.TrimRight(strings.TrimRight(ftoa(v, 2), "0"), ".")
}

func xmlEscape(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&quot;").Replace(s)
}

// writeAdmittedSVG plots windows.csv: per rule, the credits admitted per
// true window against Σ min(offered, limit) over the keys offered. A run
// with a partition adds a panel per side of its first partition
// (sides.csv): the credits the side's nodes admitted against what the
// partition policy let that side use, drawn over the windows that overlap
// a partition; a rule's panels share one scale.
func (r *Result) writeAdmittedSVG(w io.Writer) error {
	type side struct {
		nodes string
		n     int
	}
	var sides []side
	total := 0
	for _, row := range r.Sides {
		if row.Side == len(sides) {
			sides = append(sides, side{row.Nodes, row.NodeN})
			total += row.NodeN
		}
	}
	var p plot
	rules := r.Summary.Rules
	p.header(len(rules)*(1+len(sides)), fmt.Sprintf("%s (seed %d): admitted vs. limit per true window; shaded: partition (orange), node down (grey)", r.Summary.Scenario, r.Summary.Seed))
	xmax := float64(r.DurationMs) / 1000
	split := func(row SideRow) bool {
		for _, sh := range r.Shades {
			if sh.Kind == "partition" && row.StartMs < sh.To && row.StartMs+row.WindowMs > sh.From {
				return true
			}
		}
		return false
	}
	panel := 0
	for _, rs := range rules {
		var xs, adm, lim []float64
		ymax := 0.0
		for _, row := range r.Windows {
			if row.Rule != rs.Name {
				continue
			}
			x := float64(row.StartMs+row.WindowMs/2) / 1000
			xs = append(xs, x)
			adm = append(adm, float64(row.AdmCred))
			lim = append(lim, float64(row.CapSum))
			ymax = max(ymax, float64(row.AdmCred), float64(row.CapSum))
		}
		sxs, sadm, slim := make([][]float64, len(sides)), make([][]float64, len(sides)), make([][]float64, len(sides))
		for _, row := range r.Sides {
			if row.Rule != rs.Name {
				continue
			}
			k := row.Side
			sxs[k] = append(sxs[k], float64(row.StartMs+row.WindowMs/2)/1000)
			sadm[k] = append(sadm[k], float64(row.AdmCred))
			ymax = max(ymax, float64(row.AdmCred))
			if split(row) {
				slim[k] = append(slim[k], float64(row.CapSum))
				ymax = max(ymax, float64(row.CapSum))
			} else {
				slim[k] = append(slim[k], math.NaN())
			}
		}
		title := fmt.Sprintf("rule %s: credits per true window, summed over the keys offered", rs.Name)
		if len(sides) > 0 {
			title = fmt.Sprintf("rule %s, all %d nodes: credits per true window, summed over the keys offered", rs.Name, total)
		}
		p.panel(panel, title, xmax, ymax, r.Shades)
		panel++
		p.line(xs, lim, "#d62828", true, "limit: Σ min(offered, limit)")
		p.line(xs, adm, "#1d3557", false, "admitted")
		for k, sd := range sides {
			p.panel(panel, fmt.Sprintf("rule %s, side %d of %d: nodes %s (%d of %d), credits per true window, summed over the keys offered to them",
				rs.Name, k+1, len(sides), sd.nodes, sd.n, total), xmax, ymax, r.Shades)
			panel++
			if len(sxs[k]) == 0 {
				continue
			}
			p.line(sxs[k], slim[k], "#d62828", true, "its limit while split: Σ min(offered to it, limit × scale)")
			p.line(sxs[k], sadm[k], "#1d3557", false, "admitted by its nodes")
			if r.PartitionPolicy == "strict" {
				p.note("strict: scale = alive/(alive + suspect), 0 fenced")
			} else {
				p.note(r.PartitionPolicy + ": scale = 1, each side may use the whole limit")
			}
		}
	}
	_, err := io.WriteString(w, p.done())
	return err
}

func (r *Result) writeBytesSVG(w io.Writer) error {
	var p plot
	p.header(1, fmt.Sprintf("%s (seed %d): bytes sent per node per second; shaded: partition (orange), node down (grey)", r.Summary.Scenario, r.Summary.Seed))
	var xs, ys []float64
	ymax := 0.0
	for i, row := range r.Seconds {
		xs = append(xs, float64(i)+0.5)
		ys = append(ys, row.perNode())
		ymax = max(ymax, row.perNode())
	}
	p.panel(0, "bytes per node per second (gossip and anti-entropy)", float64(r.DurationMs)/1000, ymax, r.Shades)
	p.line(xs, ys, "#2a9d8f", false, "bytes/node/s")
	_, err := io.WriteString(w, p.done())
	return err
}
