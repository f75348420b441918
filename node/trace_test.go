package node_test

import (
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"

	"github.com/ratemesh/ratemesh/crdt"
	"github.com/ratemesh/ratemesh/limiter"
	"github.com/ratemesh/ratemesh/node"
	"github.com/ratemesh/ratemesh/node/nodetest"
)

// Protocol traces, in the style of raft's interaction tests: each file
// under testdata/trace is a datadriven script (github.com/cockroachdb/datadriven)
// of commands over a nodetest network, each followed by what it printed.
// TestTraces runs every script and compares; after an intended change of
// behaviour, regenerate the expected output with
//
//	go test ./node -run TestTraces -rewrite
//
// and read the diff: it is the change of the protocol, batch by batch.
//
// A script is blocks separated by blank lines; a block is a command line,
// a line "----" and the expected output ("ok" when the command printed
// nothing). Lines starting with # are comments. Arguments are bare words
// (members, keys, numbers, durations, in the order given below) and
// key=value options. The commands:
//
//	rule NAME ALG LIMIT [window=D] [ttl=D]
//	                       a rule of the cores added after it: ALG
//	                       fixed_window, sliding_window or concurrency,
//	                       window for the windowed ones, ttl a lease's
//	                       lease_ttl (default 60 s); the first rule command
//	                       replaces the default rule, api (fixed window, 100
//	                       per minute)
//	add P… [join=true] [policy=available] [skew=D]
//	                       cores P…, each connected to every member before
//	                       it (anti-entropy); join=true: joining (peers
//	                       configured); policy=available: not strict;
//	                       skew=D: their clocks read the network's time
//	                       plus D (D may be negative)
//	add-through P S [join=true]
//	                       core P connected to S alone (one bootstrap address)
//	allow P KEY N [rule=R] N requests at P; prints admissions and denials
//	acquire P KEY [N] [rule=R]
//	                       N (default 1) leases at P; prints the leases granted
//	                       and the denials
//	renew P ID / release P ID
//	                       renew or release P's lease ID; prints the error,
//	                       if any
//	leases P               P's own leases and when they expire (none: none)
//	expect P Q…            tell P that connections to Q… are up (Core.ExpectState)
//	drop FROM TO [N]       drop the next N (default 1) gossip batches FROM → TO
//	cut A B / recover      break the link A–B / heal every link (anti-entropy)
//	heal A B               heal the link A–B alone (anti-entropy)
//	isolate P              break every link of P
//	crash P                stop P: it neither ticks nor receives again, silent
//	leave P                P leaves gracefully (Core.Leave) and stops
//	evict P Q              P evicts Q at once (an operator's evict at P)
//	skew P D               from now on P's clock reads the network's time
//	                       plus D: a clock step (a forward step of
//	                       suspect_after or more looks like a stall of P's
//	                       own: docs/design.md, "What the margins assume")
//	round [D]              advance D (default 20 ms), tick every member, deliver
//	                       what they sent; prints each member's Ready
//	rounds N [D]           N rounds, printing only membership, join, fence,
//	                       skew and staleness changes and drops
//	usage P KEY [rule=R]   P's merged total, own admitted/attempted, own
//	                       unacknowledged; of a concurrency rule, the live
//	                       leases and P's own held/acquired
//	windows P KEY [rule=R] every window of KEY that P holds (its start and end
//	                       from the start of the script, in mesh time) and its
//	                       admitted/attempted per slot (peer/incarnation)
//	members P              P's view of the members, and whether P serves (or
//	                       is joining, fenced, or stale: docs/design.md,
//	                       "What the margins assume")
//	clock P                P's clock and mesh time from the network's time,
//	                       its offset to the mesh and its estimate of every
//	                       member's clock
//	stats P                P's nack counters
//	dropped P              the entries P dropped: window already collected,
//	                       window beyond max_skew ahead (and how many such
//	                       entries it held for later instead), unknown rule
//
// The rule option defaults to the first rule of the kind the command
// needs (windowed for allow and windows, concurrency for acquire, any for
// usage). A member's clock reads the network's time plus its skew; "t=+…"
// is the network's time since the start. Batches arrive at once (no
// latency, no loss but drops); every core has the default settings: sync
// interval 20 ms, heartbeat 500 ms, suspect after 2 s, reclaim after 5 s
// (strict) or dead after 5 s (available), join timeout 3 s, max_skew
// 500 ms. Every core added has incarnation 1; one that learns it was
// evicted takes a new one from its clock (Unix ms), which windows prints
// as "new".
func TestTraces(t *testing.T) {
	datadriven.Walk(t, filepath.Join("testdata", "trace"), func(t *testing.T, path string) {
		e := newTraceEnv(t)
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			e.t = t
			got, err := e.do(d)
			if err != nil {
				d.Fatalf(t, "%s: %v", d.Cmd, err)
			}
			if got == "" {
				return "ok"
			}
			return got
		})
	})
}

