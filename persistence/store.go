package persistence

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	ds "github.com/ipfs/go-datastore"
	"github.com/ipfs/go-datastore/query"
	dssync "github.com/ipfs/go-datastore/sync"
	pebbleds "github.com/ipfs/go-ds-pebble"

	"github.com/ratemesh/ratemesh/node"
)

// Sentinel errors.
var (
	// ErrClosed is returned by every call on a closed Store.
	ErrClosed = errors.New("persistence: store closed")
	// ErrCorrupt wraps a record or directory the store cannot read.
	ErrCorrupt = errors.New("persistence: corrupt data")
	// ErrNotStore wraps a directory that holds something other than a
	// ratemesh store.
	ErrNotStore = errors.New("persistence: not a ratemesh store")
	// ErrGone wraps a write (a flush, an incarnation) and Close's error
	// when the store's directory was removed or replaced while the store
	// was open: pebble would go on writing into files nobody can open
	// again.
	ErrGone = errors.New("persistence: store directory gone")
	// ErrBroken wraps a call that met a fatal pebble error (a write pebble
	// cannot complete, say), and every call after it: the store is no
	// longer usable and is not touched again.
	ErrBroken = errors.New("persistence: store broken")
	// ErrOldStore wraps Open's refusal of a store an older ratemesh wrote
	// that this version cannot take as it is: one that does not record
	// the members its node knew (see UpgradeUnknownMembers).
	ErrOldStore = errors.New("persistence: store of an older version")
)

// ErrorLogInterval is the least time between two log lines of pebble's
// errors: a disk that fails keeps failing, and pebble retries in a loop.
// The lines held back are counted in the next one.
const ErrorLogInterval = 10 * time.Second

// StoreDir is the directory under the data directory where pebble keeps its
// files; the data directory may hold other files beside it.
const StoreDir = "store"

// The store's formats, written under /meta/format and checked at Open.
//
// Format 2 records the members its node knew: a store of format 2
// without /meta/peers is one whose node never knew a member. Format 1 is
// the same layout, written by every version before it (fdd4fa5's among
// them), but it may come from before the members were saved at all
// (87f8fbc), so a format 1 store without /meta/peers says nothing about
// them. Open migrates a format 1 store that holds /meta/peers at once;
// one that holds none only with UpgradeUnknownMembers, and refuses it
// otherwise (ErrOldStore): a node that took it for "no members" would be
// ready at once and decide alone beside its peers.
const (
	format   = "ratemesh-store-2"
	formatV1 = "ratemesh-store-1"
)

// The key layout. Window records sort by the mesh time from which they are
// collected, so garbage collection reads only what it deletes.
var (
	keyFormat      = ds.RawKey("/meta/format")
	keyIdentity    = ds.RawKey("/meta/identity")
	keyIncarnation = ds.RawKey("/meta/incarnation")
	keyPeers       = ds.RawKey("/meta/peers")
)

const (
	prefixWindows = "/w"
	prefixLeases  = "/l"
	recordVersion = 1
)

var b64 = base64.RawURLEncoding

// Store is the node.Store on a go-datastore: pebble on disk (Open) or a map
// in memory (NewMemory). It is safe for concurrent use; the node runtime
// calls it from one goroutine at a time.
type Store struct {
	path    string      // the pebble directory, "" in memory
	dirInfo os.FileInfo // path's directory as opened; nil in memory
	d       ds.Batching
	ordered bool // queries return keys in order (pebble)
	errs    *errorLog

	mu         sync.Mutex
	minCollect int64 // no window record collects before this (MinInt64: unknown)
	closed     bool
	broken     error // a fatal pebble error: no call touches pebble again
}

// Option configures Open.
type Option func(*options)

type options struct {
	log            *slog.Logger
	fs             vfs.FS // tests inject failures
	unknownMembers bool
}

