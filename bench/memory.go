package main

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"time"
)

// memResult is one memory round of one system: fresh nodes, a warm-up of
// memWarmKeys keys, every node's RSS read (base), Keys new keys touched
// once each at the first node (filled, read once every node holds them),
// then the nodes left idle for IdleSeconds (idle).
type memResult struct {
	Scenario      string  `json:"scenario"` // memory (a lone node) or memory-mesh
	System        string  `json:"system"`
	Keys          int     `json:"keys"`
	FillSeconds   float64 `json:"fill_seconds"`
	FillPerSecond float64 `json:"fill_keys_per_second"`
	// Resent counts the batches (warm-up and fill) the node denied for
	// its own state (fenced, stale or joining) and the fill sent again.
	Resent int `json:"batches_resent,omitempty"`
	// memNode is the node the keys were touched at: the lone node, or
	// the member that decided them.
	memNode
	// Merged is, on a mesh, the other members, which merged the keys.
	Merged []memNode `json:"merged,omitempty"`
	// MergeSeconds is, on a mesh, the time from the fill's end until
	// every member held every key.
	MergeSeconds float64 `json:"merge_seconds,omitempty"`
	IdleSeconds  float64 `json:"idle_seconds"`
	Note         string  `json:"note,omitempty"`
	Err          string  `json:"error,omitempty"`
}

// memNode is one node's figures of a memory round.
type memNode struct {
	RSSBase       uint64  `json:"rss_base_bytes"`
	RSSFilled     uint64  `json:"rss_filled_bytes"`
	RSSIdle       uint64  `json:"rss_idle_bytes"`
	RSSPerKey     float64 `json:"rss_per_key"`
	RSSPerKeyIdle float64 `json:"rss_per_key_idle"`
	// HeapPerKey is the growth of go_memstats_heap_inuse_bytes per key
	// from base to filled (both systems export Go's collector).
	HeapPerKey float64 `json:"heap_inuse_per_key"`
	IdleCores  float64 `json:"idle_cores"`
	// KeysHeld is what the node's metrics say it holds after the fill:
	// ratemesh_keys{rule="mem"}, or the sum of gubernator_cache_size.
	KeysHeld float64 `json:"keys_held"`
}

// memReading is one reading of a node: its RSS and, when read, its Go
// heap in use.
type memReading struct {
	rss  uint64
	heap float64
}

// newMemNode makes a node's figures from its readings before the fill
// (base), once it held the keys new keys (filled) and after the idle.
func newMemNode(base, filled, idle memReading, keys int, idleCores, held float64) memNode {
	k := float64(keys)
	n := memNode{RSSBase: base.rss, RSSFilled: filled.rss, RSSIdle: idle.rss, IdleCores: idleCores, KeysHeld: held,
		RSSPerKey:     (float64(filled.rss) - float64(base.rss)) / k,
		RSSPerKeyIdle: (float64(idle.rss) - float64(base.rss)) / k}
	if base.heap > 0 && filled.heap > 0 {
		n.HeapPerKey = (filled.heap - base.heap) / k
	}
	return n
}

// text describes n's figures, idle the seconds it idled.
func (n memNode) text(idle float64) string {
	return fmt.Sprintf("RSS %s → %s (%.0f B/key) → %s after %.0f s idle (%.0f B/key); heap in use %.0f B/key; idle %.3f cores; keys held %.0f",
		mib(n.RSSBase), mib(n.RSSFilled), n.RSSPerKey, mib(n.RSSIdle), idle, n.RSSPerKeyIdle, n.HeapPerKey, n.IdleCores, n.KeysHeld)
}