// traceEnv is the state of one script.
type traceEnv struct {
	t     *testing.T
	net   *nodetest.Network
	index map[string]int
	rules []limiter.Rule // of the cores added next
	ruled bool           // a rule command replaced the default rules
	drops map[[2]int]int // gossip batches still to drop, by (from, to)
	out   *strings.Builder
	quiet bool // print no batches, only the changes (rounds)
}

func newTraceEnv(t *testing.T) *traceEnv {
	e := &traceEnv{
		t: t, net: nodetest.New(1, t0), index: map[string]int{}, drops: map[[2]int]int{},
		rules: []limiter.Rule{{Name: "api", Algorithm: limiter.FixedWindow, Limit: 100, Window: time.Minute}},
	}
	e.net.Filter = func(from, to int, b *crdt.Batch) bool {
		k := [2]int{from, to}
		if b.Has(crdt.FlagFull) {
			if e.out != nil && !e.quiet {
				fmt.Fprintf(e.out, "%s: to %s %s\n", e.peer(from), e.peer(to), e.fmtBatch(b))
			}
			return true
		}
		if e.drops[k] == 0 {
			return true
		}
		e.drops[k]--
		if e.out != nil {
			fmt.Fprintf(e.out, "%s: seq=%d dropped for %s\n", e.peer(from), b.Seq, e.peer(to))
		}
		return false
	}
	e.net.OnReady = func(i int, _ time.Time, rd node.Ready) { e.printReady(i, rd) }
	return e
}

func (e *traceEnv) peer(i int) string { return e.net.Core(i).Self().Peer }

func (e *traceEnv) member(name string) (int, error) {
	i, ok := e.index[name]
	if !ok {
		return 0, fmt.Errorf("no member %q", name)
	}
	return i, nil
}

// pair resolves the two members a command such as "cut A B" names.
func (e *traceEnv) pair(a, b string) (int, int, error) {
	i, err := e.member(a)
	if err != nil {
		return 0, 0, err
	}
	j, err := e.member(b)
	return i, j, err
}

// traceCmd is one command line: its bare words and its options.
type traceCmd struct {
	name string
	args []string
	opts map[string]string
}

// want checks the number of bare words: between least and most (-1: no
// most).
func (c *traceCmd) want(least, most int, usage string) error {
	if len(c.args) < least || (most >= 0 && len(c.args) > most) {
		return fmt.Errorf("want %s %s", c.name, usage)
	}
	return nil
}

// check checks the command's bare words (want) and options (only).
func (c *traceCmd) check(least, most int, usage string, opts ...string) error {
	if err := c.want(least, most, usage); err != nil {
		return err
	}
	return c.only(opts...)
}

// subject checks the command (check) and resolves the member its first
// word names.
func (e *traceEnv) subject(c *traceCmd, least, most int, usage string, opts ...string) (int, error) {
	if err := c.check(least, most, usage, opts...); err != nil {
		return 0, err
	}
	return e.member(c.args[0])
}

// only checks that the command has no other options than names.
func (c *traceCmd) only(names ...string) error {
	for k := range c.opts {
		if !slices.Contains(names, k) {
			return fmt.Errorf("%s takes no option %s", c.name, k)
		}
	}
	return nil
}

// count returns bare word i as a number, or def if there is none.
func (c *traceCmd) count(i, def int) (int, error) {
	if i >= len(c.args) {
		return def, nil
	}
	return strconv.Atoi(c.args[i])
}

// Which rules a command's rule option defaults to (traceEnv.rule).
const (
	anyRule = iota
	windowedRule
	leasedRule
)