// UpgradeUnknownMembers lets Open migrate a store of an older version that
// does not record the members its node knew (format 1 without saved
// members: fdd4fa5's, say). Pass it only when the node will not take the
// store's silence for "no members": it joins through a bootstrap peer
// (and so waits for the peer's relay and member table before it decides),
// or it ran alone. Without it Open refuses such a store with ErrOldStore.
func UpgradeUnknownMembers() Option {
	return func(o *options) { o.unknownMembers = true }
}

// WithLogger sends pebble's errors to log (at error level, at most one
// line per ErrorLogInterval) instead of standard error.
func WithLogger(log *slog.Logger) Option {
	return func(o *options) { o.log = log }
}

var _ node.Store = (*Store)(nil)

// NewMemory returns a Store on go-datastore's in-memory map, for tests: it
// survives a node, not a process.
func NewMemory() *Store {
	s := &Store{d: dssync.MutexWrap(ds.NewMapDatastore()), minCollect: math.MinInt64}
	_ = s.d.Put(context.Background(), keyFormat, []byte(format))
	return s
}

// Open opens, or creates, the pebble store under dir (in dir/store). It
// fails, with an error naming the path and the cause, when dir cannot be
// created or is not a directory, on a permission error, when another
// running member holds the store, when the store directory holds anything
// but a ratemesh store, and when pebble cannot read it. It never panics.
func Open(dir string, opts ...Option) (*Store, error) {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	if o.log == nil {
		o.log = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	if dir == "" {
		return nil, errors.New("persistence: open: data directory not set")
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("persistence: open %s: %w", dir, err)
	}
	path := filepath.Join(dir, StoreDir)
	if err := checkDir(path); err != nil {
		return nil, err
	}
	var corrupt atomic.Pointer[pebble.DataCorruptionInfo]
	errs := &errorLog{log: o.log, path: path}
	d, err := openPebble(path, &corrupt, errs, o.fs)
	if err != nil {
		return nil, err
	}
	s := &Store{path: path, d: d, ordered: true, errs: errs, minCollect: math.MinInt64}
	if s.dirInfo, err = os.Stat(path); err != nil {
		err = fmt.Errorf("persistence: open %s: %w", path, err)
	}
	var migrate bool
	if err == nil {
		migrate, err = s.checkFormat(o.unknownMembers)
	}
	if err == nil {
		err = s.verify()
	}
	if info := corrupt.Load(); err == nil && info != nil {
		err = fmt.Errorf("persistence: open %s: %w: %s: %v", path, ErrCorrupt, info.Path, info.Details)
	}
	if err == nil && migrate {
		// Only a store that reads whole is migrated.
		err = s.writeFormat()
		if err == nil {
			o.log.Info("persistence: migrated the store", "store", path, "from", formatV1, "to", format)
		}
	}
	if err != nil {
		_ = d.Close()
		return nil, err
	}
	errs.opened.Store(true)
	return s, nil
}

// checkDir refuses a store path that exists and is not a directory, or
// holds files pebble would not have written.
func checkDir(path string) error {
	fi, err := os.Stat(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("persistence: open %s: %w", path, err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("persistence: open %s: %w: not a directory", path, ErrNotStore)
	}
	ents, err := os.ReadDir(path)
	if err != nil {
		return fmt.Errorf("persistence: open %s: %w", path, err)
	}
	for _, e := range ents {
		if !pebbleFile(e.Name()) {
			return fmt.Errorf("persistence: open %s: %w: it holds %q, which pebble did not write", path, ErrNotStore, e.Name())
		}
	}
	return nil
}

// pebbleFile reports whether name is a file pebble writes in its
// directory.
func pebbleFile(name string) bool {
	switch {
	case name == "LOCK", name == "CURRENT",
		strings.HasPrefix(name, "MANIFEST-"), strings.HasPrefix(name, "OPTIONS-"),
		strings.HasPrefix(name, "marker."), strings.HasPrefix(name, "temporary."),
		strings.HasSuffix(name, ".sst"), strings.HasSuffix(name, ".log"),
		strings.HasSuffix(name, ".blob"), strings.HasSuffix(name, ".dbtmp"),
		name == "archive":
		return true
	}
	return false
}

// openPebble opens pebble at path, turning a panic into an error.
func openPebble(path string, corrupt *atomic.Pointer[pebble.DataCorruptionInfo], errs *errorLog, fs vfs.FS) (d *pebbleds.Datastore, err error) {
	defer func() {
		if r := recover(); r != nil {
			d, err = nil, fmt.Errorf("persistence: open %s: %w: pebble: %v", path, ErrCorrupt, r)
		}
	}()
	logger := quietLogger{errs}
	opts := &pebble.Options{Logger: logger, FS: fs}
	// A corrupt table must fail the read that meets it, not the process
	// (pebble's default listener calls Fatalf). Background errors (a
	// flush pebble retries in a loop) go to the logger: rate-limited.
	opts.EventListener = &pebble.EventListener{
		DataCorruption: func(info pebble.DataCorruptionInfo) {
			corrupt.CompareAndSwap(nil, &info)
			logger.Errorf("data corruption in %s: %v", info.Path, info.Details)
		},
		BackgroundError: func(err error) { logger.Errorf("background error: %v", err) },
	}
	d, err = pebbleds.NewDatastore(path, pebbleds.WithPebbleOpts(opts))
	if err != nil {
		cause := err
		switch {
		case strings.Contains(err.Error(), "lock held by current process"),
			errors.Is(err, syscall.EAGAIN):
			return nil, fmt.Errorf("persistence: open %s: locked by another running member (%w)", path, cause)
		case errors.Is(err, os.ErrPermission):
			return nil, fmt.Errorf("persistence: open %s: permission denied (%w)", path, cause)
		}
		return nil, fmt.Errorf("persistence: open %s: %w: %w", path, ErrCorrupt, cause)
	}
	return d, nil
}

// quietLogger keeps pebble's informational chatter out of the node's
// output; its errors go to the store's errorLog.
//
// Fatalf must not return (pebble's contract). While Open runs it panics,
// and Open turns the panic into an error. Afterwards it breaks the store
// and parks the calling goroutine for good: unwinding it is not an
// option, because pebble calls Fatalf where its deferred unlocks would
// release a mutex it has already released (a fatal, unrecoverable runtime
// error: this is how a removed data directory crashed the process when
// pebble needed a new WAL file). The store's calls then fail with
// ErrBroken; node.Close bounds a call that was parked.
type quietLogger struct{ errs *errorLog }

func (quietLogger) Infof(string, ...any) {}
func (l quietLogger) Errorf(format string, args ...any) {
	msg, _, _ := strings.Cut(fmt.Sprintf(format, args...), "\n") // not the error's stack
	l.errs.error(msg)
}
func (l quietLogger) Fatalf(format string, args ...any) {
	msg, _, _ := strings.Cut(fmt.Sprintf(format, args...), "\n")
	if !l.errs.opened.Load() {
		panic(fmt.Sprintf("persistence %s: pebble: %s", l.errs.path, msg))
	}
	if l.errs.fatal.CompareAndSwap(nil, &msg) {
		l.errs.log.Error("persistence: pebble: fatal: "+msg+"; the store is broken", "store", l.errs.path)
	}
	select {} // see quietLogger
}

// errorLog logs pebble's error lines at most once per ErrorLogInterval;
// the next line logged carries how many were held back, and Close logs
// the last count. It also carries pebble's fatal error, once there is
// one. Safe for concurrent use: pebble logs from its own goroutines.
type errorLog struct {
	log    *slog.Logger
	path   string
	opened atomic.Bool            // Open succeeded: Fatalf parks instead of panicking
	fatal  atomic.Pointer[string] // pebble's fatal error, if any

	mu   sync.Mutex
	last time.Time // when a line was last logged
	held int       // lines held back since
}

func (e *errorLog) error(msg string) {
	e.mu.Lock()
	now := time.Now()
	if !e.last.IsZero() && now.Sub(e.last) < ErrorLogInterval {
		e.held++
		e.mu.Unlock()
		return
	}
	held := e.held
	e.last, e.held = now, 0
	e.mu.Unlock()
	if held > 0 {
		e.log.Error("persistence: pebble: "+msg, "store", e.path, "held_back", held, "every", ErrorLogInterval)
		return
	}
	e.log.Error("persistence: pebble: "+msg, "store", e.path)
}

// flush logs the count of lines held back, if any.
func (e *errorLog) flush() {
	e.mu.Lock()
	held := e.held
	e.held = 0
	e.mu.Unlock()
	if held > 0 {
		e.log.Error("persistence: pebble: more errors were not logged", "store", e.path, "held_back", held)
	}
}

// guard turns a panic out of pebble (an invariant it checks) into *err
// wrapping ErrBroken, and breaks the store: pebble may have been left
// mid-operation, so it is not called again. Defer it under s.mu in every
// call that writes through pebble after Open.
func (s *Store) guard(op string, err *error) {
	if r := recover(); r != nil {
		s.broken = s.fail(op, fmt.Errorf("%w: pebble: %v", ErrBroken, r))
		*err = s.broken
	}
}

// present refuses a write when the store's directory is no longer the
// one opened: removed (pebble would write into unlinked files, and sync
// them, until it needs a new file and fails in a loop) or replaced.
func (s *Store) present() error {
	if s.dirInfo == nil {
		return nil // in memory
	}
	fi, err := os.Stat(s.path)
	switch {
	case err != nil:
		return fmt.Errorf("%w: %w", ErrGone, err)
	case !os.SameFile(fi, s.dirInfo):
		return fmt.Errorf("%w: %s was replaced while the store was open", ErrGone, s.path)
	}
	return nil
}

// checkFormat writes the format marker into a new store and refuses a
// store of another format, or a non-empty store without one. It reports
// whether the store is of format 1 and may be migrated (see format).
func (s *Store) checkFormat(unknownMembers bool) (migrate bool, err error) {
	ctx := context.Background()
	v, err := s.d.Get(ctx, keyFormat)
	switch {
	case errors.Is(err, ds.ErrNotFound):
		res, err := s.d.Query(ctx, query.Query{KeysOnly: true, Limit: 1})
		if err != nil {
			return false, s.fail("open", err)
		}
		ents, err := res.Rest()
		if err != nil {
			return false, s.fail("open", err)
		}
		if len(ents) > 0 {
			return false, fmt.Errorf("persistence: open %s: %w: it holds keys but no format marker", s.path, ErrNotStore)
		}
		return false, s.writeFormat()
	case err != nil:
		return false, s.fail("open", err)
	case string(v) == format:
		return false, nil
	case string(v) == formatV1:
		has, err := s.d.Has(ctx, keyPeers)
		if err != nil {
			return false, s.fail("open", err)
		}
		if has || unknownMembers {
			return true, nil
		}
		return false, fmt.Errorf("persistence: open %s: %w: format %q does not record the members its node knew; "+
			"taken as it is, a node restarted without --bootstrap would count itself alone and decide beside its peers. "+
			"Start it with --bootstrap naming a live member: it joins through that peer and the store is migrated to %q. "+
			"A node that ran alone has no member to name: start it once with --upgrade-alone (serve) to migrate the store as it is",
			s.path, ErrOldStore, formatV1, format)
	case strings.HasPrefix(string(v), "ratemesh-store-"):
		return false, fmt.Errorf("persistence: open %s: %w: format %q is a newer ratemesh's, this version reads %q and %q: "+
			"run that version, or restore a copy this one wrote", s.path, ErrNotStore, v, format, formatV1)
	}
	return false, fmt.Errorf("persistence: open %s: %w: format %q, this version reads %q", s.path, ErrNotStore, v, format)
}

// writeFormat writes this version's format marker and syncs it.
func (s *Store) writeFormat() error {
	ctx := context.Background()
	if err := s.d.Put(ctx, keyFormat, []byte(format)); err != nil {
		return s.fail("open", err)
	}
	return s.fail("open", s.d.Sync(ctx, keyFormat))
}

// verify reads every record once, so a corrupt table (pebble checks every
// block's checksum) or record fails Open rather than a later flush.
func (s *Store) verify() error {
	ctx := context.Background()
	if _, err := s.LoadWindows(ctx); err != nil {
		return fmt.Errorf("%w (open)", err)
	}
	if _, err := s.LoadLeases(ctx); err != nil {
		return fmt.Errorf("%w (open)", err)
	}
	if _, err := s.LoadIncarnation(ctx); err != nil {
		return fmt.Errorf("%w (open)", err)
	}
	_, err := s.LoadIdentity(ctx)
	return err
}

// fail wraps err, if any, with the operation and the path.
func (s *Store) fail(op string, err error) error {
	if err == nil {
		return nil
	}
	where := s.path
	if where == "" {
		where = "(memory)"
	}
	return fmt.Errorf("persistence %s: %s: %w", where, op, err)
}

// Path returns the pebble directory, or "" for a store in memory.
func (s *Store) Path() string { return s.path }

func (s *Store) begin() error {
	if s.broken == nil && s.errs != nil {
		if msg := s.errs.fatal.Load(); msg != nil {
			s.broken = s.fail("pebble", fmt.Errorf("%w: %s", ErrBroken, *msg))
		}
	}
	switch {
	case s.closed:
		return ErrClosed
	case s.broken != nil:
		return s.broken
	}
	return nil
}

// LoadIdentity implements node.Store: the marshalled private key saved, or
// nil and no error on a fresh store. Turn it into a libp2p key with
// crypto.UnmarshalPrivateKey.
func (s *Store) LoadIdentity(ctx context.Context) ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.begin(); err != nil {
		return nil, err
	}
	v, err := s.d.Get(ctx, keyIdentity)
	if errors.Is(err, ds.ErrNotFound) {
		return nil, nil
	}
	if err == nil && len(v) == 0 {
		err = fmt.Errorf("%w: empty identity", ErrCorrupt)
	}
	return v, s.fail("load identity", err)
}

// SaveIdentity implements node.Store: it writes key (from
// crypto.MarshalPrivateKey) and syncs.
func (s *Store) SaveIdentity(ctx context.Context, key []byte) (err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.begin(); err != nil {
		return err
	}
	defer s.guard("save identity", &err)
	if len(key) == 0 {
		return s.fail("save identity", errors.New("empty key"))
	}
	if err := s.present(); err != nil {
		return s.fail("save identity", err)
	}
	if err := s.d.Put(ctx, keyIdentity, key); err != nil {
		return s.fail("save identity", err)
	}
	return s.fail("save identity", s.d.Sync(ctx, keyIdentity))
}

// LoadIncarnation implements node.Store.
func (s *Store) LoadIncarnation(ctx context.Context) (uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.begin(); err != nil {
		return 0, err
	}
	return s.incarnation(ctx)
}

func (s *Store) incarnation(ctx context.Context) (uint64, error) {
	v, err := s.d.Get(ctx, keyIncarnation)
	switch {
	case errors.Is(err, ds.ErrNotFound):
		return 0, nil
	case err != nil:
		return 0, s.fail("load incarnation", err)
	case len(v) != 8:
		return 0, s.fail("load incarnation", fmt.Errorf("%w: %d bytes, want 8", ErrCorrupt, len(v)))
	}
	return binary.BigEndian.Uint64(v), nil
}

// SaveIncarnation implements node.Store: it never lowers the saved
// incarnation, and syncs before it returns.
func (s *Store) SaveIncarnation(ctx context.Context, inc uint64) (err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.begin(); err != nil {
		return err
	}
	defer s.guard("save incarnation", &err)
	if err := s.present(); err != nil {
		return s.fail("save incarnation", err)
	}
	old, err := s.incarnation(ctx)
	if err != nil {
		return err
	}
	if inc <= old {
		return nil
	}
	if err := s.d.Put(ctx, keyIncarnation, binary.BigEndian.AppendUint64(nil, inc)); err != nil {
		return s.fail("save incarnation", err)
	}
	return s.fail("save incarnation", s.d.Sync(ctx, keyIncarnation))
}

// LoadPeers implements node.Store: the members saved by SavePeers (JSON
// under /meta/peers), nil on a store that has none.
func (s *Store) LoadPeers(ctx context.Context) ([]node.KnownPeer, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.begin(); err != nil {
		return nil, err
	}
	v, err := s.d.Get(ctx, keyPeers)
	if errors.Is(err, ds.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, s.fail("load peers", err)
	}
	var peers []node.KnownPeer
	if err := json.Unmarshal(v, &peers); err != nil {
		return nil, s.fail("load peers", fmt.Errorf("%w: %v", ErrCorrupt, err))
	}
	for i, p := range peers {
		if p.Peer == "" {
			return nil, s.fail("load peers", fmt.Errorf("%w: peers[%d]: empty peer ID", ErrCorrupt, i))
		}
	}
	return peers, nil
}

// SavePeers implements node.Store, and syncs before it returns: a write
// without a sync stays in pebble's buffer until something else syncs, and
// an idle node's flushes write nothing, so a kill -9 would lose the
// addresses a node restarted without --bootstrap depends on. The runtime
// saves them only when they change.
func (s *Store) SavePeers(ctx context.Context, peers []node.KnownPeer) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.begin(); err != nil {
		return err
	}
	v, err := json.Marshal(peers)
	if err != nil {
		return s.fail("save peers", err)
	}
	if err := s.d.Put(ctx, keyPeers, v); err != nil {
		return s.fail("save peers", err)
	}
	return s.fail("save peers", s.d.Sync(ctx, keyPeers))
}

