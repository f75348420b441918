package main

import (
	"math/rand"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/ratemesh/ratemesh/httpapi"
)

func slot(peer string, inc, admitted uint64) httpapi.SlotJSON {
	return httpapi.SlotJSON{PeerID: peer, Incarnation: inc, Admitted: admitted, Attempted: admitted * 10}
}

func TestCountWindow(t *testing.T) {
	tests := []struct {
		name  string
		views []nodeUsage
		want  windowCount
	}{{
		name: "every node answers: the sum of the own slots, stale views of others ignored",
		views: []nodeUsage{
			{Node: 0, PeerID: "a", OK: true, Slots: []httpapi.SlotJSON{slot("a", 1, 34), slot("b", 1, 30), slot("c", 1, 20)}},
			{Node: 1, PeerID: "b", OK: true, Slots: []httpapi.SlotJSON{slot("a", 1, 33), slot("b", 1, 33), slot("c", 1, 33)}},
			{Node: 2, PeerID: "c", OK: true, Slots: []httpapi.SlotJSON{slot("a", 1, 34), slot("b", 1, 33), slot("c", 1, 35)}},
		},
		want: windowCount{Window: 7, Admitted: 102, Own: []uint64{34, 33, 35}, Ratio: 1.02},
	}, {
		name: "a node that did not answer: its slot from the others' views, relayed and missing",
		views: []nodeUsage{
			{Node: 0, PeerID: "a", OK: true, Slots: []httpapi.SlotJSON{slot("a", 1, 40), slot("c", 1, 20)}},
			{Node: 1, PeerID: "b", OK: true, Slots: []httpapi.SlotJSON{slot("a", 1, 40), slot("b", 1, 30), slot("c", 1, 25)}},
			{Node: 2, PeerID: "c"},
		},
		want: windowCount{Window: 7, Admitted: 95, Own: []uint64{40, 30, 0}, Relayed: 25, Missing: []int{2}, Ratio: 0.95},
	}, {
		name: "a node stopped before the window is neither asked nor missing",
		views: []nodeUsage{
			{Node: 0, PeerID: "a", OK: true, Slots: []httpapi.SlotJSON{slot("a", 1, 50)}},
			{Node: 1, PeerID: "b", OK: true, Slots: []httpapi.SlotJSON{slot("a", 1, 49), slot("b", 1, 50)}},
			{Node: 2, Down: true},
		},
		want: windowCount{Window: 7, Admitted: 100, Own: []uint64{50, 50, 0}, Ratio: 1},
	}, {
		name: "a node killed in the window: down at the poll, its slot relayed, stopped",
		views: []nodeUsage{
			{Node: 0, PeerID: "a", OK: true, Slots: []httpapi.SlotJSON{slot("a", 1, 50), slot("c", 1, 10)}},
			{Node: 1, PeerID: "b", OK: true, Slots: []httpapi.SlotJSON{slot("a", 1, 49), slot("b", 1, 40), slot("c", 1, 12)}},
			{Node: 2, Down: true, Stopped: true},
		},
		want: windowCount{Window: 7, Admitted: 102, Own: []uint64{50, 40, 0}, Relayed: 12, Stopped: []int{2}, Ratio: 1.02},
	}, {
		name: "a restarted node: both incarnations of its peer ID count, each at its largest view",
		views: []nodeUsage{
			{Node: 0, PeerID: "a", OK: true, Slots: []httpapi.SlotJSON{slot("a", 1, 20), slot("a", 2, 15), slot("b", 1, 30)}},
			{Node: 1, PeerID: "b", OK: true, Slots: []httpapi.SlotJSON{slot("a", 1, 22), slot("a", 2, 10), slot("b", 1, 31)}},
		},
		want: windowCount{Window: 7, Admitted: 22 + 15 + 31, Own: []uint64{35, 31}, Ratio: 0.68},
	}, {
		name: "nobody answers",
		views: []nodeUsage{
			{Node: 0, PeerID: "a"},
			{Node: 1, PeerID: "b"},
		},
		want: windowCount{Window: 7, Own: []uint64{0, 0}, Missing: []int{0, 1}},
	}, {
		name: "an old release cannot tell: its slot from a new node's view, old and not missing",
		views: []nodeUsage{
			{Node: 0, PeerID: "a", OK: true, Slots: []httpapi.SlotJSON{slot("a", 1, 50), slot("b", 1, 48)}},
			{Node: 1, PeerID: "b", Old: true},
		},
		want: windowCount{Window: 7, Admitted: 98, Own: []uint64{50, 0}, Relayed: 48, Old: []int{1}, Ratio: 0.98},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := countWindow(7, 100, tt.views)
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("countWindow:\n got %+v\nwant %+v", got, tt.want)
			}
		})
	}
	if got := countWindow(1, 0, []nodeUsage{{PeerID: "a", OK: true, Slots: []httpapi.SlotJSON{slot("a", 1, 5)}}}); got.Ratio != 0 || got.Admitted != 5 {
		t.Errorf("limit 0: %+v, want ratio 0 and 5 admitted", got)
	}
}

