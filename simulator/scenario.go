package simulator

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/ratemesh/ratemesh/config"
	"github.com/ratemesh/ratemesh/limiter"
	"github.com/ratemesh/ratemesh/node"
)

// ErrScenario wraps every scenario parse and validation error.
var ErrScenario = errors.New("simulator: invalid scenario")

// Scenario is a parsed and validated scenario file (docs/simulator.md,
// "Scenarios"). Build one with Parse; the zero value is not runnable.
type Scenario struct {
	Name     string
	Seed     uint64
	Duration time.Duration
	// Nodes is the number of nodes at the start.
	Nodes   int
	Network Network
	Mesh    node.CoreConfig // durations and policy; Peer, Incarnation, Rules unset
	// PublishGap is the nodes' leading edge (mesh.publish_gap; the
	// runtime's node.Config.PublishGap; edge.go): the least time between
	// two batches of a node with own changes to publish. 0, unless the
	// scenario sets it: the runtime's default, node.PublishGap of the
	// members the node counts (sync_interval/2, stretched toward
	// sync_interval in a large mesh). Negative: no leading edge, the
	// nodes publish on their sync tick alone.
	PublishGap time.Duration
	Rules      []limiter.Rule // normalised
	// Warnings name rule settings that do not apply and are ignored
	// (config.ParseRules).
	Warnings  []string
	Workloads []Workload
	// Events are sorted by At (stable: file order within one instant).
	Events []Event
	Churn  *Churn
}

// Network is the simulated network.
type Network struct {
	// Latency plus a uniform draw in [0, Jitter) is each delivery's delay,
	// rounded up to whole milliseconds (at least 1 ms).
	Latency, Jitter time.Duration
	// Loss is the probability that one receiver misses one gossip message.
	Loss float64
}

// Churn crashes Fraction of the live nodes (at least one) every Every, and
// restarts each DownFor later.
type Churn struct {
	Every, DownFor time.Duration
	Fraction       float64
}

// KeyDist is how a workload picks its keys: uniform, or zipf with exponent S.
type KeyDist struct {
	Zipf bool
	S    float64
}

// NodeDist is how a workload picks the node a request goes to.
type NodeDist struct {
	// Kind is "uniform", "single" or "skew".
	Kind string
	// Node is the node of "single" (a node index; "single" alone is the
	// workload's first node).
	Node int
	// Fraction of the requests goes to the first K nodes of the pool
	// ("skew:F:K"); the rest is spread uniformly over the others.
	Fraction float64
	K        int
}

// Workload is one stream of requests against one rule.
type Workload struct {
	Rule string
	// Rate is requests per second summed over all nodes (Poisson).
	Rate float64
	// Keys are named "w<i>-k<j>" (i the workload index, j < Keys), so
	// workloads never share keys.
	Keys     int
	KeyDist  KeyDist
	NodeDist NodeDist
	// Nodes restricts the pool of nodes the requests go to; nil means every
	// node present (joined nodes included, departed ones excluded).
	Nodes []int
	// WellBehaved caps each key's offered credits at its limit per true
	// window; rejections of its requests are false rejections.
	WellBehaved bool
	// Cost is the credits of each request (default 1); Class a class of the
	// rule, or "".
	Cost  uint64
	Class string
	// Type and Units, when Type is set, are each request's type from the
	// rule's costs and its units; the core resolves the cost (Cost holds
	// the resolved credits for the accounting).
	Type  string
	Units uint64
	// Hold and Crash drive a concurrency rule's workload (leases.go): each
	// arrival is a client that holds its lease for an exponential time of
	// mean Hold, renewing it every lease_ttl/3, then releases it, or, with
	// probability Crash, vanishes without releasing.
	Hold  time.Duration
	Crash float64
}

// EventKind names what an Event does.
type EventKind string

// The event kinds.
const (
	EvSkew      EventKind = "skew"
	EvPartition EventKind = "partition"
	EvHeal      EventKind = "heal"
	EvCrash     EventKind = "crash"
	EvRestart   EventKind = "restart"
	EvJoin      EventKind = "join"
	EvLeave     EventKind = "leave"
	EvRate      EventKind = "rate"
)

