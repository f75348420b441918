package simulator

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
)

func TestNodeRanges(t *testing.T) {
	for _, tt := range []struct {
		idx  []int
		want string
	}{
		{[]int{0}, "0"},
		{[]int{0, 1, 2, 3}, "0-3"},
		{[]int{0, 1, 2, 5}, "0-2,5"},
		{[]int{1, 3, 4, 7, 8, 9}, "1,3-4,7-9"},
		{nil, ""},
	} {
		if got := nodeRanges(tt.idx); got != tt.want {
			t.Errorf("nodeRanges(%v) = %q, want %q", tt.idx, got, tt.want)
		}
	}
}

// splitScenario is 8 nodes split by groups from 2 s to 8 s under policy,
// one key offered 4× its limit of 400 per second everywhere.
func splitScenario(t *testing.T, policy, groups string) *Scenario {
	t.Helper()
	return mustParse(t, fmt.Sprintf(`
name: sides
seed: 1
duration: 10s
nodes: 8
network: {latency: 5ms, jitter: 2ms, loss: 0}
mesh: {sync_interval: 20ms, heartbeat: 200ms, suspect_after: 600ms, dead_after: 3s, partition_policy: %s}
rules:
  - {name: api, algorithm: fixed_window, limit: 400, window: 1s}
workload:
  - {rule: api, rate: 1600, keys: 1, node_dist: uniform}
events:
  - {at: 2s, partition: %s}
  - {at: 8s, heal: true}
`, policy, groups))
}

// sideWindows returns res's side rows by side, then window start.
func sideWindows(res *Result) map[int]map[int64]SideRow {
	out := map[int]map[int64]SideRow{}
	for _, row := range res.Sides {
		if out[row.Side] == nil {
			out[row.Side] = map[int64]SideRow{}
		}
		out[row.Side][row.StartMs] = row
	}
	return out
}

// TestSidesOfAPartition checks sides.csv's figures against what the
// partition policies define (docs/design.md, "Partitions and crashes"):
// every admission belongs to one side; under strict an exact half scales
// the limit by 4/8 and keeps within it, a minority fences (scale 0, nothing
// admitted) while the majority scales by 5/8 and then reclaims the whole
// limit; under available each side keeps scale 1 and may use the whole
// limit.
func TestSidesOfAPartition(t *testing.T) {
	type want struct {
		side  int
		at    int64 // a window wholly within the split, after suspect_after and reclaim
		scale float64
	}
	for _, tt := range []struct {
		policy, groups string
		nodes          []string
		wants          []want
	}{
		{"strict", `["0-3", "4-7"]`, []string{"0-3", "4-7"}, []want{{0, 4000, 0.5}, {1, 4000, 0.5}, {0, 7000, 0.5}}},
		{"strict", `["0-2"]`, []string{"0-2", "3-7"}, []want{{0, 3000, 0}, {1, 3000, 0.625}, {1, 6000, 1}}},
		{"available", `["0-3", "4-7"]`, []string{"0-3", "4-7"}, []want{{0, 5000, 1}, {1, 5000, 1}}},
	} {
		t.Run(tt.policy+" "+tt.groups, func(t *testing.T) {
			res, err := Run(splitScenario(t, tt.policy, tt.groups), Options{})
			if err != nil {
				t.Fatal(err)
			}
			sides := sideWindows(res)
			if len(sides) != len(tt.nodes) {
				t.Fatalf("%d sides, want %d", len(sides), len(tt.nodes))
			}
			for _, w := range res.Windows {
				var adm, off uint64
				for side, rows := range sides {
					row, ok := rows[w.StartMs]
					if !ok {
						t.Fatalf("side %d has no window at %d ms", side, w.StartMs)
					}
					if row.Nodes != tt.nodes[side] {
						t.Errorf("side %d is nodes %q, want %q", side, row.Nodes, tt.nodes[side])
					}
					adm += row.AdmCred
					off += row.OffCred
					if w.StartMs+w.WindowMs <= 2000 && row.Scale != 1 {
						t.Errorf("side %d before the split (window at %d ms): scale %v, want 1", side, w.StartMs, row.Scale)
					}
				}
				if adm != w.AdmCred || off != w.OffCred {
					t.Errorf("window at %d ms: the sides admitted %d of %d offered, all nodes %d of %d", w.StartMs, adm, off, w.AdmCred, w.OffCred)
				}
			}
			for _, w := range tt.wants {
				row := sides[w.side][w.at]
				t.Logf("%+v", row)
				if row.Scale != w.scale {
					t.Errorf("side %d, window at %d ms: scale %v, want %v", w.side, w.at, row.Scale, w.scale)
				}
				if limit := uint64(400 * w.scale); row.CapSum != min(row.OffCred, limit) || float64(row.AdmCred) > 1.02*float64(row.CapSum) {
					t.Errorf("side %d, window at %d ms: admitted %d, capacity %d; want the capacity min(offered %d, %d) and admitted within it",
						w.side, w.at, row.AdmCred, row.CapSum, row.OffCred, limit)
				}
			}
			var csv, svg bytes.Buffer
			if err := res.writeSidesCSV(&csv); err != nil {
				t.Fatal(err)
			}
			if lines := strings.Split(strings.TrimSpace(csv.String()), "\n"); lines[0] != "rule,side,nodes,window_start_ms,window_ms,scale,offered_credits,admitted_credits,capacity" ||
				len(lines) != 1+len(tt.nodes)*len(res.Windows) {
				t.Errorf("sides.csv:\n%s", csv.String())
			}
			if err := res.writeAdmittedSVG(&svg); err != nil {
				t.Fatal(err)
			}
			for k, nodes := range tt.nodes {
				if panel := fmt.Sprintf("side %d of %d: nodes %s", k+1, len(tt.nodes), nodes); !strings.Contains(svg.String(), panel) {
					t.Errorf("admitted.svg has no panel %q", panel)
				}
			}
		})
	}
}

// TestNoSidesWithoutPartition: a run without a partition counts no sides
// and writes no sides.csv.
func TestNoSidesWithoutPartition(t *testing.T) {
	sc := splitScenario(t, "strict", `["0-3", "4-7"]`)
	sc.Events = nil
	out := outputs(t, sc, Options{})
	if _, ok := out["sides.csv"]; ok {
		t.Error("sides.csv written for a run without a partition")
	}
	if bytes.Contains(out["admitted.svg"], []byte("side 1")) {
		t.Error("admitted.svg has side panels without a partition")
	}
}
