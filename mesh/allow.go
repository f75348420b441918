package mesh

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
)

// The allowlist names the peers that may be members: when it is on
// (Config.AllowPeers, AllowPeersFile or AllowExternal), a peer not on it
// is refused everywhere a peer can enter:
//
//   - the connection gater refuses it after the security handshake
//     (InterceptSecured, where its peer ID is authenticated) and refuses
//     to dial it (a Mesh built by New; Attach has no gater, see
//     docs/p2p.md);
//   - the topic validator rejects every gossip message whose signed
//     author is not listed (ReasonNotMember), whoever forwarded it;
//   - the sync and forward streams of an unlisted remote peer are reset
//     (ReasonNotMember), and such a peer is never announced to the node
//     (PeerConnected), sent state or forwarded requests, nor dialled from
//     a member table or mDNS.
//
// This member's own peer ID is always allowed. The list is the union of
// its sources: the static Config.AllowPeers, the file
// Config.AllowPeersFile (re-read when it changes) and whatever
// SetAllowedPeers supplies at run time under a source name (serve's DNS
// TXT records). Without any source the allowlist is off: any peer that can
// connect and publish is a member, as before.

// allowSourceConfig and allowSourceFile name the built-in sources.
const (
	allowSourceConfig = "config"
	allowSourceFile   = "file"
)

// maxAllowFileBytes bounds the allowlist file: 1 MiB is ~19 000 peer IDs.
const maxAllowFileBytes = 1 << 20

// allowlist is the set of peers admitted as members. allowed is called on
// every connection, message and stream, concurrently: it reads an atomic
// pointer to an immutable set.
type allowlist struct {
	self peer.ID
	on   bool // fixed at construction

	mu      sync.Mutex // serialises replace
	sources map[string][]peer.ID
	set     atomic.Pointer[map[peer.ID]struct{}]
}

func newAllowlist(self peer.ID, on bool) *allowlist {
	a := &allowlist{self: self, on: on, sources: make(map[string][]peer.ID)}
	empty := map[peer.ID]struct{}{}
	a.set.Store(&empty)
	return a
}

// allowed reports whether p may be a member: always when the allowlist is
// off, and for this member itself.
func (a *allowlist) allowed(p peer.ID) bool {
	if a == nil || !a.on || p == a.self {
		return true
	}
	_, ok := (*a.set.Load())[p]
	return ok
}

// replace sets one source's peers and returns the peers the union lost and
// gained.
func (a *allowlist) replace(source string, ids []peer.ID) (removed, added []peer.ID) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.sources[source] = slices.Clone(ids)
	next := make(map[peer.ID]struct{})
	for _, src := range a.sources {
		for _, p := range src {
			next[p] = struct{}{}
		}
	}
	prev := *a.set.Load()
	for p := range prev {
		if _, ok := next[p]; !ok {
			removed = append(removed, p)
		}
	}
	for p := range next {
		if _, ok := prev[p]; !ok {
			added = append(added, p)
		}
	}
	a.set.Store(&next)
	return removed, added
}

// list returns the union, sorted.
func (a *allowlist) list() []string {
	set := *a.set.Load()
	out := make([]string, 0, len(set))
	for p := range set {
		out = append(out, p.String())
	}
	slices.Sort(out)
	return out
}

// ParseAllowList reads an allowlist file: one peer ID a line; blank lines
// and everything from a '#' to the end of a line are ignored. The error
// names the first bad line.
func ParseAllowList(r io.Reader) ([]peer.ID, error) {
	var out []peer.ID
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), maxAllowFileBytes)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if i := strings.IndexByte(line, '#'); i >= 0 {
			line = line[:i]
		}
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		p, err := peer.Decode(line)
		if err != nil {
			return nil, fmt.Errorf("line %d: %q is not a peer ID: %v", n, line, err)
		}
		out = append(out, p)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	return out, nil
}

// LoadAllowList reads and parses the allowlist file at path (see
// ParseAllowList); the error names the path.
func LoadAllowList(path string) ([]peer.ID, error) {
	_, ids, err := loadAllowFile(path)
	return ids, err
}

// loadAllowFile reads and parses the allowlist file at path, and returns
// its content too.
func loadAllowFile(path string) ([]byte, []peer.ID, error) {
	data, err := readAllowFile(path)
	if err != nil {
		return nil, nil, err
	}
	ids, err := parseAllowFile(path, data)
	if err != nil {
		return nil, nil, err
	}
	return data, ids, nil
}

// parseAllowFile parses data, read from path; the error names the path.
func parseAllowFile(path string, data []byte) ([]peer.ID, error) {
	ids, err := ParseAllowList(bytes.NewReader(data))
	if err != nil {
		return nil, fmt.Errorf("mesh: allowlist %s: %w", path, err)
	}
	return ids, nil
}

