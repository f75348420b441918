package main

import (
	"context"
	"fmt"
	"net/http"
	"sync/atomic"
	"time"
)

// memResult is one system's memory round: a fresh node, a warm-up of
// memWarmKeys keys, RSS read (base), Keys new keys touched once each
// (filled), then the node left idle for IdleSeconds (idle).
type memResult struct {
	System        string  `json:"system"`
	Keys          int     `json:"keys"`
	FillSeconds   float64 `json:"fill_seconds"`
	FillPerSecond float64 `json:"fill_keys_per_second"`
	RSSBase       uint64  `json:"rss_base_bytes"`
	RSSFilled     uint64  `json:"rss_filled_bytes"`
	RSSIdle       uint64  `json:"rss_idle_bytes"`
	RSSPerKey     float64 `json:"rss_per_key"`
	RSSPerKeyIdle float64 `json:"rss_per_key_idle"`
	// HeapPerKey is the growth of go_memstats_heap_inuse_bytes per key
	// from base to filled (both systems export Go's collector).
	HeapPerKey  float64 `json:"heap_inuse_per_key"`
	IdleSeconds float64 `json:"idle_seconds"`
	IdleCores   float64 `json:"idle_cores"`
	// KeysHeld is what the node's metrics say it holds after the fill:
	// ratemesh_keys{rule="mem"}, or the sum of gubernator_cache_size.
	KeysHeld float64 `json:"keys_held"`
	Note     string  `json:"note,omitempty"`
	Err      string  `json:"error,omitempty"`
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

// measureMemory runs one memory round of one system on the node of c.
func measureMemory(ctx context.Context, c *cluster, o *options, keys []string, idlePIDs []int) memResult {
	m := memResult{System: c.system, Keys: len(keys)}
	fail := func(err error) memResult {
		m.Err = err.Error()
		return m
	}
	nd := c.nodes[0]
	d, err := newDriver(c, o.Concurrency, false)
	if err != nil {
		return fail(err)
	}
	defer d.close()
	fill := func(ks []string) (phase, error) {
		var next atomic.Int64
		var f op
		if c.system == "ratemesh" {
			f = d.rmFill(memLimit.name, ks, memBatch, &next)
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
	heap := func() float64 {
		var text string
		if err := getJSON(ctx, hc, "http://"+nd.http+"/metrics", &text); err != nil {
			return 0
		}
		v, _, _ := metricValue(text, "go_memstats_heap_inuse_bytes")
		return v
	}
	if _, err := fill(keyNames("w", memWarmKeys)); err != nil {
		return fail(fmt.Errorf("warm-up: %w", err))
	}
	if m.RSSBase, err = procRSS(nd.p.pid()); err != nil {
		return fail(err)
	}
	heapBase := heap()
	p, err := fill(keys)
	if err != nil {
		return fail(fmt.Errorf("fill: %w", err))
	}
	m.FillSeconds, m.FillPerSecond = p.Seconds, p.PerSecond
	if m.RSSFilled, err = procRSS(nd.p.pid()); err != nil {
		return fail(err)
	}
	if hb, hf := heapBase, heap(); hb > 0 && hf > 0 {
		m.HeapPerKey = (hf - hb) / float64(len(keys))
	}
	var text string
	if err := getJSON(ctx, hc, "http://"+nd.http+"/metrics", &text); err != nil {
		return fail(err)
	}
	if c.system == "ratemesh" {
		m.KeysHeld, _, _ = metricValue(text, "ratemesh_keys", `rule="mem"`)
		if ev, _, _ := metricValue(text, "ratemesh_keys_evicted_total"); ev > 0 {
			m.Note = fmt.Sprintf(" (%.0f keys evicted: the figures are low)", ev)
		}
	} else {
		m.KeysHeld, _, _ = metricValue(text, "gubernator_cache_size")
		if ev, _, _ := metricValue(text, "gubernator_unexpired_evictions_count"); ev > 0 {
			m.Note = fmt.Sprintf(" (%.0f unexpired keys evicted from the LRU: the figures are low)", ev)
		}
	}
	before := sampleCPU(c.pids(), nil)
	if !sleepCtx(ctx, o.MemIdle) {
		return fail(ctx.Err())
	}
	after := sampleCPU(c.pids(), nil)
	m.IdleSeconds = after.at.Sub(before.at).Seconds()
	if m.IdleSeconds > 0 {
		m.IdleCores = (after.server - before.server).Seconds() / m.IdleSeconds
	}
	if m.RSSIdle, err = procRSS(nd.p.pid()); err != nil {
		return fail(err)
	}
	n := float64(len(keys))
	m.RSSPerKey = (float64(m.RSSFilled) - float64(m.RSSBase)) / n
	m.RSSPerKeyIdle = (float64(m.RSSIdle) - float64(m.RSSBase)) / n
	return m
}
