package limiter

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ratemesh/ratemesh/crdt"
)

const (
	self  crdt.SlotID = 0 // the member under test
	other crdt.SlotID = 1 // another member whose values arrive by merge
)

// newLimiter returns a limiter for r over a fresh container, writing as self.
func newLimiter(t testing.TB, r Rule) (*Limiter, *crdt.Container) {
	t.Helper()
	c := crdt.NewContainer()
	l, err := New(r, c, self)
	if err != nil {
		t.Fatalf("New(%+v): %v", r, err)
	}
	return l, c
}

// window returns the 1 s window of (rule, key) holding nowMs, failing the
// test if it does not exist.
func window(t *testing.T, c *crdt.Container, rule, key string, nowMs int64) *crdt.Window {
	t.Helper()
	rs := c.Lookup(rule)
	if rs == nil {
		t.Fatalf("no rule set %q", rule)
	}
	s := rs.Series(key)
	if s == nil {
		t.Fatalf("no series %q in rule %q", key, rule)
	}
	w := s.Window(1000, floorDiv(nowMs, 1000))
	if w == nil {
		t.Fatalf("no window for %d in %q/%q", nowMs, rule, key)
	}
	return w
}

// allow calls l.Allow and fails the test on an error.
func allow(t *testing.T, l *Limiter, key string, req Request, env Env) Decision {
	t.Helper()
	d, err := l.Allow(key, req, env)
	if err != nil {
		t.Fatalf("Allow(%q, %+v): %v", key, req, err)
	}
	return d
}

func TestNew(t *testing.T) {
	c := crdt.NewContainer()
	_, err := New(Rule{Name: "api", Algorithm: FixedWindow, Window: time.Second}, c, self)
	wantRuleError(t, err, "api", "limit", ErrInvalidRule)

	l, err := New(Rule{Name: "api", Algorithm: FixedWindow, Limit: 5, Window: time.Second}, c, self)
	if err != nil {
		t.Fatal(err)
	}
	if l.Rule().MaxKeys != DefaultMaxKeys || l.Rule().Mode != Reject {
		t.Errorf("Rule() not normalised: %+v", *l.Rule())
	}
	if l.Set() != c.Lookup("api") || l.Set() == nil {
		t.Errorf("Set() = %p, want the container's rule set %p", l.Set(), c.Lookup("api"))
	}
}

func TestAllowRecords(t *testing.T) {
	l, c := newLimiter(t, Rule{Name: "api", Algorithm: FixedWindow, Limit: 3, Window: time.Second})
	env := Env{NowMs: t0 + 10, Members: 1}

	var got []bool
	for i := 0; i < 5; i++ {
		got = append(got, allow(t, l, "k", Request{}, env).Allowed)
	}
	if want := []bool{true, true, true, false, false}; !slices.Equal(got, want) {
		t.Fatalf("allowed = %v, want %v", got, want)
	}
	w := window(t, c, "api", "k", env.NowMs)
	if a, at := w.Admitted.Get(self), w.Attempted.Get(self); a != 3 || at != 5 {
		t.Errorf("own slot admitted %d attempted %d, want 3 and 5", a, at)
	}
	if a, at := w.Admitted.Get(other), w.Attempted.Get(other); a != 0 || at != 0 {
		t.Errorf("other slot admitted %d attempted %d, want 0 and 0", a, at)
	}
	ws, ls := c.TakeDirty()
	if len(ws) != 1 || ws[0] != w || len(ls) != 0 {
		t.Errorf("TakeDirty = %d windows, %d lease series; want just the window", len(ws), len(ls))
	}

	// A denied request of cost 2 is attempted, not admitted.
	d := allow(t, l, "k", Request{Cost: 2, HasCost: true}, env)
	if d.Allowed || d.Reason != ReasonLimit {
		t.Errorf("cost 2 on a full key: %+v, want denied by the limit", d)
	}
	if a, at := w.Admitted.Value(), w.Attempted.Value(); a != 3 || at != 7 {
		t.Errorf("after cost 2: admitted %d attempted %d, want 3 and 7", a, at)
	}
	// So is a request that can never fit.
	if d := allow(t, l, "k", Request{Cost: 4, HasCost: true}, env); d.Reason != ReasonCost {
		t.Errorf("cost 4 over limit 3: %+v, want reason cost", d)
	}
	if a, at := w.Admitted.Value(), w.Attempted.Value(); a != 3 || at != 11 {
		t.Errorf("after cost 4: admitted %d attempted %d, want 3 and 11", a, at)
	}
	if c.Dirty() != 1 {
		t.Errorf("Dirty = %d after a denial, want 1", c.Dirty())
	}

	// The next window starts empty and is recorded apart.
	next := Env{NowMs: t0 + 1000, Members: 1}
	if d := allow(t, l, "k", Request{Cost: 2, HasCost: true}, next); !d.Allowed || d.Remaining != 1 {
		t.Errorf("next window: %+v, want allowed with 1 remaining", d)
	}
	if nw := window(t, c, "api", "k", next.NowMs); nw == w || nw.Admitted.Value() != 2 || nw.Attempted.Value() != 2 {
		t.Errorf("next window admitted %d attempted %d, want 2 and 2", nw.Admitted.Value(), nw.Attempted.Value())
	}
	if w.Admitted.Value() != 3 {
		t.Errorf("old window changed to %d", w.Admitted.Value())
	}
}