// Event is one scripted event.
type Event struct {
	At   time.Duration
	Kind EventKind
	// Nodes: skew, crash, restart, leave.
	Nodes []int
	// Groups: partition. Nodes named in no group form one more group.
	Groups [][]int
	// Count: join.
	Count int
	// Spread (each node a uniform offset in ±Spread) or By (exactly): skew.
	Spread, By time.Duration
	HasBy      bool
	// Workload, and Rate and/or NodeDist when set: rate.
	Workload    int
	Rate        float64
	HasRate     bool
	NodeDist    NodeDist
	HasNodeDist bool
}

type rawScenario struct {
	Name     string        `yaml:"name"`
	Seed     *int64        `yaml:"seed"`
	Duration string        `yaml:"duration"`
	Nodes    *int          `yaml:"nodes"`
	Network  rawNetwork    `yaml:"network"`
	Mesh     yaml.Node     `yaml:"mesh"`  // config.ParseMesh
	Rules    yaml.Node     `yaml:"rules"` // config.ParseRules
	Workload []rawWorkload `yaml:"workload"`
	Events   []rawEvent    `yaml:"events"`
	Churn    *rawChurn     `yaml:"churn"`
}

type rawNetwork struct {
	Latency string   `yaml:"latency"`
	Jitter  string   `yaml:"jitter"`
	Loss    *float64 `yaml:"loss"`
}

type rawWorkload struct {
	Rule        string    `yaml:"rule"`
	Rate        *float64  `yaml:"rate"`
	Keys        *int      `yaml:"keys"`
	KeyDist     string    `yaml:"key_dist"`
	NodeDist    string    `yaml:"node_dist"`
	Nodes       yaml.Node `yaml:"nodes"`
	WellBehaved bool      `yaml:"well_behaved"`
	Cost        *int64    `yaml:"cost"`
	Class       string    `yaml:"class"`
	Type        string    `yaml:"type"`
	Units       *int64    `yaml:"units"`
	Hold        string    `yaml:"hold"`
	Crash       *float64  `yaml:"crash"`
}

type rawSkew struct {
	Nodes  yaml.Node `yaml:"nodes"`
	Spread string    `yaml:"spread"`
	By     string    `yaml:"by"`
}

type rawRate struct {
	Rule     string   `yaml:"rule"`
	Workload *int     `yaml:"workload"`
	Rate     *float64 `yaml:"rate"`
	NodeDist string   `yaml:"node_dist"`
}

type rawEvent struct {
	At        string      `yaml:"at"`
	Skew      *rawSkew    `yaml:"skew"`
	Partition []yaml.Node `yaml:"partition"`
	Heal      *bool       `yaml:"heal"`
	Crash     yaml.Node   `yaml:"crash"`
	Restart   yaml.Node   `yaml:"restart"`
	Join      *int        `yaml:"join"`
	Leave     yaml.Node   `yaml:"leave"`
	Rate      *rawRate    `yaml:"rate"`
}

type rawChurn struct {
	Every    string   `yaml:"every"`
	Fraction *float64 `yaml:"fraction"`
	DownFor  string   `yaml:"down_for"`
}

// errf returns a scenario error naming field.
func errf(field, format string, args ...any) error {
	return fmt.Errorf("%w: %s: %s", ErrScenario, field, fmt.Sprintf(format, args...))
}

var lineRE = regexp.MustCompile(`line (\d+)`)

// Parse reads a scenario from YAML. Unknown fields and impossible values
// are errors that name the field. The mesh section and the rules are a
// config file's, read by package config (config.ParseMesh,
// config.ParseRules): the same schema and the same errors, naming the path
// and the line (rules[0] "api": limit: line 5: …); the mesh section adds
// join_timeout, local_clock and publish_gap.
func Parse(data []byte) (*Scenario, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var raw rawScenario
	if err := dec.Decode(&raw); err != nil {
		return nil, fmt.Errorf("%w: %s", ErrScenario, withLines(err.Error(), data))
	}
	return raw.build()
}

// withLines quotes the source line of every "line N" a YAML error names, so
// a type error shows the field it is about.
func withLines(msg string, data []byte) string {
	lines := strings.Split(string(data), "\n")
	msg = strings.NewReplacer(
		"in type simulator.rawScenario", "in a scenario",
		"in type simulator.rawNetwork", "in network",
		"in type simulator.rawWorkload", "in a workload",
		"in type simulator.rawEvent", "in an event",
		"in type simulator.rawSkew", "in a skew event",
		"in type simulator.rawRate", "in a rate event",
		"in type simulator.rawChurn", "in churn",
	).Replace(msg)
	return lineRE.ReplaceAllStringFunc(msg, func(m string) string {
		n, err := strconv.Atoi(m[len("line "):])
		if err != nil || n < 1 || n > len(lines) {
			return m
		}
		return fmt.Sprintf("%s (%q)", m, strings.TrimSpace(lines[n-1]))
	})
}

