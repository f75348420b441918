package envoy

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/ratemesh/ratemesh/crdt"
)

// Match is what a request descriptor matched: the entry whose limit
// applies and the counter key of the descriptor under it.
type Match struct {
	Entry *Entry
	// Key is the counter key under Entry.Rule: the values of the
	// descriptor's entries that the entry does not fix (a key without a
	// value, or a wildcard without share_threshold), so that each value
	// has its own counter.
	Key string
	// StatKey is envoyproxy/ratelimit's statistics key of the match: the
	// entry's FullKey, with the request's values where detailed_metric or
	// value_to_metric ask for them.
	StatKey string
}

// Lookup finds the limit of one descriptor of domain as
// envoyproxy/ratelimit does: at each level it tries key_value, then the
// level's wildcards in file order, then key alone; the descriptor
// matches an entry with a limit only if that entry is its last level.
// ok is false when nothing applies (an unknown domain, no entry at the
// descriptor's depth, or an entry without a limit): the descriptor is OK
// without a limit.
func (d *Descriptors) Lookup(domain string, entries []*rlcommon.RateLimitDescriptor_Entry) (m Match, ok bool) {
	if d == nil || len(entries) == 0 {
		return Match{}, false
	}
	level := d.domains[domain]
	if level == nil {
		return Match{}, false
	}
	var found *Entry
	var varsBuf [4]string
	var pathBuf [4]*Entry
	vars := varsBuf[:0]
	path := pathBuf[:0] // the entry matched at each level
	for i, en := range entries {
		k, v := en.GetKey(), en.GetValue()
		finalKey := k + "_" + v
		next := level.children[finalKey]
		if next == nil {
			for _, w := range level.wildcards {
				if strings.HasPrefix(finalKey, strings.TrimSuffix(w, "*")) {
					next = level.children[w]
					break
				}
			}
		}
		if next == nil {
			next = level.children[k]
		}
		if next == nil {
			break
		}
		path = append(path, next)
		if fixed := next.finalKey != next.Key && !(next.wildcard() && !next.ShareThreshold); !fixed {
			vars = append(vars, v)
		}
		if next.Limit != nil && i == len(entries)-1 {
			found = next
		}
		if len(next.children) == 0 {
			break
		}
		level = next
	}
	if found == nil {
		return Match{}, false
	}
	return Match{Entry: found, Key: counterKey(vars), StatKey: statKey(domain, entries, path, found)}, true
}

// counterKey encodes the variable values of a descriptor as a counter key:
// a single value as itself, several joined by '|' with '\' escaping '\',
// '|' and a leading '#'; a key that would be empty or longer than a
// counter key may be becomes '#' and the SHA-256 of the encoding.
func counterKey(vars []string) string {
	if len(vars) == 1 && vars[0] != "" && len(vars[0]) <= crdt.MaxKeyLen && !strings.ContainsAny(vars[0], `\|#`) {
		return vars[0] // itself, without a copy
	}
	var b strings.Builder
	for i, v := range vars {
		if i > 0 {
			b.WriteByte('|')
		}
		if len(vars) > 1 || strings.ContainsAny(v, `\|#`) {
			if strings.HasPrefix(v, "#") {
				b.WriteByte('\\')
			}
			v = strings.NewReplacer(`\`, `\\`, `|`, `\|`).Replace(v)
		}
		b.WriteString(v)
	}
	k := b.String()
	if len(vars) == 0 {
		return "_"
	}
	if k == "" || len(k) > crdt.MaxKeyLen {
		sum := sha256.Sum256([]byte(k))
		return "#" + hex.EncodeToString(sum[:])
	}
	return k
}

// statKey is envoyproxy/ratelimit's statistics key of a match: with
// detailed_metric on the matched entry, domain.key_value for every entry
// of the request; otherwise each level's entry final key, or key_value
// where that level asks for value_to_metric.
func statKey(domain string, entries []*rlcommon.RateLimitDescriptor_Entry, path []*Entry, found *Entry) string {
	if found.plainStat && !found.DetailedMetric && len(path) == len(entries) {
		return found.FullKey // each level's final key
	}
	var b strings.Builder
	b.WriteString(domain)
	for i, en := range entries {
		b.WriteByte('.')
		switch {
		case found.DetailedMetric:
			b.WriteString(en.GetKey() + "_" + en.GetValue())
		case i < len(path) && path[i].ValueToMetric && !path[i].ShareThreshold:
			b.WriteString(en.GetKey())
			if en.GetValue() != "" {
				b.WriteString("_" + en.GetValue())
			}
		case i < len(path):
			b.WriteString(path[i].finalKey)
		}
	}
	return b.String()
}