// TestAllowReadsMergedUsage checks that another member's merged usage
// counts against the key.
func TestAllowReadsMergedUsage(t *testing.T) {
	l, c := newLimiter(t, Rule{Name: "api", Algorithm: FixedWindow, Limit: 10, Window: time.Second})
	env := Env{NowMs: t0 + 10, Members: 1}
	w := c.Rule("api").Ensure("k").EnsureWindow(1000, t0/1000)
	w.Admitted.Raise(other, 8)
	w.Attempted.Raise(other, 12)
	d := allow(t, l, "k", Request{}, env)
	if !d.Allowed || d.Remaining != 1 {
		t.Fatalf("with 8 merged: %+v, want allowed with 1 remaining", d)
	}
	allow(t, l, "k", Request{}, env)
	if d := allow(t, l, "k", Request{}, env); d.Allowed {
		t.Fatalf("with 8 merged and 2 own: %+v, want denied", d)
	}
	if w.Admitted.Get(other) != 8 || w.Admitted.Get(self) != 2 || w.Attempted.Value() != 15 {
		t.Errorf("slots = other %d, self %d, attempted %d; want 8, 2, 15", w.Admitted.Get(other), w.Admitted.Get(self), w.Attempted.Value())
	}
}

func TestAllowTypedCost(t *testing.T) {
	l, c := newLimiter(t, Rule{Name: "api", Algorithm: SlidingWindow, Limit: 100, Window: time.Second,
		Costs: map[string]Cost{"query": {Per: 10}, "publish": {Each: 30}}})
	env := Env{NowMs: t0 + 10, Members: 1}
	allow(t, l, "k", Request{Type: "query", Units: 25}, env)  // 3
	allow(t, l, "k", Request{Type: "publish", Units: 2}, env) // 60
	w := window(t, c, "api", "k", env.NowMs)
	if w.Admitted.Value() != 63 {
		t.Errorf("admitted %d credits, want 63", w.Admitted.Value())
	}
	d := allow(t, l, "k", Request{Type: "publish", Units: 2}, env) // 60 more does not fit
	if d.Allowed || d.Remaining != 0 || d.Reason != ReasonLimit {
		t.Errorf("third: %+v, want denied by the limit with 0 remaining (37 credits are left, not 60)", d)
	}
	if w.Admitted.Value() != 63 || w.Attempted.Value() != 123 {
		t.Errorf("admitted %d attempted %d, want 63 and 123", w.Admitted.Value(), w.Attempted.Value())
	}
	// Over the limit in one request: never.
	if d := allow(t, l, "k", Request{Type: "publish", Units: 4}, env); d.Allowed || d.RetryAfter != Never || d.Reason != ReasonCost {
		t.Errorf("cost 120 over limit 100: %+v, want never", d)
	}
}

func TestAllowPeekRecordsNothing(t *testing.T) {
	l, c := newLimiter(t, Rule{Name: "api", Algorithm: FixedWindow, Limit: 2, Window: time.Second,
		Costs: map[string]Cost{"query": {Per: 10}, "publish": {Each: 3}}})
	env := Env{NowMs: t0 + 10, Members: 1}
	peek := Request{HasCost: true}
	for i := 0; i < 3; i++ {
		if d := allow(t, l, "k", peek, env); !d.Allowed || d.Remaining != 2 {
			t.Fatalf("peek %d on an empty key: %+v, want allowed with 2 remaining", i, d)
		}
	}
	if s := c.Lookup("api").Series("k"); s != nil || c.Dirty() != 0 {
		t.Fatalf("peeks created series %v, dirty %d; want nothing", s, c.Dirty())
	}
	allow(t, l, "k", Request{}, env)
	allow(t, l, "k", Request{}, env)
	c.TakeDirty()
	d := allow(t, l, "k", peek, env)
	if d.Allowed || d.Reason != ReasonLimit || d.Remaining != 0 || d.RetryAfter != 990*time.Millisecond {
		t.Errorf("peek on a full key: %+v, want denied by the limit, retry at the window's end", d)
	}
	w := window(t, c, "api", "k", env.NowMs)
	if w.Admitted.Value() != 2 || w.Attempted.Value() != 2 || c.Dirty() != 0 {
		t.Errorf("after peeks: admitted %d attempted %d dirty %d; want 2, 2, 0", w.Admitted.Value(), w.Attempted.Value(), c.Dirty())
	}
	// A typed request of 0 units costs 0: a peek too.
	for _, req := range []Request{{Type: "query"}, {Type: "publish"}} {
		if d := allow(t, l, "j", req, env); !d.Allowed || d.Remaining != 2 {
			t.Errorf("0 units of %q: %+v, want a peek: allowed, 2 remaining", req.Type, d)
		}
	}
	if s := c.Lookup("api").Series("j"); s != nil || c.Dirty() != 0 {
		t.Errorf("0-unit requests recorded: series %v, dirty %d", s, c.Dirty())
	}
	if l.Earliest(Check{Key: "k", Cost: 0, Limit: 2}, env) != 0 {
		t.Errorf("Limiter.Earliest of a peek is not 0")
	}
}

func TestAllowShadow(t *testing.T) {
	l, c := newLimiter(t, Rule{Name: "api", Algorithm: FixedWindow, Limit: 2, Window: time.Second, Shadow: true})
	env := Env{NowMs: t0 + 10, Members: 1}
	var shadowed []bool
	for i := 0; i < 4; i++ {
		d := allow(t, l, "k", Request{}, env)
		if !d.Allowed {
			t.Fatalf("shadow rule denied: %+v", d)
		}
		shadowed = append(shadowed, d.Shadow)
		if d.Shadow && (d.Reason != ReasonLimit || d.RetryAfter != 990*time.Millisecond) {
			t.Errorf("shadowed decision %+v, want reason limit and a retry hint", d)
		}
	}
	if want := []bool{false, false, true, true}; !slices.Equal(shadowed, want) {
		t.Errorf("shadowed = %v, want %v", shadowed, want)
	}
	// Shadow-admitted requests proceed, so they count as admitted.
	w := window(t, c, "api", "k", env.NowMs)
	if w.Admitted.Value() != 4 || w.Attempted.Value() != 4 {
		t.Errorf("admitted %d attempted %d, want 4 and 4", w.Admitted.Value(), w.Attempted.Value())
	}
}