// lines describes m for people: one line, and on a mesh one more a
// member.
func (m memResult) lines() []string {
	if m.Err != "" {
		return []string{fmt.Sprintf("%-10s error: %s", m.System, m.Err)}
	}
	head := fmt.Sprintf("%-10s %s keys in %.1f s (%.0f/s)", m.System, count(m.Keys), m.FillSeconds, m.FillPerSecond)
	if m.Resent > 0 {
		head += fmt.Sprintf(", %d batches sent again (denied fenced, stale or joining)", m.Resent)
	}
	if len(m.Merged) == 0 {
		return []string{head + ": " + m.text(m.IdleSeconds) + m.Note}
	}
	out := []string{fmt.Sprintf("%s at member 1, held by every member %.1f s later%s", head, m.MergeSeconds, m.Note),
		"  member 1, decided: " + m.text(m.IdleSeconds)}
	for i, n := range m.Merged {
		out = append(out, fmt.Sprintf("  member %d, merged:  %s", i+2, n.text(m.IdleSeconds)))
	}
	return out
}

const (
	memWarmKeys = 1000
	memBatch    = 64 // ratemesh's cap on the checks of one request; Gubernator takes up to 1000
)

// memLimit is the memory scenario's limit: ten-minute windows, so no key
// expires during a fill, and a limit no key reaches.
var memLimit = limitSpec{name: "mem", limit: 1_000_000_000, window: 10 * time.Minute}

// guberCacheSize is GUBER_CACHE_SIZE for keys keys: Gubernator splits its
// LRU cache evenly over its workers and hashes keys to them, so leave a
// quarter more room, and never below its default of 50,000.
func guberCacheSize(keys int) int { return max(50_000, keys+keys/4+memWarmKeys) }

// memMergeWait bounds the wait for every member of a mesh to hold keys
// keys: a minute, and 200 µs a key (200 s for a million) on a busy host.
func memMergeWait(keys int) time.Duration {
	return time.Minute + time.Duration(keys)*200*time.Microsecond
}

