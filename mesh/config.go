package mesh

import (
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/pnet"
	ma "github.com/multiformats/go-multiaddr"

	"github.com/ratemesh/ratemesh/crdt"
)

// Config configures a Mesh. Start from DefaultConfig; New and Attach
// validate it and name the first field that is wrong. Listen, PrivKey,
// PSK and GossipHeartbeat configure the host and router New builds; Attach
// takes the service's (see Attach).
type Config struct {
	// Namespace separates meshes that share a network: the gossip topic is
	// /ratemesh/1/<Namespace> and the anti-entropy protocol
	// /ratemesh/1/<Namespace>/sync.
	Namespace string
	// Listen are the multiaddrs to listen on, TCP (/ip4/…/tcp/N) and,
	// without a PSK, QUIC (/ip4/…/udp/N/quic-v1). Empty listens nowhere
	// (the mesh can still dial out). Attach requires it empty: the
	// service's host listens.
	Listen []string
	// Bootstrap are full multiaddrs of peers, ending in /p2p/<peer ID>.
	// The mesh dials them at Start and keeps redialling them, with
	// backoff, whenever the connection drops.
	Bootstrap []string
	// PrivKey is this member's identity; its peer ID names the member's
	// counter slot, so persist it to keep the slot across restarts (see
	// LoadOrCreateKey). Required by New; Attach takes the host's identity
	// and accepts only nil or the host's own key.
	PrivKey crypto.PrivKey
	// PSK, when set, is the 32-byte private network key (see LoadPSK):
	// only holders of the same key can connect. With a PSK only TCP works;
	// a QUIC listen address is refused. Attach requires it empty: build
	// the service's host with libp2p.PrivateNetwork instead.
	PSK []byte
	// MDNS discovers peers on the local network by multicast DNS.
	MDNS bool
	// Logger receives the transport's log; nil discards it.
	Logger *slog.Logger
	// MaxMessageBytes caps one encoded batch, on the topic and on the sync
	// stream; larger ones are refused (Publish) or rejected (receipt).
	MaxMessageBytes int
	// Plausible returns the largest value one slot can possibly hold for
	// rule in one window: the rule's limit (or largest override) × its
	// largest class multiplier × a safety factor. An entry whose admitted
	// count (for a window entry) or live lease count (acquired − released,
	// for a lease entry) exceeds it is implausible, and the whole message
	// carrying it is rejected. ok=false (a rule this member does not know)
	// skips the check for that entry: the core drops entries of unknown
	// rules anyway, and rejecting them would cut a peer off during a
	// rolling rule change. A rule with an unlimited class has no bound:
	// return ok=false for it. nil skips every value check.
	//
	// Plausible is called concurrently from validation goroutines and must
	// be safe for that and fast (a map read behind an atomic pointer).
	Plausible func(rule string) (maxPerWindow uint64, ok bool)
	// DialTimeout bounds one dial, handshake included. With a PSK, a peer
	// holding a different key never completes the handshake; the dial
	// fails after DialTimeout with ErrKeyMismatchOrUnreachable.
	DialTimeout time.Duration
	// SyncTimeout bounds each step of an anti-entropy stream, either
	// side: opening it, each frame written or read, and the receipt after
	// the last. A long transfer goes on while it makes progress.
	SyncTimeout time.Duration
	// MaxSyncBatches caps the batches one anti-entropy stream may carry.
	MaxSyncBatches int
	// QueueSize is the depth of gossipsub's per-peer outbound queue, its
	// validation queue and the subscription buffer (libp2p's 32 drops
	// messages silently under bursts). An attached Mesh sizes only its
	// subscription buffer: the PubSub's queues are the service's.
	QueueSize int
	// GossipHeartbeat is gossipsub's heartbeat: how soon the topic mesh
	// forms and repairs itself. It is not the member's idle heartbeat
	// (mesh.heartbeat in the config file), which the runtime drives. Not
	// used by Attach: the PubSub's parameters are the service's.
	GossipHeartbeat time.Duration
	// RedialMin and RedialMax bound the exponential backoff of redials to
	// a bootstrap peer, or a member, whose connection dropped.
	RedialMin, RedialMax time.Duration

	// AllowPeers, AllowPeersFile and AllowExternal turn on the allowlist
	// of member peer IDs (see allow.go and docs/design.md, "Admission"):
	// when any is set, a peer not on the list cannot connect (the gater
	// of a Mesh built by New), and its gossip, sync and forward traffic
	// is refused as ReasonNotMember. This member is always allowed. With
	// none set (the default) the allowlist is off: any peer that can
	// connect and publish is a member.
	//
	// AllowPeers are peer IDs in text form (12D3KooW…).
	AllowPeers []string
	// AllowPeersFile is a file of peer IDs, one a line, '#' starting a
	// comment (ParseAllowList). New and Attach fail when it cannot be
	// read; while the mesh runs it is re-read every AllowPeersPoll and a
	// changed content applies at once (peers removed are disconnected);
	// a file that turns unreadable or invalid keeps the last good list.
	AllowPeersFile string
	// AllowPeersPoll is how often AllowPeersFile is re-read.
	AllowPeersPoll time.Duration
	// AllowExternal turns the allowlist on for peers supplied at run time
	// by SetAllowedPeers (serve's DNS TXT records), even when AllowPeers
	// and AllowPeersFile name nobody: until a source names a peer, only
	// this member is allowed.
	AllowExternal bool
}

