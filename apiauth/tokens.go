// Package apiauth authenticates the clients of a node's APIs (HTTP and
// Envoy's rate limit service over gRPC): bearer tokens with a scope, and
// the TLS certificates the APIs serve and ask their clients for. Both are
// read from files and read again when the files change, so tokens and
// certificates rotate without a restart.
//
// A server drives it like this:
//
//	toks, err := apiauth.NewTokens(apiauth.TokensConfig{File: path})
//	certs, err := apiauth.NewCerts(apiauth.CertsConfig{CertFile: c, KeyFile: k, ClientCA: ca})
//	srv.TLSConfig = certs.ServerConfig("h2", "http/1.1")
//	// per request:
//	err := toks.Authorize(apiauth.BearerToken(r.Header.Get("Authorization")), apiauth.Decide)
//	// errors.Is(err, apiauth.ErrUnauthenticated): 401; apiauth.ErrForbidden: 403
//
// Everything here is safe for concurrent use.
package apiauth

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Scope is what a token may do. A higher scope implies the lower ones.
type Scope uint8

// The scopes, from least to most.
const (
	// None is no scope: an unknown or missing token.
	None Scope = iota
	// Decide asks for decisions: /v1/allow, /v1/wait, the leases, and
	// Envoy's ShouldRateLimit.
	Decide
	// Admin also reads the member table and the per-member counts and
	// changes the mesh's state (evict).
	Admin
)

// String returns the scope's name as token files spell it.
func (s Scope) String() string {
	switch s {
	case Decide:
		return "decide"
	case Admin:
		return "admin"
	}
	return "none"
}

// ParseScope reads a scope's name: decide or admin.
func ParseScope(s string) (Scope, error) {
	switch s {
	case "decide":
		return Decide, nil
	case "admin":
		return Admin, nil
	}
	return None, fmt.Errorf("scope %q is not one of decide, admin", s)
}

// Errors of Authorize.
var (
	// ErrUnauthenticated: no token, or one that no scope holds (401,
	// codes.Unauthenticated).
	ErrUnauthenticated = errors.New("apiauth: missing or invalid bearer token")
	// ErrForbidden: a valid token whose scope is too low (403,
	// codes.PermissionDenied).
	ErrForbidden = errors.New("apiauth: insufficient scope")
)

// AuthError is the error of Authorize: why, and the scopes involved.
type AuthError struct {
	// Missing is true when no token was presented at all.
	Missing bool
	// Need is the scope the call needs; Have the token's (None when
	// unauthenticated).
	Need, Have Scope
	err        error
}

func (e *AuthError) Error() string {
	switch {
	case e.Missing:
		return "authorization: a bearer token is required"
	case e.Have == None:
		return "authorization: invalid token"
	}
	return fmt.Sprintf("authorization: this call needs the %s scope; the token has %s", e.Need, e.Have)
}

// Unwrap returns ErrUnauthenticated or ErrForbidden.
func (e *AuthError) Unwrap() error { return e.err }

// MinTokenBytes is the shortest token accepted: 16 bytes, 128 bits of a
// random token.
const MinTokenBytes = 16

// TokenLine is one token of a file: its scope and its value.
type TokenLine struct {
	Scope Scope
	Value string
}

// ParseTokens reads token lines: "SCOPE TOKEN", one a line (so that a
// scope may hold several tokens, and a new one be added before an old one
// is removed). Blank lines and lines starting with # are skipped; a comma
// also ends a line, so an environment variable can hold several
// ("admin AAA…,decide BBB…"). A token is RFC 6750's b64token (letters,
// digits, - . _ ~ + / and trailing =), at least MinTokenBytes long.
// Errors name source and the line.
func ParseTokens(data []byte, source string) ([]TokenLine, error) {
	var out []TokenLine
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 4096), 1<<20)
	for ln := 1; sc.Scan(); ln++ {
		for _, part := range strings.Split(sc.Text(), ",") {
			line := strings.TrimSpace(part)
			if line == "" || strings.HasPrefix(line, "#") {
				continue
			}
			f := strings.Fields(line)
			if len(f) != 2 {
				return nil, fmt.Errorf("%s line %d: want \"SCOPE TOKEN\" (scope decide or admin), got %d fields", source, ln, len(f))
			}
			scope, err := ParseScope(f[0])
			if err != nil {
				return nil, fmt.Errorf("%s line %d: %v", source, ln, err)
			}
			if err := checkToken(f[1]); err != nil {
				return nil, fmt.Errorf("%s line %d: %v", source, ln, err)
			}
			out = append(out, TokenLine{Scope: scope, Value: f[1]})
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", source, err)
	}
	return out, nil
}

