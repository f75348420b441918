package main

import (
	"slices"
	"time"
)

// accuracy judges what one system admitted on the flooded key, window by
// window.
type accuracy struct {
	Limit    int64 `json:"limit"`
	WindowMs int64 `json:"window_ms"`
	// PerWindow is the admitted count of each window wholly inside the
	// flood, in order; the first is the flood's first window.
	PerWindow []int64 `json:"per_window"`
	// MaxRatio and FirstRatio are the busiest and the first judged
	// window's admitted ÷ limit; Over counts windows above the limit.
	MaxRatio   float64 `json:"max_ratio"`
	FirstRatio float64 `json:"first_ratio"`
	Over       int     `json:"windows_over"`
	// Partial counts admissions in windows the flood covered only in
	// part (before its first or after its last whole window).
	Partial int64 `json:"partial"`
	// Unattributed counts ratemesh admissions whose answer took so long
	// that two windows could have held them (see rmWindowEnd); they are
	// in no window's count.
	Unattributed int64 `json:"unattributed,omitempty"`
}

// judgeWindows groups admissions by the end of the window they counted in
// (Unix ms, as each system reported it) and judges the windows that lie
// wholly inside the flood [start, stop].
//
// The two systems report a window's end differently: ratemesh's windows
// end at multiples of the window, and the harness tells which from the
// request's send and receive times and reset_after_ms (rmWindowEnd; −1,
// counted as unattributed, when an answer was too slow to tell);
// Gubernator's token bucket starts at a key's first hit after the
// previous bucket expired and reports its reset_time exactly, but under
// GLOBAL a node whose copy has expired starts a bucket of its own, so the
// nodes' ends differ by some milliseconds (or, now and then, overlap). So
// ends are grouped by proximity: an end more than half a window after the
// first end of the current group starts a new group, and a group's end is
// the latest in it. A window [end − window, end] is judged when it
// starts no earlier than start − tol and ends no later than stop + tol,
// tol being a twentieth of the window.
func judgeWindows(ends []int64, start, stop time.Time, window time.Duration, limit int64) accuracy {
	w := window.Milliseconds()
	a := accuracy{Limit: limit, WindowMs: w}
	e := make([]int64, 0, len(ends))
	for _, x := range ends {
		if x < 0 {
			a.Unattributed++
			continue
		}
		e = append(e, x)
	}
	if len(e) == 0 {
		return a
	}
	slices.Sort(e)
	tol := w / 20
	lo, hi := start.UnixMilli()-tol, stop.UnixMilli()+tol
	judge := func(last, n int64) {
		if last-w >= lo && last <= hi {
			a.PerWindow = append(a.PerWindow, n)
		} else {
			a.Partial += n
		}
	}
	first, last, n := e[0], e[0], int64(0)
	for _, x := range e {
		if x-first > w/2 {
			judge(last, n)
			first, n = x, 0
		}
		last = x
		n++
	}
	judge(last, n)
	for i, n := range a.PerWindow {
		r := float64(n) / float64(limit)
		if i == 0 {
			a.FirstRatio = r
		}
		a.MaxRatio = max(a.MaxRatio, r)
		if n > limit {
			a.Over++
		}
	}
	return a
}

// alignedStart is the first multiple of window after now plus lead, so
// that a flood starting there begins with a whole ratemesh window.
func alignedStart(now time.Time, window, lead time.Duration) time.Time {
	t := now.Add(lead).UnixMilli()
	w := window.Milliseconds()
	return time.UnixMilli((t/w + 1) * w)
}
