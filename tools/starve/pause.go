package main

import (
	"context"
	"math/rand"
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
		if p.events != nil {
			p.events("paused node %d for %v", i, time.Since(start).Round(time.Millisecond))
		}
		if ctx.Err() != nil {
			return
		}
	}
}
