package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// allowConn is one keep-alive connection to a node's API sending one POST
// /v1/allow at a time. Cheaper than net/http's client, whose per-request
// goroutines and channels would take the generator's CPU on a starved
// host.
type allowConn struct {
	api string
	c   net.Conn
	br  *bufio.Reader
}

func dialAllow(api string) (*allowConn, error) {
	c, err := net.DialTimeout("tcp", api, 5*time.Second)
	if err != nil {
		return nil, err
	}
	return &allowConn{api: api, c: c, br: bufio.NewReader(c)}, nil
}

type allowAnswer struct {
	Allowed      bool   `json:"allowed"`
	Reason       string `json:"reason"`
	ResetAfterMs int64  `json:"reset_after_ms"`
}

// allow sends body and reads the decision.
func (a *allowConn) allow(body []byte) (allowAnswer, error) {
	var ans allowAnswer
	if err := a.c.SetDeadline(time.Now().Add(10 * time.Second)); err != nil {
		return ans, err
	}
	req := fmt.Appendf(nil, "POST /v1/allow HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", a.api, len(body), body)
	if _, err := a.c.Write(req); err != nil {
		return ans, err
	}
	resp, err := http.ReadResponse(a.br, nil)
	if err != nil {
		return ans, err
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	switch {
	case err != nil:
		return ans, err
	case resp.StatusCode != http.StatusOK:
		return ans, fmt.Errorf("status %d: %s", resp.StatusCode, b)
	case resp.Close:
		return ans, errors.New("the server closes the connection")
	}
	return ans, json.Unmarshal(b, &ans)
}

func (a *allowConn) close() { _ = a.c.Close() }

// stream is one paced stream of requests: its counters are read while it
// runs.
type stream struct {
	rate              float64
	sent, failed, yes atomic.Int64
	missed            atomic.Int64 // send slots dropped because a worker fell behind
}

// generator offers the load over the nodes that are up, round-robin, on
// keep-alive connections, paced open-loop: each worker sends on a fixed
// schedule, and one that falls more than 100 ms behind drops the backlog
// (counted in missed), so the offered rate says what the host allowed.
// It tallies every answer's reason and the hot key's admissions by window
// (tally).
type generator struct {
	c     *cluster
	rule  string
	wms   int64 // the rule's window, ms
	rr    atomic.Uint64
	start time.Time
	end   time.Time // when wait was called: the load's end
	wg    sync.WaitGroup
	hot   stream
	keys  stream
	tally tally
}

// tally is what the clients were told: answers by reason, the hot key's
// admissions by window, and the first denials as joining. Safe for
// concurrent use.
type tally struct {
	mu       sync.Mutex
	reasons  map[string]int64
	byWindow map[int64]uint64
	unplaced uint64   // hot admissions whose window the answer could not tell
	joining  []string // the first joining denials: when, which node
}

// maxJoiningNoted is how many joining denials tally describes.
const maxJoiningNoted = 10

// placeWindow returns the window an admission answered between sent and
// recv with reset_after_ms ra was counted in, for windows of wms: the
// window that ends ra after the decision, taken at the round trip's
// middle, so off by at most half the round trip (plus the node's mesh
// offset, milliseconds on one host) from a window's end. ok is false when
// the round trip took over half a window: too long to tell.
func placeWindow(sent, recv time.Time, ra, wms int64) (w int64, ok bool) {
	rt := recv.Sub(sent).Milliseconds()
	if rt < 0 || 2*rt > wms || ra < 0 {
		return 0, false
	}
	end := sent.UnixMilli() + rt/2 + ra
	return (end+wms/2)/wms - 1, true
}

// count returns the hot key's admitted answers placed in window w.
func (t *tally) count(w int64) uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.byWindow[w]
}

// add records one answer from node at recv; hot marks the hot key's.
func (t *tally) add(node int, hot bool, sent, recv time.Time, ans allowAnswer, wms int64, since time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.reasons == nil {
		t.reasons, t.byWindow = map[string]int64{}, map[int64]uint64{}
	}
	reason := ans.Reason
	if reason == "" {
		reason = "(none)"
	}
	t.reasons[reason]++
	if reason == "joining" && len(t.joining) < maxJoiningNoted {
		t.joining = append(t.joining, fmt.Sprintf("%.1fs: node %d", recv.Sub(since).Seconds(), node))
	}
	if hot && ans.Allowed {
		if w, ok := placeWindow(sent, recv, ans.ResetAfterMs, wms); ok {
			t.byWindow[w]++
		} else {
			t.unplaced++
		}
	}
}

// run starts the hot key's flood (rate per second, workers connections)
// and the rotating keys (keyRate per second over nKeys keys, a few
// connections) until ctx is done; wait returns once they have stopped.
func (g *generator) run(ctx context.Context, hotRate float64, workers int, nKeys int, keyRate float64) {
	g.start = time.Now()
	g.hot.rate, g.keys.rate = hotRate, keyRate
	if hotRate > 0 {
		body := fmt.Appendf(nil, `{"rule":%q,"key":"hot"}`, g.rule)
		g.spawn(ctx, &g.hot, true, workers, func(uint64) []byte { return body })
	}
	if keyRate > 0 && nKeys > 0 {
		var n atomic.Uint64
		kw := max(2*len(g.c.members), min(32, int(keyRate/50))) // every node gets some
		g.spawn(ctx, &g.keys, false, kw, func(uint64) []byte {
			return fmt.Appendf(nil, `{"rule":%q,"key":"k-%d"}`, g.rule, n.Add(1)%uint64(nKeys))
		})
	}
}

// wait waits for the workers after ctx is done, and marks the load's end.
func (g *generator) wait() {
	g.end = time.Now()
	g.wg.Wait()
}