func checkToken(t string) error {
	if len(t) < MinTokenBytes {
		return fmt.Errorf("token of %d characters: at least %d are needed (openssl rand -hex 32 makes one)", len(t), MinTokenBytes)
	}
	body := strings.TrimRight(t, "=")
	if body == "" {
		return errors.New("token: only '='")
	}
	for _, c := range []byte(body) {
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("-._~+/", c) >= 0
		if !ok {
			return fmt.Errorf("token: character %q is not allowed (letters, digits, - . _ ~ + / and trailing =)", c)
		}
	}
	return nil
}

// BearerToken returns the token of an Authorization header value
// ("Bearer TOKEN", the scheme in any case), or "" when there is none.
func BearerToken(header string) string {
	scheme, tok, ok := strings.Cut(strings.TrimSpace(header), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return ""
	}
	return strings.TrimSpace(tok)
}

// TokensConfig configures Tokens.
type TokensConfig struct {
	// File holds token lines (ParseTokens); it is read again when its
	// modification time, size or identity changes. Empty: none.
	File string
	// FileKey names File in errors (the config key); default "token file".
	FileKey string
	// Env holds token lines from the environment (fixed until a restart);
	// EnvName names it in errors.
	Env, EnvName string
	// CheckEvery is how often the file is checked for a change, at most;
	// default 1 s.
	CheckEvery time.Duration
	// Logger receives reloads and failed reloads; nil discards them.
	Logger *slog.Logger
}

// Tokens is a set of bearer tokens and their scopes: the lines of a file
// (re-read on change) and of an environment variable. The zero value is
// not usable; see NewTokens. It is safe for concurrent use.
type Tokens struct {
	cfg   TokensConfig
	fixed []entry
	cur   atomic.Pointer[[]entry]
	// checked is the time of the last look at the file, in ns.
	checked atomic.Int64
	mu      sync.Mutex // one reload at a time
	info    os.FileInfo
	// missing: the file could not be stat'ed at the last look (logged
	// once, not at every look).
	missing bool
}

type entry struct {
	sum   [sha256.Size]byte
	scope Scope
	value string
}

// NewTokens reads cfg's file and variable. At least one token is needed;
// errors name the file's key and path, or the variable.
func NewTokens(cfg TokensConfig) (*Tokens, error) {
	if cfg.FileKey == "" {
		cfg.FileKey = "token file"
	}
	if cfg.EnvName == "" {
		cfg.EnvName = "environment"
	}
	if cfg.CheckEvery <= 0 {
		cfg.CheckEvery = time.Second // rotation within a second, one stat a second at most
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	t := &Tokens{cfg: cfg}
	if cfg.Env != "" {
		lines, err := ParseTokens([]byte(cfg.Env), cfg.EnvName)
		if err != nil {
			return nil, err
		}
		t.fixed = entries(lines)
	}
	var fromFile []entry
	if cfg.File != "" {
		fi, lines, err := t.read()
		if err != nil {
			return nil, err
		}
		t.info, fromFile = fi, entries(lines)
	}
	all := append(append([]entry(nil), t.fixed...), fromFile...)
	if len(all) == 0 {
		where := cfg.EnvName
		if cfg.File != "" {
			where = fmt.Sprintf("%s %s", cfg.FileKey, cfg.File)
		}
		return nil, fmt.Errorf("%s: holds no token; add a line \"admin TOKEN\" or \"decide TOKEN\"", where)
	}
	t.cur.Store(&all)
	t.checked.Store(time.Now().UnixNano())
	return t, nil
}

func entries(lines []TokenLine) []entry {
	out := make([]entry, len(lines))
	for i, l := range lines {
		out[i] = entry{sum: sha256.Sum256([]byte(l.Value)), scope: l.Scope, value: l.Value}
	}
	return out
}

// read reads and parses the file.
func (t *Tokens) read() (os.FileInfo, []TokenLine, error) {
	f, err := os.Open(t.cfg.File)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", t.cfg.FileKey, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", t.cfg.FileKey, err)
	}
	data, err := io.ReadAll(io.LimitReader(f, 1<<20))
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", t.cfg.FileKey, err)
	}
	lines, err := ParseTokens(data, t.cfg.FileKey+" "+t.cfg.File)
	return fi, lines, err
}

