package envoy_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/ratemesh/ratemesh/envoy"
	"github.com/ratemesh/ratemesh/limiter"
)

// TestInvalidConfigs loads each of envoyproxy/ratelimit's invalid test
// configurations: every one is refused with the reference's message,
// naming the file (and the line and entry where there is one).
func TestInvalidConfigs(t *testing.T) {
	for _, c := range []struct {
		files []string
		want  []string
	}{
		{[]string{"invalid/bad_limit_unit.yaml"}, []string{"bad_limit_unit.yaml: line 6: descriptor 'test-domain.key1_value1': invalid rate limit unit 'foo'"}},
		{[]string{"invalid/bad_yaml.yaml"}, []string{"bad_yaml.yaml: error loading config file: yaml: line 2"}},
		{[]string{"basic_config.yaml", "invalid/duplicate_domain.yaml"}, []string{"duplicate_domain.yaml: line 1: duplicate domain 'test-domain' in config file (also in basic_config.yaml)"}},
		{[]string{"invalid/duplicate_key.yaml"}, []string{"duplicate_key.yaml: line 6: duplicate descriptor composite key 'test-domain.key1_value1'"}},
		{[]string{"invalid/empty_domain.yaml"}, []string{"empty_domain.yaml: line 1: config file cannot have empty domain"}},
		{[]string{"invalid/empty_key.yaml"}, []string{"empty_key.yaml: line 3: descriptor 'test-domain': descriptor has empty key"}},
		{[]string{"invalid/misspelled_key.yaml"}, []string{"misspelled_key.yaml: line 5: config error, unknown key 'ratelimit'"}},
		{[]string{"invalid/misspelled_key2.yaml"}, []string{"misspelled_key2.yaml: line 7: config error, unknown key 'requestsperunit'"}},
		{[]string{"invalid/non_map_list.yaml"}, []string{"non_map_list.yaml: line 3: config error, yaml file contains list of type other than map: a"}},
		{[]string{"invalid/non_string_key.yaml"}, []string{"non_string_key.yaml: line 1: config error, key is not of type string: 0.25"}},
		{[]string{"invalid/replaces_empty.yaml"}, []string{"replaces_empty.yaml: line 8: descriptor 'test-domain.key1_value1.subkey1': should not have an empty replaces entry"}},
		{[]string{"invalid/replaces_self.yaml"}, []string{"replaces_self.yaml: line 8: descriptor 'test-domain.key1_value1.subkey1': replaces should not contain name of same descriptor"}},
		{[]string{"invalid/unlimited_with_unit.yaml"}, []string{"unlimited_with_unit.yaml: line 5: descriptor 'test-domain.foo': should not specify rate limit unit when unlimited"}},
		{[]string{"invalid/zero_unit_multiplier.yaml"}, []string{"zero_unit_multiplier.yaml: line 8: descriptor 'test-domain.key1': rate_limit.unit_multiplier must be at least 1"}},
		// envoyproxy/ratelimit refuses a domain in two files unless
		// MERGE_DOMAIN_CONFIG is set; ratemesh does not merge.
		{[]string{"merge_domain_key1.yaml", "merge_domain_key2.yaml"}, []string{"merge_domain_key2.yaml: line 2: duplicate domain 'test-domain'"}},
	} {
		var files []envoy.File
		for _, f := range c.files {
			files = append(files, readFile(t, filepath.Join("testdata", f)))
		}
		_, err := envoy.Parse(files...)
		if err == nil {
			t.Errorf("%v: accepted", c.files)
			continue
		}
		if !errors.Is(err, envoy.ErrInvalid) {
			t.Errorf("%v: %v does not wrap ErrInvalid", c.files, err)
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%v:\n got %v\nwant it to hold %q", c.files, err, w)
			}
		}
	}
	// Every file under invalid/ is covered above.
	names, _ := filepath.Glob("testdata/invalid/*.yaml")
	if len(names) != 14 {
		t.Errorf("testdata/invalid holds %d files, the table covers 14", len(names))
	}
}

// TestMoreRefusals: what else is refused, each naming the field.
func TestMoreRefusals(t *testing.T) {
	for _, c := range []struct{ yaml, want string }{
		{"domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second}\n", "requests_per_unit is missing"},
		{"domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: -1}\n", "requests_per_unit must be a whole number"},
		{"domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1.5}\n", "error checking config"},
		{"domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: year, requests_per_unit: 1, unit_multiplier: 2}\n", "longer than the longest window"},
		{"domain: d\nunit: second\n", "key 'unit' does not belong in the top of the file"},
		{"domain: d\ndomain: e\n", "key 'domain' repeated"},
		{"domain: d\ndescriptors:\n  - key: k\n    share_threshold: true\n", "share_threshold can only be used with wildcard values"},
		{"domain: d\ndescriptors:\n  - key: k\n    shadow_mode: yes please\n", "shadow_mode must be true or false"},
		{"- a\n", "must be a mapping"},
	} {
		_, err := envoy.Parse(envoy.File{Name: "f.yaml", Data: []byte(c.yaml)})
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.HasPrefix(err.Error(), envoy.ErrInvalid.Error()+": f.yaml") {
			t.Errorf("%q: got %v, want %q", c.yaml, err, c.want)
		}
	}
}

