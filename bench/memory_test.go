package main

import (
	"context"
	"io"
	"math"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/ratemesh/ratemesh/httpapi"
)

func TestNewMemNode(t *testing.T) {
	base := memReading{rss: 100 << 20, heap: 40 << 20}
	filled := memReading{rss: 100<<20 + 270_000, heap: 40<<20 + 190_000}
	idle := memReading{rss: 100<<20 + 280_000}
	n := newMemNode(base, filled, idle, 1000, 0.012, 2000)
	want := memNode{RSSBase: 100 << 20, RSSFilled: 100<<20 + 270_000, RSSIdle: 100<<20 + 280_000,
		RSSPerKey: 270, RSSPerKeyIdle: 280, HeapPerKey: 190, IdleCores: 0.012, KeysHeld: 2000}
	if n != want {
		t.Fatalf("newMemNode = %+v, want %+v", n, want)
	}
	// RSS can shrink; a heap not read gives no heap figure.
	n = newMemNode(memReading{rss: 2000}, memReading{rss: 1000, heap: 5}, memReading{rss: 1500}, 1000, 0, 0)
	if n.RSSPerKey != -1 || n.RSSPerKeyIdle != -0.5 || n.HeapPerKey != 0 {
		t.Fatalf("shrinking, no base heap: %+v", n)
	}
}

