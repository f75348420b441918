package node

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"
)

// Defaults of the persistence settings of Config.
const (
	defaultFlushInterval    = time.Second
	defaultPersistMinWindow = time.Minute
	defaultStoreTimeout     = 2 * time.Second
)

// ErrorLogInterval is the least time between two log lines about failing
// flushes: a disk that fails keeps failing. Each line counts the failures
// since the last.
const ErrorLogInterval = 10 * time.Second

// ErrPersist wraps Close's error when the last flush or the store's close
// failed, or did not finish within Config.StoreTimeout: what the member
// admitted since its last good flush is not on disk.
var ErrPersist = errors.New("node: persistence failed")

func (c *Config) fillPersistDefaults() {
	if c.FlushInterval == 0 {
		c.FlushInterval = defaultFlushInterval
	}
	if c.PersistMinWindow == 0 {
		c.PersistMinWindow = defaultPersistMinWindow
	}
	if c.StoreTimeout == 0 {
		c.StoreTimeout = defaultStoreTimeout
	}
}

// persistence is the runtime's side of the Store. The run loop never
// touches the disk: a goroutine of its own (persistLoop) flushes every
// FlushInterval, so a slow disk delays neither decisions nor gossip. Only
// the export (Core.Persist) runs under the node's mutex, and looks only at
// the windows changed since the last flush (a full walk only after a
// failed flush or a rules change).
type persistence struct {
	storeMu sync.Mutex // serialises Store calls: the flush loop, the run loop's incarnation saves, Close
	done    chan struct{}
	peers   []KnownPeer // the members last saved; persistLoop's own

	// Owned by persistLoop: failing flushes in a row, and when one was
	// last logged.
	failures int
	logged   time.Time
	held     int // failures not logged since
}

// restore loads the saved windows and leases into core before the member
// serves. A store that cannot be read fails the start: serving without the
// usage of long windows would admit past their limits.
func restore(ctx context.Context, cfg *Config, core *Core) (*persistence, error) {
	recs, err := cfg.Store.LoadWindows(ctx)
	if err != nil {
		return nil, fmt.Errorf("node: load windows: %w", err)
	}
	leases, err := cfg.Store.LoadLeases(ctx)
	if err != nil {
		return nil, fmt.Errorf("node: load leases: %w", err)
	}
	p := NewPersister(core, cfg.PersistMinWindow)
	st := p.Restore(cfg.Clock(), recs, leases)
	if st.Windows+st.Leases+st.SkippedWindows+st.SkippedLeases > 0 {
		cfg.Logger.Info("restored", "peer", cfg.Peer, "window_records", st.Windows, "leases", st.Leases,
			"skipped_window_records", st.SkippedWindows, "skipped_leases", st.SkippedLeases)
	}
	return &persistence{done: make(chan struct{})}, nil
}

// persistLoop flushes every FlushInterval until the node closes; Close
// writes the last flush itself. Its flushes are not cancelled by Close,
// which waits for the one under way (within StoreTimeout).
func (n *Node) persistLoop() {
	defer close(n.persist.done)
	t := time.NewTicker(n.cfg.FlushInterval)
	defer t.Stop()
	for {
		select {
		case <-n.quit:
			return
		case <-t.C:
			n.reportFlush(n.flush(context.Background()), time.Now())
			n.savePeers(n.ctx)
		}
	}
}

// reportFlush logs a periodic flush's outcome: a failure at once, then at
// most one line per ErrorLogInterval while flushes keep failing, with the
// count; the first success after failures says so. A failure is also
// counted (Stats.PersistErrors); the node keeps serving from memory, and
// the next flush writes everything again.
func (n *Node) reportFlush(err error, now time.Time) {
	p := n.persist
	if err == nil {
		if p.failures > 0 {
			n.log.Info("persist: flush succeeded again", "failed_flushes", p.failures)
		}
		p.failures, p.held, p.logged = 0, 0, time.Time{}
		return
	}
	p.failures++
	if !p.logged.IsZero() && now.Sub(p.logged) < ErrorLogInterval {
		p.held++
		return
	}
	n.log.Error("persist: flush failed; serving from memory, retrying every flush_interval", "err", err,
		"failed_flushes", p.failures, "not_logged", p.held)
	p.logged, p.held = now, 0
}