// allowlistOn reports whether the config turns the allowlist on.
func (c *Config) allowlistOn() bool {
	return len(c.AllowPeers) > 0 || c.AllowPeersFile != "" || c.AllowExternal
}

// DefaultConfig returns the defaults, each with its reason.
func DefaultConfig() Config {
	return Config{
		Namespace: "default",
		// Loopback only: forming a mesh across hosts is a deliberate act
		// (a routable address, and then a PSK).
		Listen: []string{"/ip4/127.0.0.1/tcp/4001"},
		Logger: slog.Default(),
		// gossipsub's own default cap, and the decoder's.
		MaxMessageBytes: crdt.MaxBatchBytes,
		// Long enough for a handshake across a continent, short enough
		// that a wrong PSK is reported while the operator still watches.
		DialTimeout: 5 * time.Second,
		// A full state of a million keys is ~60 MB; 30 s covers it on a
		// slow link and still frees a stuck stream.
		SyncTimeout: 30 * time.Second,
		// 2000 entries per batch × 65536 is far above max_keys.
		MaxSyncBatches: 1 << 16,
		// 32× libp2p's 32: a sync interval's batch per peer never queues
		// that deep, a burst of reconnections does.
		QueueSize: 1024,
		// A 100 ms heartbeat brought partition-heal delivery from ~320 ms
		// to ~80 ms in a probe (libp2p's default is 1 s).
		GossipHeartbeat: 100 * time.Millisecond,
		// Fast first retry after a blip; a dead peer costs one dial per
		// 30 s.
		RedialMin: 250 * time.Millisecond,
		RedialMax: 30 * time.Second,
		// A file a ConfigMap or a deploy tool rewrites applies within
		// seconds; reading a small file this often costs nothing.
		AllowPeersPoll: 2 * time.Second,
	}
}

// Sentinel errors of the package.
var (
	// ErrKeyMismatchOrUnreachable is a failed dial under a PSK: a peer
	// holding another key (or no key) cannot be told apart from a peer
	// that does not answer, because the handshake stalls instead of
	// failing.
	ErrKeyMismatchOrUnreachable = errors.New("mesh: private network key mismatch or peer unreachable")
	// ErrUnreachable is a failed dial without a PSK.
	ErrUnreachable = errors.New("mesh: peer unreachable")
	// ErrClosed is returned by a closed or not yet started Mesh.
	ErrClosed = errors.New("mesh: closed")
	// ErrNotStarted is returned by Publish and SendDirect before Start.
	ErrNotStarted = errors.New("mesh: not started")
	// ErrNotMember is returned by SendDirect and Forward for a peer not on
	// the allowlist.
	ErrNotMember = errors.New("mesh: peer not on the allowlist")
	// ErrTooLarge is returned by Publish and SendDirect for a batch whose
	// encoding exceeds MaxMessageBytes.
	ErrTooLarge = errors.New("mesh: batch over the message size cap")
)

// validate checks a Config for New, naming the first wrong field.
func (c *Config) validate() error {
	if err := c.validateNamespace(); err != nil {
		return err
	}
	if c.PrivKey == nil {
		return badField("PrivKey", "required (the member's identity)")
	}
	return c.validateRest()
}

func badField(field, format string, args ...any) error {
	return fmt.Errorf("mesh: config %s: "+format, append([]any{field}, args...)...)
}

func (c *Config) validateNamespace() error {
	if c.Namespace == "" {
		return badField("Namespace", "must not be empty")
	}
	for _, r := range c.Namespace {
		if r <= ' ' || r == '/' || r == 0x7f {
			return badField("Namespace", "%q: no spaces, control characters or '/'", c.Namespace)
		}
	}
	if len(c.Namespace) > 64 {
		return badField("Namespace", "%d bytes, over 64", len(c.Namespace))
	}
	return nil
}