// LoadWindows implements node.Store.
func (s *Store) LoadWindows(ctx context.Context) ([]node.WindowRecord, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.begin(); err != nil {
		return nil, err
	}
	res, err := s.d.Query(ctx, query.Query{Prefix: prefixWindows})
	if err != nil {
		return nil, s.fail("load windows", err)
	}
	defer res.Close()
	var out []node.WindowRecord
	minCollect := int64(math.MaxInt64)
	for {
		e, ok := res.NextSync()
		if !ok {
			break
		}
		if e.Error != nil {
			return nil, s.fail("load windows", e.Error)
		}
		r, err := decodeWindow(e.Key, e.Value)
		if err != nil {
			return nil, s.fail("load windows", err)
		}
		minCollect = min(minCollect, r.CollectAt())
		out = append(out, r)
	}
	s.minCollect = minCollect
	node.SortWindowRecords(out)
	return out, nil
}

// LoadLeases implements node.Store.
func (s *Store) LoadLeases(ctx context.Context) ([]node.Lease, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.begin(); err != nil {
		return nil, err
	}
	res, err := s.d.Query(ctx, query.Query{Prefix: prefixLeases})
	if err != nil {
		return nil, s.fail("load leases", err)
	}
	ents, err := res.Rest()
	if err != nil {
		return nil, s.fail("load leases", err)
	}
	out := make([]node.Lease, 0, len(ents))
	for _, e := range ents {
		l, err := decodeLease(e.Key, e.Value)
		if err != nil {
			return nil, s.fail("load leases", err)
		}
		out = append(out, l)
	}
	sortLeases(out)
	return out, nil
}