func TestAllowClassesAndOverrides(t *testing.T) {
	l, _ := newLimiter(t, Rule{Name: "api", Algorithm: FixedWindow, Limit: 10, Window: time.Second,
		Classes:   map[string]Class{"payer": {Multiplier: 5}, "half": {Multiplier: 0.5}, "node": {Unlimited: true}},
		Overrides: map[string]uint64{"acct:42": 50}})
	env := Env{NowMs: t0 + 10, Members: 1}
	tests := []struct {
		key, class string
		want       uint64
	}{
		{"k", "", 10},
		{"k", "payer", 50},
		{"k", "half", 5},
		{"acct:42", "", 50},
		{"acct:42", "payer", 250},
		{"acct:42", "half", 25},
	}
	for _, tt := range tests {
		d := allow(t, l, tt.key, Request{Class: tt.class, Cost: 0, HasCost: true}, env)
		if d.Limit != tt.want || d.Remaining != tt.want {
			t.Errorf("Limit/Remaining of %q class %q = %d/%d, want %d", tt.key, tt.class, d.Limit, d.Remaining, tt.want)
		}
	}
	if _, err := l.Allow("k", Request{Class: "gold"}, env); !errors.Is(err, ErrUnknownClass) {
		t.Errorf("unknown class: %v, want ErrUnknownClass", err)
	}
	// The class limit is what admission uses: payer on "p" admits 50.
	n := 0
	for i := 0; i < 60; i++ {
		if allow(t, l, "p", Request{Class: "payer"}, env).Allowed {
			n++
		}
	}
	if n != 50 {
		t.Errorf("payer admitted %d of 60, want 50", n)
	}
	// The same key without the class is already over its limit of 10.
	if d := allow(t, l, "p", Request{}, env); d.Allowed || d.Limit != 10 {
		t.Errorf("classless on a key with 50 used: %+v, want denied, limit 10", d)
	}
}

func TestAllowUnlimitedClass(t *testing.T) {
	l, c := newLimiter(t, Rule{Name: "api", Algorithm: SlidingWindow, Limit: 2, Window: time.Second,
		Classes: map[string]Class{"node": {Unlimited: true}}})
	env := Env{NowMs: t0 + 10, Members: 3}
	for i := 0; i < 5; i++ {
		d := allow(t, l, "k", Request{Class: "node", Cost: 2, HasCost: true}, env)
		// Remaining is after the request: the first takes the whole limit.
		want := Decision{Allowed: true, Limit: 2, ResetAfter: 990 * time.Millisecond, Reason: ReasonUnlimited}
		if d != want {
			t.Errorf("unlimited request %d: %+v, want %+v", i, d, want)
		}
	}
	w := window(t, c, "api", "k", env.NowMs)
	if w.Admitted.Value() != 10 || w.Attempted.Value() != 10 {
		t.Errorf("unlimited counted admitted %d attempted %d, want 10 and 10", w.Admitted.Value(), w.Attempted.Value())
	}
	if d := allow(t, l, "k", Request{}, env); d.Allowed || d.Reason != ReasonLimit {
		t.Errorf("limited request after unlimited usage: %+v, want denied by the limit", d)
	}
	// Unlimited even beyond the cost cap of the limit.
	if d := allow(t, l, "k", Request{Class: "node", Cost: 3, HasCost: true}, env); !d.Allowed || d.Reason != ReasonUnlimited {
		t.Errorf("unlimited cost 3 over limit 2: %+v, want admitted", d)
	}
	ch, err := l.Resolve("k", Request{Class: "node"})
	if err != nil || !ch.Unlimited {
		t.Fatalf("Resolve unlimited = %+v, %v", ch, err)
	}
	if got := l.Earliest(ch, env); got != 0 {
		t.Errorf("Earliest of an unlimited check = %v, want 0", got)
	}
}

func TestAllowMaxKeys(t *testing.T) {
	l, c := newLimiter(t, Rule{Name: "api", Algorithm: FixedWindow, Limit: 10, Window: time.Second, MaxKeys: 2})
	env := Env{NowMs: t0 + 250, Members: 1}
	for _, k := range []string{"a", "b"} {
		if d := allow(t, l, k, Request{}, env); !d.Allowed {
			t.Fatalf("key %q under the cap: %+v", k, d)
		}
	}
	d := allow(t, l, "c", Request{}, env)
	want := Decision{Limit: 10, Remaining: 0, ResetAfter: 750 * time.Millisecond, RetryAfter: 750 * time.Millisecond, Reason: ReasonKeyCap}
	if d != want {
		t.Errorf("new key at the cap: %+v, want %+v", d, want)
	}
	if c.Lookup("api").Series("c") != nil || l.Set().Len() != 2 {
		t.Errorf("a capped key was recorded: Len %d", l.Set().Len())
	}
	if d := allow(t, l, "a", Request{}, env); !d.Allowed || d.Remaining != 8 {
		t.Errorf("existing key at the cap: %+v, want allowed with 8 remaining", d)
	}
	// A peek records nothing, so the cap does not apply to it.
	if d := allow(t, l, "c", Request{HasCost: true}, env); !d.Allowed || d.Reason != ReasonAdmitted {
		t.Errorf("peek of a new key at the cap: %+v, want allowed", d)
	}
	// Once the old keys' windows are collected the new key fits.
	later := Env{NowMs: t0 + 2000, Members: 1}
	c.TakeDirty()
	if n := c.Collect(later.NowMs); n != 2 || l.Set().Len() != 0 {
		t.Fatalf("Collect dropped %d windows, %d keys left; want 2 and 0", n, l.Set().Len())
	}
	if d := allow(t, l, "c", Request{}, later); !d.Allowed {
		t.Errorf("new key after collection: %+v", d)
	}
}

