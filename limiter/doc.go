// Package limiter holds ratemesh's rules and the decision math: the
// algorithms (fixed window, sliding window, token bucket, concurrency),
// costs, classes and overrides, and the rule that decides a request
// locally from the merged CRDT counters — the projection of this member's
// unacknowledged usage over the N live members, the lottery for a share
// smaller than a request, demand shares, suppression, pacing — and the
// time until a retry could succeed (docs/design.md, "The decision rule").
//
// It is pure: time (mesh time in Unix milliseconds) and the membership
// come in as an Env, the counters live in a crdt.Container the caller
// merges into, and nothing here reads a clock, draws from a global source
// or does I/O. Package node drives one Limiter per rule:
//
//	l, err := limiter.New(rule, container, self) // rule normalised and validated
//	env := limiter.Env{NowMs: meshMs, Members: n, Rank: rank, AckDelay: ack}
//	d, err := l.Allow(key, limiter.Request{Class: "payer"}, env)
//	// or, for several checks decided as one (node.AllowAll):
//	ch, err := l.Resolve(key, req)
//	d = l.Decide(ch, env)           // records nothing
//	l.Record(ch, d.Allowed, env.NowMs)
//
// A denial is a Decision with Allowed false and a Reason; errors are for
// bad requests (a *RequestError naming the field) and bad rules (a
// *RuleError). A Limiter is not safe for concurrent use: its owner
// serialises the calls (package node holds its mutex).
package limiter