func TestJudge(t *testing.T) {
	win := func(w int64, admitted uint64, missing ...int) windowCount {
		return windowCount{Window: w, Admitted: admitted, Ratio: float64(admitted) / 100, Missing: missing}
	}
	client := func(wc windowCount, n uint64) windowCount {
		wc.setClient(n, 100)
		return wc
	}
	tests := []struct {
		name     string
		s        summary
		pass     bool
		failures []string // substrings, one per failure, in order
		warnings int
		worst    float64
		over     int
	}{{
		name:  "within the bound, 1.02 × itself included",
		s:     summary{Scenario: "soak", Windows: []windowCount{win(3, 102), win(1, 99), win(2, 100)}},
		pass:  true,
		worst: 1.02,
	}, {
		name:     "one window over",
		s:        summary{Scenario: "soak", Windows: []windowCount{win(1, 100), win(2, 103), win(3, 101)}},
		failures: []string{"1 of 3 windows admitted more than 1.02 × 100 (worst 1.030 in window 2)"},
		worst:    1.03,
		over:     1,
	}, {
		name:     "no window counted",
		s:        summary{Scenario: "crash"},
		failures: []string{"no window was counted"},
	}, {
		name:     "skew logged on one host",
		s:        summary{Scenario: "soak", Windows: []windowCount{win(1, 90)}, SkewLines: []string{"node 1: … beyond max_skew …"}},
		failures: []string{"1 clock skew lines"},
		worst:    0.9,
	}, {
		name:     "a short burst",
		s:        summary{Scenario: "burst", BurstWant: 900, Bursts: []burstResult{{Key: "burst-1", Sent: 900, Allowed: 900, Admitted: 900}, {Key: "burst-2", Window: 9, Sent: 900, Allowed: 871, Admitted: 872, Reasons: map[string]int{"admitted": 871, "share": 29}}}},
		failures: []string{"burst on burst-2 in window 9 admitted 871 of 900"},
		warnings: 1, // the servers counted 872
	}, {
		name:     "a burst scenario without a burst",
		s:        summary{Scenario: "burst", BurstWant: 900},
		failures: []string{"no burst was sent"},
	}, {
		name: "a burst scenario without a flood counts no windows and passes",
		s:    summary{Scenario: "burst", BurstWant: 900, Bursts: []burstResult{{Sent: 900, Allowed: 900, Admitted: 900}}},
		pass: true,
	}, {
		name: "warnings: incomplete windows and a generator behind, still a pass",
		s: summary{Scenario: "soak", Windows: []windowCount{win(1, 100, 2), {Window: 2, Admitted: 90, Ratio: 0.9, Stopped: []int{1}}, win(3, 95)},
			Load: loadReport{HotTarget: 1000, HotOffered: 500, FellBehind: true}, Warnings: []string{"--cpu-max skipped: …"}},
		pass:     true,
		warnings: 3,
		worst:    1,
	}, {
		name:     "the clients were told of more than the servers counted: the clients' count is judged",
		s:        summary{Scenario: "rolling", Windows: []windowCount{client(win(1, 100), 100), client(win(2, 101), 104)}},
		failures: []string{"1 of 2 windows admitted more than 1.02 × 100 (worst 1.040 in window 2)"},
		worst:    1.04,
		over:     1,
	}, {
		name:     "a request denied as joining fails any scenario",
		s:        summary{Scenario: "soak", Windows: []windowCount{win(1, 100)}, Load: loadReport{Reasons: map[string]int64{"admitted": 100, "joining": 3}, Joining: []string{"2.5s: node 1"}}},
		failures: []string{"3 requests denied as joining (the first: [2.5s: node 1])"},
		worst:    1,
	}, {
		name:     "an upgrade fails on a join timeout and a malformed batch",
		s:        summary{Scenario: "upgrade", Windows: []windowCount{win(1, 100)}, JoinTimeouts: []string{"node 0: join timed out"}, Malformed: []string{"node 1 (/tmp/old): 12"}},
		failures: []string{"1 joins timed out", "batches refused as malformed: [node 1 (/tmp/old): 12]"},
		worst:    1,
	}, {
		name:     "a rolling restart warns of them",
		s:        summary{Scenario: "rolling", Windows: []windowCount{win(1, 100)}, JoinTimeouts: []string{"node 0: join timed out"}, Malformed: []string{"node 1: 2"}},
		pass:     true,
		warnings: 2,
		worst:    1,
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := tt.s
			s.Limit, s.Bound = 100, 1.02
			s.judge()
			if s.Pass != tt.pass || len(s.Failures) != len(tt.failures) {
				t.Fatalf("pass %v, failures %q; want pass %v and %d failures", s.Pass, s.Failures, tt.pass, len(tt.failures))
			}
			for i, f := range tt.failures {
				if !strings.Contains(s.Failures[i], f) {
					t.Errorf("failure %d: %q, want it to contain %q", i, s.Failures[i], f)
				}
			}
			if len(s.Warnings) != tt.warnings {
				t.Errorf("warnings %q, want %d", s.Warnings, tt.warnings)
			}
			if s.WorstRatio != tt.worst || s.Over != tt.over || s.Counted != len(tt.s.Windows) {
				t.Errorf("worst %v, over %d, counted %d; want %v, %d, %d", s.WorstRatio, s.Over, s.Counted, tt.worst, tt.over, len(tt.s.Windows))
			}
			for i := 1; i < len(s.Windows); i++ {
				if s.Windows[i-1].Window >= s.Windows[i].Window {
					t.Errorf("windows not in order: %v", s.Windows)
				}
			}
		})
	}
}