// validateRest checks the fields after Namespace and PrivKey, which New
// and Attach share.
func (c *Config) validateRest() error {
	bad := badField
	if len(c.PSK) != 0 && len(c.PSK) != 32 {
		return bad("PSK", "%d bytes, want 32", len(c.PSK))
	}
	for i, s := range c.Listen {
		a, err := ma.NewMultiaddr(s)
		if err != nil {
			return bad(fmt.Sprintf("Listen[%d]", i), "%q: %v", s, err)
		}
		tcp, quic := isTCP(a), isQUIC(a)
		switch {
		case !tcp && !quic:
			return bad(fmt.Sprintf("Listen[%d]", i), "%q: only /tcp and /udp/…/quic-v1 are supported", s)
		case quic && len(c.PSK) > 0:
			return bad(fmt.Sprintf("Listen[%d]", i), "%q: a private network key (PSK) works only over TCP; QUIC cannot use one", s)
		}
	}
	for i, s := range c.Bootstrap {
		if _, err := peer.AddrInfoFromString(s); err != nil {
			return bad(fmt.Sprintf("Bootstrap[%d]", i), "%q: want a multiaddr ending in /p2p/<peer ID>: %v", s, err)
		}
	}
	switch {
	case c.MaxMessageBytes <= 0 || c.MaxMessageBytes > crdt.MaxBatchBytes:
		return bad("MaxMessageBytes", "%d, must be within 1 and %d", c.MaxMessageBytes, crdt.MaxBatchBytes)
	case c.DialTimeout <= 0:
		return bad("DialTimeout", "%v, must be positive", c.DialTimeout)
	case c.SyncTimeout <= 0:
		return bad("SyncTimeout", "%v, must be positive", c.SyncTimeout)
	case c.MaxSyncBatches <= 0:
		return bad("MaxSyncBatches", "%d, must be positive", c.MaxSyncBatches)
	case c.QueueSize <= 0:
		return bad("QueueSize", "%d, must be positive", c.QueueSize)
	case c.GossipHeartbeat < 10*time.Millisecond:
		return bad("GossipHeartbeat", "%v, must be at least 10ms", c.GossipHeartbeat)
	case c.RedialMin <= 0:
		return bad("RedialMin", "%v, must be positive", c.RedialMin)
	case c.RedialMax < c.RedialMin:
		return bad("RedialMax", "%v, must not be below RedialMin %v", c.RedialMax, c.RedialMin)
	case c.AllowPeersFile != "" && c.AllowPeersPoll <= 0:
		return bad("AllowPeersPoll", "%v, must be positive with AllowPeersFile", c.AllowPeersPoll)
	}
	if _, err := decodePeers(c.AllowPeers); err != nil {
		return bad("AllowPeers", "%v", err)
	}
	return nil
}

func isTCP(a ma.Multiaddr) bool {
	_, err := a.ValueForProtocol(ma.P_TCP)
	return err == nil
}

func isQUIC(a ma.Multiaddr) bool {
	_, err := a.ValueForProtocol(ma.P_QUIC_V1)
	return err == nil
}

// LoadPSK reads a private network key from a swarm.key file in the
// libp2p/IPFS format:
//
//	/key/swarm/psk/1.0.0/
//	/base16/
//	<64 hex digits>
//
// The error names the path.
func LoadPSK(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("mesh: load PSK %s: %w", path, err)
	}
	defer f.Close()
	psk, err := pnet.DecodeV1PSK(f)
	if err != nil {
		return nil, fmt.Errorf("mesh: load PSK %s: %w", path, err)
	}
	if len(psk) != 32 {
		return nil, fmt.Errorf("mesh: load PSK %s: %d bytes, want 32", path, len(psk))
	}
	return psk, nil
}

// LoadOrCreateKey returns the Ed25519 identity stored at path (libp2p's
// protobuf key encoding), creating it with mode 0600 when the file does not
// exist. A persisted key keeps the peer ID, and so the counter slot, across
// restarts.
func LoadOrCreateKey(path string) (crypto.PrivKey, error) {
	data, err := os.ReadFile(path)
	if err == nil {
		k, err := crypto.UnmarshalPrivateKey(data)
		if err != nil {
			return nil, fmt.Errorf("mesh: load key %s: %w", path, err)
		}
		return k, nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("mesh: load key %s: %w", path, err)
	}
	k, _, err := crypto.GenerateEd25519Key(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("mesh: create key %s: %w", path, err)
	}
	data, err = crypto.MarshalPrivateKey(k)
	if err != nil {
		return nil, fmt.Errorf("mesh: create key %s: %w", path, err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, fmt.Errorf("mesh: create key %s: %w", path, err)
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return nil, fmt.Errorf("mesh: create key %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return nil, fmt.Errorf("mesh: create key %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return nil, fmt.Errorf("mesh: create key %s: %w", path, err)
	}
	return k, nil
}
