package main

import (
	"flag"
	"fmt"
	"io"
	"regexp"
	"runtime"
	"strings"
)

// setUsage makes fset's help print the command's synopsis, its
// description and its flags spelled --flag, and rewrites the flag
// package's parse errors to spell them so too.
func setUsage(fset *flag.FlagSet, w io.Writer) {
	fset.SetOutput(dashWriter{w})
	fset.Usage = func() {
		for _, c := range commands() {
			if c.name == fset.Name() {
				fmt.Fprintf(w, "usage: ratemesh %s\n\n%s\n", c.synopsis, c.description)
			}
		}
		printFlags(w, fset)
	}
}

// printFlags lists fset's flags as --name VALUE, with their help and
// defaults (flag.PrintDefaults spells them with one dash).
func printFlags(w io.Writer, fset *flag.FlagSet) {
	any := false
	fset.VisitAll(func(f *flag.Flag) {
		if !any {
			fmt.Fprintln(w, "\nflags:")
			any = true
		}
		name, usage := flag.UnquoteUsage(f)
		line := "  --" + f.Name
		if name != "" {
			line += " " + name
		}
		fmt.Fprintf(w, "%s\n    \t%s", line, strings.ReplaceAll(usage, "\n", "\n    \t"))
		if d := f.DefValue; d != "" && d != "false" && d != "0" && d != "[]" && d != "-1ns" {
			fmt.Fprintf(w, " (default %s)", d)
		}
		fmt.Fprintln(w)
	})
}

// dashWriter spells flags in the flag package's messages with two dashes.
type dashWriter struct{ w io.Writer }

var oneDash = regexp.MustCompile(`(defined: |argument: |for flag |value "[^"]*" for )-([A-Za-z])`)

func (d dashWriter) Write(p []byte) (int, error) {
	if _, err := d.w.Write(oneDash.ReplaceAll(p, []byte("$1--$2"))); err != nil {
		return 0, err
	}
	return len(p), nil
}

// version and commit are set at build time:
//
//	go build -ldflags "-X main.version=v1.2.3 -X main.commit=$(git rev-parse HEAD)" ./cmd/ratemesh
//
// Otherwise they come from the build info (the module version for
// `go install …@version`, the VCS revision when the build stamped it).
var version, commit string

// versionLine is what `ratemesh version` prints: the module version, the
// commit and the Go version.
func versionLine() string {
	bi := readBuildInfo()
	return fmt.Sprintf("ratemesh %s commit %s %s %s/%s", bi.Version, bi.Revision, bi.GoVersion, runtime.GOOS, runtime.GOARCH)
}

func runVersion(args []string, stdout, stderr io.Writer) int {
	fset := flag.NewFlagSet("version", flag.ContinueOnError)
	setUsage(fset, stderr)
	if err := fset.Parse(args); err != nil {
		return flagExit(err)
	}
	if fset.NArg() > 0 {
		fmt.Fprintln(stderr, "usage: ratemesh version")
		return 2
	}
	fmt.Fprintln(stdout, versionLine())
	return 0
}
