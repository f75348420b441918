package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ratemesh/ratemesh/crdt"
	"github.com/ratemesh/ratemesh/limiter"
)

// Config configures a Node: the core's settings plus its edges. Start from
// DefaultConfig and set Peer, Rules and Transport; the zero Config is
// refused (it names no transport and no peer). Start copies it: changes
// afterwards have no effect.
type Config struct {
	// CoreConfig holds the member's settings: Peer, Rules, the mesh
	// settings (MeshConfig), Join and JoinTimeout. Leave Incarnation zero:
	// Start sets it from the Store, and refuses a config that sets it.
	CoreConfig
	// Transport carries batches between members: package mesh on a
	// network, package memnet in one process. Required. The node owns it
	// once started: Close closes it.
	Transport Transport
	// Store persists the incarnation, the long windows, the leases and
	// the members' addresses (package persistence on disk); the members
	// saved seed the member table at Start (CoreConfig.Known). Nil means a fresh MemoryStore. The
	// node owns it once started: Close closes it.
	Store Store
	// FlushInterval is how often the merged state of long windows and the
	// owned leases are written to Store, in one synced batch; Close
	// writes a last one. 0 means 1 s.
	FlushInterval time.Duration
	// PersistMinWindow is the shortest window persisted: windows of rules
	// at least this long survive restarts. 0 means 1 minute.
	PersistMinWindow time.Duration
	// Logger receives membership changes, joins, skew and transport
	// errors. Nil discards them.
	Logger *slog.Logger
	// Clock is the local clock. Nil means time.Now. Tests may inject a
	// clock that runs at real speed with an offset; timers (ticks, Wait)
	// run on real time whatever the clock says. It is read from the
	// transport's goroutines too (Inbound.At), so it must be safe for
	// concurrent use.
	Clock func() time.Time
	// LeaveTimeout bounds how long Close spends publishing the leave.
	LeaveTimeout time.Duration
	// StoreTimeout bounds how long Close waits for the Store: for a
	// periodic flush under way, the last flush and the store's close
	// together. A call still running then is abandoned and Close returns
	// an error wrapping ErrPersist. 0 means 2 s.
	StoreTimeout time.Duration
	// PublishGap is the least time between two gossip batches of this
	// member: the leading edge of a change. A change — a decision, a
	// lease, a nack to serve — is published at once when the member's
	// last batch is at least PublishGap old, and otherwise PublishGap
	// after that batch, with every change made meanwhile; the sync tick
	// (SyncInterval) still publishes heartbeats, acknowledgements and
	// whatever is pending. Under a steady load the member thus publishes
	// every PublishGap, and a sparse change goes out without waiting.
	// 0 means SyncInterval/2; a negative value turns the leading edge off,
	// leaving changes to the tick (as the simulator's cores publish).
	PublishGap time.Duration
	// StartJoining makes Start return as soon as the transport is up,
	// without waiting for the join: until it is ready the node answers
	// every decision with a denial of reason ReasonJoining whose
	// RetryAfter is the time left of JoinTimeout (docs/design.md,
	// "Readiness"), and Ready reports false; ReadyC tells when it turns
	// ready. A daemon uses it to serve its API, /healthz saying
	// "joining", during the join. By default Start waits until the node
	// is ready.
	StartJoining bool
}

// DefaultConfig returns the defaults of the config file
// (docs/operations.md, "Config file"; see DefaultCoreConfig) for a node
// with an in-memory store.
func DefaultConfig() Config {
	return Config{
		CoreConfig:       DefaultCoreConfig(),
		Store:            &MemoryStore{}, // until the persistence issue: the incarnation rule holds without a disk
		Logger:           slog.New(slog.DiscardHandler),
		Clock:            time.Now,
		LeaveTimeout:     2 * time.Second,         // a leave that cannot go out in 2 s is not worth waiting for: peers notice the silence
		FlushInterval:    defaultFlushInterval,    // a SIGKILL loses at most 1 s of own usage; one synced batch a second is cheap
		PersistMinWindow: defaultPersistMinWindow, // shorter windows end before a restart matters
		StoreTimeout:     defaultStoreTimeout,     // a synced batch takes milliseconds; a store silent for 2 s will not answer
	}
}

func (c *Config) validate() error {
	bad := func(field, msg string) error {
		return fmt.Errorf("%w: %s: %s", ErrInvalidConfig, field, msg)
	}
	switch {
	case c.Transport == nil:
		return bad("transport", "must be set (package mesh on a network, memnet in one process)")
	case c.Incarnation != 0:
		return bad("incarnation", "is set by Start from the store; leave it 0")
	case c.LeaveTimeout <= 0:
		return bad("leave_timeout", fmt.Sprintf("must be positive, got %v", c.LeaveTimeout))
	case c.FlushInterval < 0:
		return bad("flush_interval", fmt.Sprintf("must not be negative, got %v", c.FlushInterval))
	case c.PersistMinWindow < 0:
		return bad("persist_min_window", fmt.Sprintf("must not be negative, got %v", c.PersistMinWindow))
	case c.StoreTimeout < 0:
		return bad("store_timeout", fmt.Sprintf("must not be negative, got %v", c.StoreTimeout))
	}
	return nil
}

