package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestRun runs the example briefly: three services and a client opening
// 4× the limit. Streams are echoed and others denied with RATE_LIMITED,
// none fails, no window echoes more than the limit allows across the
// three services, and the services hear each other's news on their own
// topic.
func TestRun(t *testing.T) {
	o := options{services: 3, limit: 10, window: time.Second, rate: 40, duration: 2500 * time.Millisecond}
	var out bytes.Buffer
	if err := run(context.Background(), o, &out); err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	t.Log("\n" + out.String())
	win := regexp.MustCompile(`(?m)^window [0-9:.]+: (\d+) echoed, (\d+) denied \(RATE_LIMITED\), (\d+) failed( \(partial window\))?$`)
	windows := win.FindAllStringSubmatch(out.String(), -1)
	if len(windows) < 3 {
		t.Fatalf("%d window lines, want at least 3", len(windows))
	}
	var echoed, denied int
	for _, w := range windows {
		e, _ := strconv.Atoi(w[1])
		d, _ := strconv.Atoi(w[2])
		if f, _ := strconv.Atoi(w[3]); f != 0 {
			t.Errorf("%s: streams failed", w[0])
		}
		// Counted by the client when a stream ends, a stream decided
		// at the end of a window may land in the next: allow one.
		if e > int(o.limit)+1 {
			t.Errorf("%s: more than the limit of %d echoed", w[0], o.limit)
		}
		echoed += e
		denied += d
	}
	if echoed < int(o.limit) || denied == 0 {
		t.Errorf("%d echoed and %d denied in all, want at least %d and some denied", echoed, denied, o.limit)
	}
	if !strings.Contains(out.String(), fmt.Sprintf("total: %d echoed, %d denied (RATE_LIMITED), 0 failed", echoed, denied)) {
		t.Errorf("the total does not add up the windows (%d echoed, %d denied)", echoed, denied)
	}
	news := regexp.MustCompile(`(?m)^service \d heard (\d+) news messages on its own topic$`).FindAllStringSubmatch(out.String(), -1)
	if len(news) != o.services {
		t.Fatalf("%d news lines, want %d", len(news), o.services)
	}
	for _, n := range news {
		if h, _ := strconv.Atoi(n[1]); h == 0 {
			t.Errorf("%s: the service's own topic carried nothing", n[0])
		}
	}
}

func TestRunRefusesBadOptions(t *testing.T) {
	if err := run(context.Background(), options{services: 3, limit: 0, window: time.Second, rate: 1, duration: time.Second}, &bytes.Buffer{}); err == nil {
		t.Fatal("run took a limit of 0")
	}
}

// snippet returns the lines of main.go between "// snippet:start name"
// and "// snippet:end", each trimmed of surrounding white space.
func snippet(t *testing.T, name string) []string {
	t.Helper()
	src, err := os.ReadFile("main.go")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(src), "// snippet:start "+name+"\n")
	if !ok {
		t.Fatalf("no snippet %q in main.go", name)
	}
	body, _, ok := strings.Cut(rest, "// snippet:end")
	if !ok {
		t.Fatalf("snippet %q in main.go has no end", name)
	}
	return trimmed(body)
}

func trimmed(s string) []string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	for i, l := range lines {
		lines[i] = strings.TrimSpace(l)
	}
	return lines
}

// TestDocSnippet: docs/p2p.md, and README.md once it has the section "In
// a libp2p service", quote the whole marked region of main.go in one Go
// code block, line for line (indentation aside, as internal/doccheck
// compares), so the documented code is the code that compiles and runs.
func TestDocSnippet(t *testing.T) {
	want := snippet(t, "libp2p-service")
	block := regexp.MustCompile("(?s)<!-- snippet: examples/p2p-echo/main.go -->\n```go\n(.*?)```")
	for _, doc := range []string{"docs/p2p.md", "README.md"} {
		b, err := os.ReadFile(filepath.Join("..", "..", doc))
		if err != nil {
			t.Fatal(err)
		}
		if doc == "README.md" && !strings.Contains(string(b), "In a libp2p service") {
			continue // not written yet
		}
		found := false
		for _, m := range block.FindAllStringSubmatch(string(b), -1) {
			found = found || slices.Equal(trimmed(m[1]), want)
		}
		if !found {
			t.Errorf("%s does not quote examples/p2p-echo/main.go's snippet libp2p-service whole:\n%s", doc, strings.Join(want, "\n"))
		}
	}
}
