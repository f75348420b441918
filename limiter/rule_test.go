package limiter

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/ratemesh/ratemesh/crdt"
)

// validRule returns a fully specified, valid sliding-window rule that the
// tests mutate one field at a time.
func validRule() Rule {
	return Rule{
		Name:      "api",
		Algorithm: SlidingWindow,
		Limit:     100,
		Window:    time.Second,
		Classes:   map[string]Class{"payer": {Multiplier: 5}, "node": {Unlimited: true}},
		Costs:     map[string]Cost{"query": {Per: 10}, "publish": {Each: 100}},
		Overrides: map[string]uint64{"acct:42": 5000},
	}
}

// wantRuleError checks that err is a *RuleError for rule and field that
// wraps sentinel.
func wantRuleError(t *testing.T, err error, rule, field string, sentinel error) {
	t.Helper()
	if err == nil {
		t.Fatalf("err = nil, want a *RuleError for field %q", field)
	}
	var re *RuleError
	if !errors.As(err, &re) {
		t.Fatalf("err = %v (%T), want a *RuleError", err, err)
	}
	if re.Rule != rule || re.Field != field {
		t.Errorf("RuleError{Rule %q, Field %q}, want {%q, %q}: %v", re.Rule, re.Field, rule, field, err)
	}
	if !errors.Is(err, sentinel) {
		t.Errorf("errors.Is(%v, %v) = false", err, sentinel)
	}
	msg := err.Error()
	if !strings.Contains(msg, `"`+rule+`"`) || !strings.Contains(msg, field) {
		t.Errorf("message %q does not name rule %q and field %q", msg, rule, field)
	}
}

