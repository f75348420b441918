package main

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"runtime"
	"runtime/debug"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// logLevels are --log-level's values, in slog's spelling.
func logLevels() []string { return []string{"debug", "info", "warn", "error"} }

// parseLevel reads a --log-level value; the error lists the valid ones.
func parseLevel(s string) (slog.Level, error) {
	var level slog.Level
	for _, l := range logLevels() {
		if strings.EqualFold(s, l) {
			err := level.UnmarshalText([]byte(l))
			return level, err
		}
	}
	return level, fmt.Errorf("%q is not a log level; want one of %s", s, strings.Join(logLevels(), ", "))
}

// buildInfo is what the binary knows of its build: the version and the
// commit (from -ldflags -X, else the build info the Go toolchain stamped:
// the module version, vcs.revision with -dirty when vcs.modified), and
// the Go version.
type buildInfo struct {
	Version, Revision, GoVersion string
}

func readBuildInfo() buildInfo {
	v, c := version, commit
	modified := false
	if bi, ok := debug.ReadBuildInfo(); ok {
		if v == "" {
			v = bi.Main.Version
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				if c == "" {
					c = s.Value
				}
			case "vcs.modified":
				modified = s.Value == "true"
			}
		}
	}
	if v == "" {
		v = "(devel)"
	}
	if c == "" {
		c = "unknown"
	} else if modified && commit == "" {
		c += "-dirty"
	}
	return buildInfo{Version: v, Revision: c, GoVersion: runtime.Version()}
}

// buildInfoCollector is the ratemesh_build_info gauge: 1, labelled with
// what `ratemesh version` prints.
func buildInfoCollector() prometheus.Collector {
	bi := readBuildInfo()
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "ratemesh_build_info",
		Help:        "Always 1; the labels say which build runs: version, revision (the commit) and go_version.",
		ConstLabels: prometheus.Labels{"version": bi.Version, "revision": bi.Revision, "go_version": bi.GoVersion},
	})
	g.Set(1)
	return g
}

// pprofAddress checks --pprof's value and returns the address to listen
// on: "" (off) stays off; a value without a host (":6060") listens on
// loopback; a non-loopback host is refused unless insecure (--insecure-api
// or api.insecure), for the profiler has no authentication and its
// endpoints expose the heap, goroutine stacks and command line, and can
// keep the CPU busy profiling.
func pprofAddress(addr string, insecure bool) (string, error) {
	if addr == "" {
		return "", nil
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("%q is not host:port", addr)
	}
	if host == "" {
		return net.JoinHostPort("127.0.0.1", port), nil
	}
	if host == "localhost" {
		return addr, nil
	}
	ip := net.ParseIP(host)
	if (ip == nil || !ip.IsLoopback()) && !insecure {
		return "", fmt.Errorf("%q is not a loopback address: the profiler has no authentication and shows the heap and every goroutine's stack; use 127.0.0.1 (kubectl port-forward reaches it), or add --insecure-api to serve it there anyway", addr)
	}
	return addr, nil
}

// startPprof serves net/http/pprof's handlers on their own listener at
// addr, and returns the function that stops them.
func startPprof(addr string, log *slog.Logger) (stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--pprof: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Warn("pprof", "err", err)
		}
	}()
	log.Warn("serving the Go profiler without authentication", "pprof", ln.Addr().String())
	return func() { _ = srv.Close() }, nil
}

// defaultConfigPoll is how often serve checks the config file: a
// ConfigMap update reaches a pod within a minute or so, and a stat every
// 2 s costs nothing.
const defaultConfigPoll = 2 * time.Second

// fileWatch notices that a file changed: its identity (device and inode,
// after following symlinks), size or modification time differ from the
// last look. Following symlinks catches a Kubernetes ConfigMap update,
// which swaps the ..data symlink to a new directory in one rename and
// leaves the file's own path and often its mtime as they were. The zero
// value is not usable: newFileWatch.
type fileWatch struct {
	path string
	last fs.FileInfo // nil: missing or unreadable at the last look
}

func newFileWatch(path string) *fileWatch {
	w := &fileWatch{path: path}
	w.last, _ = os.Stat(path)
	return w
}

// check reports whether the file changed since the last check. A file
// that cannot be read (missing between two writes, say) is no change:
// the running rules stay, and the file's return counts as one.
func (w *fileWatch) check() bool {
	fi, err := os.Stat(w.path)
	if err != nil {
		return false
	}
	prev := w.last
	w.last = fi
	return prev == nil || !os.SameFile(prev, fi) || prev.Size() != fi.Size() || !prev.ModTime().Equal(fi.ModTime())
}