// Flush implements node.Store: one batch, then a sync. A flush that has
// nothing to write and nothing to collect touches nothing. A flush into a
// directory removed or replaced since Open fails with ErrGone.
func (s *Store) Flush(ctx context.Context, f node.Flush) (err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.begin(); err != nil {
		return err
	}
	defer s.guard("flush", &err)
	collect := f.CollectBeforeMs >= s.minCollect
	if f.Empty() && !collect {
		return nil
	}
	if err := s.present(); err != nil {
		return s.fail("flush", err)
	}
	b, err := s.d.Batch(ctx)
	if err != nil {
		return s.fail("flush", err)
	}
	// The earliest collection time among the records written.
	written := int64(math.MaxInt64)
	if len(f.Windows) > 0 {
		seen := make(map[ds.Key]int, len(f.Windows))
		vals := make([][2]uint64, 0, len(f.Windows))
		keys := make([]ds.Key, 0, len(f.Windows))
		for _, r := range f.Windows {
			if r.CollectAt() <= f.CollectBeforeMs {
				continue // collected already
			}
			k := windowKey(r)
			v := [2]uint64{r.Admitted, r.Attempted}
			if i, ok := seen[k]; ok {
				vals[i] = [2]uint64{max(vals[i][0], v[0]), max(vals[i][1], v[1])}
				continue
			}
			old, err := s.d.Get(ctx, k)
			switch {
			case err == nil:
				oa, ot, derr := decodeCounts(old)
				if derr != nil {
					return s.fail("flush", fmt.Errorf("record %s: %w", k, derr))
				}
				v = [2]uint64{max(v[0], oa), max(v[1], ot)}
			case !errors.Is(err, ds.ErrNotFound):
				return s.fail("flush", err)
			}
			seen[k] = len(vals)
			vals, keys = append(vals, v), append(keys, k)
			written = min(written, r.CollectAt())
		}
		for i, k := range keys {
			if err := b.Put(ctx, k, encodeCounts(vals[i][0], vals[i][1])); err != nil {
				return s.fail("flush", err)
			}
		}
	}
	for _, id := range f.Released {
		if err := b.Delete(ctx, leaseKey(id)); err != nil {
			return s.fail("flush", err)
		}
	}
	for _, l := range f.Leases {
		if err := b.Put(ctx, leaseKey(l.ID), encodeLease(l)); err != nil {
			return s.fail("flush", err)
		}
	}
	minCollect := s.minCollect
	if collect {
		next, err := s.collect(ctx, b, f.CollectBeforeMs)
		if err != nil {
			return err
		}
		minCollect = next
	}
	minCollect = min(minCollect, written)
	if err := b.Commit(ctx); err != nil {
		return s.fail("flush", err)
	}
	if err := s.d.Sync(ctx, ds.RawKey("/")); err != nil {
		return s.fail("flush", err)
	}
	s.minCollect = minCollect
	return nil
}

