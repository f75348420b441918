// Package config reads ratemesh's YAML configuration file
// (docs/operations.md, "Config file"): the node and mesh settings and the
// rules. Unknown keys, impossible values and duplicate rule names are
// refused with a message naming the section or the rule and the field, for
// example
//
//	rules[2] "publish": window: must be positive, for example 1s
//
// A command drives it like this:
//
//	cfg, err := config.Load(path) // or config.Default() without a file
//	ncfg := cfg.NodeConfig(node.DefaultConfig())
//	// the transport's settings: cfg.Mesh.Namespace, cfg.Node.Listen,
//	// cfg.PeerBootstrap(), cfg.Node.MDNS, cfg.Node.PSKFile
//	…
//	// on SIGHUP:
//	data, _ := os.ReadFile(path)
//	rules, errs := config.Reload(running, data) // invalid rules keep their old version
//	n.Reload(rules)
//
// The mesh section's settings are a node.MeshConfig: node holds their
// meaning, defaults and checks, and this package only reads their keys
// (meshKeys) and names them in errors.
//
// Files that hold a mesh section and rules beside keys of their own (the
// simulator's scenarios) read them with ParseMesh and ParseRules: the same
// schema and the same errors.
//
// Nothing here is shared or mutable: every function is safe for concurrent
// use.
package config

import (
	"errors"
	"fmt"
	"net"
	"os"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	ma "github.com/multiformats/go-multiaddr"

	"github.com/ratemesh/ratemesh/limiter"
	"github.com/ratemesh/ratemesh/node"
)

// ErrInvalid is wrapped by every error about the file's content.
var ErrInvalid = errors.New("config: invalid")

// ErrYAML is wrapped (beside ErrInvalid) by the error about a file that
// cannot be read as YAML at all: a reload of it changes nothing.
var ErrYAML = errors.New("config: not YAML")

// Error is a problem with one field: Path names it the way the file spells
// it (node.api, mesh.heartbeat, rules[2] "publish": window). It wraps
// ErrInvalid (and ErrYAML for a file that is not YAML).
type Error struct {
	Path string
	Msg  string
	errs []error
}

func (e *Error) Error() string { return e.Path + ": " + e.Msg }

// Unwrap returns the sentinels the error is an instance of.
func (e *Error) Unwrap() []error { return e.errs }

func invalid(path, format string, args ...any) *Error {
	return &Error{Path: path, Msg: fmt.Sprintf(format, args...), errs: []error{ErrInvalid}}
}

// rulePath names rule i of the file, and field in it when not empty.
func rulePath(i int, name, field string) string {
	p := fmt.Sprintf("rules[%d]", i)
	if name != "" {
		p += fmt.Sprintf(" %q", name)
	}
	if field != "" {
		p += ": " + field
	}
	return p
}

// Node is the node section: where the daemon listens, keeps its data and
// finds its peers.
type Node struct {
	// Listen are the libp2p multiaddrs to listen on.
	Listen []string
	// API is the HTTP API's host:port.
	API string
	// DataDir holds the identity key and the persisted state.
	DataDir string
	// Bootstrap are full multiaddrs (ending in /p2p/<peer ID>) of peers
	// to dial, or dns:HOST:PORT entries: every address HOST resolves to
	// is asked, on API port PORT, for its peer ID and addresses (see
	// DNSBootstrap).
	Bootstrap []string
	// GRPC is the host:port of Envoy's rate limit service (gRPC); empty:
	// off.
	GRPC string
	// MDNS discovers peers on the local network.
	MDNS bool
	// PSKFile is a swarm.key: only holders of the same key can connect.
	PSKFile string
	// AllowPeers, AllowPeersFile and AllowPeersDNS are the allowlist of
	// member peer IDs: when any is set, only the peers they name (and
	// this node) may connect and be members. AllowPeers lists peer IDs;
	// AllowPeersFile names a file of peer IDs, one a line, '#' comments,
	// re-read when it changes; AllowPeersDNS names DNS names whose TXT
	// records "ratemesh-peer=<peer ID>" list members, re-read every 10 s.
	AllowPeers     []string
	AllowPeersFile string
	AllowPeersDNS  []string
	// JoinTimeout bounds how long a joining node waits for its first
	// anti-entropy exchange before serving with what it has.
	JoinTimeout time.Duration
	// FlushInterval is the persistence batch interval.
	FlushInterval time.Duration
	// PersistMinWindow: windows at least this long survive restarts.
	PersistMinWindow time.Duration
	// MaxKeys caps the keys the node holds over every rule (see
	// node.CoreConfig.MaxKeys): new keys past it are denied (key_cap).
	MaxKeys int
	// HTTP bounds the API server (node.http).
	HTTP HTTP
}

