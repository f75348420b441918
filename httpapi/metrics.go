package httpapi

import (
	"regexp"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/ratemesh/ratemesh/internal/deadline"
	"github.com/ratemesh/ratemesh/limiter"
	"github.com/ratemesh/ratemesh/mesh"
	"github.com/ratemesh/ratemesh/node"
)

// metrics are the server's Prometheus metrics: the ones the handlers
// observe, and a collector that reads the node and the mesh at scrape
// time.
type metrics struct {
	decisions *prometheus.CounterVec
	latency   *prometheus.HistogramVec
	reloads   *prometheus.CounterVec
	refused   *prometheus.CounterVec
	deadlines *deadline.Metrics

	// The latency of each endpoint, and decisions' counters by rule
	// (byRule), looked up once: a vector's lookup hashes the labels and
	// takes its lock on every request.
	allowLatency, acquireLatency prometheus.Observer
	byRuleMu                     sync.Mutex // held to add a rule to byRule
	byRule                       atomic.Pointer[map[string]*ruleCounters]
}

// ruleCounters are one rule's decisions counters by result: a reason's
// at its index, "unknown" at limiter.NumReasons and "shadowed" after it,
// each set on its first use.
type ruleCounters [limiter.NumReasons + 2]atomic.Pointer[prometheus.Counter]

func newMetrics(reg *prometheus.Registry, cfg Config) *metrics {
	m := &metrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratemesh_decisions_total",
			Help: "Decisions served over the API, by rule and result (admitted, unlimited, shadowed, limit, share, cost, key_cap, joining, suppressed).",
		}, []string{"rule", "result"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "ratemesh_decision_duration_seconds",
			Help:    "Time the node took to decide one API request (allow or acquire), excluding HTTP and JSON, including a hold for its share (share_wait).",
			Buckets: []float64{1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 1e-3, 1e-2, 5e-2, 0.1, 0.25, 1},
		}, []string{"endpoint"}),
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratemesh_config_reloads_total",
			Help: "Configuration reloads by result: ok, partial (some rules kept their old version) or failed.",
		}, []string{"result"}),
		deadlines: deadline.NewMetrics("http"),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratemesh_api_refused_total",
			Help: "HTTP API requests refused by authorization, by reason: missing (no bearer token), invalid (a token the node does not hold), scope (too low a scope).",
		}, []string{"reason"}),
	}
	for _, r := range []string{"ok", "partial", "failed"} {
		m.reloads.WithLabelValues(r)
	}
	if cfg.Tokens != nil {
		for _, r := range []string{"missing", "invalid", "scope"} {
			m.refused.WithLabelValues(r)
		}
	}
	reg.MustRegister(m.decisions, m.latency, m.reloads, m.refused, m.deadlines, &stateCollector{cfg: cfg},
		goCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m.allowLatency, m.acquireLatency = m.latency.WithLabelValues("allow"), m.latency.WithLabelValues("acquire")
	m.byRule.Store(&map[string]*ruleCounters{})
	return m
}

// goCollector is the Go runtime's collector: its defaults and
// go_sched_latencies_seconds, how long goroutines waited, runnable, for a
// CPU. A process that the host starves (busy cores, a CPU limit) answers
// late whatever it does; this says so.
func goCollector() prometheus.Collector {
	return collectors.NewGoCollector(collectors.WithGoCollectorRuntimeMetrics(
		collectors.GoRuntimeMetricsRule{Matcher: regexp.MustCompile(`^/sched/latencies:seconds$`)}))
}

// decided counts one decision of rule.
func (m *metrics) decided(rule string, d node.Decision) {
	i := min(int(d.Reason), limiter.NumReasons) // "unknown" past the names
	if d.Shadow {
		i = limiter.NumReasons + 1
	}
	rc := m.counters(rule)
	c := rc[i].Load()
	if c == nil {
		result := d.Reason.String()
		if d.Shadow {
			result = "shadowed"
		}
		// Two requests may both get here: the vector hands both the
		// same counter.
		cnt := m.decisions.WithLabelValues(rule, result)
		c = &cnt
		rc[i].Store(c)
	}
	(*c).Inc()
}