// rule returns the rule the command names with rule=, or member i's first
// rule of the kind given.
func (e *traceEnv) rule(c *traceCmd, i int, kind int) (string, error) {
	if r, ok := c.opts["rule"]; ok {
		return r, nil
	}
	for _, r := range e.net.Core(i).Rules() {
		if kind == anyRule || r.Leased() == (kind == leasedRule) {
			return r.Name, nil
		}
	}
	return "", fmt.Errorf("%s has no rule for %s", e.peer(i), c.name)
}

// do runs one command and returns what it printed.
func (e *traceEnv) do(d *datadriven.TestData) (string, error) {
	var out strings.Builder
	e.out = &out
	defer func() { e.out = nil }()
	c := traceCmd{name: d.Cmd, opts: map[string]string{}}
	for _, a := range d.CmdArgs {
		switch len(a.Vals) {
		case 0:
			c.args = append(c.args, a.Key)
		case 1:
			c.opts[a.Key] = a.Vals[0]
		default:
			return "", fmt.Errorf("%s: want one value", a.Key)
		}
	}
	cmds := map[string]func(*traceCmd, *strings.Builder) error{
		"rule": e.cmdRule, "add": e.cmdAdd, "add-through": e.cmdAdd,
		"allow": e.cmdAllow, "acquire": e.cmdAcquire, "renew": e.cmdLease, "release": e.cmdLease, "leases": e.cmdLeases,
		"expect": e.cmdExpect, "drop": e.cmdDrop,
		"cut": e.cmdLink, "heal": e.cmdLink, "recover": e.cmdLink, "isolate": e.cmdLink,
		"crash": e.cmdStop, "leave": e.cmdStop, "evict": e.cmdEvict, "skew": e.cmdSkew,
		"round": e.cmdRound, "rounds": e.cmdRound,
		"usage": e.cmdUsage, "windows": e.cmdWindows, "members": e.cmdMembers, "clock": e.cmdClock,
		"stats": e.cmdStats, "dropped": e.cmdStats,
	}
	f, ok := cmds[c.name]
	if !ok {
		return "", fmt.Errorf("unknown command %q", c.name)
	}
	if err := f(&c, &out); err != nil {
		return "", err
	}
	return strings.TrimSuffix(out.String(), "\n"), nil
}

func (e *traceEnv) cmdRule(c *traceCmd, _ *strings.Builder) error {
	if err := c.check(3, 3, "NAME ALG LIMIT [window=D] [ttl=D]", "window", "ttl"); err != nil {
		return err
	}
	limit, err := strconv.ParseUint(c.args[2], 10, 64)
	if err != nil {
		return err
	}
	r := limiter.Rule{Name: c.args[0], Algorithm: limiter.Algorithm(c.args[1]), Limit: limit}
	if v, ok := c.opts["window"]; ok {
		if r.Window, err = time.ParseDuration(v); err != nil {
			return err
		}
	}
	if v, ok := c.opts["ttl"]; ok {
		if r.LeaseTTL, err = time.ParseDuration(v); err != nil {
			return err
		}
	}
	if !e.ruled {
		e.rules, e.ruled = nil, true
	}
	e.rules = append(e.rules, r)
	return nil
}

func (e *traceEnv) cmdAdd(c *traceCmd, _ *strings.Builder) error {
	if err := c.only("join", "policy", "skew"); err != nil {
		return err
	}
	join, policy, skew := false, node.Strict, time.Duration(0)
	if v, ok := c.opts["join"]; ok {
		var err error
		if join, err = strconv.ParseBool(v); err != nil {
			return fmt.Errorf("join=%s: %w", v, err)
		}
	}
	if v, ok := c.opts["policy"]; ok {
		if policy = node.Policy(v); policy != node.Strict && policy != node.Available {
			return fmt.Errorf("policy=%s: want strict or available", v)
		}
	}
	if v, ok := c.opts["skew"]; ok {
		var err error
		if skew, err = time.ParseDuration(v); err != nil {
			return err
		}
	}
	if c.name == "add-through" {
		if err := c.want(2, 2, "PEER SEED [join=true]"); err != nil {
			return err
		}
		if skew != 0 {
			return fmt.Errorf("add-through takes no skew")
		}
		s, err := e.member(c.args[1])
		if err != nil {
			return err
		}
		e.index[c.args[0]] = e.net.AddThrough(e.newCore(c.args[0], join, policy, 0), s)
		return e.net.Drain()
	}
	if err := c.want(1, -1, "PEER… [join=true] [policy=available] [skew=D]"); err != nil {
		return err
	}
	for _, p := range c.args {
		e.index[p] = e.net.AddSkewed(e.newCore(p, join, policy, skew), skew)
		if err := e.net.Drain(); err != nil {
			return err
		}
	}
	return nil
}

