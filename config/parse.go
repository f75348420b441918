package config

import (
	"bytes"
	"fmt"
	"io"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/ratemesh/ratemesh/limiter"
	"github.com/ratemesh/ratemesh/node"
)

// parsedRule is one element of the file's rules: the rule, or why it is
// refused.
type parsedRule struct {
	index int
	name  string
	rule  limiter.Rule // normalised
	err   error
	// warning is a setting that does not apply and is ignored.
	warning string
}

// document is a parsed file: the node and mesh settings over the
// defaults, their errors, and each rule on its own, so that a reload can
// keep the running version of an invalid rule.
type document struct {
	cfg      Config
	errs     []error // node and mesh sections, and the rules list as a whole
	hasRules bool
	rules    []parsedRule
}

// parse reads data as YAML. It fails as a whole only when data is not one
// YAML mapping; everything else is reported per section and per rule.
func parse(data []byte) (*document, error) {
	var root yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&root); err != nil {
		if err == io.EOF {
			// An empty file: every default.
			return &document{cfg: Default()}, nil
		}
		return nil, &Error{Path: "yaml", Msg: strings.TrimPrefix(err.Error(), "yaml: "), errs: []error{ErrInvalid, ErrYAML}}
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); err != io.EOF {
		e := invalid("yaml", "the file holds more than one document")
		e.errs = append(e.errs, ErrYAML)
		return nil, e
	}
	doc := &document{cfg: Default()}
	top := root.Content[0]
	if top.Kind == yaml.ScalarNode && top.Tag == "!!null" {
		return doc, nil
	}
	if top.Kind != yaml.MappingNode {
		e := invalid("yaml", "line %d: the file must be a mapping with node, mesh and rules", top.Line)
		e.errs = append(e.errs, ErrYAML)
		return nil, e
	}
	n, m := &doc.cfg.Node, &doc.cfg.Mesh
	doc.errs = walk(top, "", fields{
		"node": func(v *yaml.Node, path string) error {
			return firstErr(walk(v, path, fields{
				"listen":             strings_(&n.Listen),
				"api":                str(&n.API),
				"data_dir":           str(&n.DataDir),
				"bootstrap":          strings_(&n.Bootstrap),
				"grpc":               str(&n.GRPC),
				"mdns":               boolean(&n.MDNS),
				"psk_file":           str(&n.PSKFile),
				"allow_peers":        strings_(&n.AllowPeers),
				"allow_peers_file":   str(&n.AllowPeersFile),
				"allow_peers_dns":    strings_(&n.AllowPeersDNS),
				"join_timeout":       duration(&n.JoinTimeout),
				"flush_interval":     duration(&n.FlushInterval),
				"persist_min_window": duration(&n.PersistMinWindow),
				"max_keys":           integer(&n.MaxKeys),
				"http": func(v *yaml.Node, path string) error {
					h := &n.HTTP
					return firstErr(walk(v, path, fields{
						"read_timeout":     duration(&h.ReadTimeout),
						"write_timeout":    duration(&h.WriteTimeout),
						"idle_timeout":     duration(&h.IdleTimeout),
						"max_header_bytes": integer(&h.MaxHeaderBytes),
						"max_conns":        integer(&h.MaxConns),
					}))
				},
			}))
		},
		"api": func(v *yaml.Node, path string) error {
			a := &doc.cfg.API
			return firstErr(walk(v, path, fields{
				"token_file":   str(&a.TokenFile),
				"tls_cert":     str(&a.TLSCert),
				"tls_key":      str(&a.TLSKey),
				"client_ca":    str(&a.ClientCA),
				"insecure":     boolean(&a.Insecure),
				"metrics_auth": boolean(&a.MetricsAuth),
			}))
		},
		"mesh": func(v *yaml.Node, path string) error {
			return firstErr(walk(v, path, meshFields(m)))
		},
		"envoy": func(v *yaml.Node, path string) error {
			e := &doc.cfg.Envoy
			return firstErr(walk(v, path, fields{
				"config":     str(&e.Config),
				"share_wait": shareWait(&e.ShareWait),
				"domains":    envoyDomains(&e.Domains),
			}))
		},
		"rules": func(v *yaml.Node, path string) error {
			doc.hasRules = true
			var err error
			doc.rules, err = parseRules(v, path)
			if err == nil && len(doc.rules) == 0 {
				err = invalid(path, "the list is empty; omit rules for the built-in default rule")
			}
			return err
		},
	})
	if len(doc.errs) == 0 {
		doc.errs = doc.cfg.validateSections()
	}
	return doc, nil
}