// counters returns rule's decisions counters, adding them to byRule (a
// copy of the map, which is read without a lock) on the rule's first
// decision. The map holds the rules ever decided, as the vector holds
// their counters: both stay as small as the rule set's history.
func (m *metrics) counters(rule string) *ruleCounters {
	if rc, ok := (*m.byRule.Load())[rule]; ok {
		return rc
	}
	m.byRuleMu.Lock()
	defer m.byRuleMu.Unlock()
	old := *m.byRule.Load()
	if rc, ok := old[rule]; ok {
		return rc
	}
	next := make(map[string]*ruleCounters, len(old)+1)
	for k, v := range old {
		next[k] = v
	}
	rc := new(ruleCounters)
	next[rule] = rc
	m.byRule.Store(&next)
	return rc
}

var (
	descMembers  = prometheus.NewDesc("ratemesh_members", "Members this node knows, itself included, by state (alive, suspect, dead, left).", []string{"state"}, nil)
	descMismatch = prometheus.NewDesc("ratemesh_members_rules_mismatch", "Live members advertising a rules hash different from this node's.", nil, nil)
	descReady    = prometheus.NewDesc("ratemesh_ready", "1 once the node has joined and serves decisions, 0 while joining.", nil, nil)
	descFenced   = prometheus.NewDesc("ratemesh_fenced", "1 while the node denies every decision because its side of a partition holds no majority (strict policy).", nil, nil)
	descKeys     = prometheus.NewDesc("ratemesh_keys", "Keys held, by rule.", []string{"rule"}, nil)
	descWindows  = prometheus.NewDesc("ratemesh_windows", "Window counters held, by rule.", []string{"rule"}, nil)
	descEvicted  = prometheus.NewDesc("ratemesh_keys_evicted_total", "Idle keys dropped (no usage in the current or previous window).", nil, nil)
	descKeyCap   = prometheus.NewDesc("ratemesh_keys_denied_total", "Requests for a new key denied at a rule's max_keys or the node's node.max_keys with every key active (fail closed).", nil, nil)
	descOffset   = prometheus.NewDesc("ratemesh_clock_offset_seconds", "This node's estimated clock offset to the mesh.", nil, nil)
	descEntries  = prometheus.NewDesc("ratemesh_entries_dropped_total", "Received counter entries dropped by the node, by reason.", []string{"reason"}, nil)
	descFuture   = prometheus.NewDesc("ratemesh_entries_future_held_total", "Received counter entries for a window beginning beyond max_skew ahead of mesh time, held and merged once it came within.", nil, nil)
	descBytes    = prometheus.NewDesc("ratemesh_mesh_bytes_total", "Encoded batch bytes, by direction (sent, received) and channel (gossip, sync).", []string{"direction", "channel"}, nil)
	descMsgs     = prometheus.NewDesc("ratemesh_mesh_messages_total", "Batches, by direction (sent, received) and channel (gossip, sync).", []string{"direction", "channel"}, nil)
	descAlone    = prometheus.NewDesc("ratemesh_mesh_published_alone_total", "Batches not gossiped because the node had no connection (a lone member); not in ratemesh_mesh_messages_total.", nil, nil)
	descWire     = prometheus.NewDesc("ratemesh_mesh_wire_bytes_total", "Bytes carried by libp2p streams, by direction (in, out).", []string{"direction"}, nil)
	descRejected = prometheus.NewDesc("ratemesh_mesh_rejected_total", "Received batches refused by the validator, by channel and reason.", []string{"channel", "reason"}, nil)
	descDropped  = prometheus.NewDesc("ratemesh_mesh_dropped_total", "Messages dropped inside gossipsub at a full queue, by queue.", []string{"queue"}, nil)
	descRefused  = prometheus.NewDesc("ratemesh_messages_refused_total", "Received messages refused, on any channel, by reason (docs/operations.md).", []string{"reason"}, nil)
	descConnsRef = prometheus.NewDesc("ratemesh_connections_refused_total", "Connections the connection gater refused, by reason: blocked, not_member.", []string{"reason"}, nil)
	descPersist  = prometheus.NewDesc("ratemesh_persistence_errors_total", "Errors from the persistent store.", nil, nil)
	descHeld     = prometheus.NewDesc("ratemesh_share_holds_total", "Requests held for their share (share_wait) and answered, by result: admitted or denied.", []string{"result"}, nil)
	descForwards = prometheus.NewDesc("ratemesh_forwards_total", "Requests sent to another member: leases renewed or released at their owner, lottery losers' requests.", nil, nil)
)

