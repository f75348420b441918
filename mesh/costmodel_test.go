//go:build unix

package mesh

// The cost model of issue 17 (docs/cost-model.md): what one member costs
// in CPU and gossip bytes per second as a function of the mesh size N,
// the keys and the decision rate, fitted to real in-process meshes of 5,
// 10, 20 and 40 node runtimes on loopback libp2p hosts with mesh.New's
// router (PubSubOptions) and the node's default settings. Skipped unless
// RATEMESH_COSTMODEL=1; RATEMESH_COSTMODEL_SIZES (comma-separated, e.g.
// "5,10,20,40,20:100ms"; a size with a sync_interval is measured but not
// fitted: it checks the model out of sample) picks the meshes,
// RATEMESH_COSTMODEL_SECONDS the seconds of each steady phase.
// Run it without -race:
//
//	RATEMESH_COSTMODEL=1 go test -run 'TestCostModel$' -v -count=1 -timeout 40m ./mesh/

import (
	"context"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	pubsub "github.com/libp2p/go-libp2p-pubsub"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/protocol"

	"github.com/ratemesh/ratemesh/internal/testutil"
	"github.com/ratemesh/ratemesh/limiter"
	"github.com/ratemesh/ratemesh/node"
)

// costLoad is one load point: bursts per second over the whole mesh,
// spread evenly over the members (each a Poisson process), each burst k
// Allow calls on k keys drawn from keys (or all on one hot key).
type costLoad struct {
	name   string
	bursts float64 // per second, the whole mesh
	k      int
	keys   int
	hot    bool
}

// costLoads returns the load points for a mesh of n members. A change
// batch makes every other member acknowledge it once or twice, at its
// next sync ticks (docs/design.md, "Acknowledgements"), and every batch
// is delivered to n−1 members: the process delivers up to about 2(n−1)²
// batches per burst, so the mesh-wide burst rate shrinks with n² to keep
// its CPU (shared by all n members) within the machine: at 40 members,
// the heartbeats alone take 0.6 core, and 1.3 bursts a second took the
// process to the one core a shared 2-core machine gave it, where members
// fell suspect at one another.
func costLoads(n int) []costLoad {
	f := math.Round(min(100, 1200/float64(n*(n-1)))*100) / 100
	return []costLoad{
		{name: "idle"},
		{name: "1 key/burst", bursts: f, k: 1, keys: 100_000},
		{name: "32 keys/burst", bursts: f, k: 32, keys: 100_000},
		{name: "32 of 100 keys", bursts: f, k: 32, keys: 100},
		{name: "32 hot", bursts: f, k: 32, keys: 1, hot: true},
		{name: "1 key/burst, half", bursts: f / 2, k: 1, keys: 100_000},
	}
}

// costRow is one measured point, per member and per second.
type costRow struct {
	n      int
	sync   time.Duration // sync_interval; 0: the default
	load   costLoad
	secs   float64
	cpu    float64 // CPU seconds per second (process user+sys ÷ n)
	dec    float64 // decisions
	pub    float64 // batches published
	bursts float64
	dlv    float64 // gossip batches delivered to the runtime
	ent    float64 // window entries in them
	pubB   float64 // encoded bytes published
	inB    float64 // gossipsub wire bytes in
	outB   float64 // and out
	syncB  float64 // anti-entropy wire bytes in
	dup    float64 // duplicate copies received per delivered batch
	frac   float64 // delivered ÷ ((n−1) × published)
	drops  uint64  // silent drops in gossipsub, all members
	// unsteady says why the mesh was not in a steady state during the
	// point (decisions denied, a member not alive at another); such a
	// point is shown but not fitted.
	unsteady string
}

// label is the row's N, with * for a sync_interval other than the
// default and ! for an unsteady point: neither is fitted.
func (r costRow) label() string {
	l := fmt.Sprint(r.n)
	if r.sync != 0 {
		l += "*"
	}
	if r.unsteady != "" {
		l += "!"
	}
	return l
}