// meshKey is one key of the mesh section: its decoder, and the setting
// it decodes into, which ChangedSettings compares.
type meshKey struct {
	name   string
	decode Field
	value  any // a pointer into the Mesh
}

// meshKeys lists the mesh section's keys over m, in the order the file
// documents them: the one place package config names a mesh setting
// (node.MeshConfig holds its meaning, default and checks).
func meshKeys(m *Mesh) []meshKey {
	return []meshKey{
		{"namespace", str(&m.Namespace), &m.Namespace},
		{"sync_interval", duration(&m.SyncInterval), &m.SyncInterval},
		{"heartbeat", duration(&m.Heartbeat), &m.Heartbeat},
		{"repair_interval", duration(&m.RepairInterval), &m.RepairInterval},
		{"suspect_after", duration(&m.SuspectAfter), &m.SuspectAfter},
		{"dead_after", duration(&m.DeadAfter), &m.DeadAfter},
		{"evict_after", duration(&m.EvictAfter), &m.EvictAfter},
		{"reclaim_after", duration(&m.ReclaimAfter), &m.ReclaimAfter},
		{"partition_policy", policy(&m.Policy), &m.Policy},
		{"max_skew", duration(&m.MaxSkew), &m.MaxSkew},
		{"publish_budget", fraction(&m.PublishBudget), &m.PublishBudget},
	}
}

// meshFields decodes the mesh section into m.
func meshFields(m *Mesh) fields {
	keys := meshKeys(m)
	fs := make(fields, len(keys))
	for _, k := range keys {
		fs[k.name] = k.decode
	}
	return fs
}

// parseRules reads a rules list, each rule on its own; an empty list is
// no error here.
func parseRules(v *yaml.Node, path string) ([]parsedRule, error) {
	if v.Kind != yaml.SequenceNode {
		return nil, invalid(path, "line %d: must be a list of rules", v.Line)
	}
	rules := make([]parsedRule, 0, len(v.Content))
	for i, rn := range v.Content {
		rules = append(rules, parseRule(i, rn))
	}
	return rules, nil
}

// ruleYAML holds a rule's YAML fields before conversion.
type ruleYAML struct {
	name, algorithm, mode, share string
	limit                        uint64
	window, leaseTTL, shareWait  time.Duration
	demandFloor                  float64
	pace, shadow                 bool
	maxKeys                      uint64
	max, refill, initial         uint64 // token_bucket
	interval                     time.Duration
}

