package simulator

import (
	"fmt"
	"io"
)

// ClockRow is one running node's clock at the end of a run: how far its
// raw clock is skewed from true time, the offset to the mesh it has
// estimated, and where its mesh clock (raw clock plus offset) stands
// against true time. Nodes that agree on mesh time have equal
// MeshMinusTrueMs; the mesh's median clock is not true time, so the
// common value need not be 0.
type ClockRow struct {
	Index           int
	Peer            string
	SkewMs          float64
	OffsetMs        int64
	MeshMinusTrueMs int64
}

// clockRows returns a ClockRow for every node up at the end of the run.
func (s *sim) clockRows() []ClockRow {
	trueMs := epoch.UnixMilli() + s.now
	var rows []ClockRow
	for i, n := range s.nodes {
		if !n.up || n.core == nil {
			continue
		}
		rows = append(rows, ClockRow{
			Index: i, Peer: n.peer, SkewMs: float64(n.skewNs) / 1e6,
			OffsetMs:        n.core.Offset().Milliseconds(),
			MeshMinusTrueMs: n.core.MeshMs(s.local(i)) - trueMs,
		})
	}
	return rows
}

// writeClocksCSV writes clocks.csv: one ClockRow per line.
func (r *Result) writeClocksCSV(w io.Writer) error {
	fmt.Fprintln(w, "node,peer,skew_ms,offset_ms,mesh_minus_true_ms")
	for _, c := range r.Clocks {
		fmt.Fprintf(w, "%d,%s,%s,%d,%d\n", c.Index, c.Peer, ftoa(c.SkewMs, 3), c.OffsetMs, c.MeshMinusTrueMs)
	}
	return nil
}
