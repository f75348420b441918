// Package doccheck checks ratemesh's Markdown documentation against the
// repository: every Go snippet is an excerpt of a compiled file, every
// relative link and heading anchor resolves, every test, benchmark and
// fuzz target a page names exists, every Go file and package directory a
// page names exists, and marked YAML blocks parse.
//
// The repository's own test (doccheck_test.go) runs Check over README.md,
// CONTRIBUTING.md and docs/*.md:
//
//	problems, err := doccheck.Check(root, doccheck.Options{Validators: map[string]func([]byte) error{
//		"config": func(b []byte) error { _, err := config.Parse(b); return err },
//	}})
//
// # Markers
//
// A fenced ```go block must follow, on the previous non-blank line, an
// HTML comment naming the file it is cut from:
//
//	<!-- snippet: examples/embed/main.go -->
//
// The file must be under examples/ or be an example test (a _test.go file
// declaring an Example function), so that go vet and go test compile it,
// and the block's lines, each trimmed of surrounding white space, must
// appear in it as consecutive lines, trimmed alike.
//
// A fenced ```yaml block may follow <!-- check: NAME -->; the validator of
// that name must accept its text.
package doccheck

import (
	"bufio"
	"bytes"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"unicode"
)

// Options configures Check.
type Options struct {
	// Validators check YAML blocks marked <!-- check: NAME -->, by NAME.
	// A marker naming a validator not here is a problem.
	Validators map[string]func([]byte) error
}

// Problem is one thing wrong with a page.
type Problem struct {
	File string // relative to the root, slash-separated
	Line int    // 1-based
	Msg  string
}

func (p Problem) String() string { return fmt.Sprintf("%s:%d: %s", p.File, p.Line, p.Msg) }

// Pages returns the documentation pages under root that Check reads:
// README.md, CONTRIBUTING.md and docs/*.md, those that exist, sorted.
func Pages(root string) ([]string, error) {
	var pages []string
	for _, p := range []string{"README.md", "CONTRIBUTING.md"} {
		if _, err := os.Stat(filepath.Join(root, p)); err == nil {
			pages = append(pages, p)
		} else if !os.IsNotExist(err) {
			return nil, err
		}
	}
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		return nil, err
	}
	for _, d := range docs {
		pages = append(pages, "docs/"+filepath.Base(d))
	}
	sort.Strings(pages)
	return pages, nil
}

// Check reads every page of Pages(root) and returns what is wrong with
// them. The error is for a root it cannot read, not for a bad page.
func Check(root string, opt Options) ([]Problem, error) {
	pages, err := Pages(root)
	if err != nil {
		return nil, err
	}
	c := &checker{root: root, opt: opt, docs: map[string]*doc{}}
	if c.tests, err = testNames(root); err != nil {
		return nil, err
	}
	for _, p := range pages {
		if _, err := c.load(p); err != nil {
			return nil, err
		}
	}
	for _, p := range pages {
		c.checkPage(c.docs[p])
	}
	return c.problems, nil
}

type block struct {
	lang   string
	marker string // the HTML comment before the fence, without <!-- -->
	line   int    // of the opening fence
	text   []string
}

type doc struct {
	path    string
	lines   []string
	inCode  []bool // line is a fence or inside a fenced block
	blocks  []block
	anchors map[string]bool
}

type checker struct {
	root     string
	opt      Options
	docs     map[string]*doc
	tests    map[string]bool
	problems []Problem
}

func (c *checker) addf(file string, line int, format string, args ...any) {
	c.problems = append(c.problems, Problem{File: file, Line: line, Msg: fmt.Sprintf(format, args...)})
}

var markerRE = regexp.MustCompile(`^<!--\s*(.*?)\s*-->$`)

// load reads a Markdown file (rel is slash-separated, relative to the
// root) and indexes its fenced blocks and heading anchors.
func (c *checker) load(rel string) (*doc, error) {
	if d, ok := c.docs[rel]; ok {
		return d, nil
	}
	data, err := os.ReadFile(filepath.Join(c.root, filepath.FromSlash(rel)))
	if err != nil {
		return nil, err
	}
	d := &doc{path: rel, lines: strings.Split(string(data), "\n"), anchors: map[string]bool{}}
	d.inCode = make([]bool, len(d.lines))
	slugs := map[string]int{}
	var cur *block
	fence := ""
	lastText := "" // the last non-blank line outside a block
	for i, ln := range d.lines {
		trimmed := strings.TrimSpace(ln)
		if cur != nil {
			d.inCode[i] = true
			if strings.HasPrefix(trimmed, fence) && strings.Trim(trimmed, "`~") == "" {
				d.blocks = append(d.blocks, *cur)
				cur = nil
				lastText = trimmed
				continue
			}
			cur.text = append(cur.text, ln)
			continue
		}
		if f := fenceOf(trimmed); f != "" {
			d.inCode[i] = true
			b := &block{lang: strings.TrimSpace(strings.TrimLeft(trimmed, "`~")), line: i + 1}
			if m := markerRE.FindStringSubmatch(lastText); m != nil {
				b.marker = m[1]
			}
			cur, fence = b, f
			continue
		}
		if trimmed != "" {
			lastText = trimmed
		}
		if h, ok := strings.CutPrefix(trimmed, "#"); ok {
			h = strings.TrimLeft(h, "#")
			if strings.HasPrefix(h, " ") {
				s := slug(h)
				if n := slugs[s]; n > 0 {
					d.anchors[fmt.Sprintf("%s-%d", s, n)] = true
				} else {
					d.anchors[s] = true
				}
				slugs[s]++
			}
		}
	}
	if cur != nil {
		c.addf(rel, cur.line, "unclosed code fence")
	}
	c.docs[rel] = d
	return d, nil
}