func (r costRow) fitted() bool { return r.sync == 0 && r.unsteady == "" }

func (r costRow) epb() float64 { return r.ent / max(r.dlv, 1e-9) }

// bytesX returns the copies of batches and of entries received per
// second: delivered × (1 + duplicates per delivered).
func (r costRow) bytesX() []float64 { return []float64{r.dlv * (1 + r.dup), r.ent * (1 + r.dup)} }

// costMember is one member and its counters.
type costMember struct {
	m         *Mesh
	n         *node.Node
	w         *wire
	tally     *rpcTally
	trace     *tracer
	dlv, ent  atomic.Int64
	decisions atomic.Int64
	bursts    atomic.Int64
	denied    atomic.Int64
	reason    atomic.Value // string: the last denial's reason
}

type costSnap struct {
	at                         time.Time
	cpu                        time.Duration
	dec, pub, pubB, dlv, ent   int64
	inB, outB, syncB, dup, bst int64
	drops                      uint64
	denied                     int64
}

func processCPU(t *testing.T) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func snapCost(t *testing.T, ms []*costMember) costSnap {
	s := costSnap{at: time.Now(), cpu: processCPU(t)}
	for _, c := range ms {
		st := c.m.Stats()
		s.dec += c.decisions.Load()
		s.denied += c.denied.Load()
		s.bst += c.bursts.Load()
		s.pub += int64(st.Published)
		s.pubB += int64(st.PublishedBytes)
		s.dlv += c.dlv.Load()
		s.ent += c.ent.Load()
		s.inB += c.w.gossipIn.Load()
		s.outB += c.w.gossipOut.Load()
		s.syncB += c.w.syncIn.Load()
		s.dup += c.tally.duplicates.Load()
		s.drops += c.trace.droppedRPC.Load() + c.trace.validationDropped.Load() + c.trace.undeliverable.Load()
	}
	return s
}

func TestCostModel(t *testing.T) {
	if os.Getenv("RATEMESH_COSTMODEL") != "1" {
		t.Skip("measurement: set RATEMESH_COSTMODEL=1")
	}
	// A size may name a sync_interval ("20:100ms"): such meshes are not
	// fitted, and their residuals check the model out of sample.
	type size struct {
		n    int
		sync time.Duration
	}
	sizes := []size{{5, 0}, {10, 0}, {20, 0}, {40, 0}, {20, 100 * time.Millisecond}}
	if s := os.Getenv("RATEMESH_COSTMODEL_SIZES"); s != "" {
		sizes = nil
		for _, f := range strings.Split(s, ",") {
			ns, ss, _ := strings.Cut(f, ":")
			n, err := strconv.Atoi(ns)
			if err != nil || n < 2 {
				t.Fatalf("RATEMESH_COSTMODEL_SIZES: %q", f)
			}
			var d time.Duration
			if ss != "" {
				if d, err = time.ParseDuration(ss); err != nil {
					t.Fatalf("RATEMESH_COSTMODEL_SIZES: %q: %v", f, err)
				}
			}
			sizes = append(sizes, size{n, d})
		}
	}
	steady := 3 * time.Second
	if s := os.Getenv("RATEMESH_COSTMODEL_SECONDS"); s != "" {
		d, err := time.ParseDuration(s + "s")
		if err != nil {
			t.Fatal(err)
		}
		steady = d
	}
	var rows []costRow
	for _, sz := range sizes {
		name := fmt.Sprint(sz.n)
		if sz.sync > 0 {
			name += "/sync=" + sz.sync.String()
		}
		t.Run(name, func(t *testing.T) {
			rows = append(rows, measureCost(t, sz.n, sz.sync, steady)...)
		})
	}
	if len(rows) == 0 {
		return
	}
	t.Logf("per member and second: bursts, decisions, batches published, delivered, entries delivered and per batch, gossip wire bytes in and out, anti-entropy bytes in, duplicate copies per delivered batch, delivered ÷ ((N−1) × published), CPU")
	t.Logf("%3s %-18s %7s %7s %6s %7s %7s %5s %9s %9s %6s %5s %5s %7s",
		"N", "load", "bursts", "dec/s", "pub/s", "dlv/s", "ent/s", "e/b", "in B/s", "out B/s", "sync", "dup", "frac", "cpu ms")
	for _, r := range rows {
		t.Logf("%3s %-18s %7.2f %7.1f %6.1f %7.1f %7.1f %5.2f %9.0f %9.0f %6.0f %5.2f %5.3f %7.2f",
			r.label(), r.load.name, r.bursts, r.dec, r.pub, r.dlv, r.ent, r.epb(), r.inB, r.outB, r.syncB, r.dup, r.frac, r.cpu*1000)
	}
	fitCost(t, rows)
	unsteady := 0
	for _, r := range rows {
		if r.unsteady != "" {
			unsteady++
		}
	}
	if unsteady > 0 {
		t.Errorf("%d of %d points were not steady (marked !, not fitted): the machine could not carry the mesh", unsteady, len(rows))
	}
}