// flush has the core export what changed (Core.Persist) and takes its
// Ready under the node's mutex, writes the Flush outside it, and reports
// the outcome to the core (Core.Persisted); it returns the Store's error
// naming what was not written. The Ready holds the Flush alone (every
// other input takes its Ready under the same hold of mu as it runs), and
// handle acts on the rest all the same.
func (n *Node) flush(ctx context.Context) error {
	n.pubMu.Lock()
	n.mu.Lock()
	now := n.readClock()
	n.core.Persist(now)
	rd := n.core.Ready()
	n.mu.Unlock()
	f := rd.Persist
	rd.Persist = nil
	n.handle(n.ctx, now, rd)
	if f == nil {
		return nil // no Persister: the node has no Store
	}

	n.persist.storeMu.Lock()
	err := n.cfg.Store.Flush(ctx, *f)
	n.persist.storeMu.Unlock()

	n.mu.Lock()
	n.core.Persisted(f, err)
	n.mu.Unlock()
	if err != nil {
		return fmt.Errorf("flush of %d window records and %d leases: %w", len(f.Windows), len(f.Leases), err)
	}
	return nil
}

// closeStore writes the last flush and, with closeStore, closes the
// store, all within StoreTimeout: a disk that no longer answers (a data
// directory removed under pebble, say) cannot hold Close. A call that
// does not return in time is left behind in its goroutine. Every error
// wraps ErrPersist.
func (n *Node) closeStore(closeStore bool) []error {
	ctx, cancel := context.WithTimeout(context.Background(), n.cfg.StoreTimeout)
	defer cancel()
	late := func(what string) error {
		return fmt.Errorf("%w: %s did not finish within %v (store_timeout)", ErrPersist, what, n.cfg.StoreTimeout)
	}
	// The flush loop may be inside a flush; the last one waits for it.
	select {
	case <-n.persist.done:
	case <-ctx.Done():
		return []error{late("a periodic flush")}
	}
	var errs []error
	switch err := within(ctx, func() error { return n.flush(ctx) }); {
	case errors.Is(err, errLate):
		errs = append(errs, late("the last flush"))
	case err != nil:
		errs = append(errs, fmt.Errorf("%w: last %w", ErrPersist, err))
	}
	if closeStore {
		switch err := within(ctx, n.cfg.Store.Close); {
		case errors.Is(err, errLate):
			errs = append(errs, late("closing the store"))
		case err != nil:
			errs = append(errs, fmt.Errorf("%w: node: close store: %w", ErrPersist, err))
		}
	}
	return errs
}

var errLate = errors.New("node: deadline passed")

// within runs f in a goroutine of its own and returns its error, or
// errLate once ctx ends first (f then goes on, unwaited for).
func within(ctx context.Context, f func() error) error {
	done := make(chan error, 1)
	go func() { done <- f() }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return errLate
	}
}

// saveIncarnation persists a new incarnation taken while running.
func (n *Node) saveIncarnation(inc uint64) error {
	n.persist.storeMu.Lock()
	defer n.persist.storeMu.Unlock()
	return n.cfg.Store.SaveIncarnation(n.ctx, inc)
}

// savePeers saves the live members' addresses when they changed, if the
// Transport can tell them (AddrBook), so a node restarted with no
// bootstrap address dials the members it knew. A failure is logged; the
// next flush tries again.
func (n *Node) savePeers(ctx context.Context) {
	book, ok := n.cfg.Transport.(AddrBook)
	if !ok {
		return
	}
	n.mu.Lock()
	var live []string
	for _, p := range n.core.Peers(n.readClock()) {
		if !p.Self && (p.State == Alive || p.State == Suspect) {
			live = append(live, p.Peer)
		}
	}
	n.mu.Unlock()
	var peers []KnownPeer
	for _, p := range live {
		if addrs := book.KnownAddrs(p); len(addrs) > 0 {
			peers = append(peers, KnownPeer{Peer: p, Addrs: addrs})
		}
	}
	if len(peers) == 0 || slices.EqualFunc(peers, n.persist.peers, func(a, b KnownPeer) bool {
		return a.Peer == b.Peer && slices.Equal(a.Addrs, b.Addrs)
	}) {
		return // nothing known, or nothing new: keep what was saved
	}
	n.persist.storeMu.Lock()
	err := n.cfg.Store.SavePeers(ctx, peers)
	n.persist.storeMu.Unlock()
	if err != nil {
		n.log.Warn("persist: save the members' addresses", "err", err)
		return
	}
	n.persist.peers = peers
}
