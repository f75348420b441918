package main

import (
	"fmt"
	"sort"

	"github.com/ratemesh/ratemesh/httpapi"
)

// nodeUsage is one node's answer to GET /v1/usage?window=W: the peer ID
// of the node asked (from its ready line) and the slots it holds for the
// window. OK is false when the node did not answer for that window in
// time (paused or starved past the window). Down marks a node the
// harness had stopped by the time of the poll: it is not asked, and its
// slots count from the others' views. Stopped marks a node the harness
// stopped during the window or so soon after it that it may not have
// published all it admitted there (a SIGKILL loses what it had not
// published yet).
type nodeUsage struct {
	Node    int
	PeerID  string
	OK      bool
	Down    bool
	Old     bool // its release does not serve window=N (400 naming window)
	Stopped bool
	Slots   []httpapi.SlotJSON
}

// windowCount is what the mesh admitted for one key in one ended window,
// counted at the servers, and what the clients were told.
type windowCount struct {
	Window   int64  `json:"window"`
	Admitted uint64 `json:"admitted"`
	// AtClient is how many admitted answers the clients got for the
	// window (tally, placeWindow). It counts what a node admitted and
	// never published, which a SIGKILL loses from every server's view,
	// and a node that cannot answer /v1/usage?window=N (a release before
	// 27aa619), which leaves its slot to the others' views.
	AtClient uint64 `json:"at_client"`
	// Own is, per node, the admitted count of the slots carrying the
	// node's own peer ID as that node itself reports them (0 when it did
	// not answer).
	Own []uint64 `json:"own"`
	// Relayed is the part of Admitted found only in other nodes' views:
	// slots of a peer that did not answer for this window (killed, or
	// restarted and not asked). It is a lower bound of what that peer
	// admitted: its admissions it never published are lost with it.
	Relayed uint64 `json:"relayed,omitempty"`
	// Missing lists the running nodes that did not answer.
	Missing []int `json:"missing,omitempty"`
	// Old lists the running nodes whose release does not serve
	// /v1/usage?window=N: their slots count from the others' views.
	Old []int `json:"old,omitempty"`
	// Stopped lists the nodes stopped during the window or just after.
	Stopped []int `json:"stopped,omitempty"`
	// Ratio is the larger of Admitted and AtClient over the limit.
	Ratio float64 `json:"ratio"`
}

// most is the larger of the servers' and the clients' counts: each can
// miss what the other sees, and neither counts what was not admitted.
func (wc *windowCount) most() uint64 { return max(wc.Admitted, wc.AtClient) }

// setClient records the clients' count of the window and sets Ratio.
func (wc *windowCount) setClient(n, limit uint64) {
	wc.AtClient = n
	wc.Ratio = 0
	if limit > 0 {
		wc.Ratio = float64(wc.most()) / float64(limit)
	}
}

type slotKey struct {
	peer string
	inc  uint64
}

// countWindow sums what the nodes admitted in window w from their answers.
//
// Each slot (peer ID, incarnation) is a grow-only counter its owner alone
// increments, merged elsewhere by max, so every view of a slot is at most
// the owner's, and the owner's is final once the window has ended. The
// count takes, per slot, the largest admitted any node reports: for a
// node that answered, that is its own slot as it reports it (the sum of
// the nodes' own slots when every node answered); a slot whose peer did
// not answer, such as a killed incarnation, still counts with what its
// peers heard of it (Relayed). A zero limit gives a zero Ratio.
func countWindow(w int64, limit uint64, views []nodeUsage) windowCount {
	wc := windowCount{Window: w, Own: make([]uint64, len(views))}
	best := map[slotKey]uint64{}
	answered := map[string]bool{}
	for i, v := range views {
		if v.Stopped {
			wc.Stopped = append(wc.Stopped, v.Node)
		}
		if !v.OK {
			switch {
			case v.Old:
				wc.Old = append(wc.Old, v.Node)
			case !v.Down:
				wc.Missing = append(wc.Missing, v.Node)
			}
			continue
		}
		answered[v.PeerID] = true
		for _, s := range v.Slots {
			k := slotKey{s.PeerID, s.Incarnation}
			best[k] = max(best[k], s.Admitted)
			if s.PeerID == v.PeerID {
				wc.Own[i] += s.Admitted
			}
		}
	}
	for k, a := range best {
		wc.Admitted += a
		if !answered[k.peer] {
			wc.Relayed += a
		}
	}
	if limit > 0 {
		wc.Ratio = float64(wc.Admitted) / float64(limit)
	}
	return wc
}