func (c *Config) fillDefaults() {
	if c.Store == nil {
		c.Store = &MemoryStore{}
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Clock == nil {
		c.Clock = time.Now
	}
	if c.PublishGap == 0 {
		c.PublishGap = c.SyncInterval / 2
	}
	c.fillPersistDefaults()
}

// Buffer sizes between the transport's callbacks and the run loop. A full
// buffer makes the callback wait: back-pressure, not loss.
const (
	inboxSize    = 1024
	connectsSize = 64
	stepBurst    = 64 // inbound batches merged under one lock
)

// Node is a running member: it owns a Core and drives it with a real
// clock, a Transport and a Store. Decisions (Allow, AllowAll, Wait,
// Acquire) run in the caller's goroutine under a mutex shared with the run
// loop, with no channel round trip; the run loop merges inbound batches,
// ticks the core every SyncInterval, publishes its batches and answers
// anti-entropy. Above 50,000 decisions a second, consecutive decisions
// share one clock reading, so a decision may be up to about a
// millisecond late (see decisionTime).
//
// A Node is safe for concurrent use. Start returns one; the zero value is
// not usable. After Close the request methods (Allow, AllowAll, Wait,
// Acquire, Renew, Release, Usage, Evict) return ErrClosed and Peers
// returns nil.
type Node struct {
	cfg   Config
	log   *slog.Logger
	clock func() time.Time

	mu     sync.Mutex // guards core and closed
	core   *Core
	closed bool
	// The decision clock (see decisionTime), guarded by mu.
	last      time.Time // the latest reading of Clock
	share     int       // how many decisions may share a reading after the one that took it: 0, or shareReadings−1 at high rates
	shared    int       // decisions that shared last so far
	decisions int       // decisions since the last tick
	lastTick  time.Time
	// pubArmed, guarded by mu, is set once the run loop has been told
	// (pubSig) that changes may be pending, and cleared when it finds
	// none or has published them: the leading edge of the next change
	// wakes it again. Always set when PublishGap is negative.
	pubArmed bool
	pubSig   chan struct{} // capacity 1
	// pubMu orders publishing: whoever builds batches (the run loop's
	// ticks and leading edges, a decision past the publish budget)
	// holds it from taking mu to build them until they are handed to the
	// Transport, so batches go out in the order of their Seq. Taken
	// before mu, never while holding it.
	pubMu sync.Mutex

	inbox    chan Inbound
	connects chan string
	quit     chan struct{} // closed by Close: stops the loop, releases callbacks
	loopDone chan struct{}
	ctx      context.Context // the loop's I/O; cancelled by Close
	cancel   context.CancelFunc

	ready   atomic.Bool
	readyCh chan struct{}
	health  atomic.Int32 // a Health, as of the latest step or tick

	closeOnce sync.Once
	closeErr  error

	persist *persistence // the Store's side: see runtime_persist.go

	answers sync.WaitGroup // anti-entropy answers in flight (see answer)

	// Held requests and forwarding: see hold.go and forward.go.
	waiters []*waiter           // guarded by mu, oldest first
	fwd     Forwarder           // the Transport's, or nil
	fwdBusy map[string]struct{} // guarded by mu: rules and keys with a lottery forward under way

	held, heldAdmitted, heldDenied, forwards, fwdAbandoned atomic.Uint64 // HoldStats

	// The run loop's note of clock samples refused (see tick): how many
	// it last logged, and when.
	rejLogged uint64
	rejLogAt  time.Time
}

// rejectLogEvery is how often at most the run loop logs clock samples
// refused as taken across a stall.
const rejectLogEvery = time.Minute

// Start starts a member: it takes the incarnation max(persisted + 1, unix
// ms) and saves it durably before serving, starts the transport, and
// returns once the member is ready — at once without Join, otherwise once
// the full state of every peer it connected to has arrived, or after
// JoinTimeout, whichever comes first (with Config.StartJoining, at once).
//
// ctx bounds the start only; Close stops the node. If ctx ends before the
// member is ready, Start leaves the mesh again and returns ctx's error. A
// failed Start closes the transport if it had started it, and leaves the
// store open for the caller.
func Start(ctx context.Context, cfg Config) (*Node, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	cfg.fillDefaults()
	persisted, err := cfg.Store.LoadIncarnation(ctx)
	if err != nil {
		return nil, fmt.Errorf("node: load incarnation: %w", err)
	}
	cc := cfg.CoreConfig
	cc.Incarnation = NextIncarnation(persisted, cfg.Clock())
	known, err := cfg.Store.LoadPeers(ctx)
	if err != nil {
		return nil, fmt.Errorf("node: load known peers: %w", err)
	}
	if len(known) > 0 && len(cc.Known) == 0 {
		// The members this node saw in its last run: its own evidence
		// (CoreConfig.Known).
		for _, p := range known {
			cc.Known = append(cc.Known, p.Peer)
		}
	}
	core, err := NewCore(cc, cfg.Clock())
	if err != nil {
		return nil, err
	}
	if err := cfg.Store.SaveIncarnation(ctx, cc.Incarnation); err != nil {
		return nil, fmt.Errorf("node: save incarnation: %w", err)
	}
	pers, err := restore(ctx, &cfg, core)
	if err != nil {
		return nil, err
	}
	loopCtx, cancel := context.WithCancel(context.Background())
	n := &Node{
		cfg:      cfg,
		log:      cfg.Logger.With("peer", cfg.Peer),
		clock:    cfg.Clock,
		core:     core,
		inbox:    make(chan Inbound, inboxSize),
		connects: make(chan string, connectsSize),
		quit:     make(chan struct{}),
		loopDone: make(chan struct{}),
		ctx:      loopCtx,
		cancel:   cancel,
		readyCh:  make(chan struct{}),
		persist:  pers,
		fwdBusy:  make(map[string]struct{}),
		pubSig:   make(chan struct{}, 1),
		pubArmed: cfg.PublishGap < 0,
	}
	n.fwd, _ = cfg.Transport.(Forwarder)
	if err := cfg.Transport.Start(ctx, handler{n}); err != nil {
		cancel()
		_ = cfg.Transport.Close()
		return nil, fmt.Errorf("node: start transport: %w", err)
	}
	n.log.Info("started", "incarnation", cc.Incarnation, "join", cfg.Join)
	if core.Ready() {
		n.markReady()
	}
	n.noteHealth()
	n.mu.Lock()
	n.lastTick = n.readClock()
	n.mu.Unlock()
	go n.run()
	go n.persistLoop()
	if cfg.StartJoining {
		return n, nil
	}
	select {
	case <-n.readyCh:
		return n, nil
	case <-ctx.Done():
		n.closeOnce.Do(func() { n.closeErr = n.shutdown(false) })
		return nil, ctx.Err()
	}
}

// handler is the Node's Handler: it queues what the transport hears for
// the run loop, waiting while the queue is full, and drops it once the
// node is closing.
type handler struct{ n *Node }

func (h handler) HandleBatch(in Inbound) {
	if in.At.IsZero() {
		in.At = h.n.clock()
	}
	select {
	case h.n.inbox <- in:
	case <-h.n.quit:
	}
}

func (h handler) PeerConnected(peer string) {
	// While joining, the peer's full state is awaited from now on (it
	// answers the connection as we do), before the answer is even queued.
	h.n.mu.Lock()
	if !h.n.closed {
		h.n.core.ExpectState(peer)
	}
	h.n.mu.Unlock()
	select {
	case h.n.connects <- peer:
	case <-h.n.quit:
	}
}

func (n *Node) markReady() {
	if !n.ready.Swap(true) {
		close(n.readyCh)
	}
}

// The decision clock. Reading Clock costs 50 to 100 ns on many virtual
// machines, as much as a decision itself, so at high rates decisions share
// readings: once the last tick interval saw at least fastRate decisions per
// second, up to shareReadings decisions in a row take the same reading. A
// decision is then late by at most the time shareReadings decisions take —
// about a millisecond at fastRate, microseconds above — and never by more
// than SyncInterval, after which the next tick reads Clock again. Below
// fastRate every decision reads Clock. Readings are taken under mu, so the
// core never sees time go backwards unless Clock does.
const (
	fastRate      = 50_000 // decisions per second
	shareReadings = 64
)

// readClock reads Clock for the core. mu must be held.
func (n *Node) readClock() time.Time {
	n.last, n.shared = n.clock(), 0
	return n.last
}

// decisionTime returns the time of one decision, and tells the run loop
// that the decision may leave a change to publish. mu must be held. Its
// common path is small enough to inline.
func (n *Node) decisionTime() time.Time {
	n.decisions++
	if n.shared < n.share && n.pubArmed {
		n.shared++
		return n.last
	}
	return n.decisionTimeSlow()
}

// decisionTimeSlow is the rest of decisionTime, kept out of line so that
// decisionTime inlines: it wakes the run loop unless it is woken already,
// and reads Clock unless the decision may share the last reading.
//
//go:noinline
func (n *Node) decisionTimeSlow() time.Time {
	if !n.pubArmed {
		n.armPublish()
	}
	if n.shared < n.share {
		n.shared++
		return n.last
	}
	return n.readClock()
}

// armPublish wakes the run loop to publish the changes about to be made
// (see Config.PublishGap), unless it has been woken already. mu must be
// held.
func (n *Node) armPublish() {
	n.pubArmed = true
	select {
	case n.pubSig <- struct{}{}:
	default:
	}
}

// armIfPending wakes the run loop to publish when the core holds changes
// that no decision announced (a nack's request, a held request decided
// again). mu must be held.
func (n *Node) armIfPending() {
	if !n.pubArmed && n.core.Pending() {
		n.armPublish()
	}
}

// publishWait returns how long after now a change may be published when
// the member's last batch was built at last and batches are at least gap
// apart: 0 once gap has passed (or before any batch), never more than gap
// (a clock that stepped back does not hold changes longer).
func publishWait(now, last time.Time, gap time.Duration) time.Duration {
	if last.IsZero() {
		return 0
	}
	return min(max(last.Add(gap).Sub(now), 0), gap)
}

// publishEarly publishes the pending changes when the member's last batch
// is at least PublishGap old (Core.Flush) and returns 0, or returns how
// long until it is. With nothing pending it disarms the leading edge and
// returns 0.
func (n *Node) publishEarly() time.Duration {
	n.pubMu.Lock()
	defer n.pubMu.Unlock()
	n.mu.Lock()
	if !n.core.Pending() {
		n.pubArmed = false
		n.mu.Unlock()
		return 0
	}
	now := n.readClock()
	if wait := publishWait(now, n.core.LastPublished(), n.cfg.PublishGap); wait > 0 {
		n.mu.Unlock()
		return wait
	}
	rd := n.core.Flush(now)
	n.pubArmed = false
	n.mu.Unlock()
	n.publish(rd.Messages)
	return 0
}

// publishOver publishes the pending changes before a decision's answer
// returns, when the admissions not yet published are past a rule's
// publish budget (Core.OverBudget; docs/design.md, "What a kill loses"):
// a kill then loses at most the budget. The caller has released mu; it
// holds the answer until the batches are handed to the Transport.
//
//go:noinline
func (n *Node) publishOver() {
	n.pubMu.Lock()
	defer n.pubMu.Unlock()
	n.mu.Lock()
	if n.closed || !n.core.OverBudget() {
		n.mu.Unlock() // published meanwhile
		return
	}
	rd := n.core.Flush(n.readClock())
	n.mu.Unlock()
	n.publish(rd.Messages)
}

// publishIfOver is publishOver for a caller that does not hold mu and has
// not checked the budget.
func (n *Node) publishIfOver() {
	n.mu.Lock()
	over := !n.closed && n.core.OverBudget()
	n.mu.Unlock()
	if over {
		n.publishOver()
	}
}

// publish publishes bs in order, stopping at the first failure.
func (n *Node) publish(bs []*crdt.Batch) {
	for _, b := range bs {
		if err := n.cfg.Transport.Publish(n.ctx, b); err != nil {
			if n.ctx.Err() == nil {
				n.log.Warn("publish", "err", err)
			}
			return
		}
	}
}

// retune switches shared readings on or off by the decision rate since
// the last tick at now. mu must be held.
func (n *Node) retune(now time.Time) {
	if el := now.Sub(n.lastTick); el > 0 {
		n.share = 0
		if float64(n.decisions) >= fastRate*el.Seconds() {
			n.share = shareReadings - 1
		}
		n.decisions, n.lastTick = 0, now
	}
}

// run is the loop that owns the core's background work: merges, full
// states for new connections, the core's ticks, and the leading edge of
// changes (publishEarly), woken by pubSig and then by edge until the
// changes are out.
func (n *Node) run() {
	defer close(n.loopDone)
	timer := time.NewTimer(0)
	defer timer.Stop()
	edge := time.NewTimer(time.Hour)
	edge.Stop()
	defer edge.Stop()
	edgeSet := false
	early := func() {
		if wait := n.publishEarly(); wait > 0 {
			edge.Reset(wait)
			edgeSet = true
		}
	}
	for {
		select {
		case <-n.quit:
			return
		case in := <-n.inbox:
			n.step(in)
		case peer := <-n.connects:
			n.answer(peer)
		case <-timer.C:
			timer.Reset(n.tick())
		case <-n.pubSig:
			if !edgeSet { // else the edge timer publishes them
				early()
			}
		case <-edge.C:
			edgeSet = false
			early()
		}
	}
}

// step merges in and whatever else is queued, up to stepBurst batches,
// under one lock.
func (n *Node) step(in Inbound) {
	n.mu.Lock()
	now := n.readClock()
	for i := 1; ; i++ {
		if err := n.core.StepReceived(now, in.At, in.Batch); err != nil {
			n.log.Error("merge", "from", in.Batch.From.String(), "err", err)
		}
		more := false
		if i < stepBurst {
			select {
			case in = <-n.inbox:
				more = true
			default:
			}
		}
		if !more {
			break
		}
	}
	ready := n.core.Ready()
	n.noteHealth()
	n.armIfPending() // a nack asked for values again
	n.mu.Unlock()
	if ready {
		n.markReady() // the next tick's Ready.Joined logs it
	}
}

// Health is what a member can do at the moment.
type Health int32

// The healths.
const (
	// HealthJoining: joining (or rejoining after a partition healed), not
	// yet holding the mesh's state; decisions are denied.
	HealthJoining Health = iota
	// HealthReady: serving decisions.
	HealthReady
	// HealthFenced: under the strict policy, its side of a partition
	// holds no majority of the members; decisions are denied.
	HealthFenced
	// HealthStale: under the strict policy, the members it hears have
	// not acknowledged its batches lately (Core.Stale: an overloaded
	// host queueing its output, a one-way slow link); decisions are
	// denied (reason stale) until they do. Under the available policy a
	// stale member still serves, within its share, and stays ready.
	HealthStale
)

var healthNames = [...]string{"joining", "ready", "fenced", "stale"}

func (h Health) String() string {
	if int(h) < len(healthNames) {
		return healthNames[h]
	}
	return "unknown"
}

// noteHealth records the core's health for Health. mu must be held.
func (n *Node) noteHealth() {
	h := HealthReady
	switch {
	case !n.core.Ready():
		h = HealthJoining
	case n.core.Fenced():
		h = HealthFenced
	case n.core.Stale() && n.cfg.Policy == Strict:
		h = HealthStale
	}
	n.health.Store(int32(h))
}

// Health reports whether the member serves decisions now, or why not:
// joining, fenced or stale (/healthz and /readyz answer it).
func (n *Node) Health() Health { return Health(n.health.Load()) }

// answer sends the member's full state to peers that connected.
func (n *Node) answer(peers ...string) {
	n.mu.Lock()
	rd := n.core.AntiEntropy(n.readClock(), peers...)
	n.mu.Unlock()
	n.sendDirect(rd.Direct)
}

// sendDirect sends each Direct's batches to its peers alone.
func (n *Node) sendDirect(ds []Direct) {
	for _, d := range ds {
		for _, peer := range d.To {
			// Sent from a goroutine of its own: SendDirect may wait for a
			// slow or unreachable peer up to the transport's sync timeout,
			// and the loop's ticks and merges must not wait with it. Close
			// waits for these.
			n.answers.Add(1)
			go func() {
				defer n.answers.Done()
				if err := n.cfg.Transport.SendDirect(n.ctx, peer, d.Batches); err != nil && n.ctx.Err() == nil {
					n.log.Warn("anti-entropy", "to", peer, "err", err)
				}
			}()
		}
	}
}

// tick ticks the core, acts on its Ready and returns when to tick next.
func (n *Node) tick() time.Duration {
	n.pubMu.Lock()
	n.mu.Lock()
	now := n.readClock()
	n.retune(now)
	rd := n.core.Tick(now)
	rejected := n.core.clock.rejected
	if len(n.waiters) > 0 {
		n.wake(now) // acknowledgements applied, leases expired, windows turned: decide held requests again
	}
	n.armIfPending() // held requests decided again
	n.noteHealth()
	n.mu.Unlock()
	if f := rd.Fence; f != nil {
		if f.Fenced {
			n.log.Error("fenced: this side of a partition holds no majority of the members; denying every decision until it heals (strict policy)", "alive", f.Alive, "members", f.Live)
		} else {
			n.log.Warn("fence lifted; serving again once the members heard again have sent their state", "alive", f.Alive, "members", f.Live)
		}
	}
	n.publish(rd.Messages)
	n.pubMu.Unlock()
	n.sendDirect(rd.Direct) // relays of our whole view
	var again []string
	for _, c := range rd.Changes {
		if c.New {
			n.log.Info("member", "member", c.Peer, "incarnation", c.Incarnation, "state", c.To.String(), "new", true)
		} else {
			n.log.Info("member", "member", c.Peer, "incarnation", c.Incarnation, "from", c.From.String(), "state", c.To.String())
		}
		if c.To == Alive && (c.From == Suspect || c.From == Dead) {
			// Heard again after a silence (a healed partition, a member
			// that was paused or evicted), often over a connection that
			// stayed up: full states go out by themselves only to new
			// connections, and a member whose fence lifted serves again
			// only once it holds ours, or after join_timeout.
			again = append(again, c.Peer)
		}
	}
	if len(again) > 0 {
		n.answer(again...)
	}
	if rd.NewIncarnation != 0 {
		n.log.Warn("evicted by the mesh; took a new incarnation", "incarnation", rd.NewIncarnation)
		if err := n.saveIncarnation(rd.NewIncarnation); err != nil {
			n.log.Error("save incarnation", "incarnation", rd.NewIncarnation, "err", err)
		}
	}
	if rd.Joined {
		if rd.JoinTimedOut {
			n.log.Warn("join timed out; serving with what we have", "join_timeout", n.cfg.JoinTimeout)
		} else {
			n.log.Info("joined")
		}
		n.markReady()
	}
	if st := rd.Stale; st != nil {
		if st.Stale {
			n.log.Error("view stale: the members this node hears have not acknowledged its batches lately; denying every decision under strict, holding to its share under available, until they do",
				"lagging", st.Lagging, "members", st.Live, "strict", n.cfg.Policy == Strict)
		} else {
			n.log.Warn("view fresh again: the members acknowledge this node's batches", "members", st.Live)
		}
	}
	if rejected > n.rejLogged && (n.rejLogAt.IsZero() || now.Sub(n.rejLogAt) >= rejectLogEvery) {
		n.log.Warn("clock samples taken across a stall refused; mesh time holds its last good estimate (a loaded host or a slow peer)",
			"refused", rejected-n.rejLogged, "total", rejected)
		n.rejLogged, n.rejLogAt = rejected, now
	}
	if sk := rd.Skew; sk != nil {
		if sk.Exceeded {
			n.log.Error("clock offset to the mesh beyond max_skew; fix this host's clock", "offset", sk.Offset, "max_skew", n.cfg.MaxSkew)
		} else {
			n.log.Info("clock offset to the mesh back within max_skew", "offset", sk.Offset)
		}
	}
	return min(max(rd.NextTick.Sub(now), 0), n.cfg.SyncInterval)
}

// Close leaves the mesh gracefully: it stops the run loop, publishes the
// member's pending changes with the leave announcement (the others drop it
// from N at once), then closes the transport, writes the last flush and
// closes the store. It returns within about LeaveTimeout + StoreTimeout
// (plus the transport's close) whatever the disk does; an error about the
// store wraps ErrPersist. It is idempotent: later calls return what the
// first returned.
func (n *Node) Close() error {
	n.closeOnce.Do(func() { n.closeErr = n.shutdown(true) })
	return n.closeErr
}

func (n *Node) shutdown(closeStore bool) error {
	close(n.quit)
	<-n.loopDone
	// After any decision's publish under way (pubMu), so the leave goes
	// out last.
	n.pubMu.Lock()
	n.mu.Lock()
	bs := n.core.Leave(n.readClock()).Messages
	n.closed = true
	n.mu.Unlock()
	n.cancel()
	n.answers.Wait() // cancelled: anti-entropy answers end at once

	var errs []error
	ctx, cancel := context.WithTimeout(context.Background(), n.cfg.LeaveTimeout)
	for _, b := range bs {
		if err := n.cfg.Transport.Publish(ctx, b); err != nil {
			errs = append(errs, fmt.Errorf("node: publish leave: %w", err))
			break
		}
	}
	cancel()
	n.pubMu.Unlock()
	if err := n.cfg.Transport.Close(); err != nil {
		errs = append(errs, fmt.Errorf("node: close transport: %w", err))
	}
	errs = append(errs, n.closeStore(closeStore)...)
	n.log.Info("left")
	return errors.Join(errs...)
}

// Ready reports whether the member has joined and decides requests (a
// joining member denies them with ReasonJoining).
func (n *Node) Ready() bool { return n.ready.Load() }

// ReadyC returns a channel closed once the node is ready (at once unless
// Config.StartJoining let Start return before).
func (n *Node) ReadyC() <-chan struct{} { return n.readyCh }

// Allow decides one request of rule for key now and, unless it is a peek,
// counts it. opts may set Cost, Type and Class. A denial is a Decision
// with Allowed false, not an error; errors are for bad requests and wrap
// ErrUnknownRule, limiter.ErrBadKey, limiter.ErrUnknownClass and the like,
// or ErrClosed. Allow takes the node's mutex and decides in the caller's
// goroutine. A request the limit has room for but this member's share
// does not (limiter.ReasonShare) is held for at most the rule's
// share_wait, and never past ctx, while acknowledgements return, and
// decided again (see limiter.Rule.ShareWait); when the share is a fraction
// of the request, it may be decided by a member whose lottery draw admits
// it instead (over a Transport that implements Forwarder). If ctx ends
// while the request is held, Allow returns the denial and ctx's error.
func (n *Node) Allow(ctx context.Context, rule, key string, opts ...Option) (Decision, error) {
	if err := ctx.Err(); err != nil {
		return Decision{}, err
	}
	var req limiter.Request
	if len(opts) > 0 {
		var err error
		if req, _, err = request(opts, acceptRequest); err != nil {
			return Decision{}, err
		}
	}
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return Decision{}, ErrClosed
	}
	var d Decision
	now := n.decisionTime()
	err := n.core.allowInto(&d, now, rule, key, &req)
	over := n.core.overBudget
	n.mu.Unlock()
	if over {
		n.publishOver()
	}
	if d.Reason == limiter.ReasonShare && !d.Allowed {
		d, err = n.holdAllow(ctx, d, now, rule, key, req, -1, true)
		if d.Allowed {
			n.publishIfOver()
		}
	}
	return d, err
}