// collect deletes, in b, every window record collected at beforeMs, and
// returns the earliest collection time of those left (MaxInt64 if none).
func (s *Store) collect(ctx context.Context, b ds.Batch, beforeMs int64) (int64, error) {
	res, err := s.d.Query(ctx, query.Query{Prefix: prefixWindows, KeysOnly: true})
	if err != nil {
		return 0, s.fail("collect", err)
	}
	defer res.Close()
	next := int64(math.MaxInt64)
	for {
		e, ok := res.NextSync()
		if !ok {
			break
		}
		if e.Error != nil {
			return 0, s.fail("collect", e.Error)
		}
		at, err := collectAtOf(e.Key)
		if err != nil {
			return 0, s.fail("collect", err)
		}
		if at > beforeMs {
			next = min(next, at)
			if s.ordered {
				break // keys sort by collection time: nothing further is due
			}
			continue
		}
		if err := b.Delete(ctx, ds.RawKey(e.Key)); err != nil {
			return 0, s.fail("collect", err)
		}
	}
	return next, nil
}

// Close implements node.Store: it closes pebble (flushing its memtables).
// A broken store, and a store whose directory was removed or replaced, is
// abandoned rather than closed (pebble would fail, or loop, creating the
// files it needs): Close returns the error that says why. Close may block
// as long as pebble does on a failing disk; node.Close bounds it.
func (s *Store) Close() (err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	broken := s.begin()
	s.closed = true
	if s.errs != nil {
		defer s.errs.flush()
	}
	if broken != nil {
		return broken
	}
	if err := s.present(); err != nil {
		return s.fail("close", fmt.Errorf("%w; abandoning the store without closing it", err))
	}
	defer s.guard("close", &err)
	return s.fail("close", s.d.Close())
}
