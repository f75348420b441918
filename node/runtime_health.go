package node

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
	case !n.core.Joined():
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

func (n *Node) markReady() {
	if !n.ready.Swap(true) {
		close(n.readyCh)
	}
}

// Ready reports whether the member has joined and decides requests (a
// joining member denies them with ReasonJoining).
func (n *Node) Ready() bool { return n.ready.Load() }

// ReadyC returns a channel closed once the node is ready (at once unless
// Config.StartJoining let Start return before).
func (n *Node) ReadyC() <-chan struct{} { return n.readyCh }
