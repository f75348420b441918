package node

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ratemesh/ratemesh/crdt"
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
	// 0 means the default: SyncInterval/2, stretched toward SyncInterval
	// in a large mesh (see PublishGap, the function); a negative value
	// turns the leading edge off,
	// leaving changes to the tick (a simulator scenario's
	// mesh.publish_gap: tick).
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
	burst    []Inbound // step's batches, reused (the run goroutine's alone)
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

	// Held requests and forwarding: see runtime_hold.go and runtime_forward.go.
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
	if core.Joined() {
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
// under one lock, through Core.StepMany (the path the simulator takes
// too). Step adds nothing to the core's Ready: what a merge changes comes
// out with the next tick's.
func (n *Node) step(in Inbound) {
	burst := append(n.burst[:0], in)
	for len(burst) < stepBurst {
		select {
		case in = <-n.inbox:
			burst = append(burst, in)
			continue
		default:
		}
		break
	}
	n.mu.Lock()
	now := n.readClock()
	for rest := burst; len(rest) > 0; {
		i, err := n.core.StepMany(len(rest), func(i int) (time.Time, time.Time, *crdt.Batch) {
			return now, rest[i].At, rest[i].Batch
		})
		if err == nil {
			break
		}
		n.log.Error("merge", "from", rest[i].Batch.From.String(), "err", err)
		rest = rest[i+1:]
	}
	joined := n.core.Joined()
	n.noteHealth()
	n.armIfPending() // a nack asked for values again
	n.mu.Unlock()
	clear(burst) // drop the batches for the collector
	n.burst = burst[:0]
	if joined {
		n.markReady() // the next tick's Ready.Joined logs it
	}
}

// tick ticks the core, hands its Ready to handle, and returns when to
// tick next.
func (n *Node) tick() time.Duration {
	n.pubMu.Lock()
	n.mu.Lock()
	now := n.readClock()
	n.retune(now)
	n.core.Tick(now)
	rd := n.core.Ready()
	rejected := n.core.clock.rejected
	if len(n.waiters) > 0 {
		n.wake(now) // acknowledgements applied, leases expired, windows turned: decide held requests again
	}
	n.armIfPending() // held requests decided again
	n.noteHealth()
	n.mu.Unlock()
	next, _ := n.handle(n.ctx, now, rd)
	if rejected > n.rejLogged && (n.rejLogAt.IsZero() || now.Sub(n.rejLogAt) >= rejectLogEvery) {
		n.log.Warn("clock samples taken across a stall refused; mesh time holds its last good estimate (a loaded host or a slow peer)",
			"refused", rejected-n.rejLogged, "total", rejected)
		n.rejLogged, n.rejLogAt = rejected, now
	}
	return next
}
