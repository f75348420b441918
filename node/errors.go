package node

import (
	"fmt"
)

// The errors a node returns for a request it refuses are typed, so that an
// API in front of it (package httpapi) answers by their fields, not by
// their text: a *RequestError (or a *limiter.RequestError from the rule)
// names the request's field at fault and says what is wrong, a
// *CheckError names the check of an AllowAll it is about, and an
// *OwnerError the member that owns a lease. Each wraps a sentinel
// (ErrUnknownRule, ErrBadLease, limiter.ErrUnknownClass, …) for
// errors.Is.

// RequestError is a request the node refuses because of one of its
// fields: Field names it as the HTTP API spells it (rule, peer_id,
// lease_id; empty for an option, which has no field there), Msg says what
// is wrong without the package prefix, and Err is the sentinel the error
// is an instance of (ErrUnknownRule, ErrUnknownPeer, ErrBadLease,
// ErrUnknownLease, ErrOwnerUnreachable, ErrBadOption), perhaps wrapping a
// cause.
type RequestError struct {
	Field string
	Msg   string
	Err   error
}

func (e *RequestError) Error() string { return "node: " + e.Msg }

// Unwrap returns the sentinel (and the cause it may wrap).
func (e *RequestError) Unwrap() error { return e.Err }

// CheckError is AllowAll's error about one of its checks: Index is the
// check's position in the call's checks, Err what is wrong with it (a
// *RequestError, a *limiter.RequestError).
type CheckError struct {
	Index int
	Err   error
}

func (e *CheckError) Error() string { return fmt.Sprintf("checks[%d]: %v", e.Index, e.Err) }

// Unwrap returns the check's error.
func (e *CheckError) Unwrap() error { return e.Err }

func unknownRule(rule string) error {
	return &RequestError{Field: "rule", Msg: fmt.Sprintf("unknown rule %q", rule), Err: ErrUnknownRule}
}

func unknownPeer(peer string) error {
	return &RequestError{Field: "peer_id", Msg: fmt.Sprintf("unknown peer %q", peer), Err: ErrUnknownPeer}
}

// badLease is a malformed lease ID; cause, if not nil, is wrapped too.
func badLease(id string, cause error, format string, args ...any) error {
	err := ErrBadLease
	if cause != nil {
		err = fmt.Errorf("%w: %w", ErrBadLease, cause)
	}
	return &RequestError{Field: "lease_id", Msg: fmt.Sprintf("malformed lease ID: %q: ", id) + fmt.Sprintf(format, args...), Err: err}
}

// leaseErr is a lease the node cannot renew or release: sentinel is
// ErrUnknownLease or ErrOwnerUnreachable; cause, if not nil, is wrapped
// too.
func leaseErr(sentinel, cause error, format string, args ...any) error {
	err := sentinel
	if cause != nil {
		err = fmt.Errorf("%w: %w", sentinel, cause)
	}
	return &RequestError{Field: "lease_id", Msg: fmt.Sprintf(format, args...), Err: err}
}

// badOption is an option the call does not take.
func badOption(k optKind) error {
	return &RequestError{Msg: "option does not apply: " + optNames[k], Err: ErrBadOption}
}