// HTTP is the node.http section: the API server's timeouts and caps, so
// that slow, idle or too many clients cannot hold it.
type HTTP struct {
	// ReadTimeout bounds reading one request, headers and body; a client
	// that sends slower is cut off.
	ReadTimeout time.Duration
	// WriteTimeout bounds answering a request once it is read; /v1/wait
	// adds its own wait (max_wait_ms, at most 30 s) on top.
	WriteTimeout time.Duration
	// IdleTimeout closes a keep-alive connection idle this long.
	IdleTimeout time.Duration
	// MaxHeaderBytes caps the request line and headers (431 beyond).
	MaxHeaderBytes int
	// MaxConns bounds the connections open at once; further ones wait
	// to be accepted until one closes.
	MaxConns int
}

// Bounds of node.http's sizes.
const (
	minHeaderBytes = 1 << 10
	maxHeaderBytes = 1 << 20 // net/http's own default
	maxConns       = 1 << 20
)

// Mesh is the mesh section: the transport's namespace, and the node's
// mesh settings (gossip timing, membership, the partition policy), whose
// meaning, defaults and checks are node.MeshConfig's.
type Mesh struct {
	// Namespace separates meshes on one network: the gossip topic is
	// /ratemesh/1/<namespace>.
	Namespace string
	node.MeshConfig
}

// Envoy is the envoy section: envoyproxy/ratelimit's descriptor files,
// and settings of the rules generated from them.
type Envoy struct {
	// Config is a descriptor file or a directory of *.yaml files; empty:
	// none.
	Config string
	// ShareWait is the share_wait (limiter.Rule.ShareWait) of every rule
	// generated from the descriptor files, unless Domains sets its
	// domain's: 0 leaves the rules' default, limiter.NoShareWait
	// (share_wait: 0 in the file) refuses a share denial at once. A
	// call's deadline bounds a hold anyway (docs/envoy.md).
	ShareWait time.Duration
	// Domains are settings of single domains of the descriptor files, by
	// domain. Serve refuses a domain the files do not hold.
	Domains map[string]EnvoyDomain
}

// EnvoyDomain is one domain's entry in envoy.domains.
type EnvoyDomain struct {
	// ShareWait is the share_wait of the domain's generated rules, read
	// as Envoy.ShareWait; 0 leaves envoy.share_wait.
	ShareWait time.Duration
}

// DomainShareWaits returns the share_wait of every domain that sets its
// own, by domain (nil when none does).
func (e *Envoy) DomainShareWaits() map[string]time.Duration {
	var out map[string]time.Duration
	for name, d := range e.Domains {
		if d.ShareWait != 0 {
			if out == nil {
				out = make(map[string]time.Duration)
			}
			out[name] = d.ShareWait
		}
	}
	return out
}