func (e *traceEnv) cmdAllow(c *traceCmd, out *strings.Builder) error {
	i, err := e.subject(c, 3, 3, "PEER KEY N [rule=R]", "rule")
	if err != nil {
		return err
	}
	n, err := c.count(2, 0)
	if err != nil {
		return err
	}
	rule, err := e.rule(c, i, windowedRule)
	if err != nil {
		return err
	}
	admitted, denied := 0, map[string]int{}
	for range n {
		d, err := e.net.Core(i).Allow(e.net.Local(i), rule, c.args[1], limiter.Request{})
		if err != nil {
			return err
		}
		if d.Allowed {
			admitted++
		} else {
			denied[d.Reason.String()]++
		}
	}
	fmt.Fprintf(out, "admitted %d", admitted)
	printDenied(out, denied)
	return nil
}

func printDenied(out *strings.Builder, denied map[string]int) {
	for _, r := range slices.Sorted(maps.Keys(denied)) {
		fmt.Fprintf(out, ", denied %d (%s)", denied[r], r)
	}
}

func (e *traceEnv) cmdAcquire(c *traceCmd, out *strings.Builder) error {
	i, err := e.subject(c, 2, 3, "PEER KEY [N] [rule=R]", "rule")
	if err != nil {
		return err
	}
	n, err := c.count(2, 1)
	if err != nil {
		return err
	}
	rule, err := e.rule(c, i, leasedRule)
	if err != nil {
		return err
	}
	var granted []string
	denied := map[string]int{}
	for range n {
		ls, d, err := e.net.Core(i).Acquire(e.net.Local(i), rule, c.args[1], "")
		if err != nil {
			return err
		}
		if d.Allowed {
			granted = append(granted, ls.ID)
		} else {
			denied[d.Reason.String()]++
		}
	}
	fmt.Fprintf(out, "granted %d", len(granted))
	if len(granted) > 0 {
		fmt.Fprintf(out, " (%s)", strings.Join(granted, " "))
	}
	printDenied(out, denied)
	return nil
}

func (e *traceEnv) cmdLease(c *traceCmd, out *strings.Builder) error {
	i, err := e.subject(c, 2, 2, "PEER ID")
	if err != nil {
		return err
	}
	core, now := e.net.Core(i), e.net.Local(i)
	if c.name == "release" {
		err = core.Release(now, c.args[1])
	} else {
		_, err = core.Renew(now, c.args[1])
	}
	if err != nil {
		fmt.Fprintf(out, "error: %v", err)
	}
	return nil
}

func (e *traceEnv) cmdLeases(c *traceCmd, out *strings.Builder) error {
	i, err := e.subject(c, 1, 1, "PEER")
	if err != nil {
		return err
	}
	ls := e.net.Core(i).Leases()
	if len(ls) == 0 {
		out.WriteString("none")
	}
	for _, l := range ls {
		fmt.Fprintf(out, "%s %s/%s expires +%v\n", l.ID, l.Rule, l.Key, l.Expires.Sub(t0))
	}
	return nil
}

func (e *traceEnv) cmdExpect(c *traceCmd, _ *strings.Builder) error {
	i, err := e.subject(c, 2, -1, "PEER PEER…")
	if err != nil {
		return err
	}
	for _, p := range c.args[1:] {
		e.net.Core(i).ExpectState(p)
	}
	return nil
}

func (e *traceEnv) cmdDrop(c *traceCmd, _ *strings.Builder) error {
	if err := c.check(2, 3, "FROM TO [N]"); err != nil {
		return err
	}
	from, to, err := e.pair(c.args[0], c.args[1])
	if err != nil {
		return err
	}
	n, err := c.count(2, 1)
	if err != nil {
		return err
	}
	e.drops[[2]int{from, to}] += n
	return nil
}