func parseDur(field, s string, def time.Duration, allowZero bool) (time.Duration, error) {
	if s == "" {
		return def, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, errf(field, "%q is not a duration like 20ms or 1s", s)
	}
	if d < 0 || (d == 0 && !allowZero) {
		return 0, errf(field, "%v must be positive", d)
	}
	return d, nil
}

func finite(f float64) bool { return !math.IsNaN(f) && !math.IsInf(f, 0) }

func (raw *rawScenario) build() (*Scenario, error) {
	s := &Scenario{Name: raw.Name, Seed: 1}
	var err error
	if s.Name == "" {
		return nil, errf("name", "must be set")
	}
	if raw.Seed != nil {
		if *raw.Seed < 0 {
			return nil, errf("seed", "%d must not be negative", *raw.Seed)
		}
		s.Seed = uint64(*raw.Seed)
	}
	if raw.Duration == "" {
		return nil, errf("duration", "must be set, for example 60s")
	}
	if s.Duration, err = parseDur("duration", raw.Duration, 0, false); err != nil {
		return nil, err
	}
	if s.Duration%time.Millisecond != 0 || s.Duration > 24*time.Hour {
		return nil, errf("duration", "%v must be whole milliseconds, at most 24h", s.Duration)
	}
	if raw.Nodes == nil {
		return nil, errf("nodes", "must be set")
	}
	if s.Nodes = *raw.Nodes; s.Nodes < 1 || s.Nodes > 100000 {
		return nil, errf("nodes", "%d must be within 1 and 100000", s.Nodes)
	}
	if err := raw.buildNetwork(s); err != nil {
		return nil, err
	}
	if err := raw.buildMesh(s); err != nil {
		return nil, err
	}
	if err := raw.buildRules(s); err != nil {
		return nil, err
	}
	if err := raw.buildEvents(s); err != nil {
		return nil, err
	}
	if err := raw.buildWorkloads(s); err != nil {
		return nil, err
	}
	if err := raw.buildRateEvents(s); err != nil {
		return nil, err
	}
	if raw.Churn != nil {
		c := &Churn{}
		if raw.Churn.Every == "" {
			return nil, errf("churn.every", "must be set")
		}
		if c.Every, err = parseDur("churn.every", raw.Churn.Every, 0, false); err != nil {
			return nil, err
		}
		if raw.Churn.DownFor == "" {
			return nil, errf("churn.down_for", "must be set")
		}
		if c.DownFor, err = parseDur("churn.down_for", raw.Churn.DownFor, 0, false); err != nil {
			return nil, err
		}
		if raw.Churn.Fraction == nil {
			return nil, errf("churn.fraction", "must be set")
		}
		if c.Fraction = *raw.Churn.Fraction; !(c.Fraction > 0 && c.Fraction <= 1) {
			return nil, errf("churn.fraction", "%v must be within (0, 1]", c.Fraction)
		}
		if c.Every < time.Millisecond || c.DownFor < time.Millisecond {
			return nil, errf("churn", "every and down_for must be at least 1ms")
		}
		s.Churn = c
	}
	return s, nil
}

func (raw *rawScenario) buildNetwork(s *Scenario) error {
	var err error
	n := raw.Network
	if s.Network.Latency, err = parseDur("network.latency", n.Latency, 0, true); err != nil {
		return err
	}
	if s.Network.Jitter, err = parseDur("network.jitter", n.Jitter, 0, true); err != nil {
		return err
	}
	if s.Network.Latency+s.Network.Jitter > 10*time.Second {
		return errf("network.latency", "latency plus jitter %v is over 10s", s.Network.Latency+s.Network.Jitter)
	}
	if n.Loss != nil {
		if s.Network.Loss = *n.Loss; !(s.Network.Loss >= 0 && s.Network.Loss < 1) {
			return errf("network.loss", "%v must be within [0, 1)", s.Network.Loss)
		}
	}
	return nil
}

