package limiter

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
	"regexp"
	"sort"
	"strings"
	"time"
)

// Algorithm names how a rule counts.
type Algorithm string

// The algorithms.
const (
	FixedWindow   Algorithm = "fixed_window"   // credits per aligned window
	SlidingWindow Algorithm = "sliding_window" // previous window weighted by the part still inside the last window length
	Concurrency   Algorithm = "concurrency"    // leases held at once
	TokenBucket   Algorithm = "token_bucket"   // a bucket of max credits refilled continuously (see docs/token-bucket.md)
)

// Mode names what happens when demand exceeds the limit.
type Mode string

// The modes.
const (
	Reject   Mode = "reject"   // deny what does not fit
	Suppress Mode = "suppress" // over the limit, admit the fraction limit/demand (see suppression)
)

// Share names how the remaining headroom is divided among the members.
type Share string

// The shares.
const (
	Equal  Share = "equal"  // each live member takes 1/N
	Demand Share = "demand" // shares follow attempted usage (see Rule.demandShare)
)

// Defaults applied by Rule.Normalize to fields left zero.
const (
	DefaultMaxKeys     = 1_000_000
	DefaultLeaseTTL    = 60 * time.Second
	DefaultDemandFloor = 0.05
	// MaxLimit and MaxCost bound limits and costs so that every sum of them
	// stays exact in float64 arithmetic.
	MaxLimit uint64 = 1 << 50
	MaxCost  uint64 = 1 << 50
	// MaxWindow is the longest window accepted: a year.
	MaxWindow = 366 * 24 * time.Hour
	// MaxBucket bounds a token bucket's max and refill (times any class
	// multiplier): a bucket's counters hold credits in units of
	// 1/BurnUnit, and an epoch's stay within 64 bits.
	MaxBucket uint64 = 1 << 40
	// BurnUnit is how many units of a token bucket's drained counter make
	// one credit (see Rule.Refill).
	BurnUnit = 1 << 20
)

// Sentinel errors; every error the package returns wraps one of them.
var (
	ErrInvalidRule    = errors.New("limiter: invalid rule")
	ErrUnknownClass   = errors.New("limiter: unknown class")
	ErrUnknownType    = errors.New("limiter: unknown request type")
	ErrBadCost        = errors.New("limiter: bad cost")
	ErrBadKey         = errors.New("limiter: bad key")
	ErrWrongAlgorithm = errors.New("limiter: wrong algorithm for this call")
)

// RuleError names the rule and the field a validation failure is about.
type RuleError struct {
	Rule  string
	Field string
	Msg   string
	Err   error // ErrInvalidRule
}

func (e *RuleError) Error() string {
	return fmt.Sprintf("rule %q: %s: %s", e.Rule, e.Field, e.Msg)
}

// Unwrap returns the sentinel the error is an instance of.
func (e *RuleError) Unwrap() error { return e.Err }

// RequestError is a request a rule cannot decide: Field names the
// request's field at fault as the HTTP API spells it (key, rule, cost,
// type, class), Msg says what is wrong without the package prefix, and Err
// is the sentinel the error is an instance of (ErrBadKey,
// ErrWrongAlgorithm, ErrBadCost, ErrUnknownType, ErrUnknownClass).
type RequestError struct {
	Field string
	Msg   string
	Err   error
}

func (e *RequestError) Error() string { return "limiter: " + e.Msg }

// Unwrap returns the sentinel the error is an instance of.
func (e *RequestError) Unwrap() error { return e.Err }

func requestErr(field string, sentinel error, format string, args ...any) *RequestError {
	return &RequestError{Field: field, Msg: fmt.Sprintf(format, args...), Err: sentinel}
}

// Class scales a key's limit for one class of client: a multiplier, or
// unlimited (always admitted, still counted).
type Class struct {
	Multiplier float64
	Unlimited  bool
}

// Cost converts a request type's units into credits: Each credits per unit,
// or one credit per Per units, rounded up. Exactly one of them is set.
type Cost struct {
	Each uint64
	Per  uint64
}