// AllowAll decides several checks as one — per second and per hour, say:
// it admits only if every check passes and consumes nothing when any
// fails. Build checks with NewCheck. The decisions come back in the order
// of the checks. A denial that only shares cause (no check refused by its
// limit, cost or key cap) is held like Allow's, for at most the least
// share_wait of those checks' rules, and decided again as a whole.
func (n *Node) AllowAll(ctx context.Context, checks ...Check) (allowed bool, ds []Decision, err error) {
	if err := ctx.Err(); err != nil {
		return false, nil, err
	}
	for i := range checks {
		if err := checks[i].err; err != nil {
			return false, nil, &CheckError{Index: i, Err: err}
		}
	}
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return false, nil, ErrClosed
	}
	now := n.decisionTime()
	allowed, ds, err = n.core.AllowAll(now, checks)
	over := n.core.overBudget
	n.mu.Unlock()
	if over {
		n.publishOver()
	}
	if err == nil && !allowed && shareOnly(ds) {
		allowed, ds, err = n.holdAll(ctx, now, checks, ds)
		if allowed {
			n.publishIfOver()
		}
	}
	return allowed, ds, err
}

// Wait decides like Allow, and while denied sleeps until the earliest
// moment a retry could succeed and tries again. It returns the denial at
// once, without sleeping, when that moment is past ctx's deadline or past
// MaxWait from the call, or never comes (RetryAfter Never). If ctx ends
// while it sleeps it returns the last denial and ctx's error. Every
// attempt counts as demand, like a client's retry would.
func (n *Node) Wait(ctx context.Context, rule, key string, opts ...Option) (Decision, error) {
	req, maxWait, err := request(opts, acceptWait)
	if err != nil {
		return Decision{}, err
	}
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	var until time.Time
	for first := true; ; first = false {
		if err := ctx.Err(); err != nil {
			return Decision{}, err
		}
		n.mu.Lock()
		if n.closed {
			n.mu.Unlock()
			return Decision{}, ErrClosed
		}
		now := n.readClock()
		if !n.pubArmed {
			n.armPublish()
		}
		if first && maxWait >= 0 {
			until = now.Add(maxWait)
		}
		d, err := n.core.Allow(now, rule, key, req)
		if err != nil || d.Allowed || d.RetryAfter == Never {
			over := n.core.overBudget
			n.mu.Unlock()
			if over {
				n.publishOver()
			}
			return d, err
		}
		early, err := n.core.Earliest(now, rule, key, req)
		n.mu.Unlock()
		if err != nil || early == Never {
			return d, err
		}
		wait := max(d.RetryAfter, early, time.Millisecond)
		at := now.Add(wait)
		if maxWait >= 0 && at.After(until) {
			return d, nil
		}
		if dl, ok := ctx.Deadline(); ok && at.After(dl) {
			return d, nil
		}
		if timer == nil {
			timer = time.NewTimer(wait)
		} else {
			timer.Reset(wait)
		}
		select {
		case <-timer.C:
		case <-ctx.Done():
			return d, ctx.Err()
		}
	}
}

