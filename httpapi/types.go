// Package httpapi serves a node over HTTP: the JSON API of docs/http-api.md
// (/v1/allow, /v1/wait, /v1/acquire, /v1/renew, /v1/release, /v1/usage,
// /v1/peers, /v1/peers/{peer_id}/evict, /healthz, /livez, /readyz) and
// Prometheus metrics on /metrics, from its own registry.
//
// The exported types below are the wire contract: the server encodes its
// answers with them, and clients (ratemesh check, peers, bench) encode
// AllowRequest and decode the answers with them.
//
// Errors that package node and package limiter return are typed
// (node.RequestError, node.CheckError, limiter.RequestError): the server
// answers by their fields and sentinels, never by their text.
package httpapi

// AllowRequest is the body of POST /v1/allow (single form), one element of
// its "checks" (all-or-nothing form), and the check of POST /v1/wait.
// Cost, when set, is the request's cost in credits (0 is a peek);
// otherwise Type and Units price it by the rule's cost table; neither
// means a cost of 1.
//
// MaxWaitMs is the caller's deadline on /v1/allow (single form; the
// checks form takes it beside "checks") and /v1/acquire: the answer comes
// within that many milliseconds of the request's arrival, a hold for the
// share cut to fit (see MaxWaitHeader). On /v1/wait it keeps its meaning:
// the longest the wait for an admission may last. A check of the checks
// form may not carry it.
type AllowRequest struct {
	Rule      string  `json:"rule"`
	Key       string  `json:"key"`
	Cost      *uint64 `json:"cost,omitempty"`
	Type      string  `json:"type,omitempty"`
	Units     *uint64 `json:"units,omitempty"`
	Class     string  `json:"class,omitempty"`
	MaxWaitMs *uint64 `json:"max_wait_ms,omitempty"`
}

// AllowResponse is the answer to one check. Remaining is what a retry can
// expect: the global remaining after this request when allowed, 0 when
// denied (but for reason "cost"). RetryAfterMs is 0 when allowed, −1 when
// the cost exceeds the limit and can never be admitted. Reason says why
// (limiter.Reason's names): admitted, unlimited, limit, share, cost,
// key_cap, joining or suppressed; a shadow rule's admission carries the
// reason it would have been denied for.
type AllowResponse struct {
	Allowed      bool   `json:"allowed"`
	Limit        uint64 `json:"limit"`
	Remaining    uint64 `json:"remaining"`
	ResetAfterMs int64  `json:"reset_after_ms"`
	RetryAfterMs int64  `json:"retry_after_ms"`
	Reason       string `json:"reason"`
}

// MultiAllowResponse answers the all-or-nothing form of POST /v1/allow
// ({"checks": [...]}, admitted only if every check passes, nothing
// consumed when any fails); Results come in the order of the checks.
type MultiAllowResponse struct {
	Allowed bool            `json:"allowed"`
	Results []AllowResponse `json:"results"`
}

// AcquireResponse answers POST /v1/acquire ({"rule","key","class"?}).
// LeaseID and TTLMs are set when Allowed; a denial carries RetryAfterMs,
// the earliest moment a retry could succeed as the node estimates it (at
// most the lease TTL, when a lease must end first). Remaining and Reason
// are AllowResponse's.
type AcquireResponse struct {
	Allowed      bool   `json:"allowed"`
	LeaseID      string `json:"lease_id"`
	Limit        uint64 `json:"limit"`
	Remaining    uint64 `json:"remaining"`
	TTLMs        int64  `json:"ttl_ms"`
	RetryAfterMs int64  `json:"retry_after_ms"`
	Reason       string `json:"reason"`
}

// RenewResponse answers POST /v1/renew ({"lease_id"}): the lease lives
// TTLMs from now. POST /v1/release ({"lease_id"}) answers {}.
type RenewResponse struct {
	TTLMs int64 `json:"ttl_ms"`
}

// SlotJSON is one slot's counts in a UsageResponse.
type SlotJSON struct {
	PeerID      string `json:"peer_id"`
	Incarnation uint64 `json:"incarnation"`
	Admitted    uint64 `json:"admitted"`
	Attempted   uint64 `json:"attempted"`
}

// UsageResponse answers GET /v1/usage?rule=&key=. Window is the current
// window's index (0 for concurrency rules, whose Total is the live leases).
type UsageResponse struct {
	Rule     string     `json:"rule"`
	Key      string     `json:"key"`
	Window   int64      `json:"window"`
	WindowMs int64      `json:"window_ms"`
	Total    uint64     `json:"total"`
	Slots    []SlotJSON `json:"slots"`
}

// PeerJSON is one member in a PeersResponse. State is alive, suspect,
// dead or left; LastSeenMs is the age of the last message heard (0 for
// self); Addrs are full multiaddrs ending in /p2p/<peer_id>; RulesHash is
// the member's rules hash as 16 hex digits, and RulesMatch compares it
// with this node's.
type PeerJSON struct {
	PeerID      string   `json:"peer_id"`
	Incarnation uint64   `json:"incarnation"`
	Addrs       []string `json:"addrs"`
	State       string   `json:"state"`
	LastSeenMs  int64    `json:"last_seen_ms"`
	RulesHash   string   `json:"rules_hash"`
	RulesMatch  bool     `json:"rules_match"`
	Self        bool     `json:"self"`
}

// PeersResponse answers GET /v1/peers: every member, this node included.
type PeersResponse struct {
	Peers []PeerJSON `json:"peers"`
}

// ErrorResponse is the body of every 4xx and 5xx answer. Error names the
// field at fault; Owner names the lease's owning peer on a 404 or 503 from
// /v1/renew and /v1/release that concerns it.
type ErrorResponse struct {
	Error string `json:"error"`
	Owner string `json:"owner,omitempty"`
}

// HealthResponse answers GET /healthz and GET /readyz: state "ready"
// (200), "joining" (503; also while rejoining after a partition healed),
// "fenced" (503: under the strict policy this node's side of a partition
// holds no majority of the members) or "stale" (503: under the strict
// policy the members it hears have not acknowledged its batches lately).
// GET /livez answers it with 200 in every state: the process serves.
type HealthResponse struct {
	State string `json:"state"`
}