func TestPausePlan(t *testing.T) {
	a, b := rand.New(rand.NewSource(7)), rand.New(rand.NewSource(7))
	for range 1000 {
		gap, node, length := pausePlan(a, time.Second, 3)
		gap2, node2, length2 := pausePlan(b, time.Second, 3)
		if gap != gap2 || node != node2 || length != length2 {
			t.Fatalf("the same seed drew (%v %d %v) and (%v %d %v)", gap, node, length, gap2, node2, length2)
		}
		if gap < 500*time.Millisecond || gap > 1500*time.Millisecond || node < 0 || node > 2 ||
			length < 50*time.Millisecond || length > 500*time.Millisecond {
			t.Fatalf("out of range: gap %v, node %d, length %v", gap, node, length)
		}
	}
}

func TestWindowLine(t *testing.T) {
	got := windowLine(windowCount{Window: 5, Admitted: 104, AtClient: 101, Own: []uint64{50, 30, 0}, Relayed: 24, Missing: []int{2}, Ratio: 1.04}, 100, 1.02)
	want := "window 5: 104 admitted (own [50 30 0], relayed 24), 101 at the clients, 1.040 of 100, nodes [2] did not answer OVER"
	if got != want {
		t.Errorf("windowLine:\n got %q\nwant %q", got, want)
	}
	got = windowLine(windowCount{Window: 6, Admitted: 60, AtClient: 103, Own: []uint64{60, 0}, Old: []int{1}, Ratio: 1.03}, 100, 1.02)
	want = "window 6: 60 admitted (own [60 0]), 103 at the clients, 1.030 of 100, nodes [1] cannot tell (an old release) OVER"
	if got != want {
		t.Errorf("windowLine:\n got %q\nwant %q", got, want)
	}
}

// TestPlaceWindow: an admission's window is the one that ends its
// reset_after_ms after the round trip's middle, wherever in the window
// it was decided; a round trip over half a window places nothing.
func TestPlaceWindow(t *testing.T) {
	at := func(ms int64) time.Time { return time.UnixMilli(ms) }
	tests := []struct {
		sent, recv, ra, wms int64
		w                   int64
		ok                  bool
	}{
		{sent: 10_000, recv: 10_002, ra: 999, wms: 1000, w: 10, ok: true},  // decided at 10.001 s: window 10 ends at 11 s
		{sent: 10_998, recv: 11_004, ra: 1, wms: 1000, w: 10, ok: true},    // sent at the end of window 10, decided in it
		{sent: 10_998, recv: 11_004, ra: 998, wms: 1000, w: 11, ok: true},  // … or just after, in window 11
		{sent: 10_100, recv: 10_500, ra: 600, wms: 1000, w: 10, ok: true},  // a 400 ms hold, decided at its end: still window 10
		{sent: 10_100, recv: 10_500, ra: 999, wms: 1000, w: 10, ok: true},  // … or at its start
		{sent: 10_100, recv: 10_700, ra: 400, wms: 1000, w: 0, ok: false},  // 600 ms: over half a window
		{sent: 10_000, recv: 9_999, ra: 100, wms: 1000, w: 0, ok: false},   // a clock that went back
		{sent: 10_000, recv: 10_001, ra: -1, wms: 1000, w: 0, ok: false},   // no reset_after
		{sent: 20_000, recv: 20_050, ra: 4_975, wms: 5000, w: 4, ok: true}, // 5 s windows: window 4 ends at 25 s
		{sent: 20_000, recv: 20_050, ra: 0, wms: 5000, w: 3, ok: true},     // decided at the very end of window 3
	}
	for _, tt := range tests {
		w, ok := placeWindow(at(tt.sent), at(tt.recv), tt.ra, tt.wms)
		if w != tt.w || ok != tt.ok {
			t.Errorf("placeWindow(%d, %d, %d, %d) = %d %v, want %d %v", tt.sent, tt.recv, tt.ra, tt.wms, w, ok, tt.w, tt.ok)
		}
	}
}

