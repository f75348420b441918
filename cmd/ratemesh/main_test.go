package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"
)

const tiny = `
name: tiny
seed: 5
duration: 3s
nodes: 3
network: {latency: 5ms, jitter: 2ms}
rules:
  - {name: api, algorithm: fixed_window, limit: 100, window: 1s}
workload:
  - {rule: api, rate: 500, keys: 2}
`

func writeScenario(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "tiny.yaml")
	if err := os.WriteFile(path, []byte(tiny), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestUnknownCommandPrintsUsage(t *testing.T) {
	for _, args := range [][]string{nil, {"frobnicate"}} {
		var stdout, stderr bytes.Buffer
		if code := run(args, &stdout, &stderr); code != 2 {
			t.Errorf("run(%q) = %d, want 2", args, code)
		}
		if stdout.Len() != 0 || !strings.Contains(stderr.String(), "usage: ratemesh") || !strings.Contains(stderr.String(), "sim --scenario") {
			t.Errorf("run(%q): stdout %q, stderr %q", args, stdout.String(), stderr.String())
		}
	}
}

func TestSimJSONIsTheSummaryAlone(t *testing.T) {
	path := writeScenario(t)
	out := t.TempDir()
	var stdout, stderr bytes.Buffer
	if code := run([]string{"sim", "--scenario", path, "--json", "--seed", "9", "--out", out}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d, stderr %s", code, stderr.String())
	}
	var top map[string]json.RawMessage
	dec := json.NewDecoder(&stdout)
	if err := dec.Decode(&top); err != nil {
		t.Fatalf("stdout is not one JSON object: %v", err)
	}
	if dec.More() {
		t.Error("stdout carries more than the JSON object")
	}
	want := []string{"nodes", "rules", "scenario", "seed", "virtual_seconds", "wall_seconds"}
	if got := keys(top); !reflect.DeepEqual(got, want) {
		t.Errorf("top-level keys %v, want %v", got, want)
	}
	if string(top["seed"]) != "9" || string(top["scenario"]) != `"tiny"` {
		t.Errorf("seed %s, scenario %s", top["seed"], top["scenario"])
	}
	var rules []map[string]json.RawMessage
	if err := json.Unmarshal(top["rules"], &rules); err != nil || len(rules) != 1 {
		t.Fatalf("rules %s: %v", top["rules"], err)
	}
	wantRule := []string{"admitted", "bytes_per_node_per_s", "convergence_p99_ms", "false_rejections", "limit", "messages_per_node_per_s",
		"name", "offered", "overshoot_max", "overshoot_p99", "utilisation", "windows"}
	if got := keys(rules[0]); !reflect.DeepEqual(got, wantRule) {
		t.Errorf("rule keys %v, want %v", got, wantRule)
	}
	for _, f := range []string{"windows.csv", "seconds.csv", "nodes.csv", "admitted.svg", "bytes.svg"} {
		if st, err := os.Stat(filepath.Join(out, f)); err != nil || st.Size() == 0 {
			t.Errorf("--out did not write %s: %v", f, err)
		}
	}
}

func TestSimTable(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := run([]string{"sim", "--scenario", writeScenario(t)}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d, stderr %s", code, stderr.String())
	}
	if !strings.Contains(stdout.String(), "overshoot max") || !strings.Contains(stdout.String(), "api") {
		t.Errorf("table:\n%s", stdout.String())
	}
}

func TestSimErrors(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(bad, []byte(strings.Replace(tiny, "nodes: 3", "nodes: 3\ncolour: red", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		args []string
		code int
		want string
	}{
		{[]string{"sim"}, 2, "usage: ratemesh sim"},
		{[]string{"sim", "--bogus"}, 2, "bogus"},
		{[]string{"sim", "--scenario", bad}, 1, "colour"},
		{[]string{"sim", "--scenario", filepath.Join(t.TempDir(), "none.yaml")}, 1, "none.yaml"},
	}
	for _, c := range cases {
		var stdout, stderr bytes.Buffer
		if code := run(c.args, &stdout, &stderr); code != c.code || !strings.Contains(stderr.String(), c.want) {
			t.Errorf("run(%q) = %d, stderr %q; want %d naming %q", c.args, code, stderr.String(), c.code, c.want)
		}
	}
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