// buildMesh reads the mesh section as a config file's (config.ParseMesh),
// over node's defaults, plus the simulator's own keys: join_timeout
// (a config file's node.join_timeout), local_clock
// (node.CoreConfig.LocalClock) and publish_gap (node.Config.PublishGap,
// not a config-file key; see publishGapField). namespace does not apply:
// the simulator runs one mesh.
func (raw *rawScenario) buildMesh(s *Scenario) error {
	cfg := node.DefaultCoreConfig()
	if hasKey(&raw.Mesh, "namespace") {
		return errf("mesh.namespace", "does not apply: the simulator runs one mesh")
	}
	var gap time.Duration
	m, err := config.ParseMesh(&raw.Mesh, config.Default().Mesh, map[string]config.Field{
		"join_timeout": config.DurationField(&cfg.JoinTimeout),
		"local_clock":  config.BoolField(&cfg.LocalClock),
		"publish_gap":  publishGapField(&gap),
	})
	if err != nil {
		return fmt.Errorf("%w: %w", ErrScenario, err)
	}
	cfg.MeshConfig = m.MeshConfig
	s.PublishGap = max(gap, -1) // 0: the runtime's default
	if cfg.JoinTimeout <= 0 {
		return errf("mesh.join_timeout", "must be positive, got %v", cfg.JoinTimeout)
	}
	if cfg.SyncInterval%time.Millisecond != 0 {
		return errf("mesh.sync_interval", "%v must be whole milliseconds", cfg.SyncInterval)
	}
	s.Mesh = cfg
	return nil
}

// publishGapField decodes mesh.publish_gap into dst: a duration such as
// 10ms, 0 for the runtime's default (node.PublishGap), or tick (stored as
// −1) or a negative duration for no leading edge, as
// node.Config.PublishGap reads a negative one.
func publishGapField(dst *time.Duration) config.Field {
	return func(v *yaml.Node, path string) error {
		if v.Kind == yaml.ScalarNode && v.Tag == "!!str" && v.Value == "tick" {
			*dst = -1
			return nil
		}
		d, err := time.ParseDuration(v.Value)
		if v.Kind != yaml.ScalarNode || err != nil || (v.Tag != "!!str" && v.Value != "0") {
			return fmt.Errorf("%s: line %d: must be a duration such as 10ms, 0 (the runtime's default) or tick (no leading edge), got %q", path, v.Line, v.Value)
		}
		*dst = d
		return nil
	}
}

// buildRules reads the rules as a config file's (config.ParseRules).
func (raw *rawScenario) buildRules(s *Scenario) error {
	if raw.Rules.Kind == 0 {
		return errf("rules", "at least one rule is needed")
	}
	rules, warnings, err := config.ParseRules(&raw.Rules)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrScenario, err)
	}
	if len(rules) == 0 {
		return errf("rules", "at least one rule is needed")
	}
	s.Rules, s.Warnings = rules, warnings
	return nil
}

// hasKey reports whether mapping m holds key.
func hasKey(m *yaml.Node, key string) bool {
	for k := 0; m.Kind == yaml.MappingNode && k+1 < len(m.Content); k += 2 {
		if m.Content[k].Value == key {
			return true
		}
	}
	return false
}

func (s *Scenario) rule(name string) (*limiter.Rule, bool) {
	for i := range s.Rules {
		if s.Rules[i].Name == name {
			return &s.Rules[i], true
		}
	}
	return nil, false
}

// total returns how many nodes ever exist: the initial ones and every join.
func (s *Scenario) total() int {
	n := s.Nodes
	for _, e := range s.Events {
		if e.Kind == EvJoin {
			n += e.Count
		}
	}
	return n
}