func TestResolve(t *testing.T) {
	win, _ := newLimiter(t, Rule{Name: "api", Algorithm: FixedWindow, Limit: 10, Window: time.Second,
		Costs:     map[string]Cost{"query": {Per: 10}},
		Classes:   map[string]Class{"payer": {Multiplier: 2}, "node": {Unlimited: true}},
		Overrides: map[string]uint64{"acct:42": 7}})
	conc, _ := newLimiter(t, Rule{Name: "conn", Algorithm: Concurrency, Limit: 3,
		Classes: map[string]Class{"payer": {Multiplier: 2}}})
	key256 := strings.Repeat("k", 256)
	key257 := strings.Repeat("k", 257)

	tests := []struct {
		name    string
		l       *Limiter
		key     string
		req     Request
		want    Check
		wantErr error
	}{
		{"default", win, "k", Request{}, Check{Key: "k", Cost: 1, Limit: 10}, nil},
		{"256-byte key", win, key256, Request{}, Check{Key: key256, Cost: 1, Limit: 10}, nil},
		{"explicit cost", win, "k", Request{Cost: 4, HasCost: true}, Check{Key: "k", Cost: 4, Limit: 10}, nil},
		{"peek", win, "k", Request{HasCost: true}, Check{Key: "k", Cost: 0, Limit: 10}, nil},
		{"typed", win, "k", Request{Type: "query", Units: 11}, Check{Key: "k", Cost: 2, Limit: 10}, nil},
		{"override", win, "acct:42", Request{}, Check{Key: "acct:42", Cost: 1, Limit: 7}, nil},
		{"override and class", win, "acct:42", Request{Class: "payer"}, Check{Key: "acct:42", Cost: 1, Limit: 14}, nil},
		{"unlimited", win, "k", Request{Class: "node"}, Check{Key: "k", Cost: 1, Limit: 10, Unlimited: true}, nil},
		{"empty key", win, "", Request{}, Check{}, ErrBadKey},
		{"257-byte key", win, key257, Request{}, Check{}, ErrBadKey},
		{"cost over max", win, "k", Request{Cost: MaxCost + 1, HasCost: true}, Check{}, ErrBadCost},
		{"cost and type", win, "k", Request{Cost: 1, HasCost: true, Type: "query"}, Check{}, ErrBadCost},
		{"unknown type", win, "k", Request{Type: "delete", Units: 1}, Check{}, ErrUnknownType},
		{"unknown class", win, "k", Request{Class: "gold"}, Check{}, ErrUnknownClass},
		{"concurrency through Resolve", conc, "k", Request{}, Check{}, ErrWrongAlgorithm},
		{"bad key before wrong algorithm", conc, "", Request{}, Check{}, ErrBadKey},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.l.Resolve(tt.key, tt.req)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("Resolve = %+v, %v; want %v", got, err, tt.wantErr)
				}
				d, err := tt.l.Allow(tt.key, tt.req, Env{NowMs: t0, Members: 1})
				if !errors.Is(err, tt.wantErr) || d != (Decision{}) {
					t.Errorf("Allow = %+v, %v; want the zero Decision and %v", d, err, tt.wantErr)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("Resolve = %+v, %v; want %+v", got, err, tt.want)
			}
		})
	}

	leaseTests := []struct {
		name       string
		l          *Limiter
		key, class string
		want       Check
		wantErr    error
	}{
		{"lease", conc, "k", "", Check{Key: "k", Cost: 1, Limit: 3}, nil},
		{"lease with class", conc, "k", "payer", Check{Key: "k", Cost: 1, Limit: 6}, nil},
		{"lease empty key", conc, "", "", Check{}, ErrBadKey},
		{"lease 257-byte key", conc, key257, "", Check{}, ErrBadKey},
		{"lease unknown class", conc, "k", "gold", Check{}, ErrUnknownClass},
		{"lease on a window rule", win, "k", "", Check{}, ErrWrongAlgorithm},
	}
	for _, tt := range leaseTests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.l.ResolveLease(tt.key, tt.class)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("ResolveLease = %+v, %v; want %v", got, err, tt.wantErr)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("ResolveLease = %+v, %v; want %+v", got, err, tt.want)
			}
		})
	}
}