// burstResult is one burst: Sent requests at once on a fresh key, Allowed
// of them admitted as the answers say, Admitted as the servers counted
// the windows the burst touched.
type burstResult struct {
	Key      string         `json:"key"`
	Window   int64          `json:"window"`
	Sent     int            `json:"sent"`
	Allowed  int            `json:"allowed"`
	Admitted uint64         `json:"admitted_at_servers"`
	Failed   int            `json:"failed"`
	Reasons  map[string]int `json:"reasons"`
	TookMs   int64          `json:"took_ms"`
	Pauses   []string       `json:"pauses,omitempty"` // the pauses that overlapped it
}

// summary is a run's result; judge fills Pass and Failures.
type summary struct {
	Scenario string  `json:"scenario"`
	Nodes    int     `json:"nodes"`
	Policy   string  `json:"policy"`
	Limit    uint64  `json:"limit"`
	WindowMs int64   `json:"window_ms"`
	Bound    float64 `json:"bound"`
	Seed     int64   `json:"seed"`

	Windows      []windowCount `json:"windows"`
	Counted      int           `json:"windows_counted"`
	Over         int           `json:"windows_over"`
	Incomplete   int           `json:"windows_incomplete"`
	WorstRatio   float64       `json:"worst_ratio"`
	WorstWindow  int64         `json:"worst_window"`
	MeanAdmitted float64       `json:"mean_admitted"`

	Bursts     []burstResult `json:"bursts,omitempty"`
	BurstWant  int           `json:"burst_want,omitempty"`
	Load       loadReport    `json:"load"`
	Starve     starveReport  `json:"starvation"`
	Events     []string      `json:"events,omitempty"`
	SkewLines  []string      `json:"skew_lines"`
	ElapsedSec float64       `json:"elapsed_s"`

	// JoinTimeouts are the nodes' "join timed out" log lines: a node that
	// waited its whole join_timeout for a peer's state.
	JoinTimeouts []string `json:"join_timeouts"`
	// Malformed is, per node run (rolling, upgrade), the batches it
	// refused as malformed, read from its /metrics before it stopped and
	// at the end: a release refusing a peer's batch.
	Malformed []string `json:"malformed,omitempty"`
	// Upgrade names the binaries of an upgrade: the old release's and
	// the new build's.
	Upgrade *upgradeReport `json:"upgrade,omitempty"`

	Interrupted bool     `json:"interrupted,omitempty"`
	Pass        bool     `json:"pass"`
	Failures    []string `json:"failures,omitempty"`
	Warnings    []string `json:"warnings,omitempty"`
}

// loadReport is what the generator offered and had answered.
type loadReport struct {
	HotTarget   float64 `json:"hot_target_per_s"`
	HotOffered  float64 `json:"hot_offered_per_s"`
	HotAllowed  int64   `json:"hot_allowed"`
	KeysTarget  float64 `json:"keys_target_per_s"`
	KeysOffered float64 `json:"keys_offered_per_s"`
	Sent        int64   `json:"sent"`
	Failed      int64   `json:"failed"`
	Missed      int64   `json:"missed"` // send slots the generator dropped, behind schedule
	Up          float64 `json:"up"`     // the nodes' time not paused, a fraction: the share of the target a generator can offer
	FellBehind  bool    `json:"fell_behind"`
	Seconds     float64 `json:"seconds"`
	// Reasons counts every answer (hot key and rotating keys) by reason.
	Reasons map[string]int64 `json:"reasons"`
	// Joining describes the first denials as joining (when, which node).
	Joining []string `json:"joining,omitempty"`
	// Unplaced counts hot-key admissions whose window the clients could
	// not tell (a round trip over half a window): in no AtClient.
	Unplaced uint64 `json:"unplaced,omitempty"`
}

// upgradeReport is an upgrade's binaries.
type upgradeReport struct {
	OldBin string `json:"old_bin"`
	NewBin string `json:"new_bin"`
}

// starveReport is how starved the host was.
type starveReport struct {
	BusyProcs     int     `json:"busy_procs"`
	CPUMax        string  `json:"cpu_max,omitempty"`
	Cgroup        string  `json:"cgroup,omitempty"`
	Pauses        int     `json:"pauses"`
	PausedMs      int64   `json:"paused_ms"`
	LoadAvg1Start float64 `json:"loadavg1_start"` // before the busy loops: the host's own load
	LoadAvg1Max   float64 `json:"loadavg1_max"`
	LoadAvg1End   float64 `json:"loadavg1_end"`
	RunnableAvg   float64 `json:"runnable_avg"`
}