func TestLoadDirectoryAndRules(t *testing.T) {
	d, err := envoy.Load("testdata/integration")
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(d.Domains(), ","); got != "another,basic" {
		t.Errorf("domains %s", got)
	}
	if d.Entries() != 9 {
		t.Errorf("entries %d, want 9", d.Entries())
	}
	rules := d.Rules()
	byName := map[string]limiter.Rule{}
	for _, r := range rules {
		if err := r.Normalize(); err != nil {
			t.Errorf("generated rule %q: %v", r.Name, err)
		}
		byName[r.Name] = r
	}
	for name, want := range map[string]struct {
		limit  uint64
		window time.Duration
	}{
		"envoy:basic.key1":           {50, time.Second},
		"envoy:basic.one_per_minute": {1, time.Minute},
		"envoy:another.key3":         {10, time.Hour},
		"envoy:another.key4":         {20, 24 * time.Hour},
	} {
		r, ok := byName[name]
		if !ok || r.Limit != want.limit || r.Window != want.window || r.Algorithm != limiter.FixedWindow {
			t.Errorf("rule %s = %+v (present %v), want limit %d window %v", name, r, ok, want.limit, want.window)
		}
	}
	if len(rules) != 9 {
		t.Errorf("%d rules, want 9", len(rules))
	}

	if _, err := envoy.Load(t.TempDir()); err == nil || !strings.Contains(err.Error(), "no *.yaml file") {
		t.Errorf("empty directory: %v", err)
	}
	if _, err := envoy.Load(filepath.Join(t.TempDir(), "missing.yaml")); err == nil || !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: %v", err)
	}
}

// TestRuleNames: names are valid rule names, unique, and the same
// whatever the file order; odd characters and long keys are hashed.
func TestRuleNames(t *testing.T) {
	long := strings.Repeat("k", 200)
	src := "domain: d\ndescriptors:\n" +
		"  - key: path\n    value: /api/v1 x\n    rate_limit: {unit: second, requests_per_unit: 1}\n" +
		"  - key: path\n    value: /api/v1_x\n    rate_limit: {unit: second, requests_per_unit: 2}\n" +
		"  - key: " + long + "\n    rate_limit: {unit: week, requests_per_unit: 3}\n" +
		"  - key: a.b\n    rate_limit: {unit: month, requests_per_unit: 4}\n" +
		"  - key: a\n    descriptors:\n      - key: b\n        rate_limit: {unit: year, requests_per_unit: 5}\n" +
		"  - key: zero\n    rate_limit: {unit: second, requests_per_unit: 0}\n" +
		"  - key: free\n    rate_limit: {unlimited: true}\n"
	d, err := envoy.Parse(envoy.File{Name: "f.yaml", Data: []byte(src)})
	if err != nil {
		t.Fatal(err)
	}
	rules := d.Rules()
	if len(rules) != 5 {
		t.Fatalf("%d rules, want 5 (none for 0 per unit or unlimited): %v", len(rules), rules)
	}
	seen := map[string]bool{}
	windows := map[uint64]time.Duration{}
	for _, r := range rules {
		if err := r.Normalize(); err != nil {
			t.Errorf("%q: %v", r.Name, err)
		}
		if seen[r.Name] {
			t.Errorf("rule name %q twice", r.Name)
		}
		seen[r.Name] = true
		windows[r.Limit] = r.Window
	}
	if windows[3] != 7*24*time.Hour || windows[4] != 30*24*time.Hour || windows[5] != 365*24*time.Hour {
		t.Errorf("week, month, year windows: %v", windows)
	}
	d2, _ := envoy.Parse(envoy.File{Name: "g.yaml", Data: []byte(src)})
	for i, r := range d2.Rules() {
		if r.Name != rules[i].Name {
			t.Errorf("names differ between loads: %q %q", r.Name, rules[i].Name)
		}
	}
}

