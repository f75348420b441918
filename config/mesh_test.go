package config_test

import (
	"errors"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ratemesh/ratemesh/config"
	"github.com/ratemesh/ratemesh/node"
)

// everyMeshKey sets every key of the mesh section to a value other than
// its default, in the order the section lists them.
const everyMeshKey = `mesh:
  namespace: other
  sync_interval: 10ms
  heartbeat: 400ms
  repair_interval: 4s
  suspect_after: 1500ms
  dead_after: 6s
  evict_after: 40s
  reclaim_after: 7s
  partition_policy: available
  max_skew: 300ms
  publish_budget: 0.2
`

// meshKeys returns the mesh section's keys as the parser's unknown-field
// error lists them.
func meshKeys(t *testing.T) []string {
	t.Helper()
	_, err := config.Parse([]byte("mesh: {no_such_key: 1}\n"))
	m := regexp.MustCompile(`unknown field \(known: (.*)\)`).FindStringSubmatch(errString(err))
	if m == nil {
		t.Fatalf("an unknown mesh key: %v, want the known keys listed", err)
	}
	return strings.Split(m[1], ", ")
}

// TestMeshSection: every key of the mesh section reaches node.MeshConfig
// and, through NodeConfig, the node; and a reload that changes it says it
// needs a restart (ChangedSettings).
func TestMeshSection(t *testing.T) {
	var set []string
	for _, line := range strings.Split(everyMeshKey, "\n")[1:] {
		if k, _, ok := strings.Cut(strings.TrimSpace(line), ":"); ok {
			set = append(set, k)
		}
	}
	if known := meshKeys(t); !slices.Equal(sorted(set), known) {
		t.Fatalf("the test sets %v, the section has %v: give a new key a value here", set, known)
	}
	cfg, err := config.Parse([]byte(everyMeshKey))
	if err != nil {
		t.Fatal(err)
	}
	want := node.MeshConfig{
		SyncInterval:   10 * time.Millisecond,
		Heartbeat:      400 * time.Millisecond,
		RepairInterval: 4 * time.Second,
		SuspectAfter:   1500 * time.Millisecond,
		DeadAfter:      6 * time.Second,
		EvictAfter:     40 * time.Second,
		ReclaimAfter:   7 * time.Second,
		Policy:         node.Available,
		MaxSkew:        300 * time.Millisecond,
		PublishBudget:  0.2,
	}
	if cfg.Mesh.MeshConfig != want || cfg.Mesh.Namespace != "other" {
		t.Errorf("mesh %+v, want namespace other and %+v", cfg.Mesh, want)
	}
	if got := cfg.NodeConfig(node.DefaultConfig()).MeshConfig; got != want {
		t.Errorf("NodeConfig: mesh settings %+v, want %+v", got, want)
	}
	running := config.Default()
	var wantChanged []string
	for _, k := range set {
		wantChanged = append(wantChanged, "mesh."+k)
	}
	if got := config.ChangedSettings(&running, []byte(everyMeshKey)); !slices.Equal(got, wantChanged) {
		t.Errorf("ChangedSettings = %v, want %v", got, wantChanged)
	}
	if d := config.Default().Mesh; d.MeshConfig != node.DefaultMeshConfig() || d.Namespace != "default" {
		t.Errorf("Default().Mesh = %+v, want namespace default and node.DefaultMeshConfig()", d)
	}
}

// TestMeshErrors: the mesh settings' problems name their keys, one error
// each, as node.MeshConfig.Validate finds them; a reload lists them all.
func TestMeshErrors(t *testing.T) {
	tests := []struct{ src, want string }{
		{"mesh: {reclaim_after: 3s}\n", "mesh.reclaim_after: 3s leaves a minority too little time to fence itself: at least suspect_after + heartbeat + 2 × sync_interval + max_skew = 3.04s"},
		{"mesh: {publish_budget: 2}\n", "mesh.publish_budget: 2 is not a fraction of the share: at most 1 (negative: off)"},
		{"mesh: {evict_after: 1s}\n", "mesh.evict_after: 1s is shorter than suspect_after 2s"},
		{"mesh: {namespace: \"\"}\n", "mesh.namespace: must not be empty"},
	}
	for _, tc := range tests {
		_, err := config.Parse([]byte(tc.src))
		var ce *config.Error
		if !errors.As(err, &ce) || !errors.Is(err, config.ErrInvalid) || err.Error() != tc.want {
			t.Errorf("%q: %v, want a *config.Error %q", tc.src, err, tc.want)
		}
	}
	_, errs := config.Reload(nil, []byte("mesh: {heartbeat: 0s, max_skew: 0s, namespace: \"\"}\n"))
	var got []string
	for _, e := range errs {
		var ce *config.Error
		if !errors.As(e, &ce) {
			t.Fatalf("%v is not a *config.Error", e)
		}
		got = append(got, ce.Path+": "+ce.Msg)
	}
	want := []string{"mesh.heartbeat: must be positive, got 0s", "mesh.max_skew: must be positive, got 0s", "mesh.namespace: must not be empty"}
	if !slices.Equal(got, want) {
		t.Errorf("Reload errors %q, want %q", got, want)
	}
}

func errString(err error) string {
	if err == nil {
		return "<nil>"
	}
	return err.Error()
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}