func TestNormalizeErrors(t *testing.T) {
	long := strings.Repeat("n", 129)
	tests := []struct {
		name     string
		mut      func(r *Rule)
		rule     string // the rule name the error must carry
		field    string
		sentinel error
	}{
		{"empty name", func(r *Rule) { r.Name = "" }, "", "name", ErrInvalidRule},
		{"long name", func(r *Rule) { r.Name = long }, long, "name", ErrInvalidRule},
		{"name with a space", func(r *Rule) { r.Name = "my api" }, "my api", "name", ErrInvalidRule},
		{"name starting with dash", func(r *Rule) { r.Name = "-api" }, "-api", "name", ErrInvalidRule},
		{"no algorithm", func(r *Rule) { r.Algorithm = "" }, "api", "algorithm", ErrInvalidRule},
		{"unknown algorithm", func(r *Rule) { r.Algorithm = "leaky_bucket" }, "api", "algorithm", ErrInvalidRule},
		{"limit 0", func(r *Rule) { r.Limit = 0 }, "api", "limit", ErrInvalidRule},
		{"limit over max", func(r *Rule) { r.Limit = MaxLimit + 1; r.Classes = nil }, "api", "limit", ErrInvalidRule},
		{"window 0", func(r *Rule) { r.Window = 0 }, "api", "window", ErrInvalidRule},
		{"window negative", func(r *Rule) { r.Window = -time.Second }, "api", "window", ErrInvalidRule},
		{"window not whole ms", func(r *Rule) { r.Window = 1500 * time.Microsecond }, "api", "window", ErrInvalidRule},
		{"window over max", func(r *Rule) { r.Window = MaxWindow + time.Millisecond }, "api", "window", ErrInvalidRule},
		{"lease_ttl on a window rule", func(r *Rule) { r.LeaseTTL = time.Second }, "api", "lease_ttl", ErrInvalidRule},
		{"window on concurrency", func(r *Rule) { r.Algorithm = Concurrency; r.Costs = nil }, "api", "window", ErrInvalidRule},
		{"lease_ttl negative", func(r *Rule) {
			r.Algorithm, r.Window, r.Costs, r.LeaseTTL = Concurrency, 0, nil, -time.Second
		}, "api", "lease_ttl", ErrInvalidRule},
		{"lease_ttl under 1ms", func(r *Rule) {
			r.Algorithm, r.Window, r.Costs, r.LeaseTTL = Concurrency, 0, nil, 500*time.Microsecond
		}, "api", "lease_ttl", ErrInvalidRule},
		{"unknown mode", func(r *Rule) { r.Mode = "drop" }, "api", "mode", ErrInvalidRule},
		{"unknown share", func(r *Rule) { r.Share = "fair" }, "api", "share", ErrInvalidRule},
		{"demand_floor negative", func(r *Rule) { r.DemandFloor = -0.1 }, "api", "demand_floor", ErrInvalidRule},
		{"demand_floor over 1", func(r *Rule) { r.DemandFloor = 1.5 }, "api", "demand_floor", ErrInvalidRule},
		{"demand_floor NaN", func(r *Rule) { r.DemandFloor = math.NaN() }, "api", "demand_floor", ErrInvalidRule},
		{"empty class name", func(r *Rule) { r.Classes[""] = Class{Multiplier: 2} }, "api", "classes", ErrInvalidRule},
		{"class unlimited and multiplier", func(r *Rule) { r.Classes["x"] = Class{Multiplier: 2, Unlimited: true} }, "api", "classes.x", ErrInvalidRule},
		{"class multiplier 0", func(r *Rule) { r.Classes["x"] = Class{} }, "api", "classes.x", ErrInvalidRule},
		{"class multiplier negative", func(r *Rule) { r.Classes["x"] = Class{Multiplier: -1} }, "api", "classes.x", ErrInvalidRule},
		{"class multiplier NaN", func(r *Rule) { r.Classes["x"] = Class{Multiplier: math.NaN()} }, "api", "classes.x", ErrInvalidRule},
		{"class multiplier Inf", func(r *Rule) { r.Classes["x"] = Class{Multiplier: math.Inf(1)} }, "api", "classes.x", ErrInvalidRule},
		{"class multiplier over 1e6", func(r *Rule) { r.Classes["x"] = Class{Multiplier: 2e6} }, "api", "classes.x", ErrInvalidRule},
		{"class scales limit over max", func(r *Rule) { r.Limit = MaxLimit / 2; r.Classes = map[string]Class{"x": {Multiplier: 3}} }, "api", "classes.x", ErrInvalidRule},
		{"costs on concurrency", func(r *Rule) { r.Algorithm, r.Window = Concurrency, 0 }, "api", "costs", ErrInvalidRule},
		{"empty cost type", func(r *Rule) { r.Costs[""] = Cost{Each: 1} }, "api", "costs", ErrInvalidRule},
		{"cost each and per", func(r *Rule) { r.Costs["x"] = Cost{Each: 1, Per: 2} }, "api", "costs.x", ErrInvalidRule},
		{"cost neither", func(r *Rule) { r.Costs["x"] = Cost{} }, "api", "costs.x", ErrInvalidRule},
		{"cost each over max", func(r *Rule) { r.Costs["x"] = Cost{Each: MaxCost + 1} }, "api", "costs.x", ErrInvalidRule},
		{"override empty key", func(r *Rule) { r.Overrides[""] = 10 }, "api", "overrides", ErrInvalidRule},
		{"override 257-byte key", func(r *Rule) { r.Overrides[strings.Repeat("k", 257)] = 10 }, "api", "overrides", ErrInvalidRule},
		{"override limit 0", func(r *Rule) { r.Overrides["k"] = 0 }, "api", `overrides["k"]`, ErrInvalidRule},
		{"override limit over max", func(r *Rule) { r.Overrides["k"] = MaxLimit + 1 }, "api", `overrides["k"]`, ErrInvalidRule},
		{"override scaled by a class over max", func(r *Rule) { r.Overrides["k"] = MaxLimit / 2 }, "api", `overrides["k"]`, ErrInvalidRule},
		{"max_keys negative", func(r *Rule) { r.MaxKeys = -1 }, "api", "max_keys", ErrInvalidRule},
		{"share_wait negative", func(r *Rule) { r.ShareWait = -2 * time.Millisecond }, "api", "share_wait", ErrInvalidRule},
		{"share_wait over max", func(r *Rule) { r.ShareWait = MaxShareWait + time.Millisecond }, "api", "share_wait", ErrInvalidRule},
		{"mode suppress on concurrency", func(r *Rule) {
			r.Algorithm, r.Window, r.Costs, r.Mode = Concurrency, 0, nil, Suppress
		}, "api", "mode", ErrInvalidRule},
		{"share demand on concurrency", func(r *Rule) {
			r.Algorithm, r.Window, r.Costs, r.Share = Concurrency, 0, nil, Demand
		}, "api", "share", ErrInvalidRule},
		{"pace on concurrency", func(r *Rule) {
			r.Algorithm, r.Window, r.Costs, r.Pace = Concurrency, 0, nil, true
		}, "api", "pace", ErrInvalidRule},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := validRule()
			tt.mut(&r)
			wantRuleError(t, r.Normalize(), tt.rule, tt.field, tt.sentinel)
			// Validate alone reports the same.
			wantRuleError(t, r.Validate(), tt.rule, tt.field, tt.sentinel)
		})
	}
}