// TestCounterKeys: each variable value is its own counter, values that
// the entry fixes are not part of the key, and keys never collide.
func TestCounterKeys(t *testing.T) {
	d, err := envoy.Parse(envoy.File{Name: "f.yaml", Data: []byte(`
domain: d
descriptors:
  - key: a
    descriptors:
      - key: b
        rate_limit: {unit: second, requests_per_unit: 1}
  - key: c
    value: fixed
    descriptors:
      - key: e
        rate_limit: {unit: second, requests_per_unit: 1}
  - key: one
    rate_limit: {unit: second, requests_per_unit: 1}
`)})
	if err != nil {
		t.Fatal(err)
	}
	key := func(kvs ...string) string {
		var es []*rlcommon.RateLimitDescriptor_Entry
		for i := 0; i < len(kvs); i += 2 {
			es = append(es, &rlcommon.RateLimitDescriptor_Entry{Key: kvs[i], Value: kvs[i+1]})
		}
		m, ok := d.Lookup("d", es)
		if !ok {
			t.Fatalf("%v: no match", kvs)
		}
		return m.Entry.Rule + " " + m.Key
	}
	keys := map[string]string{}
	for _, kvs := range [][]string{
		{"a", "x|y", "b", "z"}, {"a", "x", "b", "y|z"}, {"a", `x\`, "b", "|z"},
		{"a", "#h", "b", ""}, {"a", "", "b", "#h"},
		{"one", "v"}, {"one", "#v"}, {"one", `\#v`}, {"one", ""}, {"one", strings.Repeat("v", 300)}, {"one", strings.Repeat("v", 301)},
	} {
		k := key(kvs...)
		if prev, dup := keys[k]; dup {
			t.Errorf("%v and %s share the counter %q", kvs, prev, k)
		}
		keys[k] = strings.Join(kvs, ",")
		if len(k) > 256+len("envoy:d.one ") {
			t.Errorf("%v: key %q too long", kvs, k)
		}
	}
	if got := key("one", "10.0.0.1"); got != "envoy:d.one 10.0.0.1" {
		t.Errorf("a plain value is its own key: %q", got)
	}
	if got := key("c", "fixed", "e", "v"); got != "envoy:d.c_fixed.e v" {
		t.Errorf("a fixed value is not in the key: %q", got)
	}
}

// TestWithShareWait: envoy.share_wait sets every generated rule's
// share_wait, a domain's own setting beats it, the original descriptors
// keep theirs, and a domain the files do not hold is refused by name.
func TestWithShareWait(t *testing.T) {
	d, err := envoy.Parse(
		envoy.File{Name: "a.yaml", Data: []byte("domain: edge\ndescriptors:\n  - key: ip\n    rate_limit: {unit: second, requests_per_unit: 10}\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 5}\n")},
		envoy.File{Name: "b.yaml", Data: []byte("domain: api\ndescriptors:\n  - key: ip\n    rate_limit: {unit: second, requests_per_unit: 3}\n")},
	)
	if err != nil {
		t.Fatal(err)
	}
	w, err := d.WithShareWait(7*time.Millisecond, map[string]time.Duration{"api": limiter.NoShareWait})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]time.Duration{}
	for _, r := range w.Rules() {
		got[r.Name] = r.ShareWait
		if err := r.Normalize(); err != nil {
			t.Errorf("%s: %v", r.Name, err)
		}
	}
	want := map[string]time.Duration{"envoy:edge.ip": 7 * time.Millisecond, "envoy:edge.user": 7 * time.Millisecond, "envoy:api.ip": limiter.NoShareWait}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("share waits %v, want %v", got, want)
	}
	for _, r := range d.Rules() {
		if r.ShareWait != 0 {
			t.Errorf("the original descriptors changed: %s has share_wait %v", r.Name, r.ShareWait)
		}
	}
	if m, _ := w.Lookup("api", []*rlcommon.RateLimitDescriptor_Entry{{Key: "ip", Value: "1"}}); m.Entry == nil || m.Entry.Rule != "envoy:api.ip" {
		t.Errorf("the copy matches like the original: %+v", m)
	}
	if _, err := d.WithShareWait(0, map[string]time.Duration{"edge": time.Millisecond, "egde": time.Millisecond}); err == nil || err.Error() != `domain "egde": not in the descriptor files (their domains: api, edge)` {
		t.Errorf("unknown domain: %v", err)
	}
}

// TestStatKeys: a match's statistics key is each level's final key, or
// key_value at a level with value_to_metric (but not with
// share_threshold), or every key_value with detailed_metric.
func TestStatKeys(t *testing.T) {
	d, err := envoy.Parse(envoy.File{Name: "f.yaml", Data: []byte(`
domain: d
descriptors:
  - key: a
    descriptors:
      - key: b
        rate_limit: {unit: second, requests_per_unit: 1}
  - key: m
    value_to_metric: true
    descriptors:
      - key: n
        rate_limit: {unit: second, requests_per_unit: 1}
  - key: det
    detailed_metric: true
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: w
    value: pre*
    share_threshold: true
    value_to_metric: true
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: f
    value: fixed
    rate_limit: {unit: second, requests_per_unit: 1}
`)})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		kvs  []string
		want string
	}{
		{[]string{"a", "x", "b", "y"}, "d.a.b"},
		{[]string{"m", "v1", "n", "v2"}, "d.m_v1.n"},
		{[]string{"m", "", "n", "v2"}, "d.m.n"},
		{[]string{"det", "v"}, "d.det_v"},
		{[]string{"w", "prefix1"}, "d.w_pre*"},
		{[]string{"f", "fixed"}, "d.f_fixed"},
	} {
		var es []*rlcommon.RateLimitDescriptor_Entry
		for i := 0; i < len(c.kvs); i += 2 {
			es = append(es, &rlcommon.RateLimitDescriptor_Entry{Key: c.kvs[i], Value: c.kvs[i+1]})
		}
		m, ok := d.Lookup("d", es)
		if !ok {
			t.Fatalf("%v: no match", c.kvs)
		}
		if m.StatKey != c.want {
			t.Errorf("%v: statistics key %q, want %q", c.kvs, m.StatKey, c.want)
		}
	}
}