// LeaseHandle is a concurrency lease this member holds for a client, as
// returned by Acquire. Renew it before it expires or lose it; Release it
// when done. Its methods are safe for concurrent use.
type LeaseHandle struct {
	// ID names the lease across the mesh; it starts with the owner's peer
	// ID, so another member can tell who owns it.
	ID        string
	Rule, Key string

	n       *Node
	expires atomic.Int64 // Unix nanoseconds
}

// Expires returns when the lease ends unless renewed.
func (l *LeaseHandle) Expires() time.Time { return time.Unix(0, l.expires.Load()) }

// Renew extends the lease by the rule's lease_ttl from now and returns the
// TTL; see Node.Renew.
func (l *LeaseHandle) Renew(ctx context.Context) (time.Duration, error) {
	ttl, expires, err := l.n.renew(ctx, l.ID)
	if err == nil {
		l.expires.Store(expires.UnixNano())
	}
	return ttl, err
}

// Release ends the lease; see Node.Release.
func (l *LeaseHandle) Release(ctx context.Context) error { return l.n.Release(ctx, l.ID) }

// Acquire admits one more concurrent lease of a concurrency rule's key iff
// the mesh's live leases plus the projection stay within the limit, and
// returns the lease, expiring after the rule's lease_ttl unless renewed.
// opts may set Class. A denial is a nil lease and a Decision with Allowed
// false, not an error. A share denial is held like Allow's; when this
// member's share is a fraction of a lease and its lottery draw refuses it,
// the lease may be granted by a member whose draw admits it (over a
// Transport that implements Forwarder): its ID then names that member as
// the owner, and Renew and Release at any member reach it.
func (n *Node) Acquire(ctx context.Context, rule, key string, opts ...Option) (*LeaseHandle, Decision, error) {
	if err := ctx.Err(); err != nil {
		return nil, Decision{}, err
	}
	req, _, err := request(opts, acceptLease)
	if err != nil {
		return nil, Decision{}, err
	}
	return n.acquireHeld(ctx, rule, key, req.Class, -1, true)
}