// fenceOf returns the fence a line opens (``` or ~~~, possibly longer),
// or "".
func fenceOf(trimmed string) string {
	for _, ch := range []string{"`", "~"} {
		if strings.HasPrefix(trimmed, ch+ch+ch) {
			n := len(trimmed) - len(strings.TrimLeft(trimmed, ch))
			return strings.Repeat(ch, n)
		}
	}
	return ""
}

// slug is GitHub's anchor for a heading: lower case, letters, digits,
// '-' and '_' kept, spaces turned into '-', everything else dropped.
func slug(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

func (c *checker) checkPage(d *doc) {
	for _, b := range d.blocks {
		c.checkBlock(d, b)
	}
	c.checkLinks(d)
	c.checkNames(d)
}

func (c *checker) checkBlock(d *doc, b block) {
	switch b.lang {
	case "go":
		path, ok := strings.CutPrefix(b.marker, "snippet:")
		if !ok {
			c.addf(d.path, b.line, "a go block must follow <!-- snippet: FILE --> naming the compiled file it is cut from")
			return
		}
		c.checkSnippet(d, b, strings.TrimSpace(path))
	case "yaml", "yml":
		name, ok := strings.CutPrefix(b.marker, "check:")
		if !ok {
			return
		}
		name = strings.TrimSpace(name)
		v := c.opt.Validators[name]
		if v == nil {
			c.addf(d.path, b.line, "no validator %q for this yaml block", name)
			return
		}
		if err := v([]byte(strings.Join(b.text, "\n") + "\n")); err != nil {
			c.addf(d.path, b.line, "yaml block (check: %s): %v", name, err)
		}
	}
}

var exampleFuncRE = regexp.MustCompile(`(?m)^func Example\w*\(\)`)

func (c *checker) checkSnippet(d *doc, b block, path string) {
	if path == "" || filepath.IsAbs(path) || strings.Contains(path, "..") {
		c.addf(d.path, b.line, "snippet file %q: want a path relative to the repository root", path)
		return
	}
	if !strings.HasSuffix(path, ".go") {
		c.addf(d.path, b.line, "snippet file %s: not a Go file", path)
		return
	}
	src, err := os.ReadFile(filepath.Join(c.root, filepath.FromSlash(path)))
	if err != nil {
		c.addf(d.path, b.line, "snippet file %s: %v", path, err)
		return
	}
	switch {
	case strings.HasPrefix(path, "examples/"):
	case strings.HasSuffix(path, "_test.go") && exampleFuncRE.Match(src):
	default:
		c.addf(d.path, b.line, "snippet file %s: neither under examples/ nor an example test (a _test.go file with func Example…)", path)
		return
	}
	if bytes.Contains(src, []byte("//go:build ignore")) {
		c.addf(d.path, b.line, "snippet file %s: excluded from the build (//go:build ignore)", path)
		return
	}
	want := trimLines(b.text)
	if len(want) == 0 {
		c.addf(d.path, b.line, "empty go block")
		return
	}
	have := trimLines(strings.Split(string(src), "\n"))
	if !containsRun(have, want) {
		first, line := firstMismatch(have, want)
		c.addf(d.path, b.line, "go block is not an excerpt of %s: its line %d %q is not where the block puts it", path, line+1, first)
	}
}

func trimLines(lines []string) []string {
	out := make([]string, len(lines))
	for i, l := range lines {
		out[i] = strings.TrimSpace(l)
	}
	// Blank lines at either end of a block carry nothing.
	for len(out) > 0 && out[0] == "" {
		out = out[1:]
	}
	for len(out) > 0 && out[len(out)-1] == "" {
		out = out[:len(out)-1]
	}
	return out
}

func containsRun(have, want []string) bool {
	for i := 0; i+len(want) <= len(have); i++ {
		if slices.Equal(have[i:i+len(want)], want) {
			return true
		}
	}
	return false
}

// firstMismatch finds the longest prefix of want found as a run in have
// and returns the first line after it: the line to fix.
func firstMismatch(have, want []string) (string, int) {
	best := 0
	for i := range have {
		n := 0
		for n < len(want) && i+n < len(have) && have[i+n] == want[n] {
			n++
		}
		best = max(best, n)
	}
	if best >= len(want) {
		best = len(want) - 1
	}
	return want[best], best
}

var (
	inlineLinkRE = regexp.MustCompile(`!?\[[^\]]*\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)
	refLinkRE    = regexp.MustCompile(`^\s*\[[^\]]+\]:\s+(\S+)`)
	codeSpanRE   = regexp.MustCompile("`[^`]*`")
)

func (c *checker) checkLinks(d *doc) {
	for i, ln := range d.lines {
		if d.inCode[i] {
			continue
		}
		ln = codeSpanRE.ReplaceAllString(ln, "")
		var targets []string
		for _, m := range inlineLinkRE.FindAllStringSubmatch(ln, -1) {
			targets = append(targets, m[1])
		}
		if m := refLinkRE.FindStringSubmatch(ln); m != nil {
			targets = append(targets, m[1])
		}
		for _, t := range targets {
			if msg := c.resolve(d, t); msg != "" {
				c.addf(d.path, i+1, "link %s: %s", t, msg)
			}
		}
	}
}

// resolve returns what is wrong with a link target, or "".
func (c *checker) resolve(d *doc, target string) string {
	if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
		return ""
	}
	path, frag, _ := strings.Cut(target, "#")
	rel := d.path
	if path != "" {
		if strings.HasPrefix(path, "/") {
			return "absolute path; link relative to the page"
		}
		rel = filepath.ToSlash(filepath.Clean(filepath.Join(filepath.Dir(d.path), path)))
		if rel == ".." || strings.HasPrefix(rel, "../") {
			return "points outside the repository"
		}
		if _, err := os.Stat(filepath.Join(c.root, filepath.FromSlash(rel))); err != nil {
			return "no such file in the repository"
		}
	}
	if frag == "" || !strings.HasSuffix(rel, ".md") {
		return ""
	}
	target2, err := c.load(rel)
	if err != nil {
		return err.Error()
	}
	if !target2.anchors[frag] {
		return fmt.Sprintf("no heading with anchor #%s in %s", frag, rel)
	}
	return ""
}

var (
	testNameRE = regexp.MustCompile(`\b(?:Test|Benchmark|Fuzz)[A-Z][A-Za-z0-9_]*`)
	testDeclRE = regexp.MustCompile(`(?m)^func ((?:Test|Benchmark|Fuzz|Example)\w*)\(`)
	goFileRE   = regexp.MustCompile(`\b(?:[a-z0-9_-]+/)+[a-z0-9_]+\.go\b`)
	pkgDirRE   = regexp.MustCompile("(?:^|[\\s'\"(`])\\./([A-Za-z0-9_/-]+?)/?(?:[\\s'\";,)`]|$)")
)

// checkNames checks the tests, Go files and package directories a page
// names, in prose and in code blocks alike.
func (c *checker) checkNames(d *doc) {
	for i, ln := range d.lines {
		for _, name := range testNameRE.FindAllString(ln, -1) {
			if !c.tests[name] {
				c.addf(d.path, i+1, "%s: no such test, benchmark or fuzz target in any _test.go file", name)
			}
		}
		for _, f := range goFileRE.FindAllString(ln, -1) {
			if _, err := os.Stat(filepath.Join(c.root, filepath.FromSlash(f))); err != nil {
				c.addf(d.path, i+1, "%s: no such file", f)
			}
		}
		if strings.Contains(ln, "go test") || strings.Contains(ln, "go run") || strings.Contains(ln, "go build") || strings.Contains(ln, "go doc") {
			for _, m := range pkgDirRE.FindAllStringSubmatch(ln, -1) {
				dir := m[1]
				if fi, err := os.Stat(filepath.Join(c.root, filepath.FromSlash(dir))); err != nil || !fi.IsDir() {
					c.addf(d.path, i+1, "./%s: no such package directory", dir)
				}
			}
		}
	}
}

// testNames returns the test, benchmark, fuzz and example functions
// declared in the _test.go files under root.
func testNames(root string) (map[string]bool, error) {
	names := map[string]bool{}
	err := filepath.WalkDir(root, func(path string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if e.IsDir() {
			if n := e.Name(); path != root && (strings.HasPrefix(n, ".") || n == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			if m := testDeclRE.FindStringSubmatch(sc.Text()); m != nil {
				names[m[1]] = true
			}
		}
		return sc.Err()
	})
	return names, err
}
