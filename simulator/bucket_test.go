package simulator

import (
	"errors"
	"strings"
	"testing"
)

// TestBucketScenario: 5 nodes hold the credit-weighted token bucket of
// scenario bucket within 10 % of one bucket per class (crate 002's bound):
// each class's admitted credits over the credits a single bucket fed the
// same requests admits (the Utilisation column, since the reference never
// admits more than is offered) are within [0.9, 1.1]; the unlimited class
// is never refused.
func TestBucketScenario(t *testing.T) {
	if raceEnabled || testing.Short() {
		t.Skip("scenario runs skip under -race and -short")
	}
	for _, seed := range []uint64{1, 2} {
		res := runLibrary(t, "bucket", &seed)
		seen := 0
		for _, c := range res.Classes {
			t.Logf("seed %d: %+v", seed, c)
			switch c.Class {
			case "node":
				if c.Limit != 0 || c.AdmittedCredits != c.OfferedCredits || c.OfferedCredits == 0 {
					t.Errorf("seed %d: unlimited class %+v", seed, c)
				}
				seen++
			case "", "payer":
				if c.Utilisation < 0.9 || c.Utilisation > 1.1 {
					t.Errorf("seed %d: class %q admitted %.4f × one bucket, outside 10%%", seed, c.Class, c.Utilisation)
				}
				if c.AdmittedCredits*2 > c.OfferedCredits+c.OfferedCredits/10 {
					t.Errorf("seed %d: class %q admitted %d of %d offered: the flood is not limited", seed, c.Class, c.AdmittedCredits, c.OfferedCredits)
				}
				seen++
			}
		}
		if seen != 3 {
			t.Errorf("seed %d: %d classes, want regular, payer and node", seed, seen)
		}
	}
}

func TestBucketScenarioKeys(t *testing.T) {
	const head = "name: x\nduration: 2s\nnodes: 2\nworkload:\n  - {rule: b, rate: 10}\nrules:\n  - "
	if sc, err := Parse([]byte(head + "{name: b, algorithm: token_bucket, max: 10, refill: 2, interval: 1s, initial: 0}\n")); err != nil {
		t.Fatal(err)
	} else if r := sc.Rules[0]; r.Limit != 10 || r.Refill != 2 || !r.HasInitial || r.Initial != 0 || r.Interval.Seconds() != 1 {
		t.Fatalf("parsed %+v", r)
	}
	bad := []struct{ rule, field string }{
		{"{name: b, algorithm: token_bucket, limit: 10, max: 10, refill: 2, interval: 1s}", `rules[0] "b": limit`},
		{"{name: b, algorithm: token_bucket, refill: 2, interval: 1s}", `rules[0] "b": max`},
		{"{name: b, algorithm: token_bucket, max: 10, interval: 1s}", `rules[0] "b": refill`},
		{"{name: b, algorithm: token_bucket, max: 10, refill: 2}", `rules[0] "b": interval`},
		{"{name: b, algorithm: token_bucket, max: 10, refill: 2, interval: 1s, initial: 11}", "initial"},
		{"{name: b, algorithm: token_bucket, max: 10, refill: 2, interval: 1s, window: 1s}", "window"},
		{"{name: b, algorithm: token_bucket, max: 10, refill: 2, interval: 1s, pace: true}", "pace"},
		{"{name: b, algorithm: fixed_window, limit: 10, window: 1s, max: 10}", `rules[0] "b": max`},
		{"{name: b, algorithm: fixed_window, limit: 10, window: 1s, refill: 10}", "refill"},
		{"{name: b, algorithm: sliding_window, limit: 10, window: 1s, interval: 1s}", "interval"},
	}
	for _, tt := range bad {
		_, err := Parse([]byte(head + tt.rule + "\n"))
		if !errors.Is(err, ErrScenario) || !strings.Contains(err.Error(), tt.field) {
			t.Errorf("%s: error %v, want one naming %s", tt.rule, err, tt.field)
		}
	}
}