// Rule is one rate limit. The zero value is not a valid rule; fill it and
// call Normalize, which validates it.
type Rule struct {
	Name      string
	Algorithm Algorithm
	// Limit is credits per window, or concurrent leases, or a token
	// bucket's max (the YAML key max).
	Limit uint64
	// Window is the window length (windowed algorithms only); it must be
	// a whole number of milliseconds.
	Window time.Duration
	Mode   Mode  // default Reject
	Share  Share // default Equal
	// DemandFloor is the smallest share a quiet member keeps under
	// Share Demand; default 0.05.
	DemandFloor float64
	// Pace releases a window's quota over the window (LINE): at elapsed
	// fraction e the window may hold PaceCap(L, e) = min(L, L·e + B)
	// credits, with the burst allowance B = PaceBurst·L, at least 1.
	// Windowed rules only.
	Pace    bool
	Classes map[string]Class
	Costs   map[string]Cost
	// Overrides replaces Limit for individual keys.
	Overrides map[string]uint64
	// MaxKeys caps the keys held; at the cap with every key active, new
	// keys are denied. Default 1,000,000.
	MaxKeys int
	// Shadow decides and counts but never denies.
	Shadow bool
	// LeaseTTL is how long a lease lives unless renewed (concurrency
	// only); default 60s.
	LeaseTTL time.Duration

	// Token bucket only. Refill credits accrue every Interval,
	// continuously (Refill/Interval credits per second, as
	// golang.org/x/time/rate and GCRA accrue them), up to Limit. A key
	// idle for a whole epoch (see BucketEpochMs) starts the next with
	// Initial credits (Limit unless HasInitial). An override or a class
	// scales the whole bucket (initial, refill, max) by its ratio to
	// Limit.
	Refill     uint64
	Interval   time.Duration
	Initial    uint64
	HasInitial bool

	// ShareWait bounds how long package node holds a request that only
	// this member's share refuses (ReasonShare: the key's limit has room
	// as the member sees it), deciding it again as acknowledgements
	// return, before it answers the denial. 0 means the default,
	// ShareWaitFor's multiple of the acknowledgement delay, stretched on
	// a host where acknowledgements take longer; NoShareWait refuses at
	// once. At most MaxShareWait.
	ShareWait time.Duration
}

// Bounds of Rule.ShareWait.
const (
	// NoShareWait is the ShareWait of a rule that refuses a share denial
	// at once (share_wait: 0 in a config file).
	NoShareWait time.Duration = -1
	// MaxShareWait is the longest ShareWait accepted: acknowledgements
	// that take longer mean a partition, which waiting does not mend.
	MaxShareWait = time.Second
	// DefaultShareWaitMax caps the default ShareWait.
	DefaultShareWaitMax = 250 * time.Millisecond
	// shareWaitAcks is the default ShareWait in acknowledgement delays:
	// an acknowledgement takes up to a sync interval to go out, one to
	// come back and one to be applied (1.5 acknowledgement delays), and
	// more on a loaded host.
	shareWaitAcks = 5
	// shareWaitRounds is the default ShareWait in measured
	// acknowledgement rounds (from a batch's sending to its
	// acknowledgement by every member): a share grows with each round,
	// by a part of what is left, so a burst near the limit needs a few.
	shareWaitRounds = 4
)

// ShareWaitFor returns how long a request refused by the share is held
// under this rule, for a member whose acknowledgement delay is ackDelay
// and whose batches were lately acknowledged measured after they went
// out: ShareWait when set, 0 for NoShareWait, otherwise the longer of
// min(5 × ackDelay, DefaultShareWaitMax) — 200 ms at the default 20 ms
// sync interval — and min(4 × measured, MaxShareWait). On a starved host
// acknowledgements take longer than the sync interval promises, and a
// hold sized for a quiet host denies what the next acknowledgements
// would admit (a burst of 900 under 1000 over 3 members at load 17: 873
// admitted with 200 ms, all 900 with 1 s).
func (r *Rule) ShareWaitFor(ackDelay, measured time.Duration) time.Duration {
	switch {
	case r.ShareWait == NoShareWait:
		return 0
	case r.ShareWait > 0:
		return r.ShareWait
	}
	return max(min(shareWaitAcks*ackDelay, DefaultShareWaitMax), min(shareWaitRounds*measured, MaxShareWait))
}

var nameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.:-]*$`)

// Normalize fills defaults and validates the rule. The error, a *RuleError,
// names the rule and the field (as the YAML config spells it).
func (r *Rule) Normalize() error {
	if r.Mode == "" {
		r.Mode = Reject
	}
	if r.Share == "" {
		r.Share = Equal
	}
	if r.DemandFloor == 0 {
		r.DemandFloor = DefaultDemandFloor
	}
	if r.MaxKeys == 0 {
		r.MaxKeys = DefaultMaxKeys
	}
	if r.Algorithm == Concurrency && r.LeaseTTL == 0 {
		r.LeaseTTL = DefaultLeaseTTL
	}
	return r.Validate()
}

// Validate checks the rule without changing it.
func (r *Rule) Validate() error {
	bad := func(field, format string, args ...any) error {
		return &RuleError{Rule: r.Name, Field: field, Msg: fmt.Sprintf(format, args...), Err: ErrInvalidRule}
	}
	switch {
	case r.Name == "":
		return bad("name", "must not be empty")
	case len(r.Name) > 128:
		return bad("name", "%d bytes, at most 128", len(r.Name))
	case !nameRE.MatchString(r.Name):
		return bad("name", "may hold only letters, digits and _ . : - and must start with a letter or digit")
	}
	windowed := r.Algorithm == FixedWindow || r.Algorithm == SlidingWindow
	bucket := r.Algorithm == TokenBucket
	switch {
	case windowed, bucket, r.Algorithm == Concurrency:
	case r.Algorithm == "":
		return bad("algorithm", "must be set: fixed_window, sliding_window, token_bucket or concurrency")
	default:
		return bad("algorithm", "%q is not one of fixed_window, sliding_window, token_bucket, concurrency", r.Algorithm)
	}
	if bucket {
		if err := r.validateBucket(bad); err != nil {
			return err
		}
	} else {
		switch {
		case r.Refill != 0:
			return bad("refill", "applies to token_bucket rules only")
		case r.Interval != 0:
			return bad("interval", "applies to token_bucket rules only")
		case r.HasInitial || r.Initial != 0:
			return bad("initial", "applies to token_bucket rules only")
		}
	}
	if r.Limit < 1 {
		return bad("limit", "must be at least 1")
	}
	if r.Limit > MaxLimit {
		return bad("limit", "%d is over the maximum %d", r.Limit, MaxLimit)
	}
	if bucket {
		// validateBucket checked the rest.
	} else if windowed {
		switch {
		case r.Window <= 0:
			return bad("window", "must be positive, for example 1s")
		case r.Window%time.Millisecond != 0:
			return bad("window", "%v is not a whole number of milliseconds", r.Window)
		case r.Window > MaxWindow:
			return bad("window", "%v is longer than the maximum %v", r.Window, MaxWindow)
		}
		if r.LeaseTTL != 0 {
			return bad("lease_ttl", "applies to concurrency rules only")
		}
	} else {
		if r.Window != 0 {
			return bad("window", "concurrency rules have no window; remove it")
		}
		switch {
		case r.LeaseTTL < 0:
			return bad("lease_ttl", "must be positive")
		case r.LeaseTTL != 0 && r.LeaseTTL < time.Millisecond:
			return bad("lease_ttl", "%v is shorter than 1ms", r.LeaseTTL)
		}
	}
	switch r.Mode {
	case "", Reject:
	case Suppress:
		if !windowed {
			return bad("mode", "suppress applies to windowed rules only (it reads attempted credits per window)")
		}
	default:
		return bad("mode", "%q is not one of reject, suppress", r.Mode)
	}
	switch r.Share {
	case "", Equal:
	case Demand:
		if !windowed {
			return bad("share", "demand applies to windowed rules only (it reads attempted credits per window)")
		}
	default:
		return bad("share", "%q is not one of equal, demand", r.Share)
	}
	if r.DemandFloor < 0 || r.DemandFloor > 1 || math.IsNaN(r.DemandFloor) {
		return bad("demand_floor", "%v is not within 0 and 1", r.DemandFloor)
	}
	if r.Pace && !windowed {
		return bad("pace", "applies to fixed_window and sliding_window rules only")
	}
	for _, name := range sortedKeys(r.Classes) {
		c := r.Classes[name]
		field := "classes." + name
		switch {
		case name == "":
			return bad("classes", "a class name must not be empty")
		case c.Unlimited && c.Multiplier != 0:
			return bad(field, "is either unlimited or a multiplier, not both")
		case !c.Unlimited && (!(c.Multiplier > 0) || math.IsInf(c.Multiplier, 0) || c.Multiplier > 1e6):
			return bad(field, "multiplier %v must be positive and at most 1000000 (or unlimited)", c.Multiplier)
		case !c.Unlimited && float64(r.Limit)*c.Multiplier > float64(MaxLimit):
			return bad(field, "limit × %v is over the maximum %d", c.Multiplier, MaxLimit)
		case bucket && !c.Unlimited && float64(max(r.Limit, r.Refill))*c.Multiplier > float64(MaxBucket):
			return bad(field, "max and refill × %v must stay within %d", c.Multiplier, MaxBucket)
		}
	}
	if r.Algorithm == Concurrency && len(r.Costs) > 0 {
		return bad("costs", "concurrency rules count leases, not costs; remove it")
	}
	for _, name := range sortedKeys(r.Costs) {
		c := r.Costs[name]
		field := "costs." + name
		switch {
		case name == "":
			return bad("costs", "a request type must not be empty")
		case (c.Each == 0) == (c.Per == 0):
			return bad(field, "set exactly one of each and per, at least 1")
		case c.Each > MaxCost:
			return bad(field, "each %d is over the maximum cost %d", c.Each, MaxCost)
		}
	}
	for _, key := range sortedKeys(r.Overrides) {
		field := fmt.Sprintf("overrides[%q]", key)
		lim := r.Overrides[key]
		switch {
		case key == "" || len(key) > 256:
			return bad("overrides", "key %q must be 1 to 256 bytes", key)
		case lim < 1:
			return bad(field, "limit must be at least 1")
		case lim > MaxLimit:
			return bad(field, "limit %d is over the maximum %d", lim, MaxLimit)
		case bucket && lim > MaxBucket:
			return bad(field, "max %d is over the maximum %d", lim, MaxBucket)
		case bucket && float64(r.Refill)*float64(lim)/float64(r.Limit) > float64(MaxBucket):
			return bad(field, "max %d scales refill over the maximum %d", lim, MaxBucket)
		}
		for _, name := range sortedKeys(r.Classes) {
			if c := r.Classes[name]; !c.Unlimited && float64(lim)*c.Multiplier > float64(MaxLimit) {
				return bad(field, "limit %d × class %q multiplier %v is over the maximum %d", lim, name, c.Multiplier, MaxLimit)
			}
		}
	}
	if r.MaxKeys < 0 {
		return bad("max_keys", "must not be negative")
	}
	switch {
	case r.ShareWait < 0 && r.ShareWait != NoShareWait:
		return bad("share_wait", "must not be negative (0 refuses at once)")
	case r.ShareWait > MaxShareWait:
		return bad("share_wait", "%v is over the maximum %v", r.ShareWait, MaxShareWait)
	}
	return nil
}

// validateBucket checks a token bucket's own fields and refuses the window
// fields that mean nothing to it.
func (r *Rule) validateBucket(bad func(field, format string, args ...any) error) error {
	switch {
	case r.Limit < 1:
		return bad("max", "must be at least 1")
	case r.Limit > MaxBucket:
		return bad("max", "%d is over the maximum %d", r.Limit, MaxBucket)
	case r.Refill < 1:
		return bad("refill", "must be at least 1")
	case r.Refill > MaxBucket:
		return bad("refill", "%d is over the maximum %d", r.Refill, MaxBucket)
	case r.Interval <= 0:
		return bad("interval", "must be positive, for example 1s")
	case r.Interval%time.Millisecond != 0:
		return bad("interval", "%v is not a whole number of milliseconds", r.Interval)
	case r.Interval > MaxWindow:
		return bad("interval", "%v is longer than the maximum %v", r.Interval, MaxWindow)
	case r.Initial > r.Limit:
		return bad("initial", "%d is over max %d", r.Initial, r.Limit)
	case r.Window != 0:
		return bad("window", "token_bucket rules have no window; use refill and interval")
	case r.Mode == Suppress:
		return bad("mode", "suppress applies to windowed rules only")
	case r.Share == Demand:
		return bad("share", "demand applies to windowed rules only")
	case r.Pace:
		return bad("pace", "applies to fixed_window and sliding_window rules only; a bucket paces by its refill")
	case r.LeaseTTL != 0:
		return bad("lease_ttl", "applies to concurrency rules only")
	}
	if f := float64(r.Limit) / float64(r.Refill) * float64(r.Interval); 2*f > float64(MaxWindow) {
		return bad("refill", "max/refill × interval = %v to fill the bucket; at most half of %v", time.Duration(f), MaxWindow)
	}
	return nil
}

// WindowMs returns the window length in milliseconds (0 for concurrency);
// for a token bucket, its epoch (BucketEpochMs).
func (r *Rule) WindowMs() int64 {
	if r.Algorithm == TokenBucket {
		return r.BucketEpochMs()
	}
	return r.Window.Milliseconds()
}

// QuotaMs returns the period the rule's limit applies to, in whole
// milliseconds rounded up: the window, or a token bucket's time to fill
// from empty (max/refill × interval), the w of a RateLimit-Policy.
func (r *Rule) QuotaMs() int64 {
	if r.Algorithm == TokenBucket {
		return r.bucketFillMs()
	}
	return r.WindowMs()
}

// BucketEpochMs returns a token bucket's epoch: the length of the windows
// that hold its counters, max(interval, 2 × the time to fill the bucket
// from empty), in whole milliseconds. A bucket idle for an epoch is full
// again (see docs/token-bucket.md). 0 for other algorithms.
func (r *Rule) BucketEpochMs() int64 {
	if r.Algorithm != TokenBucket || r.Refill == 0 {
		return 0
	}
	return max(r.Interval.Milliseconds(), 2*r.bucketFillMs())
}

// bucketFillMs returns ⌈max·interval/refill⌉ in milliseconds, exact in
// 128 bits, at most MaxWindow.
func (r *Rule) bucketFillMs() int64 {
	if r.Algorithm != TokenBucket || r.Refill == 0 {
		return 0
	}
	hi, lo := bits.Mul64(r.Limit, uint64(r.Interval.Milliseconds()))
	if hi >= r.Refill {
		return MaxWindow.Milliseconds() // refused by Validate
	}
	q, rem := bits.Div64(hi, lo, r.Refill)
	if rem != 0 {
		q++
	}
	return int64(min(q, uint64(MaxWindow.Milliseconds())))
}

// LimitFor returns the effective limit of key for class: the key's override
// or the rule's limit, times the class multiplier (rounded down, at least
// 1). An unlimited class reports unlimited and the unscaled limit.
func (r *Rule) LimitFor(key, class string) (limit uint64, unlimited bool, err error) {
	limit = r.Limit
	if len(r.Overrides) > 0 {
		if o, ok := r.Overrides[key]; ok {
			limit = o
		}
	}
	if class == "" {
		return limit, false, nil
	}
	c, ok := r.Classes[class]
	if !ok {
		return 0, false, requestErr("class", ErrUnknownClass, "unknown class %q for rule %q", class, r.Name)
	}
	if c.Unlimited {
		return limit, true, nil
	}
	scaled := math.Floor(float64(limit) * c.Multiplier)
	if scaled < 1 {
		scaled = 1
	}
	return uint64(scaled), false, nil
}

// Request describes what one check asks for. With neither HasCost nor Type
// it costs 1 credit; Cost 0 with HasCost is a peek that consumes nothing.
type Request struct {
	Cost    uint64
	HasCost bool
	Type    string // a request type from the rule's Costs …
	Units   uint64 // … and how many units of it
	Class   string // a class from the rule's Classes, or "" for none
}

// CostOf resolves a request's cost in credits.
func (r *Rule) CostOf(req Request) (uint64, error) {
	switch {
	case req.HasCost && req.Type != "":
		return 0, requestErr("cost", ErrBadCost, "bad cost: cost and type are mutually exclusive")
	case req.HasCost:
		if req.Cost > MaxCost {
			return 0, requestErr("cost", ErrBadCost, "bad cost: cost %d is over the maximum %d", req.Cost, MaxCost)
		}
		return req.Cost, nil
	case req.Type == "":
		return 1, nil
	}
	c, ok := r.Costs[req.Type]
	if !ok {
		return 0, requestErr("type", ErrUnknownType, "unknown request type %q for rule %q", req.Type, r.Name)
	}
	var cost uint64
	if c.Each > 0 {
		if req.Units > MaxCost/c.Each {
			return 0, requestErr("cost", ErrBadCost, "bad cost: %d units of %q cost over the maximum %d", req.Units, req.Type, MaxCost)
		}
		cost = req.Units * c.Each
	} else {
		cost = req.Units / c.Per
		if req.Units%c.Per != 0 {
			cost++
		}
		if cost > MaxCost {
			return 0, requestErr("cost", ErrBadCost, "bad cost: %d units of %q cost over the maximum %d", req.Units, req.Type, MaxCost)
		}
	}
	return cost, nil
}

// Hash returns a stable hash of the rule's full definition, so peers can
// tell whether they run the same rules.
func (r *Rule) Hash() uint64 {
	var b strings.Builder
	fmt.Fprintf(&b, "%s|%s|%d|%d|%s|%s|%g|%t|%d|%t|%d", r.Name, r.Algorithm, r.Limit, r.Window, r.Mode, r.Share, r.DemandFloor, r.Pace, r.MaxKeys, r.Shadow, r.LeaseTTL)
	if r.Algorithm == TokenBucket {
		fmt.Fprintf(&b, "|b%d/%d/%d/%t", r.Refill, r.Interval, r.Initial, r.HasInitial)
	}
	for _, k := range sortedKeys(r.Classes) {
		fmt.Fprintf(&b, "|c%q=%g/%t", k, r.Classes[k].Multiplier, r.Classes[k].Unlimited)
	}
	for _, k := range sortedKeys(r.Costs) {
		fmt.Fprintf(&b, "|t%q=%d/%d", k, r.Costs[k].Each, r.Costs[k].Per)
	}
	for _, k := range sortedKeys(r.Overrides) {
		fmt.Fprintf(&b, "|o%q=%d", k, r.Overrides[k])
	}
	if r.ShareWait != 0 {
		// Only when set, so that rules without it keep the hash they
		// had before the field existed (a rolling upgrade shows no
		// mismatch).
		fmt.Fprintf(&b, "|sw=%d", r.ShareWait)
	}
	return fnv64(b.String())
}

// HashRules combines the hashes of a rule set, independent of order.
func HashRules(rules []Rule) uint64 {
	hs := make([]uint64, len(rules))
	for i := range rules {
		hs[i] = rules[i].Hash()
	}
	sort.Slice(hs, func(i, j int) bool { return hs[i] < hs[j] })
	var b strings.Builder
	for _, h := range hs {
		fmt.Fprintf(&b, "%016x", h)
	}
	return fnv64(b.String())
}

func fnv64(s string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 1099511628211
	}
	return h
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