// fitCost fits the per-member CPU and inbound gossip bytes to the
// measured points by least squares and logs the constants, the residual
// of every point and the predictions of docs/cost-model.md.
//
// CPU s/s = c0 + c1·dlv + c2·ent + c3·dec + c4·pub, per member: dlv
// gossip batches delivered per second, ent the window entries in them,
// dec decisions, pub batches published. It is fitted to relative error
// (each row divided by its measured value), so that the idle points
// weigh as much as the loaded ones. Gossip bytes in/s = k0·copies +
// k1·entry copies: every copy of a batch received, duplicates included,
// and the entries those copies carry.
func fitCost(t *testing.T, rows []costRow) {
	var xc [][]float64
	var yc []float64
	var xb [][]float64
	var yb []float64
	for _, r := range rows {
		if !r.fitted() {
			continue
		}
		x := []float64{1, r.dlv, r.ent, r.dec, r.pub}
		for i := range x {
			x[i] /= r.cpu
		}
		xc = append(xc, x)
		yc = append(yc, 1)
		xb = append(xb, r.bytesX())
		yb = append(yb, r.inB)
	}
	c, err := leastSquares(xc, yc)
	if err != nil {
		t.Logf("no fit (measure two sizes or more): %v", err)
		return
	}
	k, err := leastSquares(xb, yb)
	if err != nil {
		t.Logf("no fit: %v", err)
		return
	}
	cpuOf := func(dlv, ent, dec, pub float64) float64 { return dot(c, []float64{1, dlv, ent, dec, pub}) }
	t.Logf("CPU s/s per member = c0 + c1·dlv + c2·ent + c3·dec + c4·pub: c0 %.2f ms/s, c1 %.1f µs per delivered batch, c2 %.2f µs per merged entry, c3 %.2f µs per decision, c4 %.0f µs per published batch",
		c[0]*1e3, c[1]*1e6, c[2]*1e6, c[3]*1e6, c[4]*1e6)
	t.Logf("gossip bytes in/s per member = k0·copies + k1·entry copies: k0 %.0f B per copy of a batch, k1 %.1f B per copy of an entry", k[0], k[1])
	t.Logf("%3s %-18s %9s %9s %6s %9s %9s %6s", "N", "load", "cpu ms/s", "model", "resid", "in B/s", "model", "resid")
	var sc, sb float64
	fitted := 0
	for _, r := range rows {
		pc := cpuOf(r.dlv, r.ent, r.dec, r.pub)
		pb := dot(k, r.bytesX())
		ec, eb := (pc-r.cpu)/r.cpu, (pb-r.inB)/max(r.inB, 1)
		if r.fitted() {
			sc, sb = sc+ec*ec, sb+eb*eb
			fitted++
		}
		t.Logf("%3s %-18s %9.2f %9.2f %5.0f%% %9.0f %9.0f %5.0f%%", r.label(), r.load.name, r.cpu*1000, pc*1000, 100*ec, r.inB, pb, 100*eb)
	}
	t.Logf("rms residual of the fitted points: CPU %.1f%%, bytes in %.1f%% (* = a sync_interval other than the default, ! = not steady: not fitted)",
		100*math.Sqrt(sc/float64(fitted)), 100*math.Sqrt(sb/float64(fitted)))

	// Predictions. Every member publishes b batches/s, each delivered to
	// the N−1 others (dlv = (N−1)·b), received as 1+dup copies (dup, the
	// duplicates per delivered batch, was 1.3–1.7 at 10–40 members: the
	// topic mesh's relays, bounded by its degree, not by N). In a busy
	// mesh every member has merged some change in every sync tick, so it
	// publishes at least one batch per sync_interval S (the
	// acknowledgement), and at most that plus one leading-edge batch per
	// change up to 2/S: b between 1/S and 1/S + min(f, 2/S), for f
	// changes/s of its own. Idle, a member publishes one heartbeat per
	// 500 ms.
	const dup = 1.5
	for _, n := range []float64{100, 1000} {
		for _, p := range []struct {
			name string
			s    float64 // sync_interval, seconds; 0: idle
			f    float64 // own decisions (changes) per second
		}{{"idle", 0, 0}, {"20 dec/s, sync 20 ms (default)", 0.02, 20}, {"20 dec/s, sync 100 ms", 0.1, 20}, {"20 dec/s, sync 200 ms", 0.2, 20}, {"20 dec/s, sync 1 s", 1, 20}} {
			lo, hi := 2.0, 2.0
			if p.s > 0 {
				lo, hi = 1/p.s, 1/p.s+min(p.f, 2/p.s)
			}
			var out []string
			for _, b := range []float64{lo, hi} {
				dlv := (n - 1) * b
				ent := (n - 1) * p.f // one entry per own decision on a fresh key, at worst
				cpu := cpuOf(dlv, ent, p.f, b)
				in := dot(k, []float64{dlv * (1 + dup), ent * (1 + dup)})
				out = append(out, fmt.Sprintf("b %5.1f/s: dlv %7.0f/s, cpu %6.2f cores, in %7.2f MB/s", b, dlv, cpu, in/1e6))
			}
			t.Logf("N=%4.0f %-32s %s | %s", n, p.name, out[0], out[1])
		}
	}
}

