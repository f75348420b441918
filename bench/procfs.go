package main

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// clockTick is USER_HZ, the unit of /proc's CPU times: 100 on every Linux
// architecture Go supports.
const clockTick = 100

// parseProcStat returns the CPU time (user + system) from the text of
// /proc/PID/stat. The command name, field 2, is in parentheses and may
// hold spaces and parentheses itself, so the fields are counted from the
// last ')'.
func parseProcStat(s string) (time.Duration, error) {
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, errors.New("/proc/PID/stat: no ')' after the command name")
	}
	f := strings.Fields(s[i+1:])
	// f[0] is field 3 (state); utime and stime are fields 14 and 15.
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/PID/stat: %d fields after the command name, want at least 13", len(f))
	}
	var ticks uint64
	for _, v := range f[11:13] {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/PID/stat: utime/stime %q: %w", v, err)
		}
		ticks += n
	}
	return time.Duration(ticks) * time.Second / clockTick, nil
}

// hostCPU is the "cpu" line of /proc/stat: the time all CPUs spent busy
// and in all, and the time stolen by the hypervisor (part of busy).
type hostCPU struct {
	Busy, Total, Steal time.Duration
}

// parseHostStat reads the first "cpu " line of /proc/stat's text: user
// nice system idle iowait irq softirq steal [guest guest_nice]. Idle and
// iowait are not busy; guest time is already part of user.
func parseHostStat(s string) (hostCPU, error) {
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 || f[0] != "cpu" {
			continue
		}
		if len(f) < 9 {
			return hostCPU{}, fmt.Errorf("/proc/stat: cpu line has %d fields, want at least 9", len(f))
		}
		var v [8]uint64
		for i := range v {
			n, err := strconv.ParseUint(f[i+1], 10, 64)
			if err != nil {
				return hostCPU{}, fmt.Errorf("/proc/stat: cpu field %d %q: %w", i+1, f[i+1], err)
			}
			v[i] = n
		}
		var total uint64
		for _, n := range v {
			total += n
		}
		tick := func(n uint64) time.Duration { return time.Duration(n) * time.Second / clockTick }
		idle := v[3] + v[4]
		return hostCPU{Busy: tick(total - idle), Total: tick(total), Steal: tick(v[7])}, nil
	}
	return hostCPU{}, errors.New("/proc/stat: no cpu line")
}

// parseVmRSS returns VmRSS from the text of /proc/PID/status, in bytes.
func parseVmRSS(s string) (uint64, error) {
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), "VmRSS:")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) != 2 || f[1] != "kB" {
			return 0, fmt.Errorf("/proc/PID/status: VmRSS %q: want \"N kB\"", strings.TrimSpace(rest))
		}
		n, err := strconv.ParseUint(f[0], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/PID/status: VmRSS: %w", err)
		}
		return n * 1024, nil
	}
	return 0, errors.New("/proc/PID/status: no VmRSS line (a zombie?)")
}

// procCPU is process pid's CPU time so far.
func procCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	return parseProcStat(string(b))
}

// procRSS is process pid's resident set size in bytes.
func procRSS(pid int) (uint64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	return parseVmRSS(string(b))
}

// readHostCPU reads /proc/stat.
func readHostCPU() (hostCPU, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return hostCPU{}, err
	}
	return parseHostStat(string(b))
}

// selfCPU is this process's CPU time (user + system), from getrusage: the
// load generator's, since nothing else runs in the harness during a phase.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// metricValue returns the sum of the samples of metric name in a
// Prometheus text exposition whose labels contain every one of labels
// (each `k="v"`), and whether any sample matched.
func metricValue(text, name string, labels ...string) (float64, bool, error) {
	var sum float64
	found := false
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		rest, ok := strings.CutPrefix(line, name)
		if !ok || (rest != "" && rest[0] != ' ' && rest[0] != '{') {
			continue
		}
		lbl := ""
		if rest != "" && rest[0] == '{' {
			end := strings.IndexByte(rest, '}')
			if end < 0 {
				return 0, false, fmt.Errorf("metric %s: unterminated labels in %q", name, line)
			}
			lbl, rest = rest[1:end], rest[end+1:]
		}
		match := true
		for _, l := range labels {
			if !hasLabel(lbl, l) {
				match = false
				break
			}
		}
		if !match {
			continue
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			return 0, false, fmt.Errorf("metric %s: no value in %q", name, line)
		}
		v, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			return 0, false, fmt.Errorf("metric %s: value %q: %w", name, f[0], err)
		}
		sum += v
		found = true
	}
	return sum, found, sc.Err()
}

// hasLabel reports whether the label list lbl (`a="x",b="y"`) holds l.
func hasLabel(lbl, l string) bool {
	for _, p := range strings.Split(lbl, ",") {
		if strings.TrimSpace(p) == l {
			return true
		}
	}
	return false
}
