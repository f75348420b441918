package node

import (
	"errors"
	"fmt"
	"time"

	"github.com/ratemesh/ratemesh/crdt"
	"github.com/ratemesh/ratemesh/limiter"
)

// Policy is the partition policy: what a side of a partition may use once
// members on the other side turn suspect.
type Policy string

// The partition policies.
const (
	// Strict keeps suspect members in N and scales the limit by
	// alive/(alive+suspect), so the sides together never exceed the limit,
	// until a silent member is evicted after EvictAfter (or by hand).
	Strict Policy = "strict"
	// Available drops members silent past DeadAfter, so each side of a
	// partition may use the whole limit.
	Available Policy = "available"
)

// ErrInvalidConfig wraps every configuration error.
var ErrInvalidConfig = errors.New("node: invalid config")

// ConfigError is a setting a validation refuses: Key names it as the
// config file spells it (mesh.heartbeat), Msg says what is wrong. It wraps
// ErrInvalidConfig.
type ConfigError struct {
	Key string
	Msg string
}

func (e *ConfigError) Error() string {
	return fmt.Sprintf("%v: %s: %s", ErrInvalidConfig, e.Key, e.Msg)
}

// Unwrap returns ErrInvalidConfig.
func (e *ConfigError) Unwrap() error { return ErrInvalidConfig }

// MeshConfig holds the mesh settings: how often a member publishes, when a
// silent member turns suspect, dead or evicted, the partition policy, and
// the bounds on clock skew and on what a kill loses. They are the config
// file's mesh section (docs/operations.md, "Config file") but for
// mesh.namespace, which is the transport's: package config decodes the
// section into a MeshConfig, and Validate names every setting by its key
// there. Every member of a mesh should run the same values. Start from
// DefaultMeshConfig: the zero value does not validate.
type MeshConfig struct {
	// SyncInterval (mesh.sync_interval) is how often own changes are
	// published as one batch.
	SyncInterval time.Duration
	// Heartbeat (mesh.heartbeat) is how often an idle member still sends
	// a batch.
	Heartbeat time.Duration
	// RepairInterval (mesh.repair_interval) is how often a member
	// re-announces its slots that changed since its last repair, so a
	// lost last delta heals.
	RepairInterval time.Duration
	// SuspectAfter (mesh.suspect_after) is the silence that makes a
	// member suspect.
	SuspectAfter time.Duration
	// DeadAfter (mesh.dead_after) is the silence after which a member is
	// dead (Available).
	DeadAfter time.Duration
	// EvictAfter (mesh.evict_after) is the silence after which a member
	// is evicted (Strict) when this member's side holds exactly half of
	// the members; a side with a strict majority reclaims after
	// ReclaimAfter, and a side without one fences itself and evicts
	// nobody by itself.
	EvictAfter time.Duration
	// ReclaimAfter (mesh.reclaim_after) is the silence after which, under
	// Strict, a side that holds a strict majority of the members evicts
	// the silent ones and reclaims their capacity. A side without a
	// majority fences itself (denies with limiter.ReasonFenced) once its
	// silent members turn suspect, and the margin ReclaimAfter −
	// SuspectAfter, at least Heartbeat + 2·SyncInterval + MaxSkew, makes
	// sure it has stopped before the majority reclaims. 0 means
	// DeadAfter, raised to that margin if it is shorter.
	ReclaimAfter time.Duration
	// Policy (mesh.partition_policy) is the partition policy.
	Policy Policy
	// MaxSkew (mesh.max_skew) is the clock offset to the mesh beyond
	// which the member reports the skew (Ready.Skew).
	MaxSkew time.Duration
	// PublishBudget (mesh.publish_budget) bounds what a SIGKILL can lose:
	// the credits of one rule this member may admit and not yet have
	// published, as a fraction of its share of the limit (limit / live
	// members). Once it is reached the runtime publishes before it answers
	// (Core.OverBudget). 0 means the default, 0.1; a negative value turns
	// the bound off (changes wait for the leading edge or the sync tick,
	// as before); at most 1.
	PublishBudget float64
}

// DefaultMeshConfig returns the defaults of the config file's mesh section
// (docs/operations.md, "Config file").
func DefaultMeshConfig() MeshConfig {
	return MeshConfig{
		SyncInterval:   20 * time.Millisecond,  // one batch per 20 ms keeps the unseen share small
		Heartbeat:      500 * time.Millisecond, // idle members still prove they live
		RepairInterval: 5 * time.Second,        // lost last deltas of idle keys heal within seconds
		SuspectAfter:   2 * time.Second,        // four missed heartbeats
		DeadAfter:      5 * time.Second,        // available: give up the silent member's share
		EvictAfter:     30 * time.Second,       // strict: hold capacity for a silent member this long
		ReclaimAfter:   0,                      // strict majority: dead_after, or the shortest safe margin if longer
		Policy:         Strict,                 // never over the limit by default
		MaxSkew:        500 * time.Millisecond, // beyond this, clocks need fixing
		PublishBudget:  defaultPublishBudget,   // a kill loses at most a tenth of a share
	}
}