// Renew extends the lease id by its rule's lease_ttl from now and returns
// the TTL. A lease another member owns is renewed at its owner when the
// Transport implements Forwarder (ErrOwnerUnreachable when the owner is
// live but does not answer), and gives a *NotOwnerError naming the owner
// otherwise. An unknown or expired lease, or one whose owner is no live
// member, gives ErrUnknownLease; a malformed ID ErrBadLease.
func (n *Node) Renew(ctx context.Context, id string) (time.Duration, error) {
	ttl, _, err := n.renew(ctx, id)
	return ttl, err
}

func (n *Node) renew(ctx context.Context, id string) (time.Duration, time.Time, error) {
	if err := ctx.Err(); err != nil {
		return 0, time.Time{}, err
	}
	owner, local, err := n.leaseOwner(id)
	if err != nil {
		return 0, time.Time{}, err
	}
	if local {
		return n.renewLocal(ctx, id)
	}
	resp, err := n.forwardLease(ctx, owner, &ForwardRequest{Op: ForwardRenew, LeaseID: id})
	if err != nil {
		return 0, time.Time{}, err
	}
	return resp.TTL, time.Now().Add(resp.TTL), nil
}

// renewLocal renews a lease at this member, which must own it.
func (n *Node) renewLocal(ctx context.Context, id string) (time.Duration, time.Time, error) {
	if err := ctx.Err(); err != nil {
		return 0, time.Time{}, err
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return 0, time.Time{}, ErrClosed
	}
	now := n.decisionTime()
	ttl, err := n.core.Renew(now, id)
	return ttl, now.Add(ttl), err
}

