package main

import (
	"context"
	"fmt"
	"math/rand"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// pausePlan draws the pauser's next step from r: the gap before the next
// pause (uniform in [every/2, 3·every/2]), the node (uniform among n) and
// the pause's length (uniform in [50 ms, 500 ms]).
func pausePlan(r *rand.Rand, every time.Duration, n int) (gap time.Duration, node int, length time.Duration) {
	gap = every/2 + time.Duration(r.Int63n(int64(every)+1))
	node = r.Intn(n)
	length = 50*time.Millisecond + time.Duration(r.Int63n(int64(450*time.Millisecond)+1))
	return gap, node, length
}

// pauser stops serve processes at random (SIGSTOP, then SIGCONT after
// 50–500 ms) until ctx is done, from a seeded source: the same seed draws
// the same plan (the times it lands on depend on the host).
type pauser struct {
	c      *cluster
	rand   *rand.Rand
	every  time.Duration
	events func(format string, args ...any)

	pauses atomic.Int64 // pauses ended
	paused atomic.Int64 // their total length, ns

	mu  sync.Mutex
	log []pause // the last 10000 pauses
}

// pause is one pause of one node.
type pause struct {
	node       int
	start, end time.Time
}

// during describes the pauses that overlapped [from, to], relative to
// from: "node 1 from +40ms for 230ms".
func (p *pauser) during(from, to time.Time) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []string
	for _, x := range p.log {
		if x.start.Before(to) && x.end.After(from) {
			out = append(out, fmt.Sprintf("node %d from %+dms for %dms", x.node, x.start.Sub(from).Milliseconds(), x.end.Sub(x.start).Milliseconds()))
		}
	}
	return out
}

// run pauses until ctx is done and leaves no process stopped.
func (p *pauser) run(ctx context.Context) {
	for {
		gap, i, length := pausePlan(p.rand, p.every, len(p.c.members))
		select {
		case <-ctx.Done():
			return
		case <-time.After(gap):
		}
		p.c.mu.Lock()
		m := p.c.members[i]
		if m.down || m.p == nil {
			p.c.mu.Unlock()
			continue
		}
		proc := m.p
		m.paused = true
		err := proc.cmd.Process.Signal(syscall.SIGSTOP)
		p.c.mu.Unlock()
		if err != nil {
			continue
		}
		start := time.Now()
		select {
		case <-ctx.Done():
		case <-time.After(length):
		}
		p.c.mu.Lock()
		_ = proc.cmd.Process.Signal(syscall.SIGCONT)
		if m.p == proc {
			m.paused = false
		}
		p.c.mu.Unlock()
		p.pauses.Add(1)
		p.paused.Add(int64(time.Since(start)))
		p.mu.Lock()
		if len(p.log) == 10000 {
			p.log = p.log[1:]
		}
		p.log = append(p.log, pause{node: i, start: start, end: time.Now()})
		p.mu.Unlock()
		if p.events != nil {
			p.events("paused node %d for %v", i, time.Since(start).Round(time.Millisecond))
		}
		if ctx.Err() != nil {
			return
		}
	}
}