// measureMemory runs one memory round of one system on c, touching the
// keys at its first node (--concurrency workers; --mesh-workers on a
// mesh) and reading every node; on a ratemesh mesh each reading waits
// until every member holds the keys.
func measureMemory(ctx context.Context, c *cluster, o *options, keys []string, idlePIDs []int) memResult {
	m := memResult{System: c.system, Keys: len(keys)}
	fail := func(err error) memResult {
		m.Err = err.Error()
		return m
	}
	workers := o.Concurrency
	if len(c.nodes) > 1 {
		workers = o.MeshWorkers
	}
	d := newDriver(&cluster{system: c.system, nodes: c.nodes[:1]}, workers)
	defer d.close()
	fill := func(ks []string) (phase, error) {
		var next, resent atomic.Int64
		defer func() { m.Resent += int(resent.Load()) }()
		var f op
		if c.system == "ratemesh" {
			f = d.rmFill(memLimit.name, ks, memBatch, &next, &resent)
		} else {
			f = d.gbFill(memLimit, ks, memBatch, &next)
		}
		p := runPhase(ctx, d.workers, 0, f, c.pids(), idlePIDs, o.BoundRatio)
		if err := ctx.Err(); err != nil {
			return p, err
		}
		if p.Errors > 0 {
			return p, fmt.Errorf("%d failed requests, the first: %s", p.Errors, p.FirstErr)
		}
		if int(p.Decisions) != len(ks) {
			return p, fmt.Errorf("%d keys touched of %d", p.Decisions, len(ks))
		}
		return p, nil
	}
	hc := &http.Client{Timeout: 10 * time.Second}
	metrics := func(nd *node) (string, error) {
		var text string
		return text, getJSON(ctx, hc, "http://"+nd.http+"/metrics", &text)
	}
	keysHeld := func(text string) float64 {
		if c.system == "ratemesh" {
			v, _, _ := metricValue(text, "ratemesh_keys", `rule="mem"`)
			return v
		}
		v, _, _ := metricValue(text, "gubernator_cache_size")
		return v
	}
	// settle waits until every member of a mesh holds want keys.
	settle := func(want int) error {
		if len(c.nodes) == 1 {
			return nil
		}
		err := pollUntil(ctx, memMergeWait(want), func() error {
			for i, nd := range c.nodes {
				text, err := metrics(nd)
				if err != nil {
					return err
				}
				if h := keysHeld(text); h < float64(want) {
					return fmt.Errorf("member %d holds %.0f keys of %d", i+1, h, want)
				}
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("merges: %w", err)
		}
		return nil
	}
	// read reads every node's RSS and, with heap, its Go heap in use.
	read := func(heap bool) ([]memReading, error) {
		out := make([]memReading, len(c.nodes))
		for i, nd := range c.nodes {
			var err error
			if out[i].rss, err = procRSS(nd.p.pid()); err != nil {
				return nil, fmt.Errorf("%s: %w", nd.p.name, err)
			}
			if !heap {
				continue
			}
			if text, err := metrics(nd); err == nil {
				out[i].heap, _, _ = metricValue(text, "go_memstats_heap_inuse_bytes")
			}
		}
		return out, nil
	}
	if _, err := fill(keyNames("w", memWarmKeys)); err != nil {
		return fail(fmt.Errorf("warm-up: %w", err))
	}
	if err := settle(memWarmKeys); err != nil {
		return fail(fmt.Errorf("warm-up: %w", err))
	}
	base, err := read(true)
	if err != nil {
		return fail(err)
	}
	p, err := fill(keys)
	if err != nil {
		return fail(fmt.Errorf("fill: %w", err))
	}
	m.FillSeconds, m.FillPerSecond = p.Seconds, p.PerSecond
	fillEnd := time.Now()
	if err := settle(memWarmKeys + len(keys)); err != nil {
		return fail(err)
	}
	if len(c.nodes) > 1 {
		m.MergeSeconds = time.Since(fillEnd).Seconds()
	}
	filled, err := read(true)
	if err != nil {
		return fail(err)
	}
	held := make([]float64, len(c.nodes))
	var notes []string
	for i, nd := range c.nodes {
		text, err := metrics(nd)
		if err != nil {
			return fail(err)
		}
		held[i] = keysHeld(text)
		evicted, what := "ratemesh_keys_evicted_total", "keys evicted"
		if c.system != "ratemesh" {
			evicted, what = "gubernator_unexpired_evictions_count", "unexpired keys evicted from the LRU"
		}
		if ev, _, _ := metricValue(text, evicted); ev > 0 {
			notes = append(notes, fmt.Sprintf("%.0f %s at node %d", ev, what, i+1))
		}
	}
	if len(notes) > 0 {
		m.Note = fmt.Sprintf(" (%s: the figures are low)", strings.Join(notes, ", "))
	}
	var cores []float64
	if m.IdleSeconds, cores, err = idleCores(ctx, c.pids(), o.MemIdle); err != nil {
		return fail(err)
	}
	idle, err := read(false)
	if err != nil {
		return fail(err)
	}
	ns := make([]memNode, len(c.nodes))
	for i := range ns {
		ns[i] = newMemNode(base[i], filled[i], idle[i], len(keys), cores[i], held[i])
	}
	m.memNode, m.Merged = ns[0], ns[1:]
	return m
}

// idleCores leaves the processes pids idle for d and returns the seconds
// that passed and the CPU each used meanwhile, in cores.
func idleCores(ctx context.Context, pids []int, d time.Duration) (float64, []float64, error) {
	before := make([]time.Duration, len(pids))
	start := time.Now()
	for i, pid := range pids {
		var err error
		if before[i], err = procCPU(pid); err != nil {
			return 0, nil, err
		}
	}
	if !sleepCtx(ctx, d) {
		return 0, nil, ctx.Err()
	}
	secs := time.Since(start).Seconds()
	cores := make([]float64, len(pids))
	for i, pid := range pids {
		after, err := procCPU(pid)
		if err != nil {
			return 0, nil, err
		}
		if secs > 0 {
			cores[i] = (after - before[i]).Seconds() / secs
		}
	}
	return secs, cores, nil
}
