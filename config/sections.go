package config

import (
	"time"

	"gopkg.in/yaml.v3"

	"github.com/ratemesh/ratemesh/limiter"
)

// The section parsers below read a rules list or a mesh section that
// stands in another file (the simulator's scenarios hold both beside
// keys of their own): the same schema, the same strict reading and the
// same errors naming the path (mesh.heartbeat, rules[2] "publish":
// window) as a configuration file, with line numbers of the file the
// node was decoded from.

// Field decodes one value of a mapping: v is the value, path its name as
// errors spell it. An error names path; use it for keys that an embedding
// file adds to a section (see ParseMesh).
type Field func(v *yaml.Node, path string) error

// DurationField decodes a duration such as 20ms or 1s into dst (0 is
// allowed, a negative one is not).
func DurationField(dst *time.Duration) Field { return duration(dst) }

// BoolField decodes true or false into dst.
func BoolField(dst *bool) Field { return boolean(dst) }

// ParseMesh reads a mesh section over base and validates it as Parse
// does (every duration positive, heartbeat at least sync_interval, …).
// extra decodes further keys the embedding file allows in the section;
// any other unknown key is an error. A zero Node (the section absent)
// leaves base as it is, still validated.
func ParseMesh(v *yaml.Node, base Mesh, extra map[string]Field) (Mesh, error) {
	m := base
	if v.Kind != 0 {
		fs := meshFields(&m)
		for k, f := range extra {
			fs[k] = f
		}
		if err := firstErr(walk(v, "mesh", fs)); err != nil {
			return base, err
		}
	}
	if errs := m.validate(); len(errs) > 0 {
		return base, errs[0]
	}
	return m, nil
}

// ParseRules reads a rules list: every rule normalised, and warnings
// naming settings that do not apply and are ignored (lease_ttl on a
// windowed rule). The first invalid rule or a name defined twice is the
// error. An empty list returns no rules and no error: the caller decides
// whether that is allowed.
func ParseRules(v *yaml.Node) (rules []limiter.Rule, warnings []string, err error) {
	prs, err := parseRules(v, "rules")
	if err != nil {
		return nil, nil, err
	}
	seen := make(map[string]bool, len(prs))
	for _, pr := range prs {
		switch {
		case pr.err != nil:
			return nil, nil, pr.err
		case seen[pr.name]:
			return nil, nil, invalid(rulePath(pr.index, pr.name, "name"), "defined twice")
		}
		seen[pr.name] = true
		rules = append(rules, pr.rule)
		if pr.warning != "" {
			warnings = append(warnings, pr.warning)
		}
	}
	return rules, warnings, nil
}
