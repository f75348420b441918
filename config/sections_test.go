package config_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/ratemesh/ratemesh/config"
	"github.com/ratemesh/ratemesh/node"
)

// section decodes src (a file with other keys of its own) and returns its
// key's value node.
func section(t *testing.T, src, key string) *yaml.Node {
	t.Helper()
	var doc struct {
		Mesh  yaml.Node `yaml:"mesh"`
		Rules yaml.Node `yaml:"rules"`
		Other string    `yaml:"other"`
	}
	if err := yaml.Unmarshal([]byte(src), &doc); err != nil {
		t.Fatal(err)
	}
	if key == "mesh" {
		return &doc.Mesh
	}
	return &doc.Rules
}

func TestParseMesh(t *testing.T) {
	var jt time.Duration
	var lc bool
	extra := map[string]config.Field{"join_timeout": config.DurationField(&jt), "local_clock": config.BoolField(&lc)}
	m, err := config.ParseMesh(section(t, "other: x\nmesh: {heartbeat: 1s, partition_policy: available, join_timeout: 4s, local_clock: true}\n", "mesh"), config.Default().Mesh, extra)
	if err != nil {
		t.Fatal(err)
	}
	want := node.DefaultMeshConfig()
	want.Heartbeat, want.Policy = time.Second, node.Available
	if m.MeshConfig != want || m.Namespace != "default" || jt != 4*time.Second || !lc {
		t.Fatalf("mesh %+v join_timeout %v local_clock %v; want %+v, namespace default, 4s, true", m, jt, lc, want)
	}
	// Absent: the base, validated.
	if m, err := config.ParseMesh(&yaml.Node{}, config.Default().Mesh, nil); err != nil || m != config.Default().Mesh {
		t.Fatalf("absent section: %+v %v", m, err)
	}
	bad := config.Default().Mesh
	bad.DeadAfter = time.Millisecond
	if _, err := config.ParseMesh(&yaml.Node{}, bad, nil); err == nil || !strings.HasPrefix(err.Error(), "mesh.dead_after:") {
		t.Fatalf("an invalid base: %v", err)
	}
	for _, c := range []struct{ src, want string }{
		{"other: x\nmesh: {join_timeout: 4s}\n", "mesh.join_timeout: line 2: unknown field"}, // not without extra
		{"mesh: {suspect_after: 100ms}\n", "mesh.suspect_after: 100ms must be longer than heartbeat 500ms"},
		{"mesh:\n  heartbeat: soon\n", `mesh.heartbeat: line 2: must be a duration such as 1s or 20ms, got "soon"`},
		{"mesh: [1]\n", "mesh: line 1: must be a mapping"},
	} {
		_, err := config.ParseMesh(section(t, c.src, "mesh"), config.Default().Mesh, nil)
		if err == nil || !strings.HasPrefix(err.Error(), c.want) || !errors.Is(err, config.ErrInvalid) {
			t.Errorf("%q: %v, want %q", c.src, err, c.want)
		}
	}
}

func TestParseRules(t *testing.T) {
	rules, warnings, err := config.ParseRules(section(t, `other: x
rules:
  - {name: a, algorithm: fixed_window, limit: 5, window: 1s, lease_ttl: 3s}
  - {name: b, algorithm: concurrency, limit: 2}
`, "rules"))
	if err != nil {
		t.Fatal(err)
	}
	if len(rules) != 2 || rules[0].Name != "a" || rules[0].LeaseTTL != 0 || rules[1].LeaseTTL != time.Minute || rules[0].MaxKeys != 1_000_000 {
		t.Fatalf("rules %+v (want them normalised)", rules)
	}
	if len(warnings) != 1 || !strings.HasPrefix(warnings[0], `rules[0] "a": lease_ttl: applies to concurrency rules only`) {
		t.Fatalf("warnings %q", warnings)
	}
	if rules, _, err := config.ParseRules(section(t, "rules: []\n", "rules")); err != nil || len(rules) != 0 {
		t.Fatalf("empty list: %v %v", rules, err)
	}
	for _, c := range []struct{ src, want string }{
		{"rules:\n  - {name: a, algorithm: fixed_window, limit: 5, window: 1s}\n  - {name: a, algorithm: fixed_window, limit: 6, window: 1s}\n", `rules[1] "a": name: defined twice`},
		{"other: x\nrules:\n  - {name: a, algorithm: fixed_window, limit: 5, window: 1s, burst: 2}\n", `rules[0] "a": burst: line 3: unknown field`},
		{"rules: {name: a}\n", "rules: line 1: must be a list of rules"},
	} {
		_, _, err := config.ParseRules(section(t, c.src, "rules"))
		if err == nil || !strings.HasPrefix(err.Error(), c.want) || !errors.Is(err, config.ErrInvalid) {
			t.Errorf("%q: %v, want %q", c.src, err, c.want)
		}
	}
}