func (e *traceEnv) cmdLink(c *traceCmd, _ *strings.Builder) error {
	if err := c.only(); err != nil {
		return err
	}
	switch c.name {
	case "recover":
		if err := c.want(0, 0, ""); err != nil {
			return err
		}
		e.net.Recover()
		return e.net.Drain()
	case "isolate":
		if err := c.want(1, 1, "PEER"); err != nil {
			return err
		}
		i, err := e.member(c.args[0])
		if err != nil {
			return err
		}
		e.net.Isolate(i)
		return nil
	}
	if err := c.want(2, 2, "A B"); err != nil {
		return err
	}
	a, b, err := e.pair(c.args[0], c.args[1])
	if err != nil {
		return err
	}
	if c.name == "cut" {
		e.net.Cut(a, b)
		return nil
	}
	e.net.Heal(a, b)
	return e.net.Drain()
}

func (e *traceEnv) cmdStop(c *traceCmd, _ *strings.Builder) error {
	i, err := e.subject(c, 1, 1, "PEER")
	if err != nil {
		return err
	}
	if c.name == "crash" {
		e.net.Crash(i)
		return nil
	}
	e.net.Leave(i)
	return e.net.Drain()
}

func (e *traceEnv) cmdEvict(c *traceCmd, _ *strings.Builder) error {
	if err := c.check(2, 2, "PEER PEER"); err != nil {
		return err
	}
	i, _, err := e.pair(c.args[0], c.args[1])
	if err != nil {
		return err
	}
	return e.net.Core(i).Evict(e.net.Local(i), c.args[1])
}

func (e *traceEnv) cmdSkew(c *traceCmd, _ *strings.Builder) error {
	i, err := e.subject(c, 2, 2, "PEER DURATION")
	if err != nil {
		return err
	}
	d, err := time.ParseDuration(c.args[1])
	if err != nil {
		return err
	}
	e.net.Skew(i, d)
	return nil
}

func (e *traceEnv) cmdRound(c *traceCmd, out *strings.Builder) error {
	if err := c.only(); err != nil {
		return err
	}
	n, args := 1, c.args
	if c.name == "rounds" {
		if err := c.want(1, 2, "N [DURATION]"); err != nil {
			return err
		}
		var err error
		if n, err = c.count(0, 1); err != nil {
			return err
		}
		args = args[1:]
	} else if err := c.want(0, 1, "[DURATION]"); err != nil {
		return err
	}
	d := 20 * time.Millisecond
	if len(args) == 1 {
		var err error
		if d, err = time.ParseDuration(args[0]); err != nil {
			return err
		}
	}
	e.quiet = c.name == "rounds"
	defer func() { e.quiet = false }()
	for range n {
		var round strings.Builder
		e.out = &round
		e.net.Advance(d)
		e.net.Tick()
		if err := e.net.Drain(); err != nil {
			return err
		}
		if !e.quiet || round.Len() > 0 {
			fmt.Fprintf(out, "t=+%v\n%s", e.net.Now().Sub(t0), round.String())
		}
	}
	return nil
}

func (e *traceEnv) cmdUsage(c *traceCmd, out *strings.Builder) error {
	i, err := e.subject(c, 2, 2, "PEER KEY [rule=R]", "rule")
	if err != nil {
		return err
	}
	core, now := e.net.Core(i), e.net.Local(i)
	rule, err := e.rule(c, i, anyRule)
	if err != nil {
		return err
	}
	rep, err := core.Usage(now, rule, c.args[1])
	if err != nil {
		return err
	}
	o := own(core, rep)
	if rep.WindowMs == 0 {
		fmt.Fprintf(out, "leases %d, own %d held/%d acquired", rep.Total, o.Admitted, o.Attempted)
		return nil
	}
	fmt.Fprintf(out, "total %d, own %d/%d, unacknowledged %d", rep.Total, o.Admitted, o.Attempted, unacked(e.t, core, now, rule, c.args[1]))
	return nil
}