func (raw *rawScenario) buildEvents(s *Scenario) error {
	type timed struct {
		at  time.Duration
		i   int
		raw rawEvent
	}
	evs := make([]timed, len(raw.Events))
	for i, re := range raw.Events {
		field := fmt.Sprintf("events[%d].at", i)
		if re.At == "" {
			return errf(field, "must be set")
		}
		at, err := parseDur(field, re.At, 0, true)
		if err != nil {
			return err
		}
		if at%time.Millisecond != 0 || at >= s.Duration {
			return errf(field, "%v must be whole milliseconds within the duration %v", at, s.Duration)
		}
		evs[i] = timed{at, i, re}
	}
	sort.SliceStable(evs, func(a, b int) bool { return evs[a].at < evs[b].at })
	present := s.Nodes // nodes that exist at each event, in time order
	for _, te := range evs {
		re := te.raw
		field := fmt.Sprintf("events[%d]", te.i)
		e := Event{At: te.at}
		kinds := 0
		nodes := func(name string, n *yaml.Node) error {
			kinds++
			e.Kind = EventKind(name)
			var err error
			e.Nodes, err = parseNodes(field+"."+name, n, present)
			if err == nil && len(e.Nodes) == 0 {
				err = errf(field+"."+name, "names no node")
			}
			return err
		}
		if re.Skew != nil {
			kinds++
			e.Kind = EvSkew
			var err error
			if e.Nodes, err = parseNodes(field+".skew.nodes", &re.Skew.Nodes, present); err != nil {
				return err
			}
			if len(e.Nodes) == 0 {
				return errf(field+".skew.nodes", "must name nodes")
			}
			if (re.Skew.Spread == "") == (re.Skew.By == "") {
				return errf(field+".skew", "set exactly one of spread and by")
			}
			if re.Skew.Spread != "" {
				if e.Spread, err = parseDur(field+".skew.spread", re.Skew.Spread, 0, true); err != nil {
					return err
				}
			} else {
				d, err := time.ParseDuration(re.Skew.By)
				if err != nil {
					return errf(field+".skew.by", "%q is not a duration like -120ms", re.Skew.By)
				}
				e.By, e.HasBy = d, true
			}
			if e.Spread > time.Hour || e.By > time.Hour || e.By < -time.Hour {
				return errf(field+".skew", "an offset beyond one hour is not simulated")
			}
		}
		if len(re.Partition) > 0 {
			kinds++
			e.Kind = EvPartition
			seen := map[int]bool{}
			for g := range re.Partition {
				gf := fmt.Sprintf("%s.partition[%d]", field, g)
				grp, err := parseNodes(gf, &re.Partition[g], present)
				if err != nil {
					return err
				}
				for _, n := range grp {
					if seen[n] {
						return errf(gf, "node %d is in two groups", n)
					}
					seen[n] = true
				}
				e.Groups = append(e.Groups, grp)
			}
			if len(e.Groups) < 2 && len(seen) == present {
				return errf(field+".partition", "needs at least two groups")
			}
		}
		if re.Heal != nil {
			kinds++
			e.Kind = EvHeal
			if !*re.Heal {
				return errf(field+".heal", "must be true")
			}
		}
		for _, f := range []struct {
			name string
			n    *yaml.Node
		}{{"crash", &re.Crash}, {"restart", &re.Restart}, {"leave", &re.Leave}} {
			if f.n.Kind != 0 {
				if err := nodes(f.name, f.n); err != nil {
					return err
				}
			}
		}
		if re.Join != nil {
			kinds++
			e.Kind = EvJoin
			if e.Count = *re.Join; e.Count < 1 || e.Count > 100000 {
				return errf(field+".join", "%d must be within 1 and 100000", e.Count)
			}
			present += e.Count
		}
		if re.Rate != nil {
			kinds++
			e.Kind = EvRate // resolved in buildRateEvents, once workloads are known
			e.Workload = te.i
		}
		if kinds != 1 {
			return errf(field, "set exactly one of skew, partition, heal, crash, restart, join, leave, rate")
		}
		s.Events = append(s.Events, e)
	}
	return nil
}