func dot(a, b []float64) float64 {
	s := 0.0
	for i := range a {
		s += a[i] * b[i]
	}
	return s
}

// leastSquares solves min ‖Xβ − y‖² through the normal equations
// (XᵀX)β = Xᵀy by Gaussian elimination with partial pivoting.
func leastSquares(x [][]float64, y []float64) ([]float64, error) {
	p := len(x[0])
	a := make([][]float64, p)
	for i := range p {
		a[i] = make([]float64, p+1)
		for r := range x {
			for j := range p {
				a[i][j] += x[r][i] * x[r][j]
			}
			a[i][p] += x[r][i] * y[r]
		}
	}
	for col := range p {
		piv := col
		for r := col + 1; r < p; r++ {
			if math.Abs(a[r][col]) > math.Abs(a[piv][col]) {
				piv = r
			}
		}
		if math.Abs(a[piv][col]) < 1e-300 {
			return nil, fmt.Errorf("least squares: column %d is degenerate", col)
		}
		a[col], a[piv] = a[piv], a[col]
		for r := range p {
			if r == col {
				continue
			}
			f := a[r][col] / a[col][col]
			for j := col; j <= p; j++ {
				a[r][j] -= f * a[col][j]
			}
		}
	}
	beta := make([]float64, p)
	for i := range p {
		beta[i] = a[i][p] / a[i][i]
	}
	return beta, nil
}