// API is the api section: who may call the HTTP API (node.api) and
// Envoy's rate limit service (node.grpc), and over what.
type API struct {
	// TokenFile holds bearer tokens, "SCOPE TOKEN" a line (scope decide
	// or admin); re-read when it changes. Empty: no token file.
	TokenFile string
	// TLSCert and TLSKey are the PEM certificate and key both APIs serve
	// TLS with; re-read when they change. Empty: plaintext.
	TLSCert, TLSKey string
	// ClientCA is a PEM bundle of CAs: with it, every client must present
	// a certificate one of them signed (mutual TLS). Needs TLSCert.
	ClientCA string
	// Insecure lets serve listen on a non-loopback address without any
	// authentication (no token, no client CA).
	Insecure bool
	// MetricsAuth makes /metrics ask for a token (any scope); by default
	// it is open, like /healthz.
	MetricsAuth bool
}

// Secured reports whether the APIs authenticate their clients: tokens
// from a file or the environment (envTokens), or client certificates.
func (a *API) Secured(envTokens bool) bool {
	return a.TokenFile != "" || envTokens || a.ClientCA != ""
}

// Config is a whole configuration file, defaults filled in.
type Config struct {
	Node  Node
	API   API
	Mesh  Mesh
	Envoy Envoy
	Rules []limiter.Rule
	// Warnings name settings that do not apply and are ignored (lease_ttl
	// on a windowed rule); log them.
	Warnings []string
}

// NoRulesWarning is Parse's warning about a file without a rules
// section: it is valid (the built-in rule applies), and most often a
// mistake (an empty ConfigMap, a misspelt key, the wrong file).
const NoRulesWarning = "rules: the file names no rules, so only the built-in rule \"default\" (100 per second, sliding window) exists and every other rule name is unknown (404); add a rules section (one naming default, if that is the rule meant) to silence this"

// DefaultRule returns the built-in rule used when the file names none:
// `default`, 100 per second, sliding window.
func DefaultRule() limiter.Rule {
	return limiter.Rule{Name: "default", Algorithm: limiter.SlidingWindow, Limit: 100, Window: time.Second}
}

// Default returns the configuration of a node started without a file:
// the documented safe defaults (loopback only, data in ./ratemesh-data, mDNS
// off, the built-in default rule).
func Default() Config {
	cc := node.DefaultCoreConfig()
	r := DefaultRule()
	_ = r.Normalize()
	return Config{
		Node: Node{
			Listen:           []string{"/ip4/127.0.0.1/tcp/4001"}, // loopback: a mesh across hosts is a deliberate act
			API:              "127.0.0.1:8080",                    // local applications only
			DataDir:          "./ratemesh-data",
			JoinTimeout:      cc.JoinTimeout,
			FlushInterval:    time.Second, // at most a second of long-window counts lost to a crash
			PersistMinWindow: time.Minute, // shorter windows are over before a restart completes
			MaxKeys:          cc.MaxKeys,  // about 1.8 GiB of keys
			HTTP: HTTP{
				ReadTimeout:    10 * time.Second, // a decision request is a few hundred bytes: 10 s is generous, and cuts slow-loris clients
				WriteTimeout:   10 * time.Second, // answers are small; a client that does not read them is let go
				IdleTimeout:    60 * time.Second, // keep-alive pools reuse connections well within a minute
				MaxHeaderBytes: 32 << 10,         // ample for any real header set, like common proxies' limits
				MaxConns:       1024,             // many clients, well below the file limit
			},
		},
		Mesh: Mesh{
			Namespace:  "default", // one mesh per network unless told otherwise
			MeshConfig: cc.MeshConfig,
		},
		Rules: []limiter.Rule{r},
	}
}

// Load reads and parses the file at path; the error names the path.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	cfg, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	return cfg, nil
}