func (raw *rawScenario) buildRateEvents(s *Scenario) error {
	for k := range s.Events {
		e := &s.Events[k]
		if e.Kind != EvRate {
			continue
		}
		i := e.Workload
		rr := raw.Events[i].Rate
		field := fmt.Sprintf("events[%d].rate", i)
		switch {
		case rr.Workload != nil:
			if *rr.Workload < 0 || *rr.Workload >= len(s.Workloads) {
				return errf(field+".workload", "%d names no workload (there are %d)", *rr.Workload, len(s.Workloads))
			}
			e.Workload = *rr.Workload
			if rr.Rule != "" && rr.Rule != s.Workloads[e.Workload].Rule {
				return errf(field+".rule", "%q is not workload %d's rule", rr.Rule, e.Workload)
			}
		case rr.Rule != "":
			e.Workload = -1
			for w := range s.Workloads {
				if s.Workloads[w].Rule == rr.Rule && !s.Workloads[w].WellBehaved {
					e.Workload = w
					break
				}
			}
			if e.Workload < 0 {
				return errf(field+".rule", "%q has no workload that is not well_behaved (name one with workload:)", rr.Rule)
			}
		default:
			return errf(field, "set rule or workload")
		}
		if rr.Rate != nil {
			if e.Rate = *rr.Rate; !(e.Rate >= 0) || !finite(e.Rate) || e.Rate > 1e9 {
				return errf(field+".rate", "%v must be within 0 and 1e9", e.Rate)
			}
			e.HasRate = true
		}
		if rr.NodeDist != "" {
			w := s.Workloads[e.Workload]
			nd, err := parseNodeDist(field+".node_dist", rr.NodeDist, w.Nodes, s.total())
			if err != nil {
				return err
			}
			e.NodeDist, e.HasNodeDist = nd, true
		}
		if !e.HasRate && !e.HasNodeDist {
			return errf(field, "set rate or node_dist")
		}
		if e.HasRate && s.Workloads[e.Workload].WellBehaved {
			w := s.Workloads[e.Workload]
			w.Rate = e.Rate
			if err := s.checkWellBehaved(field+".rate", &w); err != nil {
				return err
			}
		}
	}
	return nil
}

func (raw *rawScenario) buildWorkloads(s *Scenario) error {
	if len(raw.Workload) == 0 {
		return errf("workload", "at least one workload is needed")
	}
	total := s.total()
	for i, rw := range raw.Workload {
		field := fmt.Sprintf("workload[%d]", i)
		w := Workload{Rule: rw.Rule, Keys: 1, Cost: 1, Class: rw.Class, WellBehaved: rw.WellBehaved}
		r, ok := s.rule(rw.Rule)
		if !ok {
			return errf(field+".rule", "%q is not a rule of this scenario", rw.Rule)
		}
		if err := buildLease(field, rw, r, &w); err != nil { // leases.go
			return err
		}
		if rw.Rate == nil {
			return errf(field+".rate", "must be set")
		}
		if w.Rate = *rw.Rate; !(w.Rate >= 0) || !finite(w.Rate) || w.Rate > 1e9 {
			return errf(field+".rate", "%v must be within 0 and 1e9", w.Rate)
		}
		if rw.Keys != nil {
			if w.Keys = *rw.Keys; w.Keys < 1 || w.Keys > 10_000_000 {
				return errf(field+".keys", "%d must be within 1 and 10000000", w.Keys)
			}
		}
		switch kd := rw.KeyDist; {
		case kd == "" || kd == "uniform":
		case strings.HasPrefix(kd, "zipf:"):
			f, err := strconv.ParseFloat(kd[len("zipf:"):], 64)
			if err != nil || !(f > 0) || f > 100 {
				return errf(field+".key_dist", "%q: the zipf exponent must be a number within (0, 100]", kd)
			}
			w.KeyDist = KeyDist{Zipf: true, S: f}
		default:
			return errf(field+".key_dist", "%q is not uniform or zipf:S", kd)
		}
		if rw.Nodes.Kind != 0 {
			nodes, err := parseNodes(field+".nodes", &rw.Nodes, total)
			if err != nil {
				return err
			}
			if len(nodes) == 0 {
				return errf(field+".nodes", "names no node")
			}
			w.Nodes = nodes
		}
		nd, err := parseNodeDist(field+".node_dist", rw.NodeDist, w.Nodes, total)
		if err != nil {
			return err
		}
		w.NodeDist = nd
		if rw.Cost != nil {
			if *rw.Cost < 1 || uint64(*rw.Cost) > r.Limit*1000 {
				return errf(field+".cost", "%d must be at least 1 and not absurdly above the limit", *rw.Cost)
			}
			w.Cost = uint64(*rw.Cost)
		}
		if err := buildType(field, rw, r, &w); err != nil { // credits.go
			return err
		}
		if w.Class != "" {
			if _, ok := r.Classes[w.Class]; !ok {
				return errf(field+".class", "%q is not a class of rule %q", w.Class, r.Name)
			}
		}
		if w.WellBehaved {
			if err := s.checkWellBehaved(field+".rate", &w); err != nil {
				return err
			}
		}
		s.Workloads = append(s.Workloads, w)
	}
	return nil
}

