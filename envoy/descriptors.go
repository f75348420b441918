package envoy

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"gopkg.in/yaml.v3"

	"github.com/ratemesh/ratemesh/limiter"
)

// ErrInvalid is wrapped by every error about a descriptor file's content.
var ErrInvalid = errors.New("envoy: invalid rate limit configuration")

// RulePrefix starts the name of every rule generated from descriptor
// files; a rule of the ratemesh config may not use it.
const RulePrefix = "envoy:"

// OverLimitClass is the unlimited class of every generated rule. A request
// that is denied because the limit is reached is still counted through it,
// as envoyproxy/ratelimit's Redis INCRBY counts hits over the limit.
const OverLimitClass = "over_limit"

// units maps envoyproxy/ratelimit's units to their lengths. MONTH and
// YEAR are fixed lengths, as in the reference (30 and 365 days). Windows
// are aligned to the Unix epoch in both.
var units = map[rlspb.RateLimitResponse_RateLimit_Unit]time.Duration{
	rlspb.RateLimitResponse_RateLimit_SECOND: time.Second,
	rlspb.RateLimitResponse_RateLimit_MINUTE: time.Minute,
	rlspb.RateLimitResponse_RateLimit_HOUR:   time.Hour,
	rlspb.RateLimitResponse_RateLimit_DAY:    24 * time.Hour,
	rlspb.RateLimitResponse_RateLimit_WEEK:   7 * 24 * time.Hour,
	rlspb.RateLimitResponse_RateLimit_MONTH:  30 * 24 * time.Hour,
	rlspb.RateLimitResponse_RateLimit_YEAR:   365 * 24 * time.Hour,
}

// File is one descriptor file: its name (as errors should show it) and
// its content.
type File struct {
	Name string
	Data []byte
}

// Limit is an entry's rate_limit block.
type Limit struct {
	RequestsPerUnit uint32
	Unit            rlspb.RateLimitResponse_RateLimit_Unit
	// UnitMultiplier makes the window Unit × UnitMultiplier long (0: 1).
	UnitMultiplier uint32
	Unlimited      bool
	Name           string
	Replaces       []string
}

// Window returns the limit's window length.
func (l *Limit) Window() time.Duration {
	m := time.Duration(max(l.UnitMultiplier, 1))
	return units[l.Unit] * m
}

// Entry is one descriptor of a file: a key, an optional value (ending in
// '*' for a prefix match), an optional rate limit and nested descriptors.
// It is read-only once loaded.
type Entry struct {
	Key, Value string
	// Limit is nil for an entry without a rate_limit block: a descriptor
	// ending there is OK without a limit (whitelisted).
	Limit          *Limit
	ShadowMode     bool
	DetailedMetric bool
	ValueToMetric  bool
	ShareThreshold bool
	// FullKey is envoyproxy/ratelimit's name of the entry:
	// domain.key1_value1.subkey1.
	FullKey string
	// Rule is the name of the ratemesh rule that counts the entry's
	// descriptors; empty when nothing is counted (no limit, unlimited, or
	// 0 requests per unit).
	Rule string
	// File and Line locate the entry.
	File string
	Line int

	finalKey string // key, or key_value
	// plainStat: no entry from the domain to this one asks for
	// value_to_metric (without share_threshold), so that a match's
	// statistics key is FullKey unless this one asks for detailed_metric.
	plainStat bool
	id        string // see pathID
	children  map[string]*Entry
	wildcards []string // children's final keys ending in '*', in file order
}

// wildcard reports whether e matches by prefix.
func (e *Entry) wildcard() bool { return strings.HasSuffix(e.finalKey, "*") }

// Descriptors is a loaded set of envoyproxy/ratelimit configuration files:
// one tree of entries per domain, and the ratemesh rules that count them.
// It is read-only once loaded and safe for concurrent use; the zero value
// (or nil) has no domain, so every descriptor is OK.
type Descriptors struct {
	domains map[string]*Entry
	rules   []limiter.Rule
	// ruleDomains holds the domain of each of rules.
	ruleDomains []string
	files       []string
	entries     int
}