func TestLeastSquares(t *testing.T) {
	// y = 2 + 3·x1 − x2, exactly.
	x := [][]float64{{1, 0, 0}, {1, 1, 0}, {1, 0, 1}, {1, 2, 5}, {1, 3, 1}}
	var y []float64
	for _, r := range x {
		y = append(y, 2+3*r[1]-r[2])
	}
	b, err := leastSquares(x, y)
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []float64{2, 3, -1} {
		if math.Abs(b[i]-want) > 1e-9 {
			t.Errorf("β[%d] = %v, want %v", i, b[i], want)
		}
	}
}

// measureCost builds a mesh of n members, one joining at a time through
// the member before it (each dials every member the full state names, as
// a real joiner does), waits until every member holds every other alive,
// and measures every load point of costLoads(n).
func measureCost(t *testing.T, n int, syncInterval, steady time.Duration) []costRow {
	const ns = "cost"
	topic := "/ratemesh/1/" + ns
	rules := []limiter.Rule{{Name: "api", Algorithm: limiter.FixedWindow, Limit: 1 << 40, Window: time.Second}}
	ms := make([]*costMember, n)
	built := time.Now()
	for i := range n {
		key := newKey(t)
		w := &wire{sync: protocol.ID(topic + "/sync")}
		h := wireHost(t, key, w)
		ctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(cancel)
		cfg := testConfig(t)
		cfg.Namespace = ns
		cfg.Listen = nil
		cfg.PrivKey = key
		cfg.Plausible = PlausibleFor(rules, 0)
		if i > 0 {
			cfg.Bootstrap = []string{tcpAddr(t, ms[i-1].m)}
		}
		cm := &costMember{w: w, tally: &rpcTally{self: h.ID(), topic: topic}, trace: newTracer(topic)}
		ps, err := pubsub.NewGossipSub(ctx, h, append(PubSubOptions(cfg), pubsub.WithRawTracer(cm.tally), pubsub.WithRawTracer(cm.trace))...)
		if err != nil {
			t.Fatal(err)
		}
		m, err := Attach(h, ps, cfg)
		if err != nil {
			t.Fatal(err)
		}
		cm.m = m
		ncfg := node.DefaultConfig()
		ncfg.Peer, ncfg.Rules, ncfg.Join = m.PeerID(), rules, i > 0
		ncfg.JoinTimeout = 10 * time.Second
		if syncInterval > 0 {
			ncfg.SyncInterval = syncInterval // PublishGap follows: half of it
		}
		ncfg.Transport = timedTransport{m, func(in node.Inbound) {
			if !in.Direct {
				cm.dlv.Add(1)
				cm.ent.Add(int64(len(in.Batch.Windows)))
			}
		}}
		sctx, scancel := context.WithTimeout(context.Background(), 30*time.Second)
		nd, err := node.Start(sctx, ncfg)
		scancel()
		if err != nil {
			t.Fatalf("member %d: %v", i, err)
		}
		t.Cleanup(func() { nd.Close() })
		cm.n = nd
		ms[i] = cm
		// One join at a time: the joiner is connected to every member
		// before the next one starts.
		testutil.Eventually(t, 30*time.Second, func() (bool, string) {
			for j := range i {
				if h.Network().Connectedness(ms[j].m.Host().ID()) != network.Connected {
					return false, fmt.Sprintf("member %d not connected to %d", i, j)
				}
			}
			return true, ""
		})
	}
	testutil.Eventually(t, 60*time.Second, func() (bool, string) {
		s := notAllAlive(ms)
		return s == "", s
	})
	t.Logf("N=%d: built and every member alive at every member in %v", n, time.Since(built).Round(time.Millisecond))

	keyNames := make([]string, 100_000)
	for i := range keyNames {
		keyNames[i] = fmt.Sprintf("acct:%06d", i)
	}
	var rows []costRow
	for li, l := range costLoads(n) {
		stop := make(chan struct{})
		var wg sync.WaitGroup
		if l.bursts > 0 {
			perMember := l.bursts / float64(n)
			for i, cm := range ms {
				wg.Add(1)
				go func() {
					defer wg.Done()
					rng := rand.New(rand.NewPCG(uint64(n), uint64(li*1000+i)))
					gap := func() time.Duration {
						return time.Duration(rng.ExpFloat64() / perMember * float64(time.Second))
					}
					timer := time.NewTimer(gap())
					defer timer.Stop()
					ctx := context.Background()
					for {
						select {
						case <-stop:
							return
						case <-timer.C:
						}
						cm.bursts.Add(1)
						for range l.k {
							key := "acct:hot"
							if !l.hot {
								key = keyNames[rng.IntN(l.keys)]
							}
							d, err := cm.n.Allow(ctx, "api", key)
							if err != nil {
								t.Errorf("Allow(%s): %v", key, err)
							} else if !d.Allowed { // the limit is 2⁴⁰: joining or fenced
								cm.denied.Add(1)
								cm.reason.Store(d.Reason.String())
							}
							cm.decisions.Add(1)
						}
						timer.Reset(gap())
					}
				}()
			}
		}
		// A fixed schedule, not a wait for a condition: 700 ms for the
		// previous point's acknowledgements to drain and this one's to
		// start, then the steady phase.
		warm := time.NewTimer(700 * time.Millisecond)
		<-warm.C
		a := snapCost(t, ms)
		phase := time.NewTimer(steady)
		<-phase.C
		b := snapCost(t, ms)
		close(stop)
		wg.Wait()
		secs := b.at.Sub(a.at).Seconds()
		per := func(x int64) float64 { return float64(x) / secs / float64(n) }
		r := costRow{
			n: n, sync: syncInterval, load: l, secs: secs,
			cpu:    (b.cpu - a.cpu).Seconds() / secs / float64(n),
			dec:    per(b.dec - a.dec),
			pub:    per(b.pub - a.pub),
			bursts: per(b.bst - a.bst),
			dlv:    per(b.dlv - a.dlv),
			ent:    per(b.ent - a.ent),
			pubB:   per(b.pubB - a.pubB),
			inB:    per(b.inB - a.inB),
			outB:   per(b.outB - a.outB),
			syncB:  per(b.syncB - a.syncB),
			drops:  b.drops - a.drops,
		}
		r.dup = float64(b.dup-a.dup) / max(float64(b.dlv-a.dlv), 1)
		var why []string
		if d := b.denied - a.denied; d > 0 {
			reasons := map[string]bool{}
			for _, cm := range ms {
				if x, ok := cm.reason.Load().(string); ok {
					reasons[x] = true
				}
			}
			why = append(why, fmt.Sprintf("%d decisions denied (%v)", d, slices.Sorted(maps.Keys(reasons))))
		}
		if s := notAllAlive(ms); s != "" {
			why = append(why, s)
		}
		r.unsteady = strings.Join(why, "; ")
		r.frac = r.dlv / max(float64(n-1)*r.pub, 1e-9)
		if r.drops > 0 {
			t.Logf("N=%d %s: %d silent drops in gossipsub", n, l.name, r.drops)
		}
		if r.unsteady != "" {
			t.Logf("N=%d %s: not steady, not fitted: %s", n, l.name, r.unsteady)
		}
		t.Logf("N=%d %-18s cpu %.2f ms/s per member (process %.2f cores), %.1f batches/s published, %.1f delivered, %.2f entries each, in %.0f B/s",
			n, l.name, r.cpu*1000, r.cpu*float64(n), r.pub, r.dlv, r.epb(), r.inB)
		rows = append(rows, r)
	}
	return rows
}

// notAllAlive returns "" when every member holds every other alive, and
// otherwise the first member that does not.
func notAllAlive(ms []*costMember) string {
	for i, a := range ms {
		alive := 0
		for _, p := range a.n.Peers() {
			if p.Peer != a.m.PeerID() && p.State == node.Alive {
				alive++
			}
		}
		if alive != len(ms)-1 {
			return fmt.Sprintf("member %d holds %d of %d others alive", i, alive, len(ms)-1)
		}
	}
	return ""
}