// Release ends the lease id; another member's lease is released at its
// owner, with Renew's errors.
func (n *Node) Release(ctx context.Context, id string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	owner, local, err := n.leaseOwner(id)
	if err != nil {
		return err
	}
	if local {
		return n.releaseLocal(ctx, id)
	}
	_, err = n.forwardLease(ctx, owner, &ForwardRequest{Op: ForwardRelease, LeaseID: id})
	return err
}

// releaseLocal releases a lease at this member, which must own it.
func (n *Node) releaseLocal(ctx context.Context, id string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return ErrClosed
	}
	return n.core.Release(n.decisionTime(), id)
}

// Usage reports what this member knows of (rule, key) now: the merged
// usage of the current window, per slot, or the live leases.
func (n *Node) Usage(rule, key string) (UsageReport, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return UsageReport{}, ErrClosed
	}
	return n.core.Usage(n.readClock(), rule, key)
}

// UsageOfWindow reports what this member holds of (rule, key) in the
// rule's window of index window (Core.UsageOfWindow).
func (n *Node) UsageOfWindow(rule, key string, window int64) (UsageReport, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return UsageReport{}, ErrClosed
	}
	return n.core.UsageOfWindow(n.readClock(), rule, key, window)
}

// Peers returns every member this member knows, itself included, sorted
// by peer ID; nil after Close.
func (n *Node) Peers() []PeerInfo {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return nil
	}
	return n.core.Peers(n.readClock())
}

// Evict removes a silent member at once (see Core.Evict): what `ratemesh
// peers evict` asks for, under the strict policy, of a member known to be
// gone for good.
func (n *Node) Evict(peer string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return ErrClosed
	}
	return n.core.Evict(n.readClock(), peer)
}

// Stats returns a copy of the core's counters.
func (n *Node) Stats() Stats {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.core.Stats()
}

// Offset returns the member's estimated clock offset to the mesh.
func (n *Node) Offset() time.Duration {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.core.Offset()
}

// Incarnation returns the member's current incarnation: the one Start
// took, or a newer one after an eviction.
func (n *Node) Incarnation() uint64 {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.core.Self().Incarnation
}