func readAllowFile(path string) ([]byte, error) {
	f, err := os.Open(path) // follows symlinks: a ConfigMap's ..data swap shows as new content
	if err != nil {
		return nil, fmt.Errorf("mesh: allowlist %s: %w", path, err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxAllowFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("mesh: allowlist %s: %w", path, err)
	}
	if len(data) > maxAllowFileBytes {
		return nil, fmt.Errorf("mesh: allowlist %s: over %d bytes", path, maxAllowFileBytes)
	}
	return data, nil
}

// decodePeers decodes peer IDs in text form; the error names the first bad
// one by its index.
func decodePeers(ids []string) ([]peer.ID, error) {
	out := make([]peer.ID, 0, len(ids))
	for i, s := range ids {
		p, err := peer.Decode(strings.TrimSpace(s))
		if err != nil {
			return nil, fmt.Errorf("[%d] %q is not a peer ID: %v", i, s, err)
		}
		out = append(out, p)
	}
	return out, nil
}

// AllowlistOn reports whether this member admits only the peers on its
// allowlist.
func (m *Mesh) AllowlistOn() bool { return m.allow.on }

// AllowedPeers returns the allowlist (the union of its sources, this member
// not included unless listed), sorted; nil when the allowlist is off.
func (m *Mesh) AllowedPeers() []string {
	if !m.allow.on {
		return nil
	}
	return m.allow.list()
}

// Allowed reports whether peerID may be a member: true for every valid
// peer ID when the allowlist is off, and for this member itself.
func (m *Mesh) Allowed(peerID string) bool {
	p, err := peer.Decode(peerID)
	if err != nil {
		return false
	}
	return m.allow.allowed(p)
}

// ErrAllowlistOff is returned by SetAllowedPeers on a Mesh whose
// allowlist is off: a run-time source cannot turn it on (set
// Config.AllowExternal).
var ErrAllowlistOff = errors.New("mesh: the allowlist is off (set Config.AllowExternal to supply peers at run time)")

// SetAllowedPeers replaces the peers the run-time source named source
// (not "config" or "file") contributes to the allowlist, for example the
// peers DNS TXT records list (discovery.TXT). A peer that leaves the
// allowlist is disconnected (a Mesh built by New) or no longer served (an
// attached Mesh) and refused from then on; a bootstrap peer that joins it
// is dialled at once. The error names a bad peer ID, and nothing changes
// then.
func (m *Mesh) SetAllowedPeers(source string, peerIDs []string) error {
	if !m.allow.on {
		return ErrAllowlistOff
	}
	if source == allowSourceConfig || source == allowSourceFile || source == "" {
		return fmt.Errorf("mesh: SetAllowedPeers: source %q is reserved", source)
	}
	ids, err := decodePeers(peerIDs)
	if err != nil {
		return fmt.Errorf("mesh: SetAllowedPeers %s: %w", source, err)
	}
	m.setAllowed(source, ids)
	return nil
}

// setAllowed replaces a source's peers and acts on the difference.
func (m *Mesh) setAllowed(source string, ids []peer.ID) {
	removed, added := m.allow.replace(source, ids)
	if len(removed) == 0 && len(added) == 0 {
		return
	}
	m.log.Info("allowlist changed", "source", source, "added", len(added), "removed", len(removed), "members", len(m.allow.list()))
	for _, p := range removed {
		if p == m.self {
			continue
		}
		if m.owned {
			if m.h.Network().Connectedness(p) == network.Connected {
				_ = m.h.Network().ClosePeer(p)
			}
		} else {
			m.push(connEvent{kind: evBlocked, p: p}) // no longer announced; its streams are refused
		}
	}
	for _, p := range added {
		m.signal(p, true) // a bootstrap peer's redial loop waits for this
		if !m.owned && m.h.Network().Connectedness(p) == network.Connected {
			// The service kept the connection: announce the peer now.
			if ok, _ := m.h.Peerstore().SupportsProtocols(p, m.syncProto); len(ok) > 0 {
				m.push(connEvent{kind: evProtocols, p: p, protos: ok})
			}
		}
	}
}

// watchAllowFile re-reads the allowlist file every AllowPeersPoll and
// applies it when its content changed. A file that cannot be read or
// parsed keeps the last good list, with a warning (once per distinct
// error): a ConfigMap update that swaps the file through a symlink, or an
// editor's rename, is seen as new content at the next poll.
func (m *Mesh) watchAllowFile(last []byte) {
	defer m.wg.Done()
	path := m.cfg.AllowPeersFile
	t := time.NewTicker(m.cfg.AllowPeersPoll)
	defer t.Stop()
	var lastErr string
	for {
		select {
		case <-m.ctx.Done():
			return
		case <-t.C:
		}
		data, err := readAllowFile(path)
		if err == nil && bytes.Equal(data, last) {
			lastErr = ""
			continue
		}
		var ids []peer.ID
		if err == nil {
			ids, err = parseAllowFile(path, data)
		}
		if err != nil {
			if err.Error() != lastErr {
				m.log.Warn("allowlist file unusable; keeping the last good list", "key", "node.allow_peers_file", "err", err)
				lastErr = err.Error()
			}
			continue
		}
		lastErr = ""
		last = data
		m.setAllowed(allowSourceFile, ids)
	}
}