// Parse parses a configuration file over Default and validates it whole.
// The first problem found is returned, naming the section or the rule
// and the field; it wraps ErrInvalid.
func Parse(data []byte) (*Config, error) {
	doc, err := parse(data)
	if err != nil {
		return nil, err
	}
	if len(doc.errs) > 0 {
		return nil, doc.errs[0]
	}
	for _, r := range doc.rules {
		if r.err != nil {
			return nil, r.err
		}
	}
	cfg := doc.cfg
	if !doc.hasRules {
		cfg.Warnings = append(cfg.Warnings, NoRulesWarning)
	}
	if doc.hasRules {
		cfg.Rules = make([]limiter.Rule, len(doc.rules))
		for i, r := range doc.rules {
			cfg.Rules[i] = r.rule
			if r.warning != "" {
				cfg.Warnings = append(cfg.Warnings, r.warning)
			}
		}
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &cfg, nil
}

// Reload merges the rules of a changed file into the running ones: a
// valid rule takes its new version, an invalid one keeps its running
// version (or, if it is new, is left out), a rule no longer in the file is
// removed. errs holds one error per rule that kept its old version or was
// left out, and any error outside the rules (the node and mesh sections
// are not applied by a reload: they need a restart). If the file cannot
// be read as YAML at all, the running rules are returned unchanged with
// that error. The running rules' order is irrelevant; the result follows
// the file's order.
func Reload(running []limiter.Rule, data []byte) (rules []limiter.Rule, errs []error) {
	doc, err := parse(data)
	if err != nil {
		return append([]limiter.Rule(nil), running...), []error{err}
	}
	errs = append(errs, doc.errs...)
	switch {
	case !doc.hasRules:
		doc.rules = []parsedRule{{name: "default", rule: doc.cfg.Rules[0]}}
	case len(doc.rules) == 0:
		// An empty or malformed list (its error is in errs): keep every
		// running rule rather than remove them all.
		return append([]limiter.Rule(nil), running...), errs
	}
	old := make(map[string]limiter.Rule, len(running))
	for _, r := range running {
		old[r.Name] = r
	}
	count := make(map[string]int, len(doc.rules))
	for _, r := range doc.rules {
		if r.name != "" {
			count[r.name]++
		}
	}
	done := make(map[string]bool, len(doc.rules))
	for _, r := range doc.rules {
		err := r.err
		if err == nil && count[r.name] > 1 {
			err = invalid(rulePath(r.index, r.name, "name"), "defined %d times", count[r.name])
		}
		if err == nil {
			rules = append(rules, r.rule)
			done[r.name] = true
			continue
		}
		if o, ok := old[r.name]; ok && r.name != "" && !done[r.name] {
			rules = append(rules, o)
			done[r.name] = true
			err = fmt.Errorf("%w (keeping the running version)", err)
		}
		errs = append(errs, err)
	}
	return rules, errs
}

// NodeConfig returns base with the file's node and mesh settings applied:
// the rules, the mesh settings (node.MeshConfig), the join timeout and the
// persistence intervals.
// Peer, Transport and Store are left for the caller; Join is set when
// bootstrap peers are configured.
func (c *Config) NodeConfig(base node.Config) node.Config {
	cc := &base.CoreConfig
	cc.MeshConfig = c.Mesh.MeshConfig
	cc.Rules = append([]limiter.Rule(nil), c.Rules...)
	cc.JoinTimeout = c.Node.JoinTimeout
	cc.MaxKeys = c.Node.MaxKeys
	cc.Join = len(c.Node.Bootstrap) > 0 // dns: entries too
	base.FlushInterval = c.Node.FlushInterval
	base.PersistMinWindow = c.Node.PersistMinWindow
	return base
}

// PeerBootstrap returns the bootstrap entries that are full multiaddrs
// (ending in /p2p/<peer ID>), the transport's bootstrap list; the dns:
// entries are DNSBootstrap's.
func (c *Config) PeerBootstrap() []string {
	var out []string
	for _, b := range c.Node.Bootstrap {
		if !strings.HasPrefix(b, DNSPrefix) {
			out = append(out, b)
		}
	}
	return out
}

// Validate checks the node and mesh sections and the rule set as a whole
// (after flags have overridden the file, say). The error names the field.
func (c *Config) Validate() error {
	if errs := c.validateSections(); len(errs) > 0 {
		return errs[0]
	}
	if len(c.Rules) == 0 {
		return invalid("rules", "at least one rule is needed")
	}
	seen := make(map[string]bool, len(c.Rules))
	for i := range c.Rules {
		r := c.Rules[i]
		if err := r.Normalize(); err != nil {
			return ruleErr(i, r.Name, err)
		}
		if seen[r.Name] {
			return invalid(rulePath(i, r.Name, "name"), "defined twice")
		}
		seen[r.Name] = true
	}
	return nil
}

func (c *Config) validateSections() []error {
	errs := append(c.Node.validate(), c.API.validate()...)
	return append(errs, c.Mesh.validate()...)
}

// validate checks the api section on its own: the TLS files come
// together. (Whether the files exist and load is for serve to say.)
func (a *API) validate() []error {
	switch {
	case a.TLSCert != "" && a.TLSKey == "":
		return []error{invalid("api.tls_key", "required with api.tls_cert")}
	case a.TLSKey != "" && a.TLSCert == "":
		return []error{invalid("api.tls_cert", "required with api.tls_key")}
	case a.ClientCA != "" && a.TLSCert == "":
		return []error{invalid("api.client_ca", "needs api.tls_cert and api.tls_key: client certificates are asked for in a TLS handshake")}
	}
	return nil
}

// validate checks the node section on its own.
func (n *Node) validate() []error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, invalid(field, format, args...))
	}
	if n.API == "" {
		bad("node.api", "must not be empty (host:port)")
	}
	if n.DataDir == "" {
		bad("node.data_dir", "must not be empty")
	}
	for i, a := range n.Listen {
		if a == "" {
			bad(fmt.Sprintf("node.listen[%d]", i), "must not be empty")
		}
	}
	for i, a := range n.Bootstrap {
		if a == "" {
			bad(fmt.Sprintf("node.bootstrap[%d]", i), "must not be empty")
		}
		if a != "" {
			if err := CheckBootstrap(a); err != nil {
				bad(fmt.Sprintf("node.bootstrap[%d]", i), "%q: %v", a, err)
			}
		}
	}
	for i, id := range n.AllowPeers {
		if _, err := peer.Decode(id); err != nil {
			bad(fmt.Sprintf("node.allow_peers[%d]", i), "%q is not a peer ID (12D3KooW…)", id)
		}
	}
	for i, name := range n.AllowPeersDNS {
		if strings.TrimSpace(name) == "" || strings.ContainsAny(name, " \t/:") {
			bad(fmt.Sprintf("node.allow_peers_dns[%d]", i), "%q is not a DNS name (its TXT records list ratemesh-peer=<peer ID>)", name)
		}
	}
	if n.GRPC != "" {
		if _, port, err := net.SplitHostPort(n.GRPC); err != nil || port == "" {
			bad("node.grpc", "%q is not host:port (port 0 picks one)", n.GRPC)
		}
	}
	positive(&errs, []setting{
		{"node.join_timeout", n.JoinTimeout}, {"node.flush_interval", n.FlushInterval},
		{"node.persist_min_window", n.PersistMinWindow},
		{"node.http.read_timeout", n.HTTP.ReadTimeout}, {"node.http.write_timeout", n.HTTP.WriteTimeout},
		{"node.http.idle_timeout", n.HTTP.IdleTimeout},
	})
	if n.MaxKeys < 1 {
		bad("node.max_keys", "must be at least 1, got %d", n.MaxKeys)
	}
	switch h := n.HTTP; {
	case h.MaxHeaderBytes < minHeaderBytes || h.MaxHeaderBytes > maxHeaderBytes:
		bad("node.http.max_header_bytes", "%d, must be within %d and %d", h.MaxHeaderBytes, minHeaderBytes, maxHeaderBytes)
	case h.MaxConns < 1 || h.MaxConns > maxConns:
		bad("node.http.max_conns", "%d, must be within 1 and %d", h.MaxConns, maxConns)
	}
	return errs
}