func TestLeases(t *testing.T) {
	l, c := newLimiter(t, Rule{Name: "conn", Algorithm: Concurrency, Limit: 2,
		Classes: map[string]Class{"node": {Unlimited: true}}})
	all := func(crdt.SlotID) bool { return true }
	onlySelf := func(id crdt.SlotID) bool { return id == self }
	env := Env{NowMs: t0, Members: 1}

	ch, err := l.ResolveLease("k", "")
	if err != nil {
		t.Fatal(err)
	}
	acquire := func(want bool) Decision {
		t.Helper()
		d := l.DecideLease(ch, env, all)
		if d.Allowed != want {
			t.Fatalf("DecideLease = %+v, want allowed %v", d, want)
		}
		if d.Allowed {
			l.RecordLease("k", 1)
		}
		return d
	}
	if d := acquire(true); d.Remaining != 1 || d.ResetAfter != 0 {
		t.Errorf("first lease: %+v, want 1 remaining, no reset", d)
	}
	if u := l.LeaseUsage("k", all); u != (Usage{Cur: 1, CurUnacked: 1}) {
		t.Errorf("LeaseUsage = %+v, want {Cur 1, CurUnacked 1}", u)
	}
	if ws, ls := c.TakeDirty(); len(ws) != 0 || len(ls) != 1 || ls[0] != c.Lookup("conn").Series("k") {
		t.Errorf("TakeDirty = %d windows, %d lease series; want the key's series", len(ws), len(ls))
	}
	acquire(true)
	if d := acquire(false); d.Reason != ReasonLimit || d.RetryAfter != DefaultLeaseTTL {
		t.Errorf("third lease: %+v, want denied by the limit, retry after the lease TTL", d)
	}
	l.RecordLease("k", -1)
	if u := l.LeaseUsage("k", all); u != (Usage{Cur: 1, CurUnacked: 1}) {
		t.Errorf("after a release LeaseUsage = %+v, want {1, 1}", u)
	}
	s := c.Lookup("conn").Series("k")
	if s.Leases().P.Get(self) != 2 || s.Leases().N.Get(self) != 1 {
		t.Errorf("own slot P %d N %d, want 2 and 1", s.Leases().P.Get(self), s.Leases().N.Get(self))
	}

	// Another member's lease counts while live says so.
	s.EnsureLeases().Raise(other, 1, 0)
	if d := l.DecideLease(ch, env, all); d.Allowed {
		t.Errorf("with another member's lease: %+v, want denied", d)
	}
	if d := l.DecideLease(ch, env, onlySelf); !d.Allowed {
		t.Errorf("with a dead member's lease: %+v, want allowed", d)
	}
	if u := l.LeaseUsage("k", onlySelf); u.Cur != 1 {
		t.Errorf("LeaseUsage without the dead member = %+v, want Cur 1", u)
	}

	// An unlimited class always gets a lease.
	chn, err := l.ResolveLease("k", "node")
	if err != nil {
		t.Fatal(err)
	}
	if d := l.DecideLease(chn, env, all); !d.Allowed || d.Reason != ReasonUnlimited || d.Remaining != 0 {
		t.Errorf("unlimited lease: %+v, want allowed, 0 remaining", d)
	}
	l.RecordLease("k", -1) // no own lease left; the other member holds 1
	if d := l.DecideLease(chn, env, all); !d.Allowed || d.Remaining != 0 {
		t.Errorf("unlimited lease with one held: %+v, want allowed, 0 remaining after it", d)
	}
	if d := l.DecideLease(chn, env, onlySelf); !d.Allowed || d.Remaining != 1 {
		t.Errorf("unlimited lease with none held: %+v, want allowed, 1 remaining after it", d)
	}
	if u := l.LeaseUsage("none", all); u != (Usage{}) {
		t.Errorf("LeaseUsage of an unknown key = %+v", u)
	}
}

// TestLeasesShare checks the projection for leases: N = 2, limit 4.
func TestLeasesShare(t *testing.T) {
	l, c := newLimiter(t, Rule{Name: "conn", Algorithm: Concurrency, Limit: 4})
	all := func(crdt.SlotID) bool { return true }
	env := Env{NowMs: t0, Members: 2, AckDelay: 40 * time.Millisecond}
	ch, _ := l.ResolveLease("k", "")
	for i := 0; i < 2; i++ {
		if d := l.DecideLease(ch, env, all); !d.Allowed {
			t.Fatalf("lease %d: %+v", i, d)
		}
		l.RecordLease("k", 1)
	}
	// P 0, u 2: 0 + 2·(2+1) > 4.
	d := l.DecideLease(ch, env, all)
	if d.Allowed || d.Reason != ReasonShare || d.RetryAfter != 40*time.Millisecond {
		t.Errorf("unacknowledged leases: %+v, want denied by the share, retry after 40ms", d)
	}
	s := c.Lookup("conn").Series("k")
	s.EnsureLeases().Acked = 2
	if u := l.LeaseUsage("k", all); u != (Usage{Cur: 2}) {
		t.Errorf("acknowledged LeaseUsage = %+v, want {Cur 2}", u)
	}
	// P 2, u 0: 2 + 2·1 ≤ 4.
	if d := l.DecideLease(ch, env, all); !d.Allowed {
		t.Errorf("acknowledged leases: %+v, want allowed", d)
	}
	// Released below the acknowledged count: nothing unacknowledged.
	l.RecordLease("k", -1)
	if u := l.LeaseUsage("k", all); u != (Usage{Cur: 1}) {
		t.Errorf("after a release below acked: %+v, want {Cur 1}", u)
	}
}

func TestLeasesMaxKeys(t *testing.T) {
	l, _ := newLimiter(t, Rule{Name: "conn", Algorithm: Concurrency, Limit: 2, MaxKeys: 1, LeaseTTL: 5 * time.Second})
	all := func(crdt.SlotID) bool { return true }
	env := Env{NowMs: t0, Members: 1}
	a, _ := l.ResolveLease("a", "")
	b, _ := l.ResolveLease("b", "")
	if d := l.DecideLease(a, env, all); !d.Allowed {
		t.Fatalf("first key: %+v", d)
	}
	l.RecordLease("a", 1)
	want := Decision{Limit: 2, Reason: ReasonKeyCap, RetryAfter: 5 * time.Second}
	if d := l.DecideLease(b, env, all); d != want {
		t.Errorf("new key at the cap: %+v, want %+v", d, want)
	}
	if d := l.DecideLease(a, env, all); !d.Allowed {
		t.Errorf("existing key at the cap: %+v", d)
	}
}