// refresh re-reads the file when it changed and CheckEvery has passed
// since the last look. A file that cannot be read or parsed keeps the
// running tokens (logged); one that holds no token leaves only the
// environment's: revoking every token refuses every client.
func (t *Tokens) refresh() {
	if t.cfg.File == "" {
		return
	}
	now := time.Now().UnixNano()
	last := t.checked.Load()
	if now-last < int64(t.cfg.CheckEvery) || !t.checked.CompareAndSwap(last, now) {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	fi, err := os.Stat(t.cfg.File)
	if err != nil {
		if !t.missing {
			t.cfg.Logger.Error("token file: keeping the running tokens", "key", t.cfg.FileKey, "err", err)
		}
		t.missing = true
		return
	}
	t.missing = false
	if t.info != nil && os.SameFile(fi, t.info) && fi.ModTime().Equal(t.info.ModTime()) && fi.Size() == t.info.Size() {
		return
	}
	fi, lines, err := t.read()
	if err != nil {
		t.cfg.Logger.Error("token file changed but cannot be read: keeping the running tokens", "err", err)
		if fi != nil {
			t.info = fi // not again until it changes once more
		}
		return
	}
	t.info = fi
	all := append(append([]entry(nil), t.fixed...), entries(lines)...)
	t.cur.Store(&all)
	t.cfg.Logger.Info("token file reloaded", "key", t.cfg.FileKey, "path", t.cfg.File, "tokens", len(lines))
}

// Scope returns the scope of token, None when it is unknown. Every known
// token is compared, in constant time each, whatever matches: the time
// taken tells nothing of which bytes were right.
func (t *Tokens) Scope(token string) Scope {
	t.refresh()
	if token == "" {
		return None
	}
	sum := sha256.Sum256([]byte(token))
	var best int
	for _, e := range *t.cur.Load() {
		eq := subtle.ConstantTimeCompare(sum[:], e.sum[:])
		// best = max(best, scope) when eq, without a branch on eq.
		s := subtle.ConstantTimeSelect(eq, int(e.scope), 0)
		gt := subtle.ConstantTimeLessOrEq(best+1, s)
		best = subtle.ConstantTimeSelect(gt, s, best)
	}
	return Scope(best)
}

// Authorize checks that token holds need: nil, or an *AuthError wrapping
// ErrUnauthenticated (no token, or an unknown one) or ErrForbidden (a
// lower scope). A nil *Tokens admits everything: no token is configured.
func (t *Tokens) Authorize(token string, need Scope) error {
	if t == nil || need == None {
		return nil
	}
	have := t.Scope(token)
	switch {
	case token == "":
		return &AuthError{Missing: true, Need: need, err: ErrUnauthenticated}
	case have == None:
		return &AuthError{Need: need, err: ErrUnauthenticated}
	case have < need:
		return &AuthError{Need: need, Have: have, err: ErrForbidden}
	}
	return nil
}

// First returns the first token of scope s at least (the environment's
// before the file's), "" when there is none: what a node presents when it
// asks its peers' APIs (DNS discovery), the members of a mesh sharing
// their tokens.
func (t *Tokens) First(s Scope) string {
	if t == nil {
		return ""
	}
	t.refresh()
	for _, e := range *t.cur.Load() {
		if e.scope >= s {
			return e.value
		}
	}
	return ""
}