func (e *traceEnv) cmdWindows(c *traceCmd, out *strings.Builder) error {
	i, err := e.subject(c, 2, 2, "PEER KEY [rule=R]", "rule")
	if err != nil {
		return err
	}
	core, now := e.net.Core(i), e.net.Local(i)
	rule, err := e.rule(c, i, windowedRule)
	if err != nil {
		return err
	}
	s := core.Container().Lookup(rule).Series(c.args[1])
	if s == nil {
		return nil
	}
	for _, w := range s.Windows() {
		rep, err := core.UsageOfWindow(now, rule, c.args[1], w.Index)
		if err != nil {
			return err
		}
		start := time.UnixMilli(w.Start()).Sub(t0)
		fmt.Fprintf(out, "[+%v, +%v) total %d:", start, start+time.Duration(w.WindowMs)*time.Millisecond, rep.Total)
		for _, sl := range rep.Slots {
			fmt.Fprintf(out, " %s/%s=%d/%d", sl.Peer, e.inc(sl.Incarnation), sl.Admitted, sl.Attempted)
		}
		out.WriteString("\n")
	}
	return nil
}

// inc names an incarnation: 1, that of every core added, or "new" for
// the one a core takes when it learns it was evicted.
func (e *traceEnv) inc(n uint64) string {
	if n == 1 {
		return "1"
	}
	return "new"
}

func (e *traceEnv) cmdMembers(c *traceCmd, out *strings.Builder) error {
	i, err := e.subject(c, 1, 1, "PEER")
	if err != nil {
		return err
	}
	core := e.net.Core(i)
	var ps []string
	for _, p := range core.Peers(e.net.Local(i)) {
		if !p.Self {
			ps = append(ps, p.Peer+":"+p.State.String())
		}
	}
	n, _ := core.Members()
	serves := "serving"
	switch {
	case !core.Joined():
		serves = "joining"
	case core.Fenced():
		serves = "fenced"
	case core.Stale():
		serves = "stale"
	}
	fmt.Fprintf(out, "%s, N=%d, %s", strings.Join(ps, " "), n, serves)
	return nil
}

func (e *traceEnv) cmdClock(c *traceCmd, out *strings.Builder) error {
	i, err := e.subject(c, 1, 1, "PEER")
	if err != nil {
		return err
	}
	core, now := e.net.Core(i), e.net.Local(i)
	mesh := time.UnixMilli(core.MeshMs(now)).Sub(e.net.Now())
	fmt.Fprintf(out, "local %s, mesh %s, offset %s", signed(now.Sub(e.net.Now())), signed(mesh), signed(core.Offset()))
	for _, p := range core.Peers(now) {
		if p.Self {
			continue
		}
		how := "one way"
		if p.ClockRoundTrip {
			how = "round trip"
		}
		fmt.Fprintf(out, "; %s %s (%s)", p.Peer, signed(p.ClockOffset), how)
	}
	return nil
}

// signed prints d with its sign.
func signed(d time.Duration) string {
	if d < 0 {
		return d.String()
	}
	return "+" + d.String()
}

func (e *traceEnv) cmdStats(c *traceCmd, out *strings.Builder) error {
	i, err := e.subject(c, 1, 1, "PEER")
	if err != nil {
		return err
	}
	st := e.net.Core(i).Stats()
	if c.name == "dropped" {
		fmt.Fprintf(out, "collected %d, beyond max_skew %d (held %d), unknown rule %d", st.DroppedExpired, st.DroppedFuture, st.FutureHeld, st.DroppedUnknownRule)
		return nil
	}
	fmt.Fprintf(out, "nacks sent %d, received %d, repairs skipped %d", st.NacksSent, st.NacksReceived, st.RepairsSkipped)
	return nil
}

func (e *traceEnv) newCore(peer string, join bool, policy node.Policy, skew time.Duration) *node.Core {
	e.t.Helper()
	return newCore(e.t, peer, e.net.Now().Add(skew), e.rules, func(c *node.CoreConfig) {
		c.Join, c.Policy = join, policy
		c.Incarnation = 1
	})
}