func TestNormalizeValid(t *testing.T) {
	tests := []struct {
		name string
		rule Rule
	}{
		{"full sliding", validRule()},
		{"limit 1", Rule{Name: "one", Algorithm: FixedWindow, Limit: 1, Window: time.Second}},
		{"limit max", Rule{Name: "max", Algorithm: FixedWindow, Limit: MaxLimit, Window: time.Millisecond}},
		{"window max", Rule{Name: "year", Algorithm: SlidingWindow, Limit: 1, Window: MaxWindow}},
		{"concurrency", Rule{Name: "conn", Algorithm: Concurrency, Limit: 1}},
		{"concurrency 1ms ttl", Rule{Name: "conn", Algorithm: Concurrency, Limit: 1, LeaseTTL: time.Millisecond}},
		{"paced fixed", Rule{Name: "p", Algorithm: FixedWindow, Limit: 10, Window: time.Second, Pace: true}},
		{"paced sliding", Rule{Name: "p", Algorithm: SlidingWindow, Limit: 1, Window: time.Hour, Pace: true}},
		{"explicit reject equal", Rule{Name: "a.b:c_d-e", Algorithm: FixedWindow, Limit: 3, Window: time.Minute, Mode: Reject, Share: Equal, DemandFloor: 1}},
		{"suppress demand", Rule{Name: "flood", Algorithm: SlidingWindow, Limit: 3, Window: time.Second, Mode: Suppress, Share: Demand, DemandFloor: 0.2}},
		{"class at 1e6", Rule{Name: "big", Algorithm: FixedWindow, Limit: 10, Window: time.Second, Classes: map[string]Class{"x": {Multiplier: 1e6}}}},
		{"override at max", Rule{Name: "o", Algorithm: FixedWindow, Limit: 10, Window: time.Second, Overrides: map[string]uint64{strings.Repeat("k", 256): MaxLimit}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := tt.rule
			if err := r.Normalize(); err != nil {
				t.Fatalf("Normalize: %v", err)
			}
			if err := r.Validate(); err != nil {
				t.Fatalf("Validate after Normalize: %v", err)
			}
		})
	}
}

func TestNormalizeDefaults(t *testing.T) {
	tests := []struct {
		name string
		rule Rule
		want Rule
	}{
		{
			name: "window rule",
			rule: Rule{Name: "w", Algorithm: FixedWindow, Limit: 1, Window: time.Second},
			want: Rule{Name: "w", Algorithm: FixedWindow, Limit: 1, Window: time.Second,
				Mode: Reject, Share: Equal, DemandFloor: DefaultDemandFloor, MaxKeys: DefaultMaxKeys},
		},
		{
			name: "concurrency gets a lease ttl",
			rule: Rule{Name: "c", Algorithm: Concurrency, Limit: 2},
			want: Rule{Name: "c", Algorithm: Concurrency, Limit: 2,
				Mode: Reject, Share: Equal, DemandFloor: DefaultDemandFloor, MaxKeys: DefaultMaxKeys, LeaseTTL: DefaultLeaseTTL},
		},
		{
			name: "explicit values kept",
			rule: Rule{Name: "c", Algorithm: Concurrency, Limit: 2, DemandFloor: 0.2, MaxKeys: 7, LeaseTTL: 5 * time.Second},
			want: Rule{Name: "c", Algorithm: Concurrency, Limit: 2,
				Mode: Reject, Share: Equal, DemandFloor: 0.2, MaxKeys: 7, LeaseTTL: 5 * time.Second},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := tt.rule
			if err := r.Normalize(); err != nil {
				t.Fatalf("Normalize: %v", err)
			}
			if r.Hash() != tt.want.Hash() {
				t.Errorf("after Normalize = %+v, want %+v", r, tt.want)
			}
			if r.MaxKeys != tt.want.MaxKeys || r.LeaseTTL != tt.want.LeaseTTL || r.DemandFloor != tt.want.DemandFloor ||
				r.Mode != tt.want.Mode || r.Share != tt.want.Share {
				t.Errorf("defaults = {MaxKeys %d, LeaseTTL %v, DemandFloor %v, Mode %q, Share %q}, want {%d, %v, %v, %q, %q}",
					r.MaxKeys, r.LeaseTTL, r.DemandFloor, r.Mode, r.Share,
					tt.want.MaxKeys, tt.want.LeaseTTL, tt.want.DemandFloor, tt.want.Mode, tt.want.Share)
			}
		})
	}
}