// defaultPublishBudget is PublishBudget's default: a kill loses at most a
// tenth of the killed member's share of a window.
const defaultPublishBudget = 0.1

// publishBudget is PublishBudget with its zero value resolved; 0: off.
func (c *MeshConfig) publishBudget() float64 {
	switch {
	case c.PublishBudget < 0:
		return 0
	case c.PublishBudget == 0:
		return defaultPublishBudget
	}
	return c.PublishBudget
}

// MinReclaimAfter is the shortest ReclaimAfter the other settings allow.
func (c *MeshConfig) MinReclaimAfter() time.Duration { return c.minReclaim() }

// minReclaim is the shortest ReclaimAfter: a minority member fences itself
// at most SuspectAfter (plus a tick) after it last heard the majority, and
// the majority may have last heard it up to a Heartbeat before that;
// MaxSkew covers delivery and clock-rate differences.
func (c *MeshConfig) minReclaim() time.Duration {
	return c.SuspectAfter + c.Heartbeat + 2*c.SyncInterval + c.MaxSkew
}

// reclaimAfter is ReclaimAfter with its zero value resolved.
func (c *MeshConfig) reclaimAfter() time.Duration {
	if c.ReclaimAfter > 0 {
		return c.ReclaimAfter
	}
	return max(c.DeadAfter, c.minReclaim())
}

// Validate checks the settings: every duration positive; then, when they
// are, the order of the silences, reclaim_after's margin, publish_budget
// and the policy. Each problem found is a *ConfigError naming its key
// (mesh.suspect_after: 100ms must be longer than heartbeat 500ms); the
// error joins them (errors.Join), so errors.As finds the first and a
// caller that lists every problem unwraps them all.
func (c *MeshConfig) Validate() error {
	var errs []error
	bad := func(key, format string, args ...any) {
		errs = append(errs, &ConfigError{Key: "mesh." + key, Msg: fmt.Sprintf(format, args...)})
	}
	positive := []struct {
		key string
		d   time.Duration
	}{
		{"sync_interval", c.SyncInterval}, {"heartbeat", c.Heartbeat},
		{"repair_interval", c.RepairInterval}, {"suspect_after", c.SuspectAfter},
		{"dead_after", c.DeadAfter}, {"evict_after", c.EvictAfter},
		{"max_skew", c.MaxSkew},
	}
	for _, p := range positive {
		if p.d <= 0 {
			bad(p.key, "must be positive, got %v", p.d)
		}
	}
	if len(errs) > 0 {
		// The orders below mean little between durations that are not.
		return errors.Join(errs...)
	}
	switch {
	case c.Heartbeat < c.SyncInterval:
		bad("heartbeat", "%v is shorter than sync_interval %v", c.Heartbeat, c.SyncInterval)
	case c.SuspectAfter <= c.Heartbeat:
		bad("suspect_after", "%v must be longer than heartbeat %v", c.SuspectAfter, c.Heartbeat)
	case c.DeadAfter < c.SuspectAfter:
		bad("dead_after", "%v is shorter than suspect_after %v", c.DeadAfter, c.SuspectAfter)
	case c.EvictAfter < c.SuspectAfter:
		bad("evict_after", "%v is shorter than suspect_after %v", c.EvictAfter, c.SuspectAfter)
	case c.ReclaimAfter < 0:
		bad("reclaim_after", "must not be negative, got %v", c.ReclaimAfter)
	case c.ReclaimAfter > 0 && c.ReclaimAfter < c.minReclaim():
		bad("reclaim_after", "%v leaves a minority too little time to fence itself: at least suspect_after + heartbeat + 2 × sync_interval + max_skew = %v", c.ReclaimAfter, c.minReclaim())
	case c.PublishBudget > 1 || c.PublishBudget != c.PublishBudget:
		bad("publish_budget", "%v is not a fraction of the share: at most 1 (negative: off)", c.PublishBudget)
	}
	switch c.Policy {
	case Strict, Available:
	default:
		bad("partition_policy", "%q is not one of strict, available", c.Policy)
	}
	return errors.Join(errs...)
}

