package node

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"
)

// Defaults of the persistence settings of Config.
const (
	defaultFlushInterval    = time.Second
	defaultPersistMinWindow = time.Minute
)

func (c *Config) fillPersistDefaults() {
	if c.FlushInterval == 0 {
		c.FlushInterval = defaultFlushInterval
	}
	if c.PersistMinWindow == 0 {
		c.PersistMinWindow = defaultPersistMinWindow
	}
}

// persistence is the runtime's side of the Store. The run loop never
// touches the disk: a goroutine of its own (persistLoop) flushes every
// FlushInterval, so a slow disk delays neither decisions nor gossip. Only
// Persister.Export runs under the node's mutex, and looks only at the
// windows changed since the last flush (a full walk only after a failed
// flush or a rules change).
type persistence struct {
	p       *Persister // guarded by Node.mu
	storeMu sync.Mutex // serialises Store calls: the flush loop, the run loop's incarnation saves, Close
	done    chan struct{}
	failing bool        // the last flush failed; guarded by storeMu
	peers   []KnownPeer // the members last saved; persistLoop's own
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
	return &persistence{p: p, done: make(chan struct{})}, nil
}

// persistLoop flushes every FlushInterval until the node closes; Close
// writes the last flush itself.
func (n *Node) persistLoop() {
	defer close(n.persist.done)
	t := time.NewTicker(n.cfg.FlushInterval)
	defer t.Stop()
	for {
		select {
		case <-n.quit:
			return
		case <-t.C:
			_ = n.flush(n.ctx)
			n.savePeers(n.ctx)
		}
	}
}

// flush exports what changed under the node's mutex and writes it outside
// it. A write error is logged and counted (Stats.PersistErrors); the node
// keeps serving from memory, and the next flush writes everything again.
func (n *Node) flush(ctx context.Context) error {
	n.mu.Lock()
	f := n.persist.p.Export(n.readClock())
	n.mu.Unlock()

	n.persist.storeMu.Lock()
	err := n.cfg.Store.Flush(ctx, f)
	failing := n.persist.failing
	n.persist.failing = err != nil
	n.persist.storeMu.Unlock()

	n.mu.Lock()
	n.persist.p.Done(&f, err)
	n.mu.Unlock()
	switch {
	case err != nil:
		n.log.Error("persist: flush failed; serving from memory, retrying next flush", "records", len(f.Windows), "leases", len(f.Leases), "err", err)
		return fmt.Errorf("node: flush: %w", err)
	case failing:
		n.log.Info("persist: flush succeeded again")
	}
	return nil
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
