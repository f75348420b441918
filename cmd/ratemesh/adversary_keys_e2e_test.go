package main

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ratemesh/ratemesh/crdt"
	"github.com/ratemesh/ratemesh/httpapi"
	"github.com/ratemesh/ratemesh/internal/testutil"
	"github.com/ratemesh/ratemesh/mesh"
)

// TestServeKeyFloodAdversary: an allowlisted member that lies publishes
// gossip batches of its own slot — which pass every check of the topic
// validator — for 60,000 invented keys, against three `serve` nodes whose
// node.max_keys is 2000. Each node takes at most a key budget of new keys
// from one peer, M + max(M/4, 1024) for node.max_keys M, and drops the
// rest: every node counts the drop
// (ratemesh_entries_dropped_total{reason="key_budget"}), logs the liar's
// peer ID with "key budget", holds at most 2·M + max(M/4, 1024) keys
// (its own M and the liar's budget, and a margin), and grows by under
// 64 MB of resident memory. A key that existed before the flood keeps its
// limit exactly: spent one request at a time over the three nodes after
// the flood (and after the liar leaves), it admits its limit, no more and
// no less.
func TestServeKeyFloodAdversary(t *testing.T) {
	// Memory is measured under Go's default collector, as in
	// TestServeAllowlistedAdversary.
	t.Setenv("GOGC", "100")
	bin := buildBinary(t)
	const (
		maxKeys   = 2000
		limit     = 30
		rule      = "k"
		windowMs  = 3_600_000 // the flood's keys stay active for the whole test
		floodKeys = 60_000
		// Entries of one batch: under crdt.MaxEntries, and about 140 kB
		// encoded, under crdt.MaxBatchBytes.
		perBatch = 4000
		// Every flood entry admits 1, far under the plausibility bound
		// (the limit × a safety factor), so none is refused as implausible.
		floodAdmitted = 1
	)
	budget := maxKeys + max(maxKeys/4, 1024)
	keyBound := maxKeys + budget + 100
	pm := startPrivateMesh(t, bin, fmt.Sprintf("node: {max_keys: %d}\nrules:\n  - {name: %s, algorithm: fixed_window, limit: %d, window: 1h}\n", maxKeys, rule, limit))
	ps, advID := pm.ps, pm.advID.String()

	// The scenario runs in one window of the hour, so the honest key's
	// exact count is one window's.
	w := alignWindow(t, ps[0], rule, "h0", windowMs, 20*time.Second)

	// Honest keys, each made at its own node, and the marker: the liar
	// writes its slot of the marker after its flood, so a node that holds
	// it has merged the flood.
	honest := []string{"h0", "h1", "h2", "marker"}
	for i, key := range honest {
		admitN(t, ps[i%len(ps)], rule, key, 1)
	}
	for _, key := range honest {
		waitTotals(t, ps, rule, key, w, 1, 5*time.Second, "every node holds honest key "+key)
	}
	rssBefore := make([]int, len(ps))
	for i, p := range ps {
		rssBefore[i] = rssKB(t, p.cmd.Process.Pid)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	l := &liar{m: pm.adversary(ctx), slot: crdt.Slot{Peer: advID, Incarnation: uint64(time.Now().UnixMilli())}}
	l.introduce(ctx, t, ps)

	// The flood, as fast as the liar can publish it.
	floodStart := time.Now()
	publishBy := floodStart.Add(10 * time.Second)
	for first := 0; first < floodKeys; first += perBatch {
		if time.Now().After(publishBy) {
			t.Skipf("the liar published %d of %d keys in %v: the machine is too busy for the flood", first, floodKeys, time.Since(floodStart))
		}
		nowMs := time.Now().UnixMilli()
		b := &crdt.Batch{Windows: make([]crdt.WindowEntry, 0, perBatch)}
		for k := first; k < min(first+perBatch, floodKeys); k++ {
			b.Windows = append(b.Windows, crdt.WindowEntry{Rule: rule, Key: fmt.Sprintf("flood-%06d", k),
				WindowMs: windowMs, Window: nowMs / windowMs, Admitted: floodAdmitted, Attempted: floodAdmitted})
		}
		if err := l.publish(ctx, b); err != nil {
			t.Fatalf("the liar publishes flood batch %d: %v", first/perBatch, err)
		}
	}
	published := time.Since(floodStart)
	if st := l.m.Stats(); st.DroppedOutbound > 0 {
		t.Skipf("the liar's own gossipsub dropped %d messages at its outbound queue: the machine is too busy for the flood", st.DroppedOutbound)
	}

	// Then the liar goes on as a member would, acknowledging and writing
	// its slot of the marker (attempted counts its heartbeats) until it
	// leaves: a silent member would turn suspect and, under strict, scale
	// the honest key's limit down.
	stopBeats := make(chan struct{})
	beatErr := make(chan error, 1)
	var beats sync.WaitGroup
	beats.Add(1)
	go func() {
		defer beats.Done()
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for n := uint64(1); ; n++ {
			nowMs := time.Now().UnixMilli()
			if err := l.publish(ctx, &crdt.Batch{Windows: []crdt.WindowEntry{{Rule: rule, Key: "marker",
				WindowMs: windowMs, Window: nowMs / windowMs, Attempted: n}}}); err != nil {
				beatErr <- err
				return
			}
			select {
			case <-stopBeats:
				return
			case <-tick.C:
			}
		}
	}()
	stopBeating := func() {
		select {
		case <-stopBeats:
			return
		default:
		}
		close(stopBeats)
		beats.Wait()
		select {
		case err := <-beatErr:
			t.Errorf("the liar's heartbeat: %v", err)
		default:
		}
	}
	defer stopBeating()

	// Every node has merged the marker, published after the flood: the
	// flood has reached it too.
	testutil.Eventually(t, 15*time.Second, func() (bool, string) {
		for i, p := range ps {
			u, err := p.usage(rule, "marker")
			if err != nil {
				return false, fmt.Sprintf("node %d: marker: %v", i, err)
			}
			var seen uint64
			for _, s := range u.Slots {
				if s.PeerID == advID {
					seen = s.Attempted
				}
			}
			if seen == 0 {
				return false, fmt.Sprintf("node %d holds no marker of the liar's (slots %+v)", i, u.Slots)
			}
		}
		return true, ""
	})
	delivered := time.Since(floodStart)
	// Gossipsub validates a peer's messages on more than one worker, so the
	// last flood batch may merge just after the first marker: the keys and
	// the drops must stand still over two scrapes.
	type tally struct{ keys, dropped float64 }
	read := func(p *proc) tally {
		text := metrics(t, p)
		return tally{keys: metricSum(text, "ratemesh_keys"), dropped: metricValue(text, `ratemesh_entries_dropped_total{reason="key_budget"}`)}
	}
	settled := make([]tally, len(ps))
	for i, p := range ps {
		last := read(p)
		tick := time.NewTicker(250 * time.Millisecond)
		for deadline := time.Now().Add(10 * time.Second); ; {
			<-tick.C
			now := read(p)
			if now == last {
				break
			}
			if time.Now().After(deadline) {
				t.Errorf("node %d: keys and key_budget drops still moving 10 s after the marker: %+v → %+v", i, last, now)
				break
			}
			last = now
		}
		tick.Stop()
		settled[i] = last
	}
	t.Logf("the liar published %d keys in %v; every node merged its marker %v after the flood began; keys and key_budget drops by node: %+v (bound %d keys)",
		floodKeys, published.Round(time.Millisecond), delivered.Round(time.Millisecond), settled, keyBound)

	for i, s := range settled {
		if s.dropped < 1 {
			t.Errorf("node %d: ratemesh_entries_dropped_total{reason=\"key_budget\"} is %v, want ≥ 1 after %d invented keys", i, s.dropped, floodKeys)
		}
		if s.keys > float64(keyBound) {
			t.Errorf("node %d holds %v keys after the flood, over 2·M + max(M/4, 1024) + 100 = %d for node.max_keys %d", i, s.keys, keyBound, maxKeys)
		}
	}
	// The warning names the liar; stderr reaches the test through a copy
	// of exec's, which a busy host may run late.
	logDeadline := time.Now().Add(3 * time.Second)
	for i, p := range ps {
		if !p.loggedLine(time.Until(logDeadline), advID, "key budget") {
			t.Errorf("node %d logged no line with the liar's peer ID %s and \"key budget\"", i, advID)
		}
	}
	for i, p := range ps {
		after := rssKB(t, p.cmd.Process.Pid)
		t.Logf("node %d: resident memory %d → %d kB", i, rssBefore[i], after)
		if grew := after - rssBefore[i]; grew > 64*1024 {
			t.Errorf("node %d's resident memory grew by %d kB under the flood, over 64 MB", i, grew)
		}
	}

	// The liar leaves before the honest key is spent: a live member that
	// takes no requests holds a rank in the lottery, and with a request or
	// two of headroom left the draw may pick it alone (design.md, "The
	// lottery"); the members then forward the last request to it and
	// never admit it. With the liar still live, 4 of 10 runs stopped at
	// 29 of 30.
	stopBeating()
	if err := l.publish(ctx, &crdt.Batch{Flags: crdt.FlagLeaving}); err != nil {
		t.Fatalf("the liar's leave: %v", err)
	}
	for i, p := range ps {
		testutil.Eventually(t, 5*time.Second, func() (bool, string) {
			st := p.states(t)[advID]
			return st == "left", fmt.Sprintf("node %d sees the liar %q, want left", i, st)
		})
	}
	got := 1 + exhaust(t, ps, rule, "h0", limit) // 1 admitted before the flood
	if got != limit {
		t.Errorf("honest key h0 admitted %d in window %d, want exactly its limit %d", got, w, limit)
	}
	waitTotals(t, ps, rule, "h0", w, uint64(got), 5*time.Second, "every node agrees on what h0 admitted")
	if now := time.Now().UnixMilli() / windowMs; now != w {
		t.Fatalf("the scenario ran past window %d into %d", w, now)
	}
}

// TestServeWindowLengthAdversary: an allowlisted member that lies
// publishes, in one gossip batch of its own slot, entries for a key every
// node holds under 2,000 window lengths its rule does not have (1 s to
// 3 s; the rule's window is an hour), then its slot of a marker key.
// Before, each length made a window of its own at every node, none of
// which a decision reads. Every node drops them, counts them
// (ratemesh_entries_dropped_total{reason="window_length"}), and holds the
// two windows of the rule's length it held before: the key's and the
// marker's.
func TestServeWindowLengthAdversary(t *testing.T) {
	bin := buildBinary(t)
	const (
		rule     = "k"
		windowMs = 3_600_000
		lengths  = 2000
	)
	pm := startPrivateMesh(t, bin, fmt.Sprintf("rules:\n  - {name: %s, algorithm: fixed_window, limit: 30, window: 1h}\n", rule))
	ps, advID := pm.ps, pm.advID.String()
	w := alignWindow(t, ps[0], rule, "h", windowMs, 20*time.Second)
	admitN(t, ps[0], rule, "h", 1)
	waitTotals(t, ps, rule, "h", w, 1, 5*time.Second, "every node holds the honest key")

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	l := &liar{m: pm.adversary(ctx), slot: crdt.Slot{Peer: advID, Incarnation: uint64(time.Now().UnixMilli())}}
	l.introduce(ctx, t, ps)
	nowMs := time.Now().UnixMilli()
	b := &crdt.Batch{}
	for ms := int64(1000); ms < 1000+lengths; ms++ {
		b.Windows = append(b.Windows, crdt.WindowEntry{Rule: rule, Key: "h", WindowMs: ms, Window: nowMs / ms, Admitted: 1, Attempted: 1})
	}
	// The marker last: a node that holds it has merged the whole batch.
	b.Windows = append(b.Windows, crdt.WindowEntry{Rule: rule, Key: "marker", WindowMs: windowMs, Window: nowMs / windowMs, Attempted: 1})
	if err := l.publish(ctx, b); err != nil {
		t.Fatalf("the liar publishes: %v", err)
	}
	testutil.Eventually(t, 15*time.Second, func() (bool, string) {
		for i, p := range ps {
			u, err := p.usage(rule, "marker")
			if err != nil {
				return false, fmt.Sprintf("node %d: marker: %v", i, err)
			}
			if len(u.Slots) == 0 {
				return false, fmt.Sprintf("node %d holds no marker of the liar's", i)
			}
		}
		return true, ""
	})
	for i, p := range ps {
		text := metrics(t, p)
		if got := metricValue(text, `ratemesh_windows{rule="k"}`); got != 2 {
			t.Errorf("node %d holds %v windows of rule k, want 2 (the honest key's and the marker's)", i, got)
		}
		if got := metricValue(text, `ratemesh_entries_dropped_total{reason="window_length"}`); got < lengths {
			t.Errorf("node %d counts %v entries dropped as window_length, want at least %d", i, got, lengths)
		}
	}
	// The honest key's count is untouched: one admission, the rule's window.
	waitTotals(t, ps, rule, "h", w, 1, 5*time.Second, "the honest key still counts 1 at every node")
}

// liar publishes gossip batches of its own slot through a real transport.
// It is safe for concurrent use.
type liar struct {
	m    *mesh.Mesh
	slot crdt.Slot

	mu  sync.Mutex
	seq uint64
}

// publish stamps b as the liar's next batch — its slot, sequence number,
// clock, an acknowledgement of everything up to now, and FlagEcho as a
// current member announces it — and publishes it on the topic. Without
// FlagEcho the members stop echoing one another while the liar is live,
// and when it leaves their last echoes are too old: a member may turn
// stale for an echo round and deny as stale (node/stale.go, ackedBy).
func (l *liar) publish(ctx context.Context, b *crdt.Batch) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.seq++
	nowMs := time.Now().UnixMilli()
	b.Version, b.From, b.Seq, b.Sent, b.Clock, b.Ack = crdt.Version, l.slot, l.seq, nowMs, nowMs, nowMs
	b.Flags |= crdt.FlagEcho
	return l.m.Publish(ctx, b)
}

