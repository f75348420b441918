package node_test

import (
	"errors"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/ratemesh/ratemesh/node"
)

// TestDefaultMeshConfig: the defaults are the config file's
// (docs/operations.md, "Config file"), and they validate.
func TestDefaultMeshConfig(t *testing.T) {
	want := node.MeshConfig{
		SyncInterval:   20 * time.Millisecond,
		Heartbeat:      500 * time.Millisecond,
		RepairInterval: 5 * time.Second,
		SuspectAfter:   2 * time.Second,
		DeadAfter:      5 * time.Second,
		EvictAfter:     30 * time.Second,
		ReclaimAfter:   0,
		Policy:         node.Strict,
		MaxSkew:        500 * time.Millisecond,
		PublishBudget:  0.1,
	}
	m := node.DefaultMeshConfig()
	if m != want {
		t.Errorf("DefaultMeshConfig() = %+v, want %+v", m, want)
	}
	if err := m.Validate(); err != nil {
		t.Errorf("the defaults: %v", err)
	}
	cc := node.DefaultCoreConfig()
	if cc.MeshConfig != want || cc.JoinTimeout != 3*time.Second {
		t.Errorf("DefaultCoreConfig() = %+v, %v; want the mesh defaults and join timeout 3s", cc.MeshConfig, cc.JoinTimeout)
	}
}

// TestMeshConfigValidate: every refusal names the setting's key in the
// config file.
func TestMeshConfigValidate(t *testing.T) {
	tests := []struct {
		name string
		mut  func(*node.MeshConfig)
		want string // Error() of the one problem
	}{
		{"zero sync interval", func(m *node.MeshConfig) { m.SyncInterval = 0 }, "mesh.sync_interval: must be positive, got 0s"},
		{"negative max skew", func(m *node.MeshConfig) { m.MaxSkew = -time.Second }, "mesh.max_skew: must be positive, got -1s"},
		{"heartbeat", func(m *node.MeshConfig) { m.Heartbeat = 10 * time.Millisecond }, "mesh.heartbeat: 10ms is shorter than sync_interval 20ms"},
		{"suspect after", func(m *node.MeshConfig) { m.SuspectAfter = 500 * time.Millisecond }, "mesh.suspect_after: 500ms must be longer than heartbeat 500ms"},
		{"dead after", func(m *node.MeshConfig) { m.DeadAfter = time.Second }, "mesh.dead_after: 1s is shorter than suspect_after 2s"},
		{"evict after", func(m *node.MeshConfig) { m.EvictAfter = time.Second }, "mesh.evict_after: 1s is shorter than suspect_after 2s"},
		{"negative reclaim", func(m *node.MeshConfig) { m.ReclaimAfter = -time.Second }, "mesh.reclaim_after: must not be negative, got -1s"},
		{"short reclaim", func(m *node.MeshConfig) { m.ReclaimAfter = 3 * time.Second }, "mesh.reclaim_after: 3s leaves a minority too little time to fence itself: at least suspect_after + heartbeat + 2 × sync_interval + max_skew = 3.04s"},
		{"budget over 1", func(m *node.MeshConfig) { m.PublishBudget = 1.5 }, "mesh.publish_budget: 1.5 is not a fraction of the share: at most 1 (negative: off)"},
		{"budget NaN", func(m *node.MeshConfig) { m.PublishBudget = math.NaN() }, "mesh.publish_budget: NaN is not a fraction of the share: at most 1 (negative: off)"},
		{"policy", func(m *node.MeshConfig) { m.Policy = "loose" }, `mesh.partition_policy: "loose" is not one of strict, available`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := node.DefaultMeshConfig()
			tc.mut(&m)
			err := m.Validate()
			var ce *node.ConfigError
			if !errors.As(err, &ce) || !errors.Is(err, node.ErrInvalidConfig) {
				t.Fatalf("Validate() = %v, want a *ConfigError wrapping ErrInvalidConfig", err)
			}
			if got := ce.Key + ": " + ce.Msg; got != tc.want {
				t.Errorf("Validate() = %q, want %q", got, tc.want)
			}
			if got, want := err.Error(), "node: invalid config: "+tc.want; got != want {
				t.Errorf("Error() = %q, want %q", got, want)
			}
		})
	}
	for _, ok := range []func(*node.MeshConfig){
		func(m *node.MeshConfig) { m.PublishBudget = -1 },                     // off
		func(m *node.MeshConfig) { m.PublishBudget = 1 },                      // the whole share
		func(m *node.MeshConfig) { m.ReclaimAfter = 3040 * time.Millisecond }, // exactly the margin
		func(m *node.MeshConfig) { m.Policy = node.Available },
	} {
		m := node.DefaultMeshConfig()
		ok(&m)
		if err := m.Validate(); err != nil {
			t.Errorf("%+v: %v, want valid", m, err)
		}
	}
}

// TestMeshConfigValidateEvery: every duration that is not positive is
// reported, in the file's order, and the policy beside an order problem,
// so a reload can list them all.
func TestMeshConfigValidateEvery(t *testing.T) {
	keys := func(err error) []string {
		var out []string
		for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
			var ce *node.ConfigError
			if !errors.As(e, &ce) {
				t.Fatalf("%v is not a *ConfigError", e)
			}
			out = append(out, ce.Key)
		}
		return out
	}
	m := node.DefaultMeshConfig()
	m.Heartbeat, m.DeadAfter, m.Policy = 0, 0, "loose"
	if got, want := keys(m.Validate()), []string{"mesh.heartbeat", "mesh.dead_after"}; !slices.Equal(got, want) {
		t.Errorf("zero heartbeat and dead_after: %v, want %v (the policy waits for positive durations)", got, want)
	}
	m = node.DefaultMeshConfig()
	m.EvictAfter, m.Policy = time.Second, "loose"
	if got, want := keys(m.Validate()), []string{"mesh.evict_after", "mesh.partition_policy"}; !slices.Equal(got, want) {
		t.Errorf("short evict_after and a bad policy: %v, want %v", got, want)
	}
}

// TestNewCoreRefusesMeshConfig: NewCore checks the mesh settings with
// Validate, and its own after them.
func TestNewCoreRefusesMeshConfig(t *testing.T) {
	cfg := node.DefaultCoreConfig()
	cfg.Peer, cfg.Incarnation = "peer-a", 1
	cfg.SuspectAfter = 100 * time.Millisecond
	_, err := node.NewCore(cfg, time.Unix(0, 0))
	if got, want := errString(err), "node: invalid config: mesh.suspect_after: 100ms must be longer than heartbeat 500ms"; got != want {
		t.Errorf("NewCore: %s, want %s", got, want)
	}
	cfg = node.DefaultCoreConfig()
	cfg.Peer, cfg.Incarnation, cfg.JoinTimeout = "peer-a", 1, 0
	_, err = node.NewCore(cfg, time.Unix(0, 0))
	if got, want := errString(err), "node: invalid config: join_timeout: must be positive, got 0s"; got != want {
		t.Errorf("NewCore: %s, want %s", got, want)
	}
}

func errString(err error) string {
	if err == nil {
		return "<nil>"
	}
	return err.Error()
}