func TestUsage(t *testing.T) {
	l, c := newLimiter(t, Rule{Name: "api", Algorithm: SlidingWindow, Limit: 100, Window: time.Second})
	now := t0 + 300
	env := Env{NowMs: now, Members: 1}
	for i := 0; i < 5; i++ {
		allow(t, l, "k", Request{}, env)
	}
	s := c.Lookup("api").Series("k")
	w := s.Window(1000, t0/1000)
	w.Admitted.Raise(other, 3)
	w.Acked = 2
	if u := l.Usage("k", now); u != (Usage{Cur: 8, CurUnacked: 3}) {
		t.Errorf("Usage = %+v, want {Cur 8, CurUnacked 3}", u)
	}
	pw := s.EnsureWindow(1000, t0/1000-1)
	pw.Admitted.Raise(self, 4)
	pw.Admitted.Raise(other, 6)
	pw.Acked = 1
	// Windows that must not count: older, and another window length.
	s.EnsureWindow(1000, t0/1000-2).Admitted.Raise(self, 50)
	s.EnsureWindow(2000, t0/2000).Admitted.Raise(self, 70)
	s.EnsureWindow(500, t0/500).Admitted.Raise(self, 90)
	if u := l.Usage("k", now); u != (Usage{Cur: 8, CurUnacked: 3, Prev: 10, PrevUnacked: 3}) {
		t.Errorf("Usage = %+v, want {Cur 8, Prev 10, CurUnacked 3, PrevUnacked 3}", u)
	}
	w.Acked = 9 // acknowledged beyond the own value: nothing unacknowledged
	if u := l.Usage("k", now); u.CurUnacked != 0 {
		t.Errorf("CurUnacked = %d with Acked over the own value, want 0", u.CurUnacked)
	}
	// One window later the current window becomes the previous one.
	if u := l.Usage("k", t0+1000); u != (Usage{Prev: 8}) {
		t.Errorf("Usage a window later = %+v, want {Prev 8}", u)
	}
	if u := l.Usage("nobody", now); u != (Usage{}) {
		t.Errorf("Usage of an unknown key = %+v", u)
	}
	// Decide reads the same usage: sliding at elapsed 0.3 with N = 1:
	// 10·0.7 + 8 = 15, remaining 100 − 15 − 1 = 84.
	if d := allow(t, l, "k", Request{}, env); !d.Allowed || d.Remaining != 84 {
		t.Errorf("Allow on the merged usage: %+v, want 84 remaining", d)
	}
}

func TestSetSelf(t *testing.T) {
	l, c := newLimiter(t, Rule{Name: "api", Algorithm: FixedWindow, Limit: 10, Window: time.Second})
	env := Env{NowMs: t0, Members: 1}
	allow(t, l, "k", Request{}, env)
	l.SetSelf(other)
	allow(t, l, "k", Request{}, env)
	allow(t, l, "k", Request{}, env)
	w := window(t, c, "api", "k", t0)
	if w.Admitted.Get(self) != 1 || w.Admitted.Get(other) != 2 {
		t.Errorf("slots self %d other %d, want 1 and 2", w.Admitted.Get(self), w.Admitted.Get(other))
	}
}

func TestLimiterEarliest(t *testing.T) {
	l, _ := newLimiter(t, Rule{Name: "api", Algorithm: SlidingWindow, Limit: 10, Window: time.Second})
	env := Env{NowMs: t0 + 250, Members: 1}
	for i := 0; i < 10; i++ {
		allow(t, l, "k", Request{}, env)
	}
	ch, _ := l.Resolve("k", Request{})
	if got := l.Earliest(ch, env); got != 850*time.Millisecond {
		t.Errorf("Earliest on a full key = %v, want 850ms", got)
	}
	if got := l.Earliest(Check{Key: "k", Cost: 11, Limit: 10}, env); got != Never {
		t.Errorf("Earliest over the limit = %v, want Never", got)
	}
	if got := l.Earliest(Check{Key: "fresh", Cost: 1, Limit: 10}, env); got != 0 {
		t.Errorf("Earliest on a fresh key = %v, want 0", got)
	}
}

func TestDraw(t *testing.T) {
	rule := Rule{Name: "api", Algorithm: SlidingWindow, Limit: 10, Window: time.Second}
	a, _ := newLimiter(t, rule)
	b, _ := newLimiter(t, rule)
	at := func(ms int64, rank, n int) *Env { return &Env{NowMs: ms, Members: n, Rank: rank} }

	d := a.draw("k", at(t0+1, 0, 1))
	if d < 0 || d >= 1 {
		t.Fatalf("draw = %v, not in [0, 1)", d)
	}
	if got := a.draw("k", at(t0+1, 0, 1)); got != d {
		t.Errorf("draw not stable: %v then %v", d, got)
	}
	if got := b.draw("k", at(t0+999, 0, 1)); got != d {
		t.Errorf("another member, same key, window and rank: %v, want %v", got, d)
	}
	if got := a.draw("k", at(t0+1000, 0, 1)); got == d {
		t.Errorf("the next window gives the same draw %v", d)
	}
	if got := a.draw("j", at(t0+1, 0, 1)); got == d {
		t.Errorf("another key gives the same draw %v", d)
	}

	// Stratified: the members' draws for one key and window are spaced
	// exactly 1/N apart from the common start, modulo 1.
	const members = 7
	u := a.draw("k", at(t0+1, 0, members))
	for r := 0; r < members; r++ {
		want := u + float64(r)/members
		if want >= 1 {
			want--
		}
		if got := b.draw("k", at(t0+1, r, members)); math.Abs(got-want) > 1e-12 {
			t.Errorf("rank %d of %d: draw %v, want %v", r, members, got, want)
		}
	}
	// A rank out of range (a membership view in flux) is clamped, never
	// a draw outside [0, 1).
	for _, r := range []int{-3, members, 99} {
		if v := a.draw("k", at(t0+1, r, members)); v < 0 || v >= 1 {
			t.Errorf("rank %d: draw %v out of [0, 1)", r, v)
		}
	}
	// A concurrency rule has no window: a new draw every millisecond,
	// still stratified within it.
	lc, _ := newLimiter(t, Rule{Name: "conns", Algorithm: Concurrency, Limit: 10, LeaseTTL: time.Minute})
	if v0, v1 := lc.draw("k", at(t0, 2, 5)), lc.draw("k", at(t0+1, 2, 5)); v0 == v1 {
		t.Errorf("concurrency draw did not move with time: %v", v0)
	}
	if v0, v2 := lc.draw("k", at(t0, 0, 5)), lc.draw("k", at(t0, 2, 5)); math.Abs(math.Mod(v2-v0+1, 1)-0.4) > 1e-12 {
		t.Errorf("concurrency draws of ranks 0 and 2 of 5: %v and %v, want 0.4 apart", v0, v2)
	}

	// Spread: over many keys the draws look uniform on [0, 1).
	var sum float64
	var below [10]int
	const n = 10000
	for i := 0; i < n; i++ {
		v := a.draw("key:"+strconv.Itoa(i), at(t0, 0, 1))
		if v < 0 || v >= 1 {
			t.Fatalf("draw %v out of [0, 1)", v)
		}
		sum += v
		below[int(v*10)]++
	}
	if mean := sum / n; mean < 0.48 || mean > 0.52 {
		t.Errorf("mean draw over %d keys = %v, want about 0.5", n, mean)
	}
	for i, k := range below {
		if k < n/10-150 || k > n/10+150 {
			t.Errorf("decile %d holds %d of %d draws, want about %d", i, k, n, n/10)
		}
	}
}