// judge sets the summary's totals and verdict from its windows and
// bursts, once (it adds to Failures and Warnings): it fails when a window
// admitted more than Bound × Limit (at the servers or at the clients), a
// burst admitted fewer than BurstWant, no window was counted, a node
// logged a clock skew (the nodes share one host's clock, so any skew is
// false), or a request was denied as joining; an upgrade also fails when
// a join timed out or a node refused a batch as malformed.
// A generator that fell behind its target rate is a warning, not a
// failure: the bound was tested with less load than asked.
func (s *summary) judge() {
	s.Counted, s.Over, s.Incomplete = len(s.Windows), 0, 0
	s.WorstRatio, s.WorstWindow, s.MeanAdmitted = 0, 0, 0
	sort.Slice(s.Windows, func(i, j int) bool { return s.Windows[i].Window < s.Windows[j].Window })
	var sum uint64
	for i, w := range s.Windows {
		sum += w.most()
		if len(w.Missing) > 0 || len(w.Stopped) > 0 {
			s.Incomplete++
		}
		if i == 0 || w.Ratio > s.WorstRatio {
			s.WorstRatio, s.WorstWindow = w.Ratio, w.Window
		}
		if float64(w.most()) > s.Bound*float64(s.Limit) {
			s.Over++
		}
	}
	if s.Counted > 0 {
		s.MeanAdmitted = float64(sum) / float64(s.Counted)
	}
	if s.Scenario != "burst" || s.Load.HotTarget > 0 {
		if s.Counted == 0 {
			s.Failures = append(s.Failures, "no window was counted")
		}
		if s.Over > 0 {
			s.Failures = append(s.Failures, fmt.Sprintf("%d of %d windows admitted more than %.2f × %d (worst %.3f in window %d)",
				s.Over, s.Counted, s.Bound, s.Limit, s.WorstRatio, s.WorstWindow))
		}
	}
	if s.Scenario == "burst" && len(s.Bursts) == 0 {
		s.Failures = append(s.Failures, "no burst was sent")
	}
	for _, b := range s.Bursts {
		if b.Allowed < s.BurstWant {
			s.Failures = append(s.Failures, fmt.Sprintf("burst on %s in window %d admitted %d of %d (want all %d): %v; pauses during it: %v",
				b.Key, b.Window, b.Allowed, b.Sent, s.BurstWant, b.Reasons, b.Pauses))
		}
		if b.Failed == 0 && uint64(b.Allowed) != b.Admitted {
			s.Warnings = append(s.Warnings, fmt.Sprintf("burst on %s: the servers counted %d admitted, the answers said %d",
				b.Key, b.Admitted, b.Allowed))
		}
	}
	if n := len(s.SkewLines); n > 0 {
		s.Failures = append(s.Failures, fmt.Sprintf("%d clock skew lines logged (\"beyond max_skew\") on one host", n))
	}
	// The load starts once every node is ready, and goes only to nodes
	// that printed their ready line: a node that denies as joining then
	// stopped serving.
	if n := s.Load.Reasons["joining"]; n > 0 {
		s.Failures = append(s.Failures, fmt.Sprintf("%d requests denied as joining (the first: %v)", n, s.Load.Joining))
	}
	if n := len(s.JoinTimeouts); n > 0 {
		msg := fmt.Sprintf("%d joins timed out (a node waited its whole join_timeout for a peer's state)", n)
		if s.Scenario == "upgrade" {
			s.Failures = append(s.Failures, msg)
		} else {
			s.Warnings = append(s.Warnings, msg)
		}
	}
	if len(s.Malformed) > 0 {
		msg := fmt.Sprintf("batches refused as malformed: %v", s.Malformed)
		if s.Scenario == "upgrade" {
			s.Failures = append(s.Failures, msg)
		} else {
			s.Warnings = append(s.Warnings, msg)
		}
	}
	if s.Incomplete > 0 {
		s.Warnings = append(s.Warnings, fmt.Sprintf("%d windows with a node that did not answer or was stopped in them: a stopped or silent node's slot counts from the others' views, a lower bound", s.Incomplete))
	}
	if s.Load.FellBehind {
		s.Warnings = append(s.Warnings, fmt.Sprintf("the load generator fell behind: offered %.0f/s on the hot key of %.0f/s asked (%.0f/s with the pauses), %.0f/s on the rotating keys of %.0f/s",
			s.Load.HotOffered, s.Load.HotTarget, s.Load.Up*s.Load.HotTarget, s.Load.KeysOffered, s.Load.KeysTarget))
	}
	s.Pass = len(s.Failures) == 0
}