// TestOneBadRuleNeverBreaksTheOthers validates a rule set in which one rule
// is bad: only that rule fails, naming itself, and the others still build
// limiters (so a reload can keep the bad rule's old version and apply the
// rest).
func TestOneBadRuleNeverBreaksTheOthers(t *testing.T) {
	rules := []Rule{
		{Name: "a", Algorithm: SlidingWindow, Limit: 10, Window: time.Second},
		{Name: "b", Algorithm: FixedWindow, Limit: 0, Window: time.Second}, // bad
		{Name: "c", Algorithm: Concurrency, Limit: 1},
		{Name: "d", Algorithm: FixedWindow, Limit: 1, Window: time.Minute},
	}
	for i := range rules {
		r := rules[i]
		err := r.Normalize()
		if r.Name == "b" {
			wantRuleError(t, err, "b", "limit", ErrInvalidRule)
			continue
		}
		if err != nil {
			t.Errorf("rule %q: %v, want nil", r.Name, err)
		}
		if _, err := New(rules[i], crdt.NewContainer(), 0); err != nil {
			t.Errorf("New(%q): %v", r.Name, err)
		}
	}
}

func TestCostOf(t *testing.T) {
	r := Rule{Name: "api", Algorithm: FixedWindow, Limit: 100, Window: time.Second,
		Costs: map[string]Cost{"query": {Per: 10}, "publish": {Each: 100}, "one": {Per: 1}, "big": {Each: MaxCost}}}
	if err := r.Normalize(); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		req     Request
		want    uint64
		wantErr error
	}{
		{"default", Request{}, 1, nil},
		{"class does not change cost", Request{Class: "payer"}, 1, nil},
		{"explicit", Request{Cost: 7, HasCost: true}, 7, nil},
		{"explicit 0 is a peek", Request{Cost: 0, HasCost: true}, 0, nil},
		{"explicit at max", Request{Cost: MaxCost, HasCost: true}, MaxCost, nil},
		{"explicit over max", Request{Cost: MaxCost + 1, HasCost: true}, 0, ErrBadCost},
		{"explicit huge", Request{Cost: math.MaxUint64, HasCost: true}, 0, ErrBadCost},
		{"each", Request{Type: "publish", Units: 3}, 300, nil},
		{"each 0 units", Request{Type: "publish", Units: 0}, 0, nil},
		{"each at max", Request{Type: "big", Units: 1}, MaxCost, nil},
		{"each overflow", Request{Type: "big", Units: 2}, 0, ErrBadCost},
		{"each uint64 overflow", Request{Type: "publish", Units: math.MaxUint64 / 10}, 0, ErrBadCost},
		{"per 0 units", Request{Type: "query", Units: 0}, 0, nil},
		{"per 1 unit", Request{Type: "query", Units: 1}, 1, nil},
		{"per 9 units", Request{Type: "query", Units: 9}, 1, nil},
		{"per 10 units", Request{Type: "query", Units: 10}, 1, nil},
		{"per 11 units", Request{Type: "query", Units: 11}, 2, nil},
		{"per 20 units", Request{Type: "query", Units: 20}, 2, nil},
		{"per max units", Request{Type: "query", Units: math.MaxUint64}, 0, ErrBadCost},
		{"per huge units", Request{Type: "one", Units: MaxCost + 1}, 0, ErrBadCost},
		{"per units at max", Request{Type: "one", Units: MaxCost}, MaxCost, nil},
		{"unknown type", Request{Type: "delete", Units: 1}, 0, ErrUnknownType},
		{"cost and type", Request{Cost: 1, HasCost: true, Type: "query", Units: 1}, 0, ErrBadCost},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := r.CostOf(tt.req)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("CostOf(%+v) = %d, %v; want error %v", tt.req, got, err, tt.wantErr)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("CostOf(%+v) = %d, %v; want %d", tt.req, got, err, tt.want)
			}
		})
	}
}