func parseRule(i int, rn *yaml.Node) parsedRule {
	pr := parsedRule{index: i}
	if rn.Kind == yaml.MappingNode {
		// Find the name first, so every error names the rule.
		for k := 0; k+1 < len(rn.Content); k += 2 {
			if rn.Content[k].Value == "name" && rn.Content[k+1].Kind == yaml.ScalarNode {
				pr.name = rn.Content[k+1].Value
			}
		}
	}
	path := rulePath(i, pr.name, "")
	if rn.Kind != yaml.MappingNode {
		pr.err = invalid(path, "line %d: a rule must be a mapping (name, algorithm, limit, …)", rn.Line)
		return pr
	}
	var y ruleYAML
	r := &pr.rule
	errs := walk(rn, path+":", fields{
		"name":         str(&y.name),
		"algorithm":    str(&y.algorithm),
		"limit":        uinteger(&y.limit),
		"window":       duration(&y.window),
		"mode":         str(&y.mode),
		"share":        str(&y.share),
		"demand_floor": fraction(&y.demandFloor),
		"pace":         boolean(&y.pace),
		"classes": func(v *yaml.Node, path string) error {
			if v.Kind != yaml.MappingNode {
				return invalid(path, "line %d: must be a mapping of class name to a multiplier or unlimited", v.Line)
			}
			r.Classes = make(map[string]limiter.Class)
			return firstErr(walkAny(v, path, func(name string, cv *yaml.Node, path string) error {
				if cv.Kind == yaml.ScalarNode && cv.Value == "unlimited" {
					r.Classes[name] = limiter.Class{Unlimited: true}
					return nil
				}
				var f float64
				if err := fraction(&f)(cv, path); err != nil {
					return invalid(path, "must be a positive multiplier or unlimited, got %q", cv.Value)
				}
				r.Classes[name] = limiter.Class{Multiplier: f}
				return nil
			}))
		},
		"costs": func(v *yaml.Node, path string) error {
			if v.Kind != yaml.MappingNode {
				return invalid(path, "line %d: must be a mapping of request type to {each: N} or {per: N}", v.Line)
			}
			r.Costs = make(map[string]limiter.Cost)
			return firstErr(walkAny(v, path, func(name string, cv *yaml.Node, path string) error {
				var c limiter.Cost
				err := firstErr(walk(cv, path, fields{"each": uinteger(&c.Each), "per": uinteger(&c.Per)}))
				r.Costs[name] = c
				return err
			}))
		},
		"overrides": func(v *yaml.Node, path string) error {
			if v.Kind != yaml.SequenceNode {
				return invalid(path, "line %d: must be a list of {key, limit}", v.Line)
			}
			r.Overrides = make(map[string]uint64)
			for j, ov := range v.Content {
				p := fmt.Sprintf("%s[%d]", path, j)
				var key string
				var lim uint64
				hasKey, hasLimit := false, false
				err := firstErr(walk(ov, p, fields{
					"key":   func(v *yaml.Node, path string) error { hasKey = true; return str(&key)(v, path) },
					"limit": func(v *yaml.Node, path string) error { hasLimit = true; return uinteger(&lim)(v, path) },
				}))
				switch {
				case err != nil:
					return err
				case !hasKey || key == "":
					return invalid(p+".key", "must be set")
				case !hasLimit:
					return invalid(p+".limit", "must be set")
				}
				if _, dup := r.Overrides[key]; dup {
					return invalid(p+".key", "%q is overridden twice", key)
				}
				r.Overrides[key] = lim
			}
			return nil
		},
		"max_keys":   uinteger(&y.maxKeys),
		"shadow":     boolean(&y.shadow),
		"lease_ttl":  duration(&y.leaseTTL),
		"max":        uinteger(&y.max),
		"refill":     uinteger(&y.refill),
		"interval":   duration(&y.interval),
		"initial":    uinteger(&y.initial),
		"share_wait": duration(&y.shareWait),
	})
	if len(errs) > 0 {
		pr.err = errs[0]
		return pr
	}
	if y.maxKeys > math.MaxInt32 {
		pr.err = invalid(rulePath(i, pr.name, "max_keys"), "%d is over the maximum %d", y.maxKeys, math.MaxInt32)
		return pr
	}
	r.Name, r.Algorithm, r.Limit, r.Window = y.name, limiter.Algorithm(y.algorithm), y.limit, y.window
	r.Mode, r.Share, r.DemandFloor, r.Pace = limiter.Mode(y.mode), limiter.Share(y.share), y.demandFloor, y.pace
	r.MaxKeys, r.Shadow, r.LeaseTTL, r.ShareWait = int(y.maxKeys), y.shadow, y.leaseTTL, y.shareWait
	if hasKey(rn, "share_wait") && y.shareWait == 0 {
		r.ShareWait = limiter.NoShareWait // share_wait: 0 refuses at once
	}
	r.Refill, r.Interval, r.Initial, r.HasInitial = y.refill, y.interval, y.initial, hasKey(rn, "initial")
	if err := bucketMax(rn, r, y.max); err != nil {
		pr.err = ruleErr(i, pr.name, err)
		return pr
	}
	if !r.Leased() && r.LeaseTTL != 0 {
		// The documented example sets lease_ttl on a windowed rule ("concurrency
		// only"): it does not apply there, and saying so beats refusing it.
		pr.warning = fmt.Sprintf("%s: applies to concurrency rules only; ignored for %s", rulePath(i, pr.name, "lease_ttl"), r.Algorithm)
		r.LeaseTTL = 0
	}
	if hasKey(rn, "max_keys") && y.maxKeys == 0 {
		pr.err = invalid(rulePath(i, pr.name, "max_keys"), "must be at least 1")
		return pr
	}
	if hasKey(rn, "demand_floor") && y.demandFloor == 0 {
		pr.err = invalid(rulePath(i, pr.name, "demand_floor"), "must be above 0")
		return pr
	}
	if err := r.Normalize(); err != nil {
		pr.err = ruleErr(i, pr.name, err)
	}
	return pr
}

