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
//	add P… [join=true] [policy=available]
//	                       cores P… (rule api: fixed window, 100 per minute),
//	                       each connected to every member before it
//	                       (anti-entropy); join=true: joining (peers
//	                       configured); policy=available: not strict
//	add-through P S [join=true]
//	                       core P connected to S alone (one bootstrap address)
//	allow P KEY N          N requests at P; prints admissions and denials
//	expect P Q…            tell P that connections to Q… are up (Core.ExpectState)
//	drop FROM TO [N]       drop the next N (default 1) gossip batches FROM → TO
//	cut A B / recover      break the link A–B / heal every link (anti-entropy)
//	heal A B               heal the link A–B alone (anti-entropy)
//	round [D]              advance D (default 20 ms), tick every member, deliver
//	                       what they sent; prints each member's Ready
//	rounds N [D]           N rounds, printing only membership, join and fence
//	                       changes and drops
//	usage P KEY            P's merged total, own admitted/attempted, own unacknowledged
//	members P              P's view of the members, and whether P serves
//	stats P                P's nack counters
//
// Batches arrive at once (no latency, no loss but drops), so the members'
// clocks agree; every core has the default settings: sync interval 20 ms,
// heartbeat 500 ms, suspect after 2 s, join timeout 3 s.
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
	drops map[[2]int]int // gossip batches still to drop, by (from, to)
	out   *strings.Builder
	quiet bool // print no batches, only the changes (rounds)
}