// checkWellBehaved refuses a well_behaved workload whose busiest key is
// offered more than its limit per window on average.
func (s *Scenario) checkWellBehaved(field string, w *Workload) error {
	r, _ := s.rule(w.Rule)
	pmax := 1 / float64(w.Keys)
	if w.KeyDist.Zipf {
		pmax = 1 / harmonic(w.Keys, w.KeyDist.S)
	}
	lim, unlimited, err := r.LimitFor("", w.Class)
	if err != nil || unlimited {
		return nil
	}
	for k := range r.Overrides {
		lim = min(lim, r.Overrides[k])
	}
	perWin := w.Rate * pmax * float64(w.Cost) * r.Window.Seconds()
	if perWin > float64(lim) {
		return errf(field, "a well_behaved workload offers its busiest key %.1f credits per window, over the limit %d", perWin, lim)
	}
	return nil
}

func harmonic(n int, s float64) float64 {
	h := 0.0
	for k := 1; k <= n; k++ {
		h += math.Pow(float64(k), -s)
	}
	return h
}

func parseNodeDist(field, s string, pool []int, total int) (NodeDist, error) {
	parts := strings.Split(s, ":")
	switch {
	case s == "" || s == "uniform":
		return NodeDist{Kind: "uniform"}, nil
	case parts[0] == "single" && len(parts) <= 2:
		nd := NodeDist{Kind: "single", Node: -1}
		if len(parts) == 2 {
			n, err := strconv.Atoi(parts[1])
			if err != nil || n < 0 || n >= total {
				return nd, errf(field, "%q: the node must be an index below %d", s, total)
			}
			if pool != nil && !containsInt(pool, n) {
				return nd, errf(field, "%q: node %d is not in the workload's nodes", s, n)
			}
			nd.Node = n
		}
		return nd, nil
	case parts[0] == "skew" && len(parts) == 3:
		f, err := strconv.ParseFloat(parts[1], 64)
		if err != nil || !(f >= 0 && f <= 1) {
			return NodeDist{}, errf(field, "%q: the fraction F of skew:F:K must be within 0 and 1", s)
		}
		k, err := strconv.Atoi(parts[2])
		size := total
		if pool != nil {
			size = len(pool)
		}
		if err != nil || k < 1 || k > size {
			return NodeDist{}, errf(field, "%q: K of skew:F:K must be within 1 and %d", s, size)
		}
		return NodeDist{Kind: "skew", Fraction: f, K: k}, nil
	}
	return NodeDist{}, errf(field, "%q is not uniform, single, single:N or skew:F:K", s)
}

func containsInt(xs []int, x int) bool {
	for _, v := range xs {
		if v == x {
			return true
		}
	}
	return false
}

// parseNodes reads a node set: an index, an inclusive range "a-b", or a
// list of either. Indices must be below present.
func parseNodes(field string, n *yaml.Node, present int) ([]int, error) {
	var out []int
	add := func(v string) error {
		v = strings.TrimSpace(v)
		lo, hi, isRange := strings.Cut(v, "-")
		a, err1 := strconv.Atoi(strings.TrimSpace(lo))
		b := a
		var err2 error
		if isRange {
			b, err2 = strconv.Atoi(strings.TrimSpace(hi))
		}
		if err1 != nil || err2 != nil || a < 0 || b < a {
			return errf(field, "%q is not a node index or an inclusive range like 0-9", v)
		}
		if b >= present {
			return errf(field, "node %d does not exist (there are %d nodes then)", b, present)
		}
		for i := a; i <= b; i++ {
			out = append(out, i)
		}
		return nil
	}
	switch n.Kind {
	case yaml.ScalarNode:
		for _, part := range strings.Split(n.Value, ",") {
			if err := add(part); err != nil {
				return nil, err
			}
		}
	case yaml.SequenceNode:
		for _, c := range n.Content {
			if c.Kind != yaml.ScalarNode {
				return nil, errf(field, "a list of node indices or ranges is expected")
			}
			if err := add(c.Value); err != nil {
				return nil, err
			}
		}
	default:
		return nil, errf(field, "a node index, range or list is expected")
	}
	sort.Ints(out)
	uniq := out[:0]
	for i, v := range out {
		if i == 0 || v != out[i-1] {
			uniq = append(uniq, v)
		}
	}
	return uniq, nil
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
