package simulator

import (
	"strings"
	"testing"
	"time"
)

// edgeScenario is two idle nodes 5 ms apart, ticking every 100 ms, with
// one key that the test changes itself (the workload offers nothing).
const edgeScenario = `
name: edge
duration: 3s
nodes: 2
network: {latency: 5ms}
mesh: {sync_interval: 100ms%s}
rules:
  - {name: api, algorithm: fixed_window, limit: 1000, window: 10s}
workload:
  - {rule: api, rate: 0, keys: 1, node_dist: single}
`

// TestLeadingEdge makes one change at node 0 and measures when node 1
// has merged it. With the leading edge (the runtime's, node.Config.
// PublishGap: sync_interval/2 = 50 ms by default) a change made when
// node 0's last batch is at least the gap old leaves at once, and one
// made sooner leaves the gap after that batch, both well before node 0's
// next sync tick; with publish_gap: tick it waits for the tick.
func TestLeadingEdge(t *testing.T) {
	cases := []struct {
		name, mesh string
		sinceLast  time.Duration // node 0's last batch this long before the change; 0: at least the gap
		want       func(t0, last, tick int64) int64
	}{
		{"idle: at once", "", 0, func(t0, _, _ int64) int64 { return t0 + 5 }},
		{"10ms after a batch: 50ms after it", "", 10 * time.Millisecond, func(_, last, _ int64) int64 { return last + 50 + 5 }},
		{"gap 20ms", ", publish_gap: 20ms", 10 * time.Millisecond, func(_, last, _ int64) int64 { return last + 20 + 5 }},
		{"tick only", ", publish_gap: tick", 0, func(_, _, tick int64) int64 { return tick + 5 }},
		{"tick only, negative", ", publish_gap: -1ms", 10 * time.Millisecond, func(_, _, tick int64) int64 { return tick + 5 }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			sc := mustParse(t, strings.Replace(edgeScenario, "%s", c.mesh, 1))
			s, err := newSim(sc, Options{eager: true}) // eager: node 1 merges each batch as it arrives
			if err != nil {
				t.Fatal(err)
			}
			n0 := s.nodes[0]
			t0, last, tick := int64(-1), int64(0), int64(0)
			for s.now = 0; s.now < s.durMs; s.now++ {
				if t0 < 0 && s.now >= 500 && n0.nextTick-s.now >= 60 {
					since := s.local(0).Sub(n0.core.LastPublished())
					if c.sinceLast == 0 && since >= 50*time.Millisecond || c.sinceLast != 0 && since == c.sinceLast {
						// One change at node 0, made as generate's requests are.
						t0, tick = s.now, n0.nextTick
						last = s.now - since.Milliseconds()
						s.calls = append(s.calls, allowCall{ws: s.wls[0], ra: s.rules[0], node: 0})
					}
				}
				if err := s.step(); err != nil {
					t.Fatal(err)
				}
				if t0 < 0 {
					continue
				}
				u, err := s.nodes[1].core.Usage(s.local(1), "api", "w0-k0")
				if err != nil {
					t.Fatal(err)
				}
				if u.Total > 0 {
					if want := c.want(t0, last, tick); s.now != want {
						t.Errorf("change at %d ms (node 0's last batch at %d ms, next tick at %d ms) merged by node 1 at %d ms, want %d ms",
							t0, last, tick, s.now, want)
					}
					return
				}
			}
			t.Fatalf("change at %d ms never merged by node 1 (no change made: %v)", t0, t0 < 0)
		})
	}
}