func TestIdleCores(t *testing.T) {
	secs, cores, err := idleCores(context.Background(), []int{os.Getpid(), os.Getpid()}, 60*time.Millisecond)
	if err != nil || secs < 0.06 || len(cores) != 2 || cores[0] < 0 || cores[0] > 1 {
		t.Fatalf("idleCores = %v, %v, %v", secs, cores, err)
	}
	if _, _, err := idleCores(context.Background(), []int{1 << 30}, time.Millisecond); err == nil {
		t.Fatal("a pid that does not exist: no error")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, _, err := idleCores(ctx, []int{os.Getpid()}, time.Hour); err == nil {
		t.Fatal("cancelled: no error")
	}
}

// memRounds is a report of two rounds of memory and memory-mesh: the
// lone nodes' RSS per key (ratemesh, Gubernator) and the mesh members'.
func memRounds(lone [][2]float64, mesh [][3]float64) *report {
	rep := &report{}
	for r := range max(len(lone), len(mesh)) {
		rr := rep.round(r + 1)
		if r < len(lone) {
			rr.Memory = append(rr.Memory,
				memResult{Scenario: "memory", System: "ratemesh", FillPerSecond: 1000 * lone[r][0], memNode: memNode{RSSPerKey: lone[r][0], IdleCores: 0.01}},
				memResult{Scenario: "memory", System: "gubernator", FillPerSecond: 1000 * lone[r][1], memNode: memNode{RSSPerKey: lone[r][1], RSSPerKeyIdle: lone[r][1], HeapPerKey: lone[r][1] - 100}})
		}
		if r < len(mesh) {
			m := mesh[r]
			rr.Memory = append(rr.Memory, memResult{Scenario: "memory-mesh", System: "ratemesh", MergeSeconds: float64(r + 1), Resent: 10 * r,
				memNode: memNode{RSSPerKey: m[0], RSSPerKeyIdle: m[0] + 1, HeapPerKey: m[0] - 50},
				Merged:  []memNode{{RSSPerKey: m[1], RSSPerKeyIdle: m[1] + 1}, {RSSPerKey: m[2], RSSPerKeyIdle: m[2] + 1}}})
		}
	}
	return rep
}

func rowOf(t *testing.T, rows []summaryRow, scenario, metric string) summaryRow {
	t.Helper()
	for _, r := range rows {
		if r.Scenario == scenario && r.Metric == metric {
			return r
		}
	}
	t.Fatalf("no row %q / %q", scenario, metric)
	return summaryRow{}
}

func near(a, b stat) bool {
	return a.N == b.N && math.Abs(a.Min-b.Min) < 1e-9 && math.Abs(a.Median-b.Median) < 1e-9 && math.Abs(a.Max-b.Max) < 1e-9
}

func TestSummarizeMemoryMesh(t *testing.T) {
	o, err := parseOptions([]string{"--scenarios", "memory-mesh,memory", "--mem-keys", "1000000"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(o.Scenarios, ","); got != "memory,memory-mesh" {
		t.Fatalf("--scenarios memory-mesh,memory = %s, want memory,memory-mesh (run order)", got)
	}
	rep := memRounds([][2]float64{{280, 500}, {290, 400}}, [][3]float64{{250, 200, 250}, {300, 220, 260}})
	// A failed mesh round counts nowhere.
	rep.round(3).Memory = []memResult{{Scenario: "memory-mesh", System: "ratemesh", Err: "merges: not within 1m", memNode: memNode{RSSPerKey: 9999}}}
	rows := summarize(rep, o)
	const mesh = "3 members, 1M keys once"
	for _, c := range []struct {
		metric        string
		rm, gb, ratio stat
		against, unit string
	}{
		// The deciding member against Gubernator's lone node, round by round: 250/500, 300/400.
		{"RSS growth per key, deciding member", stat{2, 250, 275, 300}, stat{2, 400, 450, 500}, stat{2, 0.5, 0.625, 0.75}, "gubernator lone node", "bytes"},
		{"… after --mem-idle, deciding member", stat{2, 251, 276, 301}, stat{2, 400, 450, 500}, stat{2, 251.0 / 500, (251.0/500 + 301.0/400) / 2, 301.0 / 400}, "gubernator lone node", "bytes"},
		// Both merging members of both rounds, pooled: 200/500, 250/500, 220/400, 260/400.
		{"RSS growth per key, merging members", stat{4, 200, 235, 260}, stat{2, 400, 450, 500}, stat{4, 0.4, 0.525, 0.65}, "gubernator lone node", "bytes"},
		// The heap is a figure only where it was read: not at the merging members here.
		// 200/400, 250/300.
		{"Go heap in use per key, deciding member", stat{2, 200, 225, 250}, stat{2, 300, 350, 400}, stat{2, 0.5, (0.5 + 250.0/300) / 2, 250.0 / 300}, "gubernator lone node", "bytes"},
		{"Go heap in use per key, merging members", stat{}, stat{2, 300, 350, 400}, stat{}, "gubernator lone node", "bytes"},
		{"every member holds them, s later", stat{2, 1, 1.5, 2}, stat{}, stat{}, "", "seconds"},
		{"batches denied (fenced …) and sent again", stat{2, 0, 5, 10}, stat{}, stat{}, "", "count"},
	} {
		r := rowOf(t, rows, mesh, c.metric)
		if !near(r.Ratemesh, c.rm) || !near(r.Other, c.gb) || !near(r.Ratio, c.ratio) || r.Against != c.against || r.Unit != c.unit {
			t.Errorf("%s: ratemesh %+v, other %+v (%q), ratio %+v, unit %s; want %+v, %+v (%q), %+v, %s",
				c.metric, r.Ratemesh, r.Other, r.Against, r.Ratio, r.Unit, c.rm, c.gb, c.against, c.ratio, c.unit)
		}
	}
	// memory's own rows, lone against lone.
	r := rowOf(t, rows, "1 node, 1M keys once", "RSS growth per key")
	if !near(r.Ratemesh, stat{2, 280, 285, 290}) || !near(r.Ratio, stat{2, 0.56, 0.6425, 0.725}) || r.Against != "gubernator" {
		t.Errorf("memory RSS row %+v", r)
	}
	r = rowOf(t, rows, "1 node, 1M keys once", "Go heap in use per key")
	if r.Ratemesh.N != 0 || r.Other.N != 2 || r.Ratio.N != 0 {
		t.Errorf("memory heap row (no ratemesh heap read) %+v", r)
	}
	r = rowOf(t, rows, "1 node, 1M keys once", "fill, keys/s (batches of 64)")
	if !near(r.Ratemesh, stat{2, 280_000, 285_000, 290_000}) || !near(r.Other, stat{2, 400_000, 450_000, 500_000}) {
		t.Errorf("memory fill row %+v", r)
	}

	// memory-mesh alone: the members' figures, nothing to compare with.
	o.Scenarios = []string{"memory-mesh"}
	rows = summarize(memRounds(nil, [][3]float64{{250, 200, 250}}), o)
	r = rowOf(t, rows, mesh, "RSS growth per key, merging members")
	if !near(r.Ratemesh, stat{2, 200, 225, 250}) || r.Other.N != 0 || r.Ratio.N != 0 {
		t.Errorf("without memory: %+v", r)
	}
	if len(rows) != 2*len(memMetrics)+2 {
		t.Errorf("%d rows, want %d", len(rows), 2*len(memMetrics)+2)
	}
}

func TestMemResultLines(t *testing.T) {
	m := memResult{Scenario: "memory-mesh", System: "ratemesh", Keys: 1_000_000, FillSeconds: 20, FillPerSecond: 50_000, MergeSeconds: 1.25, IdleSeconds: 10,
		memNode: memNode{RSSBase: 50 << 20, RSSFilled: 300 << 20, RSSPerKey: 262.1, IdleCores: 0.0104, KeysHeld: 1_001_000},
		Merged:  []memNode{{RSSPerKey: 226}, {RSSPerKey: 240.4}}}
	got := strings.Join(m.lines(), "\n")
	for _, want := range []string{
		"ratemesh   1M keys in 20.0 s (50000/s) at member 1, held by every member 1.2 s later",
		"  member 1, decided: RSS 50.0 MiB → 300.0 MiB (262 B/key)",
		"idle 0.010 cores; keys held 1001000",
		"  member 2, merged:  RSS 0.0 MiB → 0.0 MiB (226 B/key)",
		"  member 3, merged:  RSS 0.0 MiB → 0.0 MiB (240 B/key)",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("lines lack %q:\n%s", want, got)
		}
	}
	if n := len(m.lines()); n != 4 {
		t.Errorf("%d lines, want 4", n)
	}
	lone := memResult{System: "gubernator", Keys: 100_000, IdleSeconds: 3, memNode: memNode{RSSPerKey: 650}, Note: " (3 unexpired keys evicted from the LRU at node 1: the figures are low)"}
	if l := lone.lines(); len(l) != 1 || !strings.HasPrefix(l[0], "gubernator 100k keys in 0.0 s (0/s): RSS") || !strings.HasSuffix(l[0], "keys held 0"+lone.Note) {
		t.Errorf("lone lines %q", l)
	}
	if l := (memResult{System: "ratemesh", Err: "fill: boom"}).lines(); len(l) != 1 || l[0] != "ratemesh   error: fill: boom" {
		t.Errorf("error lines %q", l)
	}
}

func TestMemberDenial(t *testing.T) {
	res := func(reason string, retry int64) httpapi.AllowResponse {
		return httpapi.AllowResponse{Reason: reason, RetryAfterMs: retry}
	}
	for _, c := range []struct {
		name string
		r    httpapi.MultiAllowResponse
		wait time.Duration
		ok   bool
	}{
		{"fenced: a heartbeat", httpapi.MultiAllowResponse{Results: []httpapi.AllowResponse{res("fenced", 500), res("fenced", 500)}}, 500 * time.Millisecond, true},
		{"stale and joining, the longest", httpapi.MultiAllowResponse{Results: []httpapi.AllowResponse{res("stale", 40), res("joining", 2500)}}, time.Second, true},
		{"no wait named: 10 ms", httpapi.MultiAllowResponse{Results: []httpapi.AllowResponse{res("stale", 0)}}, 10 * time.Millisecond, true},
		{"a key's own denial is not the member's", httpapi.MultiAllowResponse{Results: []httpapi.AllowResponse{res("fenced", 500), res("key_cap", 0)}}, 0, false},
		{"limit", httpapi.MultiAllowResponse{Results: []httpapi.AllowResponse{res("limit", 100)}}, 0, false},
		{"all-or-nothing: admitted beside a fenced one", httpapi.MultiAllowResponse{Results: []httpapi.AllowResponse{res("admitted", 0), res("fenced", 500)}}, 500 * time.Millisecond, true},
		{"allowed", httpapi.MultiAllowResponse{Allowed: true, Results: []httpapi.AllowResponse{res("admitted", 0)}}, 0, false},
		{"no results", httpapi.MultiAllowResponse{}, 10 * time.Millisecond, false},
	} {
		wait, ok := memberDenial(c.r)
		if ok != c.ok || (ok && wait != c.wait) {
			t.Errorf("%s: memberDenial = %v, %v; want %v, %v", c.name, wait, ok, c.wait, c.ok)
		}
	}
}