// Load reads path, a descriptor file or a directory whose *.yaml files
// (not recursing) are read in name order, like envoyproxy/ratelimit's
// runtime directory.
func Load(path string) (*Descriptors, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("envoy config: %w", err)
	}
	names := []string{path}
	if st.IsDir() {
		names, err = filepath.Glob(filepath.Join(path, "*.yaml"))
		if err != nil {
			return nil, fmt.Errorf("envoy config %s: %w", path, err)
		}
		sort.Strings(names)
		if len(names) == 0 {
			return nil, fmt.Errorf("%w: envoy config %s: the directory holds no *.yaml file", ErrInvalid, path)
		}
	}
	files := make([]File, 0, len(names))
	for _, n := range names {
		data, err := os.ReadFile(n)
		if err != nil {
			return nil, fmt.Errorf("envoy config: %w", err)
		}
		files = append(files, File{Name: n, Data: data})
	}
	return Parse(files...)
}

// Parse loads files, refusing what envoyproxy/ratelimit refuses: bad
// YAML, keys that are not strings or not known (a misspelled field), lists
// of something other than mappings, an empty domain or key, a domain in
// two files, a duplicate key/value at one level, an invalid unit, a unit
// on an unlimited limit, empty or self replaces, share_threshold on a
// value that is not a wildcard. Errors wrap ErrInvalid and name the file,
// the line and the entry.
func Parse(files ...File) (*Descriptors, error) {
	d := &Descriptors{domains: make(map[string]*Entry)}
	domainFile := make(map[string]string)
	for _, f := range files {
		p := &parser{file: f.Name}
		root, err := p.file_(f.Data)
		if err != nil {
			return nil, err
		}
		if root == nil {
			continue // an empty file
		}
		if prev, dup := domainFile[root.Key]; dup {
			return nil, p.errf(root.Line, "", "duplicate domain '%s' in config file (also in %s)", root.Key, prev)
		}
		domainFile[root.Key] = f.Name
		d.domains[root.Key] = root
		d.files = append(d.files, f.Name)
	}
	d.nameRules()
	return d, nil
}