func TestLimitFor(t *testing.T) {
	r := Rule{Name: "api", Algorithm: FixedWindow, Limit: 3, Window: time.Second,
		Classes: map[string]Class{
			"payer": {Multiplier: 5},
			"half":  {Multiplier: 0.5},
			"tenth": {Multiplier: 0.1},
			"x1.5":  {Multiplier: 1.5},
			"node":  {Unlimited: true},
		},
		Overrides: map[string]uint64{"acct:42": 50}}
	if err := r.Normalize(); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		key, class    string
		want          uint64
		wantUnlimited bool
		wantErr       error
	}{
		{"k", "", 3, false, nil},
		{"acct:42", "", 50, false, nil},
		{"acct:4", "", 3, false, nil},
		{"k", "payer", 15, false, nil},
		{"acct:42", "payer", 250, false, nil},
		{"k", "half", 1, false, nil},        // 1.5 rounds down
		{"acct:42", "half", 25, false, nil}, // exact
		{"k", "tenth", 1, false, nil},       // 0.3, but at least 1
		{"acct:42", "tenth", 5, false, nil},
		{"k", "x1.5", 4, false, nil}, // 4.5 rounds down
		{"k", "node", 3, true, nil},
		{"acct:42", "node", 50, true, nil},
		{"k", "gold", 0, false, ErrUnknownClass},
		{"k", "Payer", 0, false, ErrUnknownClass},
	}
	for _, tt := range tests {
		got, unl, err := r.LimitFor(tt.key, tt.class)
		if tt.wantErr != nil {
			if !errors.Is(err, tt.wantErr) {
				t.Errorf("LimitFor(%q, %q) = %d, %v, %v; want error %v", tt.key, tt.class, got, unl, err, tt.wantErr)
			}
			continue
		}
		if err != nil || got != tt.want || unl != tt.wantUnlimited {
			t.Errorf("LimitFor(%q, %q) = %d, %v, %v; want %d, %v", tt.key, tt.class, got, unl, err, tt.want, tt.wantUnlimited)
		}
	}

	// A rule without classes knows no class at all.
	plain := Rule{Name: "plain", Algorithm: FixedWindow, Limit: 3, Window: time.Second}
	if _, _, err := plain.LimitFor("k", "payer"); !errors.Is(err, ErrUnknownClass) {
		t.Errorf("LimitFor on a rule without classes: %v, want ErrUnknownClass", err)
	}
}

func TestHash(t *testing.T) {
	base := validRule()
	if err := base.Normalize(); err != nil {
		t.Fatal(err)
	}
	h := base.Hash()
	if h2 := base.Hash(); h2 != h {
		t.Fatalf("Hash not stable: %x then %x", h, h2)
	}
	// The same definition built with maps filled in another order.
	same := validRule()
	same.Classes = map[string]Class{"node": {Unlimited: true}, "payer": {Multiplier: 5}}
	same.Costs = map[string]Cost{"publish": {Each: 100}, "query": {Per: 10}}
	if err := same.Normalize(); err != nil {
		t.Fatal(err)
	}
	if same.Hash() != h {
		t.Errorf("equal rules hash differently: %x, %x", same.Hash(), h)
	}

	muts := []struct {
		name string
		mut  func(r *Rule)
	}{
		{"name", func(r *Rule) { r.Name = "api2" }},
		{"algorithm", func(r *Rule) { r.Algorithm = FixedWindow }},
		{"limit", func(r *Rule) { r.Limit++ }},
		{"window", func(r *Rule) { r.Window += time.Millisecond }},
		{"mode", func(r *Rule) { r.Mode = Suppress }},
		{"share", func(r *Rule) { r.Share = Demand }},
		{"demand_floor", func(r *Rule) { r.DemandFloor = 0.06 }},
		{"pace", func(r *Rule) { r.Pace = true }},
		{"max_keys", func(r *Rule) { r.MaxKeys++ }},
		{"shadow", func(r *Rule) { r.Shadow = true }},
		{"lease_ttl", func(r *Rule) { r.LeaseTTL = time.Second }},
		{"class multiplier", func(r *Rule) { r.Classes["payer"] = Class{Multiplier: 5.5} }},
		{"class unlimited", func(r *Rule) { r.Classes["payer"] = Class{Unlimited: true} }},
		{"class added", func(r *Rule) { r.Classes["free"] = Class{Multiplier: 0.5} }},
		{"class removed", func(r *Rule) { delete(r.Classes, "node") }},
		{"class renamed", func(r *Rule) { r.Classes["nodes"] = r.Classes["node"]; delete(r.Classes, "node") }},
		{"cost each", func(r *Rule) { r.Costs["publish"] = Cost{Each: 101} }},
		{"cost each to per", func(r *Rule) { r.Costs["publish"] = Cost{Per: 100} }},
		{"cost added", func(r *Rule) { r.Costs["subscribe"] = Cost{Each: 10} }},
		{"override limit", func(r *Rule) { r.Overrides["acct:42"] = 5001 }},
		{"override key", func(r *Rule) { r.Overrides["acct:43"] = r.Overrides["acct:42"]; delete(r.Overrides, "acct:42") }},
		{"override removed", func(r *Rule) { r.Overrides = nil }},
		{"share_wait", func(r *Rule) { r.ShareWait = 100 * time.Millisecond }},
		{"share_wait none", func(r *Rule) { r.ShareWait = NoShareWait }},
	}
	seen := map[uint64]string{h: "base"}
	for _, m := range muts {
		r := validRule()
		if err := r.Normalize(); err != nil {
			t.Fatal(err)
		}
		m.mut(&r)
		got := r.Hash()
		if prev, dup := seen[got]; dup {
			t.Errorf("changing %s gives the hash of %s (%x)", m.name, prev, got)
		}
		seen[got] = m.name
	}
}