// introduce publishes empty batches of the liar's until every node of ps
// holds it alive: its gossip reaches them all, directly or through their
// topic mesh.
func (l *liar) introduce(ctx context.Context, t *testing.T, ps []*proc) {
	t.Helper()
	testutil.Eventually(t, 10*time.Second, func() (bool, string) {
		if err := l.publish(ctx, &crdt.Batch{}); err != nil {
			return false, "the liar's hello: " + err.Error()
		}
		for i, p := range ps {
			if st := p.states(t)[l.slot.Peer]; st != "alive" {
				return false, fmt.Sprintf("node %d sees the liar %q, want alive", i, st)
			}
		}
		return true, ""
	})
}

// metricSum returns the sum of every sample of name in text, whatever its
// labels, or 0 when there is none.
func metricSum(text, name string) float64 {
	var sum float64
	for _, line := range strings.Split(text, "\n") {
		rest, ok := strings.CutPrefix(line, name)
		if !ok || (!strings.HasPrefix(rest, "{") && !strings.HasPrefix(rest, " ")) {
			continue
		}
		f := strings.Fields(rest[strings.LastIndexByte(rest, '}')+1:])
		var v float64
		if len(f) > 0 {
			if _, err := fmt.Sscan(f[0], &v); err == nil {
				sum += v
			}
		}
	}
	return sum
}