// TestLotteryUsesDraw checks that a fractional share admits exactly when
// the member's draw for the key and window is below share/c, and that the
// stratified draws admit exactly the room: 5 members with share 3/5 each
// admit 3, whatever the start of the draws (a new one every window).
func TestLotteryUsesDraw(t *testing.T) {
	rule := Rule{Name: "api", Algorithm: FixedWindow, Limit: 3, Window: time.Second}
	const members = 5
	for w := int64(0); w < 200; w++ {
		admitted := 0
		for rank := 0; rank < members; rank++ {
			env := Env{NowMs: t0 + w*1000 + 5, Members: members, Rank: rank, AckDelay: 20 * time.Millisecond}
			l, _ := newLimiter(t, rule)
			want := l.draw("k", &env) < 0.6 // share 3/5
			d := allow(t, l, "k", Request{}, env)
			if d.Allowed != want {
				t.Fatalf("window %d rank %d: allowed %v, draw %v, want %v", w, rank, d.Allowed, l.draw("k", &env), want)
			}
			if d.Allowed {
				admitted++
				// u = 1 now: share 0.6 − 1 < 0 until acknowledged.
				if d2 := allow(t, l, "k", Request{}, env); d2.Allowed || d2.Reason != ReasonShare {
					t.Errorf("window %d rank %d: second request %+v, want denied by the share", w, rank, d2)
				}
			}
		}
		if admitted != 3 {
			t.Errorf("window %d: %d of %d members with share 0.6 admitted, want exactly 3", w, admitted, members)
		}
	}
}

// TestHermesAcrossMembers runs the Hermes case through real limiters: 96
// members, limit 10 per 1 s window, every member offering one request per
// window before any acknowledgement. Exactly 10 pass per window (the draws
// are stratified), never a stall at zero.
func TestHermesAcrossMembers(t *testing.T) {
	const members, windows = 96, 100
	ls := make([]*Limiter, members)
	for i := range ls {
		ls[i], _ = newLimiter(t, Rule{Name: "api", Algorithm: FixedWindow, Limit: 10, Window: time.Second})
	}
	winners := make(map[int]int) // rank → windows won
	for w := int64(0); w < windows; w++ {
		n := 0
		for rank, l := range ls {
			env := Env{NowMs: t0 + w*1000 + 17, Members: members, Rank: rank, AckDelay: 40 * time.Millisecond}
			if allow(t, l, "k", Request{}, env).Allowed {
				n++
				winners[rank]++
			}
		}
		// Stratified draws: share 10/96 each, so exactly 10 win.
		if n != 10 {
			t.Errorf("window %d admitted %d, want exactly 10", w, n)
		}
	}
	// The winners move from window to window: no member is starved.
	if len(winners) < members/2 {
		t.Errorf("only %d of %d members ever won in %d windows", len(winners), members, windows)
	}
}