// TestTally: reasons of every answer, the hot key's admissions by window,
// the first joining denials noted, unplaced admissions counted.
func TestTally(t *testing.T) {
	var tl tally
	since := time.UnixMilli(10_000)
	at := func(ms int64) time.Time { return time.UnixMilli(ms) }
	tl.add(0, true, at(10_100), at(10_101), allowAnswer{Allowed: true, Reason: "admitted", ResetAfterMs: 899}, 1000, since)
	tl.add(1, true, at(10_200), at(10_201), allowAnswer{Allowed: true, Reason: "admitted", ResetAfterMs: 799}, 1000, since)
	tl.add(1, false, at(10_200), at(10_201), allowAnswer{Allowed: true, Reason: "admitted", ResetAfterMs: 799}, 1000, since) // not the hot key
	tl.add(2, true, at(11_200), at(11_201), allowAnswer{Reason: "share", ResetAfterMs: 799}, 1000, since)                    // denied
	tl.add(2, true, at(12_500), at(12_501), allowAnswer{Reason: "joining"}, 1000, since)
	tl.add(2, true, at(13_000), at(13_900), allowAnswer{Allowed: true, Reason: "admitted", ResetAfterMs: 100}, 1000, since) // too slow to place
	if got := tl.count(10); got != 2 {
		t.Errorf("window 10: %d admitted, want 2", got)
	}
	if got := tl.count(11); got != 0 {
		t.Errorf("window 11: %d admitted, want 0 (a denial)", got)
	}
	want := map[string]int64{"admitted": 4, "share": 1, "joining": 1}
	if !reflect.DeepEqual(tl.reasons, want) {
		t.Errorf("reasons %v, want %v", tl.reasons, want)
	}
	if !reflect.DeepEqual(tl.joining, []string{"2.5s: node 2"}) || tl.unplaced != 1 {
		t.Errorf("joining %q, unplaced %d; want [2.5s: node 2] and 1", tl.joining, tl.unplaced)
	}
}

func TestSumMetric(t *testing.T) {
	text := `# HELP ratemesh_mesh_rejected_total Received batches refused by the validator, by channel and reason.
# TYPE ratemesh_mesh_rejected_total counter
ratemesh_mesh_rejected_total{channel="gossip",reason="malformed"} 3
ratemesh_mesh_rejected_total{channel="gossip",reason="author"} 7
ratemesh_mesh_rejected_total{channel="sync",reason="malformed"} 2
ratemesh_mesh_rejected_totalx{channel="sync",reason="malformed"} 100
ratemesh_messages_refused_total{reason="malformed"} 40
`
	got, err := sumMetric(strings.NewReader(text), "ratemesh_mesh_rejected_total", `reason="malformed"`)
	if err != nil || got != 5 {
		t.Errorf("sumMetric = %d, %v; want 5", got, err)
	}
	if _, err := sumMetric(strings.NewReader(`ratemesh_mesh_rejected_total{reason="malformed"} x`), "ratemesh_mesh_rejected_total", `reason="malformed"`); err == nil {
		t.Error("a value that is not a number: no error")
	}
}

func TestPauserDuring(t *testing.T) {
	at := time.Unix(1000, 0)
	p := &pauser{log: []pause{
		{node: 0, start: at.Add(-300 * time.Millisecond), end: at.Add(-100 * time.Millisecond)}, // before
		{node: 1, start: at.Add(-100 * time.Millisecond), end: at.Add(50 * time.Millisecond)},   // into it
		{node: 2, start: at.Add(40 * time.Millisecond), end: at.Add(270 * time.Millisecond)},    // within
		{node: 0, start: at.Add(400 * time.Millisecond), end: at.Add(600 * time.Millisecond)},   // after
	}}
	got := p.during(at, at.Add(300*time.Millisecond))
	want := []string{"node 1 from -100ms for 150ms", "node 2 from +40ms for 230ms"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("during: %q, want %q", got, want)
	}
}