// Domains returns the loaded domains, sorted.
func (d *Descriptors) Domains() []string {
	if d == nil {
		return nil
	}
	out := make([]string, 0, len(d.domains))
	for k := range d.domains {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// Files returns the files loaded, in load order.
func (d *Descriptors) Files() []string {
	if d == nil {
		return nil
	}
	return append([]string(nil), d.files...)
}

// Entries returns how many entries the files hold.
func (d *Descriptors) Entries() int {
	if d == nil {
		return 0
	}
	return d.entries
}

// Rules returns the ratemesh rules that count the entries: one fixed
// window rule per entry with a limit of at least one request per unit,
// named RulePrefix + the entry's FullKey (made a valid, unique rule name),
// its window the entry's unit. Every member that loads the same files
// generates the same rules, so their counters replicate like any rule's.
func (d *Descriptors) Rules() []limiter.Rule {
	if d == nil {
		return nil
	}
	out := make([]limiter.Rule, len(d.rules))
	for i, r := range d.rules {
		out[i] = r
		out[i].Classes = map[string]limiter.Class{OverLimitClass: {Unlimited: true}}
	}
	return out
}

// WithShareWait returns a copy of d whose generated rules hold a share
// denial (limiter.Rule.ShareWait) for perDomain's value of their domain,
// or for all when perDomain names none of them: 0 leaves the rules'
// default, limiter.NoShareWait refuses at once. d itself is unchanged. A
// domain of perDomain that the files do not hold is an error naming it.
func (d *Descriptors) WithShareWait(all time.Duration, perDomain map[string]time.Duration) (*Descriptors, error) {
	if d == nil {
		for dom := range perDomain {
			return nil, fmt.Errorf("domain %q: no descriptor files are loaded", dom)
		}
		return nil, nil
	}
	for _, dom := range sortedKeys(perDomain) {
		if _, ok := d.domains[dom]; !ok {
			return nil, fmt.Errorf("domain %q: not in the descriptor files (their domains: %s)", dom, strings.Join(d.Domains(), ", "))
		}
	}
	c := *d
	c.rules = append([]limiter.Rule(nil), d.rules...)
	for i := range c.rules {
		w, ok := perDomain[c.ruleDomains[i]]
		if !ok {
			w = all
		}
		c.rules[i].ShareWait = w
	}
	return &c, nil
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// each calls f for every entry, depth first in file order of domains
// sorted by name, with its domain.
func (d *Descriptors) each(f func(domain string, e *Entry)) {
	var walk func(dom string, e *Entry)
	walk = func(dom string, e *Entry) {
		keys := make([]string, 0, len(e.children))
		for k := range e.children {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			c := e.children[k]
			f(dom, c)
			walk(dom, c)
		}
	}
	for _, dom := range d.Domains() {
		walk(dom, d.domains[dom])
	}
}

// nameRules gives every counted entry its rule. Names are RulePrefix +
// FullKey when that is a valid rule name and unique; otherwise the
// characters a rule name may not hold become '_', the name is cut to fit
// and a hash of the entry's exact path tells it apart.
func (d *Descriptors) nameRules() {
	type cand struct {
		e      *Entry
		name   string
		id     string // unambiguous path
		domain string
	}
	var cs []cand
	count := make(map[string]int)
	d.each(func(domain string, e *Entry) {
		d.entries++
		l := e.Limit
		if l == nil || l.Unlimited || l.RequestsPerUnit == 0 {
			return
		}
		name, clean := ruleName(e.FullKey)
		cs = append(cs, cand{e: e, name: name, id: e.pathID(), domain: domain})
		if clean {
			count[name]++
		} else {
			count[name] += 2 // always hashed
		}
	})
	for _, c := range cs {
		name := c.name
		if count[name] > 1 {
			sum := sha256.Sum256([]byte(c.id))
			suffix := "-" + hex.EncodeToString(sum[:6])
			if len(name)+len(suffix) > maxRuleName {
				name = name[:maxRuleName-len(suffix)]
			}
			name += suffix
		}
		c.e.Rule = name
		d.rules = append(d.rules, limiter.Rule{
			Name:      name,
			Algorithm: limiter.FixedWindow,
			Limit:     uint64(c.e.Limit.RequestsPerUnit),
			Window:    c.e.Limit.Window(),
			Shadow:    c.e.ShadowMode,
		})
		d.ruleDomains = append(d.ruleDomains, c.domain)
	}
}

const maxRuleName = 128

// ruleName returns RulePrefix + fullKey with every character a rule name
// may not hold replaced by '_' and cut to maxRuleName; clean is false when
// anything was replaced or cut.
func ruleName(fullKey string) (name string, clean bool) {
	var b strings.Builder
	b.WriteString(RulePrefix)
	clean = true
	for _, r := range fullKey {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '_', r == '.', r == ':', r == '-':
			b.WriteRune(r)
		default:
			b.WriteByte('_')
			clean = false
		}
	}
	name = b.String()
	if len(name) > maxRuleName {
		name, clean = name[:maxRuleName], false
	}
	return name, clean
}

// pathID encodes the entry's domain and final keys unambiguously, and
// independently of the file's name, so that members holding the same
// entries in differently named files agree on the rule names.
func (e *Entry) pathID() string { return e.id }

// idPart is one length-prefixed component of a pathID.
func idPart(s string) string { return strconv.Itoa(len(s)) + ":" + s }

// validKeys are the keys envoyproxy/ratelimit accepts, and where each may
// stand: at the top of a file (root), in a descriptor (entry), in a
// rate_limit block (limit), in a replaces item (replaces).
var validKeys = map[string]string{
	"domain":            "root",
	"descriptors":       "root entry",
	"key":               "entry",
	"value":             "entry",
	"rate_limit":        "entry",
	"shadow_mode":       "entry",
	"detailed_metric":   "entry",
	"value_to_metric":   "entry",
	"share_threshold":   "entry",
	"unit":              "limit",
	"requests_per_unit": "limit",
	"unit_multiplier":   "limit",
	"unlimited":         "limit",
	"name":              "limit replaces",
	"replaces":          "limit",
}

// parser reads one file.
type parser struct {
	file   string
	domain string
}

func (p *parser) errf(line int, entry, format string, args ...any) error {
	loc := p.file
	if line > 0 {
		loc += fmt.Sprintf(": line %d", line)
	}
	if entry != "" {
		loc += fmt.Sprintf(": descriptor '%s'", entry)
	}
	return fmt.Errorf("%w: %s: %s", ErrInvalid, loc, fmt.Sprintf(format, args...))
}

// file_ parses one file into its domain's root entry (Key is the domain);
// nil for an empty file.
func (p *parser) file_(data []byte) (*Entry, error) {
	var doc yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&doc); err != nil {
		if err == io.EOF {
			return nil, nil
		}
		return nil, p.errf(0, "", "error loading config file: %s", err)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); err != io.EOF {
		return nil, p.errf(0, "", "error loading config file: the file holds more than one YAML document")
	}
	top := doc.Content[0]
	if top.Kind == yaml.ScalarNode && top.Tag == "!!null" {
		return nil, nil
	}
	if top.Kind != yaml.MappingNode {
		return nil, p.errf(top.Line, "", "error loading config file: the file must be a mapping with domain and descriptors")
	}
	// envoyproxy/ratelimit checks every key of the file before it reads
	// any value; so do we, so that a misspelled key is named first.
	if err := p.checkKeys(top, "root"); err != nil {
		return nil, err
	}
	root := &Entry{File: p.file, Line: top.Line, children: map[string]*Entry{}}
	var descs *yaml.Node
	for i := 0; i+1 < len(top.Content); i += 2 {
		k, v := top.Content[i].Value, top.Content[i+1]
		switch k {
		case "domain":
			s, err := p.str(v, "", "domain")
			if err != nil {
				return nil, err
			}
			root.Key = s
		case "descriptors":
			descs = v
		}
	}
	if root.Key == "" {
		return nil, p.errf(top.Line, "", "config file cannot have empty domain")
	}
	p.domain = root.Key
	root.FullKey, root.id, root.plainStat = root.Key, idPart(root.Key), true
	if err := p.descriptors(root, descs); err != nil {
		return nil, err
	}
	return root, nil
}

// checkKeys walks m, a mapping at place (root, entry, limit, replaces),
// refusing keys that are not strings, not known, or known elsewhere,
// repeated keys, lists of non-mappings and leaves that are not strings,
// integers or booleans.
func (p *parser) checkKeys(m *yaml.Node, place string) error {
	seen := make(map[string]int)
	for i := 0; i+1 < len(m.Content); i += 2 {
		kn, v := m.Content[i], m.Content[i+1]
		if kn.Kind != yaml.ScalarNode || kn.Tag != "!!str" {
			return p.errf(kn.Line, "", "config error, key is not of type string: %s", kn.Value)
		}
		k := kn.Value
		where, ok := validKeys[k]
		if !ok {
			return p.errf(kn.Line, "", "config error, unknown key '%s'", k)
		}
		if !strings.Contains(where, place) {
			return p.errf(kn.Line, "", "config error, key '%s' does not belong in %s (it goes in %s)", k, placeName(place), placeName(strings.Fields(where)[0]))
		}
		if line, dup := seen[k]; dup {
			return p.errf(kn.Line, "", "config error, key '%s' repeated (first on line %d)", k, line)
		}
		seen[k] = kn.Line
		var err error
		switch v.Kind {
		case yaml.SequenceNode:
			next := map[string]string{"descriptors": "entry", "replaces": "replaces"}[k]
			for _, e := range v.Content {
				if e.Kind != yaml.MappingNode {
					return p.errf(e.Line, "", "config error, yaml file contains list of type other than map: %s", e.Value)
				}
				if next == "" {
					return p.errf(v.Line, "", "config error, key '%s' must not be a list", k)
				}
				if err = p.checkKeys(e, next); err != nil {
					return err
				}
			}
		case yaml.MappingNode:
			if k != "rate_limit" {
				return p.errf(v.Line, "", "config error, key '%s' must not be a mapping", k)
			}
			err = p.checkKeys(v, "limit")
		case yaml.ScalarNode:
			switch v.Tag {
			case "!!str", "!!int", "!!bool", "!!null":
			default:
				return p.errf(v.Line, "", "error checking config: key '%s' has a %s value %q; want a string, a whole number or a boolean", k, strings.TrimPrefix(v.Tag, "!!"), v.Value)
			}
		default:
			return p.errf(v.Line, "", "error checking config: key '%s': aliases are not supported", k)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func placeName(place string) string {
	switch place {
	case "root":
		return "the top of the file"
	case "entry":
		return "a descriptor"
	case "limit":
		return "a rate_limit block"
	}
	return "a replaces item"
}

// descriptors reads the list v into parent's children.
func (p *parser) descriptors(parent *Entry, v *yaml.Node) error {
	if v == nil || (v.Kind == yaml.ScalarNode && v.Tag == "!!null") {
		return nil
	}
	if v.Kind != yaml.SequenceNode {
		return p.errf(v.Line, parent.entryName(), "descriptors must be a list")
	}
	for _, n := range v.Content {
		e := &Entry{File: p.file, Line: n.Line, children: map[string]*Entry{}}
		var limit, descs *yaml.Node
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, val := n.Content[i].Value, n.Content[i+1]
			var err error
			switch k {
			case "key":
				e.Key, err = p.str(val, "", "key")
			case "value":
				e.Value, err = p.str(val, "", "value")
			case "rate_limit":
				limit = val
			case "descriptors":
				descs = val
			case "shadow_mode":
				e.ShadowMode, err = p.boolean(val, "shadow_mode")
			case "detailed_metric":
				e.DetailedMetric, err = p.boolean(val, "detailed_metric")
			case "value_to_metric":
				e.ValueToMetric, err = p.boolean(val, "value_to_metric")
			case "share_threshold":
				e.ShareThreshold, err = p.boolean(val, "share_threshold")
			}
			if err != nil {
				return err
			}
		}
		if e.Key == "" {
			return p.errf(n.Line, parent.entryName(), "descriptor has empty key")
		}
		e.finalKey = e.Key
		if e.Value != "" {
			e.finalKey += "_" + e.Value
		}
		e.FullKey = parent.FullKey + "." + e.finalKey
		e.plainStat = parent.plainStat && !(e.ValueToMetric && !e.ShareThreshold)
		e.id = parent.id + idPart(e.finalKey)
		if _, dup := parent.children[e.finalKey]; dup {
			return p.errf(n.Line, "", "duplicate descriptor composite key '%s'", e.FullKey)
		}
		if limit != nil && !(limit.Kind == yaml.ScalarNode && limit.Tag == "!!null") {
			l, err := p.limit(e, limit)
			if err != nil {
				return err
			}
			e.Limit = l
		}
		if e.ShareThreshold && !e.wildcard() {
			return p.errf(n.Line, e.FullKey, "share_threshold can only be used with wildcard values (ending with '*'), but found key '%s'", e.finalKey)
		}
		if err := p.descriptors(e, descs); err != nil {
			return err
		}
		parent.children[e.finalKey] = e
		if e.wildcard() {
			parent.wildcards = append(parent.wildcards, e.finalKey)
		}
	}
	return nil
}

// entryName names e in errors: its FullKey, or the domain at the top.
func (e *Entry) entryName() string { return e.FullKey }

// limit reads e's rate_limit block.
func (p *parser) limit(e *Entry, n *yaml.Node) (*Limit, error) {
	l := &Limit{}
	unit := ""
	hasRPU := false
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i].Value, n.Content[i+1]
		var err error
		switch k {
		case "unit":
			unit, err = p.str(v, e.FullKey, "rate_limit.unit")
		case "requests_per_unit":
			hasRPU = true
			l.RequestsPerUnit, err = p.uint32(v, e.FullKey, "rate_limit.requests_per_unit")
		case "unit_multiplier":
			l.UnitMultiplier, err = p.uint32(v, e.FullKey, "rate_limit.unit_multiplier")
			if err == nil && l.UnitMultiplier == 0 {
				err = p.errf(v.Line, e.FullKey, "rate_limit.unit_multiplier must be at least 1")
			}
		case "unlimited":
			l.Unlimited, err = p.boolean(v, "rate_limit.unlimited")
		case "name":
			l.Name, err = p.str(v, e.FullKey, "rate_limit.name")
		case "replaces":
			if v.Kind == yaml.ScalarNode && v.Tag == "!!null" {
				continue
			}
			if v.Kind != yaml.SequenceNode {
				return nil, p.errf(v.Line, e.FullKey, "rate_limit.replaces must be a list of {name: ...}")
			}
			for _, item := range v.Content {
				var name string
				for j := 0; j+1 < len(item.Content); j += 2 {
					if item.Content[j].Value == "name" {
						if name, err = p.str(item.Content[j+1], e.FullKey, "rate_limit.replaces.name"); err != nil {
							return nil, err
						}
					}
				}
				l.Replaces = append(l.Replaces, name)
			}
		}
		if err != nil {
			return nil, err
		}
	}
	value, known := rlspb.RateLimitResponse_RateLimit_Unit_value[strings.ToUpper(unit)]
	validUnit := known && value != int32(rlspb.RateLimitResponse_RateLimit_UNKNOWN)
	if l.Unlimited {
		if validUnit {
			return nil, p.errf(n.Line, e.FullKey, "should not specify rate limit unit when unlimited")
		}
	} else if !validUnit {
		return nil, p.errf(n.Line, e.FullKey, "invalid rate limit unit '%s'", unit)
	} else {
		l.Unit = rlspb.RateLimitResponse_RateLimit_Unit(value)
		if !hasRPU {
			return nil, p.errf(n.Line, e.FullKey, "rate_limit.requests_per_unit is missing (0 blocks every request: write it out)")
		}
		if w := l.Window(); w > limiter.MaxWindow {
			return nil, p.errf(n.Line, e.FullKey, "rate_limit: %s × %d is longer than the longest window ratemesh keeps (%v)", strings.ToLower(l.Unit.String()), l.UnitMultiplier, limiter.MaxWindow)
		}
	}
	for _, r := range l.Replaces {
		if r == "" {
			return nil, p.errf(n.Line, e.FullKey, "should not have an empty replaces entry")
		}
		if r == l.Name {
			return nil, p.errf(n.Line, e.FullKey, "replaces should not contain name of same descriptor")
		}
	}
	return l, nil
}

func (p *parser) str(v *yaml.Node, entry, field string) (string, error) {
	if v.Kind != yaml.ScalarNode {
		return "", p.errf(v.Line, entry, "%s must be a string", field)
	}
	switch v.Tag {
	case "!!null":
		return "", nil
	case "!!str", "!!int":
		return v.Value, nil
	}
	return "", p.errf(v.Line, entry, "%s must be a string, got %s %q", field, strings.TrimPrefix(v.Tag, "!!"), v.Value)
}

func (p *parser) boolean(v *yaml.Node, field string) (bool, error) {
	switch {
	case v.Kind == yaml.ScalarNode && v.Tag == "!!null":
		return false, nil
	case v.Kind == yaml.ScalarNode && v.Tag == "!!bool":
		var b bool
		if err := v.Decode(&b); err == nil {
			return b, nil
		}
	}
	return false, p.errf(v.Line, "", "%s must be true or false, got %q", field, v.Value)
}

func (p *parser) uint32(v *yaml.Node, entry, field string) (uint32, error) {
	if v.Kind == yaml.ScalarNode && v.Tag == "!!null" {
		return 0, nil
	}
	if v.Kind == yaml.ScalarNode && v.Tag == "!!int" {
		if n, err := strconv.ParseUint(v.Value, 0, 32); err == nil {
			return uint32(n), nil
		}
	}
	return 0, p.errf(v.Line, entry, "%s must be a whole number from 0 to %d, got %q", field, uint32(1<<32-1), v.Value)
}
