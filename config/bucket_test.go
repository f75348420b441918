package config_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ratemesh/ratemesh/config"
	"github.com/ratemesh/ratemesh/limiter"
)

func TestParseTokenBucket(t *testing.T) {
	cfg, err := config.Parse([]byte("rules:\n  - {name: credits, algorithm: token_bucket, max: 100, refill: 10, interval: 1s, initial: 0, classes: {payer: 5}}\n"))
	if err != nil {
		t.Fatal(err)
	}
	r := cfg.Rules[0]
	if r.Algorithm != limiter.TokenBucket || r.Limit != 100 || r.Refill != 10 || r.Interval != time.Second ||
		r.Initial != 0 || !r.HasInitial || r.Classes["payer"].Multiplier != 5 {
		t.Fatalf("parsed %+v", r)
	}
	cfg, err = config.Parse([]byte("rules:\n  - {name: b, algorithm: token_bucket, max: 5, refill: 1, interval: 200ms}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if r := cfg.Rules[0]; r.HasInitial || r.WindowMs() != 2000 {
		t.Fatalf("parsed %+v (epoch %d ms), want no initial and a 2 s epoch", r, r.WindowMs())
	}
}

func TestBadTokenBucket(t *testing.T) {
	tests := []struct{ name, rule, want string }{
		{"limit on a bucket", "{name: x, algorithm: token_bucket, limit: 5, max: 5, refill: 1, interval: 1s}", `rules[0] "x": limit: a token_bucket rule has max`},
		{"no max", "{name: x, algorithm: token_bucket, refill: 1, interval: 1s}", `rules[0] "x": max: must be set`},
		{"zero max", "{name: x, algorithm: token_bucket, max: 0, refill: 1, interval: 1s}", `rules[0] "x": max: must be at least 1`},
		{"no refill", "{name: x, algorithm: token_bucket, max: 5, interval: 1s}", `rules[0] "x": refill: must be at least 1`},
		{"no interval", "{name: x, algorithm: token_bucket, max: 5, refill: 1}", `rules[0] "x": interval: must be positive`},
		{"interval not a duration", "{name: x, algorithm: token_bucket, max: 5, refill: 1, interval: 7}", `rules[0] "x": interval: line 2: must be a duration`},
		{"initial over max", "{name: x, algorithm: token_bucket, max: 5, refill: 1, interval: 1s, initial: 6}", `rules[0] "x": initial: 6 is over max 5`},
		{"window on a bucket", "{name: x, algorithm: token_bucket, max: 5, refill: 1, interval: 1s, window: 1s}", `rules[0] "x": window: token_bucket rules have no window`},
		{"suppress on a bucket", "{name: x, algorithm: token_bucket, max: 5, refill: 1, interval: 1s, mode: suppress}", `rules[0] "x": mode: suppress applies to windowed rules only`},
		{"demand on a bucket", "{name: x, algorithm: token_bucket, max: 5, refill: 1, interval: 1s, share: demand}", `rules[0] "x": share: demand applies to windowed rules only`},
		{"pace on a bucket", "{name: x, algorithm: token_bucket, max: 5, refill: 1, interval: 1s, pace: true}", `rules[0] "x": pace: applies to fixed_window`},
		{"max on a window", "{name: x, algorithm: fixed_window, limit: 5, window: 1s, max: 5}", `rules[0] "x": max: applies to token_bucket rules only`},
		{"refill on a window", "{name: x, algorithm: sliding_window, limit: 5, window: 1s, refill: 5}", `rules[0] "x": refill: applies to token_bucket rules only`},
		{"interval on concurrency", "{name: x, algorithm: concurrency, limit: 5, interval: 1s}", `rules[0] "x": interval: applies to token_bucket rules only`},
		{"initial on a window", "{name: x, algorithm: fixed_window, limit: 5, window: 1s, initial: 0}", `rules[0] "x": initial: applies to token_bucket rules only`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := config.Parse([]byte("rules:\n  - " + tc.rule + "\n"))
			if err == nil || !strings.HasPrefix(err.Error(), tc.want) || !errors.Is(err, config.ErrInvalid) {
				t.Fatalf("error %v, want prefix %q wrapping ErrInvalid", err, tc.want)
			}
		})
	}
}
