package node

import (
	"context"
	"errors"
	"fmt"
)

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
	now := n.readClock()
	n.core.Leave(now)
	rd := n.core.Ready()
	n.closed = true
	n.mu.Unlock()
	n.cancel()
	n.answers.Wait() // cancelled: anti-entropy answers end at once

	var errs []error
	ctx, cancel := context.WithTimeout(context.Background(), n.cfg.LeaveTimeout)
	if _, err := n.handle(ctx, now, rd); err != nil {
		errs = append(errs, fmt.Errorf("node: publish leave: %w", err))
	}
	cancel()
	if err := n.cfg.Transport.Close(); err != nil {
		errs = append(errs, fmt.Errorf("node: close transport: %w", err))
	}
	errs = append(errs, n.closeStore(closeStore)...)
	n.log.Info("left")
	return errors.Join(errs...)
}