// printReady prints what member i's Ready asks: the batches it publishes
// (its Direct batches are printed as they are sent, by the network's
// Filter, like every full state), the membership changes and the join,
// fence, skew and staleness changes.
func (e *traceEnv) printReady(i int, rd node.Ready) {
	if e.out == nil {
		return
	}
	p := e.peer(i)
	for _, b := range rd.Messages {
		if !e.quiet {
			fmt.Fprintf(e.out, "%s: publish %s\n", p, e.fmtBatch(b))
		}
	}
	for _, c := range rd.Changes {
		if c.New {
			fmt.Fprintf(e.out, "%s: member %s new, %s\n", p, c.Peer, c.To)
		} else {
			fmt.Fprintf(e.out, "%s: member %s %s -> %s\n", p, c.Peer, c.From, c.To)
		}
	}
	if rd.NewIncarnation != 0 {
		fmt.Fprintf(e.out, "%s: new incarnation\n", p)
	}
	if rd.Joined {
		fmt.Fprintf(e.out, "%s: joined (timed out %v)\n", p, rd.JoinTimedOut)
	}
	if rd.Fence != nil {
		fmt.Fprintf(e.out, "%s: fenced %v (%d of %d alive)\n", p, rd.Fence.Fenced, rd.Fence.Alive, rd.Fence.Live)
	}
	if rd.Skew != nil {
		fmt.Fprintf(e.out, "%s: skew beyond max_skew %v (offset %s)\n", p, rd.Skew.Exceeded, signed(rd.Skew.Offset))
	}
	if rd.Stale != nil {
		fmt.Fprintf(e.out, "%s: stale %v (%d of %d lagging)\n", p, rd.Stale.Stale, rd.Stale.Lagging, rd.Stale.Live)
	}
}

// fmtBatch prints a batch's protocol fields: flags, seq, Ack (mesh ms since
// the start; - for none), window entries (rule/key=admitted/attempted),
// lease entries (rule/key=+acquired-released; entries of another slot than
// the author's name it), repairs, nacks, the slots the author evicted and
// the member table.
func (e *traceEnv) fmtBatch(b *crdt.Batch) string {
	var f []string
	for _, fl := range []struct {
		bit  uint64
		name string
	}{{crdt.FlagFull, "full"}, {crdt.FlagWant, "want"}, {crdt.FlagRelay, "relay"}, {crdt.FlagLast, "last"}, {crdt.FlagLeaving, "leaving"}} {
		if b.Has(fl.bit) {
			f = append(f, fl.name)
		}
	}
	ack := "-"
	if b.Ack != 0 {
		ack = fmt.Sprintf("+%d", b.Ack-t0.UnixMilli())
	}
	f = append(f, fmt.Sprintf("seq=%d ack=%s", b.Seq, ack))
	var es []string
	for _, w := range b.Windows {
		who := ""
		if w.Slot != 0 {
			who = "@" + b.SlotOf(w.Slot).Peer
		}
		es = append(es, fmt.Sprintf("%s/%s%s=%d/%d", w.Rule, w.Key, who, w.Admitted, w.Attempted))
	}
	if len(es) > 0 {
		f = append(f, "["+strings.Join(es, " ")+"]")
	}
	var ls []string
	for _, l := range b.Leases {
		who := ""
		if l.Slot != 0 {
			who = "@" + b.SlotOf(l.Slot).Peer
		}
		ls = append(ls, fmt.Sprintf("%s/%s%s=+%d-%d", l.Rule, l.Key, who, l.Acquired, l.Released))
	}
	if len(ls) > 0 {
		f = append(f, "leases=["+strings.Join(ls, " ")+"]")
	}
	var rs []string
	for _, r := range b.Repairs {
		rs = append(rs, fmt.Sprintf("#%d:%d", r.Seq, r.N))
	}
	if len(rs) > 0 {
		f = append(f, "repairs="+strings.Join(rs, ","))
	}
	var ns []string
	for _, n := range b.Nacks {
		ns = append(ns, fmt.Sprintf("%s#%d", n.Slot.Peer, n.Seq))
	}
	if len(ns) > 0 {
		f = append(f, "nacks="+strings.Join(ns, ","))
	}
	var ev []string
	for _, s := range b.Evicted {
		ev = append(ev, s.Peer)
	}
	if len(ev) > 0 {
		f = append(f, "evicted="+strings.Join(ev, ","))
	}
	var ms []string
	for _, m := range b.Members {
		ms = append(ms, m.Peer+":"+node.State(m.State).String())
	}
	if len(ms) > 0 {
		f = append(f, "members="+strings.Join(ms, ","))
	}
	return strings.Join(f, " ")
}
