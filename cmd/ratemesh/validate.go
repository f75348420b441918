package main

import (
	"flag"
	"fmt"
	"io"

	"github.com/ratemesh/ratemesh/config"
)

// runValidate checks a config file, and the envoyproxy/ratelimit
// descriptor files it or --envoy-config names, exactly as serve would at
// start, without starting anything: exit 0 and a summary on stdout, or 1
// and the error naming the field (or the file, line and descriptor).
func runValidate(args []string, stdout, stderr io.Writer) int {
	fset := flag.NewFlagSet("validate", flag.ContinueOnError)
	setUsage(fset, stderr)
	cfgPath := fset.String("config", "", "YAML config `file` to check")
	envoyCfg := fset.String("envoy-config", "", "envoyproxy/ratelimit descriptor `path` to check (a file or a directory of *.yaml; default: the file's envoy.config)")
	if err := fset.Parse(args); err != nil {
		return flagExit(err)
	}
	if fset.NArg() > 0 || (*cfgPath == "" && *envoyCfg == "") {
		fmt.Fprintln(stderr, "usage: ratemesh validate --config FILE [--envoy-config PATH]")
		return 2
	}
	cfg := config.Default()
	if *cfgPath != "" {
		c, err := config.Load(*cfgPath)
		if err != nil {
			fmt.Fprintf(stderr, "ratemesh validate: %v\n", err)
			return 1
		}
		cfg = *c
	}
	if *envoyCfg != "" {
		cfg.Envoy.Config = *envoyCfg
	}
	desc, err := loadEnvoy(&cfg)
	if err != nil {
		fmt.Fprintf(stderr, "ratemesh validate: %v\n", err)
		return 1
	}
	for _, w := range cfg.Warnings {
		fmt.Fprintf(stderr, "ratemesh validate: warning: %s\n", w)
	}
	name := *cfgPath
	if name == "" {
		name = "(defaults)"
	}
	fmt.Fprintf(stdout, "%s: ok, %d rule(s)\n", name, len(cfg.Rules))
	if desc != nil {
		fmt.Fprintf(stdout, "%s: ok, %d file(s), domains %v, %d descriptor(s), %d generated rule(s)\n",
			cfg.Envoy.Config, len(desc.Files()), desc.Domains(), desc.Entries(), len(desc.Rules()))
	}
	return 0
}
