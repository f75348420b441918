package node_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ratemesh/ratemesh/limiter"
	"github.com/ratemesh/ratemesh/node"
)

// TestCoreAllowAllIsAllOrNothing: one request naming a per-second and a
// per-minute limit is admitted only if both pass; when one fails nothing
// is admitted in either (the attempts still count as demand), and when
// both pass both are consumed.
func TestCoreAllowAllIsAllOrNothing(t *testing.T) {
	rules := []limiter.Rule{
		{Name: "sec", Algorithm: limiter.FixedWindow, Limit: 5, Window: time.Second},
		{Name: "min", Algorithm: limiter.FixedWindow, Limit: 3, Window: time.Minute},
	}
	now := t0.Add(10 * time.Second)
	c := newCore(t, "solo", now, rules, nil)
	checks := []node.Check{{Rule: "sec", Key: "k"}, {Rule: "min", Key: "k"}}
	usage := func(rule string) (admitted, attempted uint64) {
		t.Helper()
		rep, err := c.Usage(now, rule, "k")
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range rep.Slots {
			admitted += s.Admitted
			attempted += s.Attempted
		}
		if admitted != rep.Total {
			t.Fatalf("%s: Total %d, slots %d", rule, rep.Total, admitted)
		}
		return admitted, attempted
	}
	type want struct {
		allowed        bool
		each           [2]bool
		secAdm, secAtt uint64
		minAdm, minAtt uint64
		secRem, minRem uint64
		minReason      limiter.Reason
		description    string
	}
	steps := []want{
		{allowed: true, each: [2]bool{true, true}, secAdm: 1, secAtt: 1, minAdm: 1, minAtt: 1, secRem: 4, minRem: 2, description: "both pass"},
		{allowed: true, each: [2]bool{true, true}, secAdm: 2, secAtt: 2, minAdm: 2, minAtt: 2, secRem: 3, minRem: 1, description: "both pass again"},
		{allowed: true, each: [2]bool{true, true}, secAdm: 3, secAtt: 3, minAdm: 3, minAtt: 3, secRem: 2, minRem: 0, description: "the minute limit is now full"},
		{allowed: false, each: [2]bool{false, false}, secAdm: 3, secAtt: 4, minAdm: 3, minAtt: 4, secRem: 2, minRem: 0, minReason: limiter.ReasonLimit, description: "the minute check fails: the second's credit is not consumed"},
		{allowed: false, each: [2]bool{false, false}, secAdm: 3, secAtt: 5, minAdm: 3, minAtt: 5, secRem: 2, minRem: 0, minReason: limiter.ReasonLimit, description: "and again"},
	}
	for _, st := range steps {
		allowed, ds, err := c.AllowAll(now, checks)
		if err != nil {
			t.Fatal(err)
		}
		if allowed != st.allowed || len(ds) != 2 || ds[0].Allowed != st.each[0] || ds[1].Allowed != st.each[1] {
			t.Fatalf("%s: AllowAll = %v, %+v", st.description, allowed, ds)
		}
		if !st.allowed && ds[1].Reason != st.minReason {
			t.Errorf("%s: the minute check's reason %v, want %v", st.description, ds[1].Reason, st.minReason)
		}
		if ds[0].Remaining != st.secRem || ds[1].Remaining != st.minRem {
			t.Errorf("%s: remaining %d and %d, want %d and %d", st.description, ds[0].Remaining, ds[1].Remaining, st.secRem, st.minRem)
		}
		sa, sn := usage("sec")
		ma, mn := usage("min")
		if sa != st.secAdm || sn != st.secAtt || ma != st.minAdm || mn != st.minAtt {
			t.Errorf("%s: sec %d/%d, min %d/%d admitted/attempted; want %d/%d, %d/%d", st.description, sa, sn, ma, mn, st.secAdm, st.secAtt, st.minAdm, st.minAtt)
		}
	}
	// A bad check fails the whole request before anything is decided.
	_, _, err := c.AllowAll(now, []node.Check{{Rule: "sec", Key: "k"}, {Rule: "nope", Key: "k"}})
	if !errors.Is(err, node.ErrUnknownRule) || !strings.Contains(err.Error(), "checks[1]") {
		t.Errorf("AllowAll with an unknown rule = %v, want ErrUnknownRule naming checks[1]", err)
	}
	if sa, sn := usage("sec"); sa != 3 || sn != 5 {
		t.Errorf("a rejected request counted: sec %d/%d", sa, sn)
	}
	// Next second: the per-second limit is fresh, the minute one still
	// full, so still nothing is admitted; a peek (cost 0) on the minute
	// consumes nothing and is denied since the minute's share is spent.
	now = now.Add(time.Second)
	allowed, ds, err := c.AllowAll(now, []node.Check{{Rule: "sec", Key: "k"}, {Rule: "min", Key: "k", Request: limiter.Request{HasCost: true}}})
	if err != nil {
		t.Fatal(err)
	}
	if allowed || ds[0].Allowed || ds[0].Remaining != 5 {
		t.Errorf("next second with the minute full: %v, %+v", allowed, ds)
	}
	if sa, sn := usage("sec"); sa != 0 || sn != 1 {
		t.Errorf("next second: sec %d/%d admitted/attempted, want 0/1", sa, sn)
	}
}

// TestCoreAllowAllWhileJoining: a joining core admits nothing and consumes
// nothing.
func TestCoreAllowAllWhileJoining(t *testing.T) {
	c := newCore(t, "j", t0, apiRule(limiter.FixedWindow, 10), func(cfg *node.CoreConfig) { cfg.Join = true })
	allowed, ds, err := c.AllowAll(t0, []node.Check{{Rule: "api", Key: "a"}, {Rule: "api", Key: "b"}})
	if err != nil {
		t.Fatal(err)
	}
	if allowed || len(ds) != 2 || ds[0].Reason != limiter.ReasonJoining || ds[1].Reason != limiter.ReasonJoining || ds[0].RetryAfter != 3*time.Second {
		t.Errorf("joining AllowAll = %v, %+v", allowed, ds)
	}
	for _, k := range []string{"a", "b"} {
		if rep, _ := c.Usage(t0, "api", k); len(rep.Slots) != 0 {
			t.Errorf("key %s counted while joining: %+v", k, rep)
		}
	}
}