// bucketMax moves a token bucket's max into r.Limit, which holds it, and
// refuses limit on a bucket and max elsewhere.
func bucketMax(rn *yaml.Node, r *limiter.Rule, maxCredits uint64) error {
	bad := func(field, msg string) error {
		return &limiter.RuleError{Rule: r.Name, Field: field, Msg: msg, Err: limiter.ErrInvalidRule}
	}
	if r.Algorithm != limiter.TokenBucket {
		if hasKey(rn, "max") {
			return bad("max", "applies to token_bucket rules only; use limit")
		}
		return nil
	}
	switch {
	case hasKey(rn, "limit"):
		return bad("limit", "a token_bucket rule has max, refill and interval instead")
	case !hasKey(rn, "max"):
		return bad("max", "must be set: the credits the bucket holds at most")
	}
	r.Limit = maxCredits
	return nil
}

func hasKey(m *yaml.Node, key string) bool {
	for k := 0; k+1 < len(m.Content); k += 2 {
		if m.Content[k].Value == key {
			return true
		}
	}
	return false
}

// fields maps a mapping's keys to their decoders; a decoder gets the
// value and the field's path.
type fields map[string]Field

// walk decodes mapping m with fs: an unknown or repeated key, or a value
// its decoder refuses, is an error naming the path. prefix is the
// mapping's path ("" at the top; a rule's path ends in ":").
func walk(m *yaml.Node, prefix string, fs fields) []error {
	if m.Kind == yaml.ScalarNode && m.Tag == "!!null" {
		return nil
	}
	if m.Kind != yaml.MappingNode {
		return []error{invalid(strings.TrimSuffix(prefix, ":"), "line %d: must be a mapping", m.Line)}
	}
	known := make([]string, 0, len(fs))
	for k := range fs {
		known = append(known, k)
	}
	return walkAny(m, prefix, func(key string, v *yaml.Node, path string) error {
		f, ok := fs[key]
		if !ok {
			return invalid(path, "line %d: unknown field (known: %s)", v.Line, strings.Join(sorted(known), ", "))
		}
		return f(v, path)
	})
}