// exhaust spends (rule, key) one request at a time, round-robin over ps,
// until every node has denied it for the limit itself (reason limit), and
// returns how many it admitted. A denial for a share or a lost draw is
// asked again at the next node.
func exhaust(t *testing.T, ps []*proc, rule, key string, limit int) int {
	t.Helper()
	body := fmt.Sprintf(`{"rule":%q,"key":%q}`, rule, key)
	admitted, full := 0, make([]bool, len(ps))
	reasons := map[string]int{}
	for tries := 0; ; tries++ {
		if tries > 20*limit {
			t.Fatalf("spending %s: %d admitted and denials %v after %d requests, and not every node denies for the limit (%v)", key, admitted, reasons, tries, full)
		}
		i := tries % len(ps)
		var ar httpapi.AllowResponse
		status, err := ps[i].post("/v1/allow", body, &ar)
		if err == nil && status != http.StatusOK {
			err = fmt.Errorf("status %d", status)
		}
		if err != nil {
			t.Fatalf("spending %s at node %d: %v", key, i, err)
		}
		if ar.Allowed {
			admitted++
			continue
		}
		reasons[ar.Reason]++
		if ar.Reason == "limit" {
			full[i] = true
		}
		done := true
		for _, f := range full {
			done = done && f
		}
		if done {
			t.Logf("spending %s: %d admitted; denials by reason %v", key, admitted, reasons)
			return admitted
		}
	}
}