func TestHashRules(t *testing.T) {
	a := Rule{Name: "a", Algorithm: FixedWindow, Limit: 1, Window: time.Second}
	b := Rule{Name: "b", Algorithm: SlidingWindow, Limit: 2, Window: time.Second}
	c := Rule{Name: "c", Algorithm: Concurrency, Limit: 3}
	for _, r := range []*Rule{&a, &b, &c} {
		if err := r.Normalize(); err != nil {
			t.Fatal(err)
		}
	}
	abc := HashRules([]Rule{a, b, c})
	for _, perm := range [][]Rule{{a, c, b}, {b, a, c}, {b, c, a}, {c, a, b}, {c, b, a}} {
		if got := HashRules(perm); got != abc {
			t.Errorf("HashRules(%s%s%s) = %x, want %x", perm[0].Name, perm[1].Name, perm[2].Name, got, abc)
		}
	}
	if got := HashRules([]Rule{a, b, c}); got != abc {
		t.Errorf("HashRules not stable: %x then %x", abc, got)
	}
	b2 := b
	b2.Limit = 3
	others := map[string][]Rule{
		"subset":     {a, b},
		"changed":    {a, b2, c},
		"duplicated": {a, b, c, c},
		"empty":      nil,
	}
	for name, rs := range others {
		if HashRules(rs) == abc {
			t.Errorf("HashRules(%s) equals the hash of {a, b, c}", name)
		}
	}
}

// TestHashWithoutShareWait: a rule that leaves share_wait unset hashes as
// it did before the field existed, so members of two versions running the
// same rules see no mismatch. The constant is validRule's hash at the
// commit before share_wait (fdd4fa5).
func TestHashWithoutShareWait(t *testing.T) {
	r := validRule()
	if err := r.Normalize(); err != nil {
		t.Fatal(err)
	}
	if got, want := r.Hash(), uint64(0x9757bd6334ec3789); got != want {
		t.Errorf("Hash = %#x, want the former %#x", got, want)
	}
}

func TestShareWaitFor(t *testing.T) {
	ack := 40 * time.Millisecond
	ms := time.Millisecond
	tests := []struct {
		set, ack, measured, want time.Duration
	}{
		{0, ack, 0, 200 * ms},                   // the default: 5 acknowledgement delays
		{0, ack, 45 * ms, 200 * ms},             // a quiet host's rounds do not shorten it
		{0, ack, 150 * ms, 600 * ms},            // a starved host's: 4 measured rounds
		{0, ack, 2 * time.Second, MaxShareWait}, // capped at 1 s
		{0, 100 * ms, 0, DefaultShareWaitMax},   // capped at 250 ms
		{0, 0, 0, 0},
		{NoShareWait, ack, 150 * ms, 0},
		{30 * ms, ack, 150 * ms, 30 * ms}, // a set share_wait is kept
		{MaxShareWait, ack, 0, MaxShareWait},
	}
	for _, tt := range tests {
		r := Rule{ShareWait: tt.set}
		if got := r.ShareWaitFor(tt.ack, tt.measured); got != tt.want {
			t.Errorf("ShareWait %v, ack delay %v, measured %v: ShareWaitFor = %v, want %v", tt.set, tt.ack, tt.measured, got, tt.want)
		}
	}
}