// walkAny calls f for every key of mapping m, refusing repeated keys.
func walkAny(m *yaml.Node, prefix string, f func(key string, v *yaml.Node, path string) error) []error {
	var errs []error
	seen := make(map[string]bool, len(m.Content)/2)
	for k := 0; k+1 < len(m.Content); k += 2 {
		kn, v := m.Content[k], m.Content[k+1]
		key := kn.Value
		path := key
		switch {
		case prefix == "":
		case strings.HasSuffix(prefix, ":"):
			path = prefix + " " + key
		default:
			path = prefix + "." + key
		}
		if kn.Kind != yaml.ScalarNode {
			errs = append(errs, invalid(strings.TrimSuffix(prefix, ":"), "line %d: keys must be plain strings", kn.Line))
			continue
		}
		if seen[key] {
			errs = append(errs, invalid(path, "line %d: defined twice", kn.Line))
			continue
		}
		seen[key] = true
		if err := f(key, v, path); err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

func firstErr(errs []error) error {
	if len(errs) > 0 {
		return errs[0]
	}
	return nil
}

func sorted(s []string) []string {
	sort.Strings(s)
	return s
}

func scalar(v *yaml.Node, path, what string) error {
	if v.Kind != yaml.ScalarNode || v.Tag == "!!null" {
		return invalid(path, "line %d: must be %s", v.Line, what)
	}
	return nil
}

func str(dst *string) func(*yaml.Node, string) error {
	return func(v *yaml.Node, path string) error {
		if err := scalar(v, path, "a string"); err != nil {
			return err
		}
		*dst = v.Value
		return nil
	}
}

func strings_(dst *[]string) func(*yaml.Node, string) error {
	return func(v *yaml.Node, path string) error {
		if v.Kind != yaml.SequenceNode {
			return invalid(path, "line %d: must be a list of strings", v.Line)
		}
		out := make([]string, 0, len(v.Content))
		for i, e := range v.Content {
			if err := scalar(e, fmt.Sprintf("%s[%d]", path, i), "a string"); err != nil {
				return err
			}
			out = append(out, e.Value)
		}
		*dst = out
		return nil
	}
}

func boolean(dst *bool) func(*yaml.Node, string) error {
	return func(v *yaml.Node, path string) error {
		if v.Kind != yaml.ScalarNode || v.Tag != "!!bool" {
			return invalid(path, "line %d: must be true or false, got %q", v.Line, v.Value)
		}
		b, err := strconv.ParseBool(strings.ToLower(v.Value))
		if err != nil {
			return invalid(path, "line %d: must be true or false, got %q", v.Line, v.Value)
		}
		*dst = b
		return nil
	}
}

func duration(dst *time.Duration) func(*yaml.Node, string) error {
	return func(v *yaml.Node, path string) error {
		if err := scalar(v, path, "a duration such as 1s or 20ms"); err != nil {
			return err
		}
		d, err := time.ParseDuration(v.Value)
		if err != nil || (v.Tag != "!!str" && v.Value != "0") {
			return invalid(path, "line %d: must be a duration such as 1s or 20ms, got %q", v.Line, v.Value)
		}
		if d < 0 {
			return invalid(path, "line %d: must not be negative, got %v", v.Line, d)
		}
		*dst = d
		return nil
	}
}

// policy decodes a partition policy; Validate checks its value.
func policy(dst *node.Policy) func(*yaml.Node, string) error {
	return func(v *yaml.Node, path string) error {
		var p string
		if err := str(&p)(v, path); err != nil {
			return err
		}
		*dst = node.Policy(p)
		return nil
	}
}

// shareWait decodes a share_wait: a duration from 0 to
// limiter.MaxShareWait, 0 meaning limiter.NoShareWait (refuse at once), as
// a rule's share_wait reads.
func shareWait(dst *time.Duration) func(*yaml.Node, string) error {
	return func(v *yaml.Node, path string) error {
		var d time.Duration
		if err := duration(&d)(v, path); err != nil {
			return err
		}
		if d > limiter.MaxShareWait {
			return invalid(path, "line %d: %v is over the maximum %v", v.Line, d, limiter.MaxShareWait)
		}
		if d == 0 {
			d = limiter.NoShareWait
		}
		*dst = d
		return nil
	}
}

// envoyDomains decodes envoy.domains: a mapping of domain names to their
// settings.
func envoyDomains(dst *map[string]EnvoyDomain) func(*yaml.Node, string) error {
	return func(v *yaml.Node, path string) error {
		if v.Kind != yaml.MappingNode {
			return invalid(path, "line %d: must be a mapping of domains to their settings, such as {edge: {share_wait: 5ms}}", v.Line)
		}
		out := make(map[string]EnvoyDomain, len(v.Content)/2)
		errs := walkAny(v, path, func(name string, dv *yaml.Node, dpath string) error {
			if name == "" {
				return invalid(path, "line %d: a domain name must not be empty", dv.Line)
			}
			var d EnvoyDomain
			err := firstErr(walk(dv, dpath, fields{
				"share_wait": shareWait(&d.ShareWait),
			}))
			out[name] = d
			return err
		})
		if err := firstErr(errs); err != nil {
			return err
		}
		*dst = out
		return nil
	}
}

func uinteger(dst *uint64) func(*yaml.Node, string) error {
	return func(v *yaml.Node, path string) error {
		if err := scalar(v, path, "a whole number"); err != nil {
			return err
		}
		if v.Tag != "!!int" {
			return invalid(path, "line %d: must be a whole number, got %q", v.Line, v.Value)
		}
		var u uint64
		if err := v.Decode(&u); err != nil {
			if strings.HasPrefix(strings.TrimSpace(v.Value), "-") {
				return invalid(path, "line %d: must not be negative, got %s", v.Line, v.Value)
			}
			return invalid(path, "line %d: %s is not a whole number within 0 and 2^64−1", v.Line, v.Value)
		}
		*dst = u
		return nil
	}
}

// integer reads a whole number into an int; the caller checks its range.
func integer(dst *int) func(*yaml.Node, string) error {
	return func(v *yaml.Node, path string) error {
		var u uint64
		if err := uinteger(&u)(v, path); err != nil {
			return err
		}
		if u > math.MaxInt32 {
			return invalid(path, "line %d: %d is too large", v.Line, u)
		}
		*dst = int(u)
		return nil
	}
}

func fraction(dst *float64) func(*yaml.Node, string) error {
	return func(v *yaml.Node, path string) error {
		if err := scalar(v, path, "a number"); err != nil {
			return err
		}
		if v.Tag != "!!int" && v.Tag != "!!float" {
			return invalid(path, "line %d: must be a number, got %q", v.Line, v.Value)
		}
		var f float64
		if err := v.Decode(&f); err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
			return invalid(path, "line %d: must be a finite number, got %q", v.Line, v.Value)
		}
		*dst = f
		return nil
	}
}