// TestAllowMatchesReference drives one limiter through a seeded sequence of
// requests at instants that jump between windows, back in time and to the
// ends of time, with merges and acknowledgements in between, and checks
// every decision against Rule.Decide on Usage (the plain path), and every
// recording against the counters.
func TestAllowMatchesReference(t *testing.T) {
	for _, alg := range []Algorithm{FixedWindow, SlidingWindow} {
		t.Run(string(alg), func(t *testing.T) {
			const seed = 5
			rng := rand.New(rand.NewPCG(seed, 0))
			l, c := newLimiter(t, Rule{Name: "api", Algorithm: alg, Limit: 40, Window: 100 * time.Millisecond,
				Classes: map[string]Class{"x2": {Multiplier: 2}}})
			keys := []string{"a", "b", "c"}
			instants := []int64{t0, t0 + 1, t0 + 50, t0 + 99, t0 + 100, t0 + 150, t0 + 250, t0 - 1, t0 - 100,
				-1, 0, -150, 1, math.MinInt64, math.MinInt64 + 99, math.MaxInt64, math.MaxInt64 - 50}
			for step := 0; step < 5000; step++ {
				key := keys[rng.IntN(len(keys))]
				var now int64
				if rng.IntN(4) == 0 {
					now = instants[rng.IntN(len(instants))]
				} else {
					now = t0 + rng.Int64N(400) // mostly near t0, often the same window
				}
				env := Env{NowMs: now, Members: 1 + rng.IntN(4), AckDelay: 20 * time.Millisecond}
				req := Request{}
				switch rng.IntN(4) {
				case 0:
					req = Request{Cost: uint64(rng.IntN(4)), HasCost: true}
				case 1:
					req.Class = "x2"
				}
				switch rng.IntN(10) {
				case 0: // another member's usage arrives
					w := c.Rule("api").Ensure(key).EnsureWindow(100, floorDiv(now, 100))
					w.Admitted.Raise(other, w.Admitted.Get(other)+uint64(rng.IntN(5)))
				case 1: // acknowledgements arrive
					if s := l.Set().Series(key); s != nil {
						for _, w := range s.Windows() {
							w.Acked = w.Admitted.Get(self)
						}
					}
				}

				ch, err := l.Resolve(key, req)
				if err != nil {
					t.Fatal(err)
				}
				u := l.Usage(key, now)
				want := l.Rule().Decide(ch.Limit, ch.Cost, u, env, l.draw(key, &env))
				if got := l.Decide(ch, env); got != want {
					t.Fatalf("seed %d step %d: Decide(%+v, %+v) = %+v, want %+v (usage %+v)", seed, step, ch, env, got, want, u)
				}
				var before, beforeAt uint64
				if s := l.Set().Series(key); s != nil {
					if w := s.Window(100, floorDiv(now, 100)); w != nil {
						before, beforeAt = w.Admitted.Get(self), w.Attempted.Get(self)
					}
				}
				got := allow(t, l, key, req, env)
				if got != want {
					t.Fatalf("seed %d step %d: Allow(%q, %+v, %+v) = %+v, want %+v", seed, step, key, req, env, got, want)
				}
				if ch.Cost == 0 {
					continue
				}
				w := window100(t, c, key, now)
				wantAdm := before
				if got.Allowed {
					wantAdm += ch.Cost
				}
				if w.Admitted.Get(self) != wantAdm || w.Attempted.Get(self) != beforeAt+ch.Cost {
					t.Fatalf("seed %d step %d: own slot admitted %d attempted %d, want %d and %d",
						seed, step, w.Admitted.Get(self), w.Attempted.Get(self), wantAdm, beforeAt+ch.Cost)
				}
			}
		})
	}
}

func window100(t *testing.T, c *crdt.Container, key string, nowMs int64) *crdt.Window {
	t.Helper()
	s := c.Lookup("api").Series(key)
	if s == nil {
		t.Fatalf("no series %q", key)
	}
	w := s.Window(100, floorDiv(nowMs, 100))
	if w == nil {
		t.Fatalf("no window for %d", nowMs)
	}
	return w
}

// TestUnlimitedNeverShadowed checks that an unlimited class's decision is
// never flagged as shadowed, even on a shadow rule whose key is full.
func TestUnlimitedNeverShadowed(t *testing.T) {
	all := func(crdt.SlotID) bool { return true }
	env := Env{NowMs: t0, Members: 1}
	conc, _ := newLimiter(t, Rule{Name: "conn", Algorithm: Concurrency, Limit: 1, Shadow: true,
		Classes: map[string]Class{"node": {Unlimited: true}}})
	conc.RecordLease("k", 1)
	conc.RecordLease("k", 1)
	ch, _ := conc.ResolveLease("k", "node")
	want := Decision{Allowed: true, Limit: 1, Reason: ReasonUnlimited}
	if d := conc.DecideLease(ch, env, all); d != want {
		t.Errorf("unlimited lease on a full shadow rule: %+v, want %+v", d, want)
	}
	win, _ := newLimiter(t, Rule{Name: "api", Algorithm: FixedWindow, Limit: 1, Window: time.Second, Shadow: true,
		Classes: map[string]Class{"node": {Unlimited: true}}})
	allow(t, win, "k", Request{}, env)
	allow(t, win, "k", Request{}, env)
	want = Decision{Allowed: true, Limit: 1, ResetAfter: time.Second, Reason: ReasonUnlimited}
	if d := allow(t, win, "k", Request{Class: "node"}, env); d != want {
		t.Errorf("unlimited request on a full shadow rule: %+v, want %+v", d, want)
	}
}

// TestLeaseLotteryStratified: 5 members, a concurrency limit of 3, no
// lease held: each member's share is 3/5 of a lease, so every Acquire is
// a draw, and the stratified draws of one epoch admit exactly 3 of the 5
// members for every key — in any millisecond of the epoch once its guard
// is over, and none within the guard.
func TestLeaseLotteryStratified(t *testing.T) {
	const members, limit = 5, 3
	rule := Rule{Name: "conn", Algorithm: Concurrency, Limit: limit, LeaseTTL: time.Minute}
	ls := make([]*Limiter, members)
	for i := range ls {
		ls[i], _ = newLimiter(t, rule)
	}
	live := func(crdt.SlotID) bool { return true }
	for k := range 200 {
		key := fmt.Sprintf("user%d", k)
		for _, at := range []int64{t0 + 40, t0 + 41 + int64(k), t0 + 399} {
			admitted, guarded := 0, 0
			for rank, l := range ls {
				ch, err := l.ResolveLease(key, "")
				if err != nil {
					t.Fatal(err)
				}
				env := Env{NowMs: at, Members: members, Rank: rank, AckDelay: 40 * time.Millisecond}
				if l.DecideLease(ch, env, live).Allowed {
					admitted++
				}
				env.NowMs = at - at%400 + 39 // the same epoch's guard
				if l.DecideLease(ch, env, live).Allowed {
					guarded++
				}
			}
			if admitted != limit || guarded != 0 {
				t.Fatalf("key %s at t0+%d: %d members admitted, %d in the guard; want %d and 0", key, at-t0, admitted, guarded, limit)
			}
		}
	}
}
