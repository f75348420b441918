package main

import (
	"flag"
	"fmt"
	"sort"
	"strings"
)

// envPrefix starts the environment variable of every serve flag:
// --data-dir reads RATEMESH_DATA_DIR, --bootstrap RATEMESH_BOOTSTRAP.
const envPrefix = "RATEMESH_"

// envName is the environment variable that sets flag name: RATEMESH_ and
// the name in capitals, dashes as underscores.
func envName(name string) string {
	return envPrefix + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}

// repeatable reports whether a flag may be given more than once (its
// variable takes a comma-separated list).
func repeatable(f *flag.Flag) bool {
	_, ok := f.Value.(*multiFlag)
	return ok
}

// applyEnv sets every flag of fset that the command line left unset from
// its environment variable (envName), so a flag beats its variable and
// the variable beats the config file (whose values the flags override).
// A repeatable flag's variable is a comma-separated list; empty items are
// skipped. Variables set to the empty string are ignored. The error names
// the variable and the flag.
// fromEnv names the flags their variables set.
func applyEnv(fset *flag.FlagSet, getenv func(string) string) (fromEnv map[string]bool, err error) {
	set := map[string]bool{}
	fset.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var names []string
	fset.VisitAll(func(f *flag.Flag) {
		if !set[f.Name] {
			names = append(names, f.Name)
		}
	})
	sort.Strings(names)
	fromEnv = map[string]bool{}
	for _, name := range names {
		f := fset.Lookup(name)
		v := getenv(envName(name))
		if v == "" {
			continue
		}
		values := []string{v}
		if repeatable(f) {
			values = nil
			for _, item := range strings.Split(v, ",") {
				if item = strings.TrimSpace(item); item != "" {
					values = append(values, item)
				}
			}
		}
		for _, item := range values {
			if err := fset.Set(name, item); err != nil {
				return nil, fmt.Errorf("%s (--%s) %q: %v", envName(name), name, item, err)
			}
		}
		fromEnv[name] = true
	}
	return fromEnv, nil
}

// flagSource names where flag name's value came from, for an error:
// --name, or its variable when the environment set it.
func flagSource(name string, fromEnv map[string]bool) string {
	if fromEnv[name] {
		return envName(name) + " (--" + name + ")"
	}
	return "--" + name
}

// flagSettings maps serve's flags to the config file's settings they
// override: a reload does not warn that such a setting changed in the file
// (the flag, or its variable, still decides it).
func flagSettings() map[string]string {
	return map[string]string{
		"listen": "node.listen", "api": "node.api", "data-dir": "node.data_dir",
		"bootstrap": "node.bootstrap", "psk-file": "node.psk_file",
		"allow-peer": "node.allow_peers", "allow-peers-file": "node.allow_peers_file",
		"allow-peers-dns": "node.allow_peers_dns", "grpc": "node.grpc",
		"envoy-config": "envoy.config", "envoy-share-wait": "envoy.share_wait", "token-file": "api.token_file",
		"tls-cert": "api.tls_cert", "tls-key": "api.tls_key", "client-ca": "api.client_ca",
		"insecure-api": "api.insecure", "metrics-auth": "api.metrics_auth",
	}
}

// overridden returns the config settings that fset's set flags (from the
// command line or the environment) decide.
func overridden(fset *flag.FlagSet) map[string]bool {
	out := map[string]bool{}
	settings := flagSettings()
	fset.Visit(func(f *flag.Flag) {
		if s, ok := settings[f.Name]; ok {
			out[s] = true
		}
	})
	return out
}