// validate checks the mesh section on its own: the mesh settings as
// node.MeshConfig.Validate does (one error for each problem it finds, by
// its key), then the namespace.
func (m *Mesh) validate() []error {
	var errs []error
	if err := m.MeshConfig.Validate(); err != nil {
		all := []error{err}
		if j, ok := err.(interface{ Unwrap() []error }); ok {
			all = j.Unwrap()
		}
		for _, e := range all {
			var ce *node.ConfigError
			if errors.As(e, &ce) {
				errs = append(errs, invalid(ce.Key, "%s", ce.Msg))
			} else {
				errs = append(errs, invalid("mesh", "%v", e))
			}
		}
	}
	if m.Namespace == "" {
		errs = append(errs, invalid("mesh.namespace", "must not be empty"))
	}
	return errs
}

// setting is a duration setting by its name in the file.
type setting struct {
	name string
	d    time.Duration
}

// positive appends an error to errs for every setting that is not
// positive.
func positive(errs *[]error, settings []setting) {
	for _, s := range settings {
		if s.d <= 0 {
			*errs = append(*errs, invalid(s.name, "must be positive, got %v", s.d))
		}
	}
}

// ruleErr names rule i of the file in err.
func ruleErr(i int, name string, err error) error {
	var re *limiter.RuleError
	if errors.As(err, &re) {
		return invalid(rulePath(i, name, re.Field), "%s", re.Msg)
	}
	return invalid(rulePath(i, name, ""), "%v", err)
}