func newTraceEnv(t *testing.T) *traceEnv {
	e := &traceEnv{t: t, net: nodetest.New(1, t0), index: map[string]int{}, drops: map[[2]int]int{}}
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

// do runs one command and returns what it printed.
func (e *traceEnv) do(d *datadriven.TestData) (string, error) {
	var out strings.Builder
	e.out = &out
	defer func() { e.out = nil }()
	args, opts, err := splitArgs(d)
	if err != nil {
		return "", err
	}
	cmd := d.Cmd
	if len(opts) > 0 && cmd != "add" && cmd != "add-through" {
		return "", fmt.Errorf("%s takes no options", cmd)
	}
	switch cmd {
	case "add", "add-through":
		join, policy := false, node.Strict
		for k, v := range opts {
			switch k {
			case "join":
				if join, err = strconv.ParseBool(v); err != nil {
					return "", fmt.Errorf("join=%s: %w", v, err)
				}
			case "policy":
				if policy = node.Policy(v); policy != node.Strict && policy != node.Available {
					return "", fmt.Errorf("policy=%s: want strict or available", v)
				}
			default:
				return "", fmt.Errorf("unknown option %s", k)
			}
		}
		if cmd == "add-through" {
			if len(args) != 2 {
				return "", fmt.Errorf("want add-through PEER SEED [join=true]")
			}
			s, err := e.member(args[1])
			if err != nil {
				return "", err
			}
			e.index[args[0]] = e.net.AddThrough(e.newCore(args[0], join, policy), s)
			if err := e.net.Drain(); err != nil {
				return "", err
			}
			break
		}
		for _, p := range args {
			e.index[p] = e.net.Add(e.newCore(p, join, policy))
			if err := e.net.Drain(); err != nil {
				return "", err
			}
		}
	case "allow":
		if len(args) != 3 {
			return "", fmt.Errorf("want allow PEER KEY N")
		}
		i, err := e.member(args[0])
		if err != nil {
			return "", err
		}
		n, err := strconv.Atoi(args[2])
		if err != nil {
			return "", err
		}
		admitted, denied := 0, map[string]int{}
		for range n {
			d, err := e.net.Core(i).Allow(e.net.Local(i), "api", args[1], limiter.Request{})
			if err != nil {
				return "", err
			}
			if d.Allowed {
				admitted++
			} else {
				denied[d.Reason.String()]++
			}
		}
		fmt.Fprintf(&out, "admitted %d", admitted)
		for _, r := range slices.Sorted(maps.Keys(denied)) {
			fmt.Fprintf(&out, ", denied %d (%s)", denied[r], r)
		}
	case "expect":
		if len(args) < 2 {
			return "", fmt.Errorf("want expect PEER PEER…")
		}
		i, err := e.member(args[0])
		if err != nil {
			return "", err
		}
		for _, p := range args[1:] {
			e.net.Core(i).ExpectState(p)
		}
	case "drop":
		if len(args) < 2 || len(args) > 3 {
			return "", fmt.Errorf("want drop FROM TO [N]")
		}
		from, to, err := e.pair(args[0], args[1])
		if err != nil {
			return "", err
		}
		n := 1
		if len(args) == 3 {
			if n, err = strconv.Atoi(args[2]); err != nil {
				return "", err
			}
		}
		e.drops[[2]int{from, to}] += n
	case "cut":
		if len(args) != 2 {
			return "", fmt.Errorf("want cut A B")
		}
		a, b, err := e.pair(args[0], args[1])
		if err != nil {
			return "", err
		}
		e.net.Cut(a, b)
	case "heal":
		if len(args) != 2 {
			return "", fmt.Errorf("want heal A B")
		}
		a, b, err := e.pair(args[0], args[1])
		if err != nil {
			return "", err
		}
		e.net.Heal(a, b)
		if err := e.net.Drain(); err != nil {
			return "", err
		}
	case "recover":
		e.net.Recover()
		if err := e.net.Drain(); err != nil {
			return "", err
		}
	case "round", "rounds":
		n, d := 1, 20*time.Millisecond
		if cmd == "rounds" {
			if len(args) == 0 {
				return "", fmt.Errorf("want rounds N [DURATION]")
			}
			var err error
			if n, err = strconv.Atoi(args[0]); err != nil {
				return "", err
			}
			args = args[1:]
		}
		if len(args) > 1 {
			return "", fmt.Errorf("want %s [DURATION]", cmd)
		}
		if len(args) == 1 {
			var err error
			if d, err = time.ParseDuration(args[0]); err != nil {
				return "", err
			}
		}
		e.quiet = cmd == "rounds"
		for range n {
			var round strings.Builder
			e.out = &round
			e.net.Advance(d)
			e.net.Tick()
			if err := e.net.Drain(); err != nil {
				return "", err
			}
			if !e.quiet || round.Len() > 0 {
				fmt.Fprintf(&out, "t=+%v\n%s", e.net.Now().Sub(t0), round.String())
			}
		}
		e.quiet = false
	case "usage":
		if len(args) != 2 {
			return "", fmt.Errorf("want usage PEER KEY")
		}
		i, err := e.member(args[0])
		if err != nil {
			return "", err
		}
		c, now := e.net.Core(i), e.net.Local(i)
		rep, err := c.Usage(now, "api", args[1])
		if err != nil {
			return "", err
		}
		o := own(c, rep)
		fmt.Fprintf(&out, "total %d, own %d/%d, unacknowledged %d", rep.Total, o.Admitted, o.Attempted, unacked(e.t, c, now, "api", args[1]))
	case "members":
		if len(args) != 1 {
			return "", fmt.Errorf("want members PEER")
		}
		i, err := e.member(args[0])
		if err != nil {
			return "", err
		}
		c := e.net.Core(i)
		var ps []string
		for _, p := range c.Peers(e.net.Local(i)) {
			if !p.Self {
				ps = append(ps, p.Peer+":"+p.State.String())
			}
		}
		n, _ := c.Members()
		serves := "serving"
		switch {
		case !c.Joined():
			serves = "joining"
		case c.Fenced():
			serves = "fenced"
		}
		fmt.Fprintf(&out, "%s, N=%d, %s", strings.Join(ps, " "), n, serves)
	case "stats":
		if len(args) != 1 {
			return "", fmt.Errorf("want stats PEER")
		}
		i, err := e.member(args[0])
		if err != nil {
			return "", err
		}
		st := e.net.Core(i).Stats()
		fmt.Fprintf(&out, "nacks sent %d, received %d, repairs skipped %d", st.NacksSent, st.NacksReceived, st.RepairsSkipped)
	default:
		return "", fmt.Errorf("unknown command %q", cmd)
	}
	return strings.TrimSuffix(out.String(), "\n"), nil
}

// splitArgs returns a command's bare words, in order, and its key=value
// options.
func splitArgs(d *datadriven.TestData) (args []string, opts map[string]string, err error) {
	opts = map[string]string{}
	for _, a := range d.CmdArgs {
		switch len(a.Vals) {
		case 0:
			args = append(args, a.Key)
		case 1:
			opts[a.Key] = a.Vals[0]
		default:
			return nil, nil, fmt.Errorf("%s: want one value", a.Key)
		}
	}
	return args, opts, nil
}

func (e *traceEnv) newCore(peer string, join bool, policy node.Policy) *node.Core {
	e.t.Helper()
	rules := []limiter.Rule{{Name: "api", Algorithm: limiter.FixedWindow, Limit: 100, Window: time.Minute}}
	return newCore(e.t, peer, e.net.Now(), rules, func(c *node.CoreConfig) {
		c.Join, c.Policy = join, policy
		c.Incarnation = 1
	})
}

// printReady prints what member i's Ready asks: the batches it publishes
// (its Direct batches are printed as they are sent, by the network's
// Filter, like every full state), the membership changes and the join and
// fence changes.
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
}

// fmtBatch prints a batch's protocol fields: flags, seq, Ack (mesh ms since
// the start; - for none), entries (values of another slot than the
// author's name it), nacks and the member table.
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
	var ms []string
	for _, m := range b.Members {
		ms = append(ms, m.Peer+":"+node.State(m.State).String())
	}
	if len(ms) > 0 {
		f = append(f, "members="+strings.Join(ms, ","))
	}
	return strings.Join(f, " ")
}
