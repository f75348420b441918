package node

import (
	"errors"
	"time"

	"github.com/ratemesh/ratemesh/limiter"
)

// Decision is the answer to one check; see limiter.Decision.
type Decision = limiter.Decision

// Never is the RetryAfter of a request that can never be admitted: its
// cost exceeds the key's limit.
const Never = limiter.Never

// ErrBadOption is wrapped by the *RequestError returned for an option the
// call does not take, such as MaxWait given to Allow or Cost given to
// Acquire.
var ErrBadOption = errors.New("node: option does not apply")

type optKind uint8

const (
	optCost optKind = iota + 1
	optType
	optClass
	optMaxWait
)

var optNames = [...]string{optCost: "Cost", optType: "Type", optClass: "Class", optMaxWait: "MaxWait"}

// Option refines one request: Cost, Type, Class or MaxWait. Options are
// small values, not closures, so passing them allocates nothing. The zero
// Option does nothing.
type Option struct {
	kind optKind
	n    uint64
	s    string
	d    time.Duration
}

// Cost makes the request cost n credits instead of 1. A cost of 0 is a
// peek: it is decided like any other and consumes nothing.
func Cost(n uint64) Option { return Option{kind: optCost, n: n} }

// Type prices the request by the rule's cost table: units of request type
// t (a rule's costs, {each: N} or {per: N}). It excludes Cost.
func Type(t string, units uint64) Option { return Option{kind: optType, s: t, n: units} }

// Class names the client's class, which scales the key's limit by the
// rule's multiplier for it, or makes it unlimited.
func Class(c string) Option { return Option{kind: optClass, s: c} }

// MaxWait bounds how long Wait may wait in all: when the earliest possible
// admission is further away, Wait returns the denial at once.
func MaxWait(d time.Duration) Option { return Option{kind: optMaxWait, d: d} }

// which option kinds a call accepts.
const (
	acceptRequest = 1<<optCost | 1<<optType | 1<<optClass
	acceptWait    = acceptRequest | 1<<optMaxWait
	acceptLease   = 1 << optClass
)

// request folds opts into a limiter.Request and the MaxWait bound (-1 when
// none). accept is the bit set of kinds the call takes.
func request(opts []Option, accept uint) (req limiter.Request, maxWait time.Duration, err error) {
	maxWait = -1
	for i := range opts {
		o := &opts[i]
		if o.kind == 0 {
			continue
		}
		if accept&(1<<o.kind) == 0 {
			return req, maxWait, badOption(o.kind)
		}
		switch o.kind {
		case optCost:
			req.Cost, req.HasCost = o.n, true
		case optType:
			req.Type, req.Units = o.s, o.n
		case optClass:
			req.Class = o.s
		case optMaxWait:
			maxWait = max(o.d, 0)
		}
	}
	return req, maxWait, nil
}

// NewCheck builds one check of an AllowAll from the options Allow takes.
// An option Allow does not take (MaxWait) makes AllowAll fail with a
// *CheckError wrapping ErrBadOption.
func NewCheck(rule, key string, opts ...Option) Check {
	req, _, err := request(opts, acceptRequest)
	return Check{Rule: rule, Key: key, Request: req, err: err}
}