// CoreConfig configures a Core. Start from DefaultCoreConfig.
type CoreConfig struct {
	// Peer is this member's peer ID; with Incarnation it forms its slot.
	Peer string
	// Incarnation must grow across restarts: use NextIncarnation.
	Incarnation uint64
	// Rules are the rate limits. Each is normalised and validated; one
	// invalid rule fails NewCore with an error naming it.
	Rules []limiter.Rule
	// MeshConfig holds the mesh settings: the intervals, the silences,
	// the partition policy, MaxSkew and PublishBudget.
	MeshConfig
	// Join says that peers are configured or known: the member is not
	// ready until the full state of the first peer, and of every peer the
	// runtime reported connected (Core.ExpectState), has arrived, or
	// JoinTimeout (node.join_timeout in the config file) passes. Without
	// it the member is ready at once.
	Join        bool
	JoinTimeout time.Duration
	// Known are the peers this member saw as live members in an earlier
	// run (the runtime loads them from Store.LoadPeers): its own
	// observation, unlike a peer's member table. NewCore counts each as a
	// suspect member, silent since it starts, until a batch of its own
	// arrives, so a member restarted on the minority side of a partition
	// under Strict fences itself instead of deciding with the members it
	// happens to hear. At most maxKnown are taken, duplicates and the
	// member's own peer ID skipped.
	Known []string
	// MaxKeys (node.max_keys) caps the keys this member holds over every
	// rule, its own and those merged from peers: at the cap a decision
	// for a key it does not hold is denied (limiter.ReasonKeyCap), as at
	// a rule's MaxKeys. Merges do not stop at the cap — refusing an
	// honest peer's key would lose its counts — so the keys held can pass
	// it while peers make keys; keys go when their last window expires.
	// But no peer may make more than its key budget here (keyBudget:
	// MaxKeys plus a quarter, at least 1024 more), which an honest peer
	// never reaches, since it stops making keys of its own at its cap: a
	// member that invents keys cannot grow this one's memory beyond that.
	// 0 means DefaultMaxKeys.
	MaxKeys int
	// LocalClock opens and counts windows on the member's own clock, with
	// no offset correction: mesh time (docs/design.md, "Mesh time") off.
	// The offset is still estimated (Offset, Ready.Skew); only MeshMs
	// ignores it. It is
	// for measuring what mesh time buys (the simulator's clock-skew
	// comparison); the zero value, false, keeps mesh time on.
	LocalClock bool
}

// DefaultMaxKeys is CoreConfig.MaxKeys's default: a member holding this
// many keys, each touched once, takes about 1.8 GiB of memory
// (docs/performance.md, "A key budget"), half of what ten million take.
const DefaultMaxKeys = 5_000_000

// keyBudget returns the most keys one peer's entries may make at a member
// whose cap is maxKeys (CoreConfig.MaxKeys): the cap, and a quarter more
// (at least 1024) for the keys an honest peer makes while the counts
// that would stop it are on their way.
func keyBudget(maxKeys int) int { return maxKeys + max(maxKeys/4, 1024) }

// DefaultCoreConfig returns the defaults of the config file
// (docs/operations.md, "Config file"): DefaultMeshConfig's, and the join
// timeout. Peer and Incarnation are left for the caller.
func DefaultCoreConfig() CoreConfig {
	return CoreConfig{
		MeshConfig:  DefaultMeshConfig(),
		JoinTimeout: 3 * time.Second, // serve with what we have after this
		MaxKeys:     DefaultMaxKeys,
	}
}

func (c *CoreConfig) validate() error {
	if err := c.MeshConfig.Validate(); err != nil {
		return err
	}
	bad := func(field, format string, args ...any) error {
		return fmt.Errorf("%w: %s: %s", ErrInvalidConfig, field, fmt.Sprintf(format, args...))
	}
	switch {
	case c.JoinTimeout <= 0:
		return bad("join_timeout", "must be positive, got %v", c.JoinTimeout)
	case c.MaxKeys < 0:
		return bad("max_keys", "must not be negative, got %d", c.MaxKeys)
	case c.Peer == "":
		return bad("peer", "must not be empty")
	case len(c.Peer) > crdt.MaxPeerLen:
		return bad("peer", "%d bytes, at most %d", len(c.Peer), crdt.MaxPeerLen)
	case c.Incarnation == 0:
		return bad("incarnation", "must be set (use NextIncarnation)")
	}
	seen := make(map[string]bool, len(c.Rules))
	for i := range c.Rules {
		name := c.Rules[i].Name
		if seen[name] {
			return fmt.Errorf("%w: rule %q: name: defined twice", ErrInvalidConfig, name)
		}
		seen[name] = true
	}
	return nil
}

// NextIncarnation returns the incarnation to take at a start: larger than
// any persisted before, and at least the Unix time in milliseconds, so a
// restarted member never writes a value lower than one it wrote before,
// with or without a disk.
func NextIncarnation(persisted uint64, now time.Time) uint64 {
	ms := now.UnixMilli()
	if ms < 0 {
		ms = 0
	}
	return max(persisted+1, uint64(ms))
}
