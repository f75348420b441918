package node_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ratemesh/ratemesh/limiter"
	"github.com/ratemesh/ratemesh/node"
	"github.com/ratemesh/ratemesh/node/memnet"
)

// TestTypedErrors: the errors of a refused request name the check and the
// field by their types, wrap their sentinels, and read as before.
func TestTypedErrors(t *testing.T) {
	cfg := node.DefaultConfig()
	cfg.Peer, cfg.Transport = "a", memnet.NewHub().Transport("a")
	cfg.Rules = []limiter.Rule{{Name: "api", Algorithm: limiter.FixedWindow, Limit: 5, Window: time.Hour}}
	n, err := node.Start(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Close() })
	ctx := context.Background()

	tests := []struct {
		name     string
		call     func() error
		index    int // -1: no CheckError
		field    string
		sentinel error
		text     string
	}{
		{"unknown rule in a check", func() error {
			_, _, err := n.AllowAll(ctx, node.NewCheck("api", "k"), node.NewCheck("nope", "k"))
			return err
		}, 1, "rule", node.ErrUnknownRule, `checks[1]: node: unknown rule "nope"`},
		{"option a check does not take", func() error {
			_, _, err := n.AllowAll(ctx, node.NewCheck("api", "k"), node.NewCheck("api", "k"), node.NewCheck("api", "k", node.MaxWait(time.Second)))
			return err
		}, 2, "", node.ErrBadOption, "checks[2]: node: option does not apply: MaxWait"},
		{"unknown class in a check", func() error {
			_, _, err := n.AllowAll(ctx, node.NewCheck("api", "k", node.Class("gold")))
			return err
		}, 0, "class", limiter.ErrUnknownClass, `checks[0]: limiter: unknown class "gold" for rule "api"`},
		{"unknown rule", func() error { _, err := n.Allow(ctx, "nope", "k"); return err }, -1, "rule", node.ErrUnknownRule, `node: unknown rule "nope"`},
		{"option Allow does not take", func() error { _, err := n.Allow(ctx, "api", "k", node.MaxWait(1)); return err }, -1, "", node.ErrBadOption, "node: option does not apply: MaxWait"},
		{"unknown type", func() error { _, err := n.Allow(ctx, "api", "k", node.Type("q", 1)); return err }, -1, "type", limiter.ErrUnknownType, `limiter: unknown request type "q" for rule "api"`},
		{"bad key", func() error { _, err := n.Allow(ctx, "api", ""); return err }, -1, "key", limiter.ErrBadKey, "limiter: bad key: key must be 1 to 256 bytes, got 0"},
		{"wrong algorithm", func() error { _, _, err := n.Acquire(ctx, "api", "k"); return err }, -1, "rule", limiter.ErrWrongAlgorithm, `limiter: wrong algorithm for this call: rule "api" is a fixed_window rule; use allow`},
		{"unknown peer", func() error { return n.Evict("QmNobody") }, -1, "peer_id", node.ErrUnknownPeer, `node: unknown peer "QmNobody"`},
		{"malformed lease", func() error { _, err := n.Renew(ctx, "a~0~1"); return err }, -1, "lease_id", node.ErrBadLease, `node: malformed lease ID: "a~0~1": incarnation and sequence must be positive base-36 numbers`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			if err == nil {
				t.Fatal("no error")
			}
			if err.Error() != tc.text {
				t.Errorf("text %q, want %q", err, tc.text)
			}
			if !errors.Is(err, tc.sentinel) {
				t.Errorf("%v does not wrap %v", err, tc.sentinel)
			}
			var ce *node.CheckError
			switch {
			case errors.As(err, &ce) != (tc.index >= 0):
				t.Errorf("CheckError %v, want index %d", ce, tc.index)
			case ce != nil && ce.Index != tc.index:
				t.Errorf("check index %d, want %d", ce.Index, tc.index)
			}
			var field string
			var ne *node.RequestError
			var le *limiter.RequestError
			switch {
			case errors.As(err, &ne):
				field = ne.Field
			case errors.As(err, &le):
				field = le.Field
			default:
				t.Fatalf("%v is no RequestError", err)
			}
			if field != tc.field {
				t.Errorf("field %q, want %q", field, tc.field)
			}
		})
	}
}