// DNSPrefix starts a bootstrap entry discovered by DNS: dns:HOST:PORT.
const DNSPrefix = "dns:"

// SplitDNS splits the HOST:PORT of a dns: bootstrap entry: HOST a name or
// an address, PORT the peers' API port.
func SplitDNS(hostPort string) (host string, port int, err error) {
	h, p, err := net.SplitHostPort(hostPort)
	if err != nil {
		return "", 0, fmt.Errorf("want dns:HOST:PORT (PORT: the peers' API port): %w", err)
	}
	n, err := strconv.Atoi(p)
	if h == "" || err != nil || n < 1 || n > 65535 {
		return "", 0, fmt.Errorf("want dns:HOST:PORT with a host and a port from 1 to 65535")
	}
	return h, n, nil
}

// CheckBootstrap checks one bootstrap entry: a dns:HOST:PORT, or a
// multiaddr ending in /p2p/<peer ID>. Its error says what was wrong and,
// for a HOST:PORT or a multiaddr without the peer ID, what to write.
func CheckBootstrap(entry string) error {
	if hp, ok := strings.CutPrefix(entry, DNSPrefix); ok {
		_, _, err := SplitDNS(hp)
		return err
	}
	if !strings.HasPrefix(entry, "/") {
		msg := "not a multiaddr or dns:HOST:PORT"
		if host, port, err := net.SplitHostPort(entry); err == nil {
			switch ip := net.ParseIP(host); {
			case ip == nil:
				msg += fmt.Sprintf("; try dns:%s:<API port> (every address %s resolves to) or /dns/%s/tcp/%s/p2p/<peer ID>", host, host, host, port)
			case ip.To4() != nil:
				msg += fmt.Sprintf("; try /ip4/%s/tcp/%s/p2p/<peer ID>", host, port)
			default:
				msg += fmt.Sprintf("; try /ip6/%s/tcp/%s/p2p/<peer ID>", host, port)
			}
		}
		return errors.New(msg)
	}
	a, err := ma.NewMultiaddr(entry)
	if err != nil {
		return fmt.Errorf("not a multiaddr: %v", err)
	}
	if _, err := peer.AddrInfoFromP2pAddr(a); err != nil {
		return fmt.Errorf("want a multiaddr ending in /p2p/<peer ID> (the peer's ID, as its ready line or ratemesh peers shows): %v", err)
	}
	return nil
}

