package config_test

import (
	"testing"

	"github.com/ratemesh/ratemesh/config"
)

// TestPace accepts pace on windowed rules, leaves it off by default, and
// hands it to the limiter's rule, whose hash tells the versions apart.
func TestPace(t *testing.T) {
	cfg, err := config.Parse([]byte(`rules:
  - {name: paced, algorithm: fixed_window, limit: 100, window: 1s, pace: true}
  - {name: sliding, algorithm: sliding_window, limit: 100, window: 1m, pace: true}
  - {name: plain, algorithm: fixed_window, limit: 100, window: 1s}
  - {name: off, algorithm: fixed_window, limit: 100, window: 1s, pace: false}
`))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{"paced": true, "sliding": true, "plain": false, "off": false}
	if len(cfg.Rules) != len(want) {
		t.Fatalf("%d rules, want %d", len(cfg.Rules), len(want))
	}
	for _, r := range cfg.Rules {
		if r.Pace != want[r.Name] {
			t.Errorf("rule %q: Pace = %t, want %t", r.Name, r.Pace, want[r.Name])
		}
		if err := r.Normalize(); err != nil {
			t.Errorf("rule %q: %v", r.Name, err)
		}
	}
	paced, plain := cfg.Rules[0], cfg.Rules[2]
	plain.Name = paced.Name
	if paced.Hash() == plain.Hash() {
		t.Error("a paced and an unpaced rule hash alike")
	}
}