// stateCollector reads the node and the mesh at scrape time.
type stateCollector struct{ cfg Config }

// Describe implements prometheus.Collector.
func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descMembers, descMismatch, descReady, descFenced, descKeys, descWindows, descEvicted, descKeyCap, descOffset, descEntries, descFuture, descPersist, descHeld, descForwards} {
		ch <- d
	}
	if c.cfg.Transport != nil {
		for _, d := range []*prometheus.Desc{descBytes, descMsgs, descAlone, descWire, descRejected, descDropped, descRefused, descConnsRef} {
			ch <- d
		}
	}
}

// Collect implements prometheus.Collector.
func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	n := c.cfg.Node
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	states := map[string]int{"alive": 0, "suspect": 0, "dead": 0, "left": 0}
	mismatch := 0
	for _, p := range n.Peers() {
		states[p.State.String()]++
		if !p.RulesMatch && (p.State == node.Alive || p.State == node.Suspect) {
			mismatch++
		}
	}
	for s, v := range states {
		gauge(descMembers, float64(v), s)
	}
	gauge(descMismatch, float64(mismatch))
	ready := 0.0
	if n.Ready() {
		ready = 1
	}
	gauge(descReady, ready)
	fenced := 0.0
	if n.Health() == node.HealthFenced {
		fenced = 1
	}
	gauge(descFenced, fenced)
	for _, h := range n.Keys() {
		gauge(descKeys, float64(h.Keys), h.Rule)
		gauge(descWindows, float64(h.Windows), h.Rule)
	}
	st := n.Stats()
	counter(descEvicted, st.KeysCollected)
	counter(descKeyCap, st.Decisions[limiter.ReasonKeyCap])
	gauge(descOffset, n.Offset().Seconds())
	counter(descEntries, st.DroppedExpired, "expired")
	counter(descEntries, st.DroppedFuture, "future")
	counter(descEntries, st.DroppedKeyBudget, "key_budget")
	counter(descFuture, st.FutureHeld)
	counter(descEntries, st.DroppedUnknownRule, "unknown_rule")
	counter(descEntries, st.DroppedWindowLength, "window_length")
	counter(descEntries, st.DroppedStale, "stale")
	counter(descEntries, st.RepairsSkipped, "already_merged")
	counter(descEntries, st.RelayLowering, "lowering_relay")
	counter(descPersist, st.PersistErrors)
	hs := n.HoldStats()
	counter(descHeld, hs.HeldAdmitted, "admitted")
	counter(descHeld, hs.HeldDenied, "denied")
	counter(descForwards, hs.Forwards)
	if t := c.cfg.Transport; t != nil {
		ms := t.Stats()
		counter(descBytes, ms.PublishedBytes, "sent", "gossip")
		counter(descBytes, ms.ReceivedBytes, "received", "gossip")
		counter(descBytes, ms.DirectSentBytes, "sent", "sync")
		counter(descBytes, ms.DirectReceivedBytes, "received", "sync")
		counter(descMsgs, ms.Published, "sent", "gossip")
		counter(descAlone, ms.PublishedAlone)
		counter(descMsgs, ms.Received, "received", "gossip")
		counter(descMsgs, ms.DirectSent, "sent", "sync")
		counter(descMsgs, ms.DirectReceived, "received", "sync")
		counter(descWire, ms.WireIn, "in")
		counter(descWire, ms.WireOut, "out")
		for r := mesh.Reason(0); r < mesh.NumReasons; r++ {
			counter(descRejected, ms.RejectedGossip[r], "gossip", r.String())
			counter(descRejected, ms.RejectedDirect[r], "sync", r.String())
		}
		counter(descDropped, ms.DroppedOutbound, "outbound")
		counter(descDropped, ms.DroppedValidation, "validation")
		counter(descDropped, ms.DroppedSubscriber, "subscriber")
		for r := mesh.Reason(0); r < mesh.NumReasons; r++ {
			counter(descRefused, ms.RefusedMessages[r], r.String())
		}
		for r := mesh.ConnReason(0); r < mesh.NumConnReasons; r++ {
			counter(descConnsRef, ms.RefusedConns[r], r.String())
		}
	}
}