// DNSBootstrap returns the HOST:PORT of every dns: bootstrap entry.
func (c *Config) DNSBootstrap() []string {
	var out []string
	for _, b := range c.Node.Bootstrap {
		if hp, ok := strings.CutPrefix(b, DNSPrefix); ok {
			out = append(out, hp)
		}
	}
	return out
}

// ReloadEnvoy reads the envoy section of data for a reload: its
// share_wait and domains apply at once (envoy.config only after a
// restart: see ChangedSettings). A file that is not YAML, or an envoy
// section with an error, returns running and the error; errors in other
// sections do not matter here.
func ReloadEnvoy(running Envoy, data []byte) (Envoy, error) {
	doc, err := parse(data)
	if err != nil {
		return running, err
	}
	for _, e := range doc.errs {
		var ce *Error
		if errors.As(e, &ce) && (ce.Path == "envoy" || strings.HasPrefix(ce.Path, "envoy.")) {
			return running, e
		}
	}
	return doc.cfg.Envoy, nil
}

// ChangedSettings returns the settings outside the rules (node, mesh and
// envoy sections) whose values in data differ from running's, by their
// names in the file (node.api, mesh.heartbeat, …): a reload cannot apply
// them, a restart does. running is the file as loaded at start, before
// flags. A file that cannot be read as YAML reports nothing.
func ChangedSettings(running *Config, data []byte) []string {
	doc, err := parse(data)
	if err != nil {
		return nil
	}
	a, b := running, &doc.cfg
	type change struct {
		name string
		x, y any
	}
	fields := []change{
		{"node.listen", a.Node.Listen, b.Node.Listen}, {"node.api", a.Node.API, b.Node.API},
		{"node.grpc", a.Node.GRPC, b.Node.GRPC},
		{"node.data_dir", a.Node.DataDir, b.Node.DataDir}, {"node.bootstrap", a.Node.Bootstrap, b.Node.Bootstrap},
		{"node.mdns", a.Node.MDNS, b.Node.MDNS}, {"node.psk_file", a.Node.PSKFile, b.Node.PSKFile},
		{"node.allow_peers", a.Node.AllowPeers, b.Node.AllowPeers}, {"node.allow_peers_file", a.Node.AllowPeersFile, b.Node.AllowPeersFile},
		{"node.allow_peers_dns", a.Node.AllowPeersDNS, b.Node.AllowPeersDNS},
		{"node.join_timeout", a.Node.JoinTimeout, b.Node.JoinTimeout}, {"node.flush_interval", a.Node.FlushInterval, b.Node.FlushInterval},
		{"node.persist_min_window", a.Node.PersistMinWindow, b.Node.PersistMinWindow},
		{"node.max_keys", a.Node.MaxKeys, b.Node.MaxKeys},
	}
	ka, kb := meshKeys(&a.Mesh), meshKeys(&b.Mesh)
	for i := range ka {
		x, y := reflect.ValueOf(ka[i].value).Elem(), reflect.ValueOf(kb[i].value).Elem()
		fields = append(fields, change{"mesh." + ka[i].name, x.Interface(), y.Interface()})
	}
	fields = append(fields, []change{
		{"envoy.config", a.Envoy.Config, b.Envoy.Config},
		{"api.token_file", a.API.TokenFile, b.API.TokenFile}, {"api.tls_cert", a.API.TLSCert, b.API.TLSCert},
		{"api.tls_key", a.API.TLSKey, b.API.TLSKey}, {"api.client_ca", a.API.ClientCA, b.API.ClientCA},
		{"api.insecure", a.API.Insecure, b.API.Insecure}, {"api.metrics_auth", a.API.MetricsAuth, b.API.MetricsAuth},
	}...)
	var out []string
	for _, f := range fields {
		x, y := reflect.ValueOf(f.x), reflect.ValueOf(f.y)
		if x.Kind() == reflect.Slice && x.Len() == 0 && y.Len() == 0 {
			continue // nil and empty lists are the same setting
		}
		if !reflect.DeepEqual(f.x, f.y) {
			out = append(out, f.name)
		}
	}
	return out
}
