package doccheck_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/ratemesh/ratemesh/config"
	"github.com/ratemesh/ratemesh/internal/doccheck"
	"github.com/ratemesh/ratemesh/simulator"
)

const root = "../.."

// validators check the YAML blocks the pages mark: a config file as
// `ratemesh serve` reads it, a scenario as `ratemesh sim` reads it.
var validators = map[string]func([]byte) error{
	"config":   func(b []byte) error { _, err := config.Parse(b); return err },
	"scenario": func(b []byte) error { _, err := simulator.Parse(b); return err },
}

// TestDocs checks README.md, CONTRIBUTING.md and docs/*.md: snippets cut
// from compiled files, links and anchors that resolve, tests and files
// that exist, YAML that parses.
func TestDocs(t *testing.T) {
	pages, err := doccheck.Pages(root)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"README.md", "CONTRIBUTING.md", "docs/design.md", "docs/operations.md", "docs/http-api.md", "docs/embedding.md", "docs/simulator.md", "docs/experiments.md", "docs/performance.md", "docs/envoy.md", "docs/token-bucket.md"} {
		found := false
		for _, p := range pages {
			found = found || p == want
		}
		if !found {
			t.Errorf("%s: missing", want)
		}
	}
	problems, err := doccheck.Check(root, doccheck.Options{Validators: validators})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Error(p)
	}
}

// TestREADME holds the README to its size and to the commands CI runs.
func TestREADME(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	if len(readme) > 12000 {
		t.Errorf("README.md is %d bytes; at most 12000 (the depth belongs in docs/)", len(readme))
	}
	ci, err := os.ReadFile(filepath.Join(root, ".ci", "run"))
	if err != nil {
		t.Fatal(err)
	}
	testCmd := regexp.MustCompile(`(?m)^go test -race [^\n]*\./\.\.\.$`).Find(ci)
	if testCmd == nil {
		t.Fatal(".ci/run: no `go test -race … ./...` line")
	}
	for _, want := range []string{"go run ./cmd/ratemesh demo", "\ngo test ./...\n", string(testCmd)} {
		if !strings.Contains(string(readme), want) {
			t.Errorf("README.md does not contain %q", strings.TrimSpace(want))
		}
	}
	contributing, err := os.ReadFile(filepath.Join(root, "CONTRIBUTING.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(contributing), string(testCmd)) {
		t.Errorf("CONTRIBUTING.md does not contain CI's test command %q", testCmd)
	}
}

// TestCheckFindsProblems runs Check over a small made-up repository with
// one page of each kind of mistake, and one of none.
func TestCheckFindsProblems(t *testing.T) {
	dir := t.TempDir()
	write := func(rel, text string) {
		t.Helper()
		p := filepath.Join(dir, filepath.FromSlash(rel))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("examples/demo/main.go", "package main\n\nfunc main() {\n\tx := 1\n\t_ = x\n}\n")
	write("lib/lib.go", "package lib\n\nfunc F() {}\n")
	write("lib/example_test.go", "package lib_test\n\nfunc ExampleF() {\n\tlib.F()\n\t// Output:\n}\n\nfunc TestF(t *testing.T) {}\n")
	write("lib/plain_test.go", "package lib\n\nfunc BenchmarkF(b *testing.B) {}\n")
	write("README.md", strings.Join([]string{
		"# Title",
		"## Good section — with punctuation",
		"<!-- snippet: examples/demo/main.go -->",
		"```go",
		"    x := 1",
		"    _ = x",
		"```",
		"<!-- snippet: lib/example_test.go -->",
		"```go",
		"lib.F()",
		"```",
		"[design](docs/design.md#state), [self](#good-section--with-punctuation), ![plot](lib/lib.go), [web](https://example.com/x.md#nope)",
		"Run `TestF` and BenchmarkF; `go test ./lib/` and lib/lib.go.",
		"<!-- check: ok -->",
		"```yaml",
		"a: 1",
		"```",
		"```yaml",
		"unchecked: [",
		"```",
	}, "\n"))
	write("docs/design.md", strings.Join([]string{
		"# Design",
		"## State",
		"## State",
		"[dup](#state-1) [readme](../README.md#title)",
		"```go",
		"x := 1",
		"```",
		"<!-- snippet: examples/demo/main.go -->",
		"```go",
		"x := 2",
		"```",
		"<!-- snippet: lib/lib.go -->",
		"```go",
		"func F() {}",
		"```",
		"<!-- snippet: examples/demo/gone.go -->",
		"```go",
		"x := 1",
		"```",
		"[gone](gone.md) [anchor](design.md#nowhere) [up](../../etc/passwd) [abs](/README.md)",
		"`TestGone` runs with `go test -run TestGone ./nopkg/`; see lib/gone.go.",
		"<!-- check: bad -->",
		"```yaml",
		"a: 1",
		"```",
		"<!-- check: missing -->",
		"```yaml",
		"a: 1",
		"```",
		"```sh",
		"[not a link](nowhere.md)",
		"```",
	}, "\n"))
	problems, err := doccheck.Check(dir, doccheck.Options{Validators: map[string]func([]byte) error{
		"ok":  func(b []byte) error { return nil },
		"bad": func(b []byte) error { return os.ErrInvalid },
	}})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, p := range problems {
		got = append(got, p.String())
	}
	want := []string{
		`docs/design.md:5: a go block must follow <!-- snippet: FILE --> naming the compiled file it is cut from`,
		`docs/design.md:9: go block is not an excerpt of examples/demo/main.go: its line 1 "x := 2" is not where the block puts it`,
		`docs/design.md:13: snippet file lib/lib.go: neither under examples/ nor an example test (a _test.go file with func Example…)`,
		`docs/design.md:17: snippet file examples/demo/gone.go: open ../../examples/demo/gone.go: no such file or directory`,
		`docs/design.md:23: yaml block (check: bad): invalid argument`,
		`docs/design.md:27: no validator "missing" for this yaml block`,
		`docs/design.md:20: link gone.md: no such file in the repository`,
		`docs/design.md:20: link design.md#nowhere: no heading with anchor #nowhere in docs/design.md`,
		`docs/design.md:20: link ../../etc/passwd: points outside the repository`,
		`docs/design.md:20: link /README.md: absolute path; link relative to the page`,
		`docs/design.md:16: examples/demo/gone.go: no such file`,
		`docs/design.md:21: TestGone: no such test, benchmark or fuzz target in any _test.go file`,
		`docs/design.md:21: TestGone: no such test, benchmark or fuzz target in any _test.go file`,
		`docs/design.md:21: lib/gone.go: no such file`,
		`docs/design.md:21: ./nopkg: no such package directory`,
	}
	// The snippet file's error text depends on the root's spelling; match
	// it by prefix.
	for i := range got {
		if strings.HasPrefix(got[i], "docs/design.md:17: snippet file examples/demo/gone.go: ") {
			got[i] = want[3]
		}
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("problems:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