func (g *generator) spawn(ctx context.Context, s *stream, hot bool, workers int, body func(uint64) []byte) {
	every := time.Duration(float64(workers) / s.rate * float64(time.Second))
	for w := range workers {
		g.wg.Add(1)
		go func() {
			defer g.wg.Done()
			conns := map[*proc]*allowConn{}
			defer func() {
				for _, c := range conns {
					c.close()
				}
			}()
			next := g.start.Add(time.Duration(w) * every / time.Duration(workers))
			timer := time.NewTimer(0)
			defer timer.Stop()
			for n := uint64(0); ; n++ {
				timer.Reset(time.Until(next))
				select {
				case <-ctx.Done():
					return
				case <-timer.C:
				}
				next = next.Add(every)
				if now := time.Now(); next.Before(now.Add(-100 * time.Millisecond)) {
					s.missed.Add(int64(now.Sub(next) / every))
					next = now
				}
				p, node := g.pick(w)
				if p == nil {
					continue
				}
				s.sent.Add(1)
				c := conns[p]
				if c == nil {
					var err error
					if c, err = dialAllow(p.ready.API); err != nil {
						s.failed.Add(1)
						continue
					}
					conns[p] = c
				}
				sent := time.Now()
				ans, err := c.allow(body(n))
				if err != nil {
					s.failed.Add(1)
					c.close()
					delete(conns, p)
					continue
				}
				g.tally.add(node, hot, sent, time.Now(), ans, g.wms, g.start)
				if ans.Allowed {
					s.yes.Add(1)
				}
			}
		}()
	}
}

// pick returns worker w's node and its index, w modulo the nodes, while
// it runs (a pause holds up that node's workers only), else the next
// running node round-robin; nil when none is.
func (g *generator) pick(w int) (*proc, int) {
	n := len(g.c.members)
	if p := g.c.running(w % n); p != nil {
		return p, w % n
	}
	for range n {
		i := int(g.rr.Add(1) % uint64(n))
		if p := g.c.running(i); p != nil {
			return p, i
		}
	}
	return nil, -1
}

// report says what was offered over the run so far. A worker waits for
// its node's answer, so a paused node's share of the load is not offered
// while it is paused: the generator fell behind when it offered under 90%
// of a stream's rate less that share (paused, in total over the nodes).
func (g *generator) report(r *loadReport, paused time.Duration) {
	end := g.end
	if end.IsZero() {
		end = time.Now()
	}
	el := end.Sub(g.start).Seconds()
	r.Seconds = el
	r.HotTarget, r.KeysTarget = g.hot.rate, g.keys.rate
	if el > 0 {
		r.HotOffered = float64(g.hot.sent.Load()) / el
		r.KeysOffered = float64(g.keys.sent.Load()) / el
	}
	r.HotAllowed = g.hot.yes.Load()
	r.Sent = g.hot.sent.Load() + g.keys.sent.Load()
	r.Failed = g.hot.failed.Load() + g.keys.failed.Load()
	r.Missed = g.hot.missed.Load() + g.keys.missed.Load()
	up := 1.0
	if el > 0 {
		up = max(0, 1-paused.Seconds()/(el*float64(len(g.c.members))))
	}
	r.Up = up
	r.FellBehind = r.HotOffered < 0.9*up*r.HotTarget || r.KeysOffered < 0.9*up*r.KeysTarget
	g.tally.mu.Lock()
	defer g.tally.mu.Unlock()
	r.Reasons = make(map[string]int64, len(g.tally.reasons))
	for k, v := range g.tally.reasons {
		r.Reasons[k] = v
	}
	r.Joining = append([]string{}, g.tally.joining...)
	r.Unplaced = g.tally.unplaced
}

// burst sends n requests for key over the running nodes at once from
// conns connections, dialled before start, sending at start. It returns
// how many were admitted, failed, and the reasons of the answers.
func burst(ctx context.Context, c *cluster, rule, key string, n, conns int, start time.Time) (allowed, failed int, reasons map[string]int, took time.Duration, err error) {
	var ps []*proc
	for i := range c.members {
		if p := c.running(i); p != nil {
			ps = append(ps, p)
		}
	}
	if len(ps) == 0 {
		return 0, 0, nil, 0, errors.New("no node is running")
	}
	conns = max(1, min(conns, n))
	cs := make([]*allowConn, conns)
	defer func() {
		for _, a := range cs {
			if a != nil {
				a.close()
			}
		}
	}()
	for i := range cs {
		if cs[i], err = dialAllow(ps[i%len(ps)].ready.API); err != nil {
			return 0, 0, nil, 0, fmt.Errorf("dial %s: %w", ps[i%len(ps)].ready.API, err)
		}
	}
	body := fmt.Appendf(nil, `{"rule":%q,"key":%q}`, rule, key)
	var mu sync.Mutex
	reasons = map[string]int{}
	var wg sync.WaitGroup
	select {
	case <-ctx.Done():
		return 0, 0, nil, 0, ctx.Err()
	case <-time.After(time.Until(start)):
	}
	for i, a := range cs {
		share := n / conns
		if i < n%conns {
			share++
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := range share {
				ans, err := a.allow(body)
				mu.Lock()
				switch {
				case err != nil: // the connection is gone: the rest of its share too
					failed += share - k
					reasons["error"] += share - k
				case ans.Allowed:
					allowed++
					reasons[ans.Reason]++
				default:
					reasons[ans.Reason]++
				}
				mu.Unlock()
				if err != nil {
					return
				}
			}
		}()
	}
	wg.Wait()
	return allowed, failed, reasons, time.Since(start), nil
}
