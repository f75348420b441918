package main

import (
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ratemesh/ratemesh/config"
	"github.com/ratemesh/ratemesh/internal/apitest"
	"github.com/ratemesh/ratemesh/limiter"
	"github.com/ratemesh/ratemesh/mesh"
)

const shareWaitDescriptors = "domain: edge\ndescriptors:\n  - key: ip\n    rate_limit: {unit: second, requests_per_unit: 10}\n"

// shareWaits returns the share_wait of every rule generated from
// descriptor files, by rule.
func shareWaits(rules []limiter.Rule) string {
	var out []string
	for _, r := range rules {
		if strings.HasPrefix(r.Name, "envoy:") {
			out = append(out, fmt.Sprintf("%s=%v", r.Name, r.ShareWait))
		}
	}
	slices.Sort(out)
	return strings.Join(out, " ")
}

// TestEnvoyShareWaitSettings: envoy.share_wait and envoy.domains reach
// the generated rules at start (validate says the same), are reloaded
// with the file (a flag's share_wait kept), and a domain the descriptor
// files do not hold is refused by name, at start and on reload.
func TestEnvoyShareWaitSettings(t *testing.T) {
	dir := t.TempDir()
	desc := filepath.Join(dir, "descriptors.yaml")
	write(t, desc, shareWaitDescriptors+"  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 5}\n")
	cfgPath := filepath.Join(dir, "ratemesh.yaml")
	write(t, cfgPath, "envoy:\n  config: "+desc+"\n  share_wait: 6ms\n  domains: {edge: {share_wait: 0}}\n")
	cfg, err := config.Load(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	d, err := loadEnvoy(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if got := shareWaits(d.Rules()); got != "envoy:edge.ip=-1ns envoy:edge.user=-1ns" {
		t.Errorf("at start: %s", got)
	}

	write(t, filepath.Join(dir, "bad.yaml"), "envoy:\n  config: "+desc+"\n  domains: {egde: {share_wait: 5ms}}\n")
	code, _, errOut := runCLI("validate", "--config", filepath.Join(dir, "bad.yaml"))
	if code != 1 || !strings.Contains(errOut, "envoy.domains.egde: no such domain in envoy.config "+desc+" (its domains: edge)") {
		t.Errorf("validate of a misspelt domain: exit %d %q", code, errOut)
	}

	n := apitest.Start(t, nil, "solo", d.Rules())
	ex := &serveExtras{file: *cfg, envoyPath: desc, desc: d, envoy: cfg.Envoy, overridden: map[string]bool{}}
	plaus := mesh.NewPlausibility(n.Node.Rules())
	log := slog.New(slog.DiscardHandler)
	reload := func(file string) string {
		t.Helper()
		write(t, cfgPath, file)
		reloadAll(n.Node, n.API, nil, plaus, cfgPath, ex, log)
		return shareWaits(n.Node.Rules())
	}
	if got := reload("envoy:\n  config: " + desc + "\n  share_wait: 9ms\n"); got != "envoy:edge.ip=9ms envoy:edge.user=9ms" {
		t.Errorf("reloaded envoy.share_wait: %s", got)
	}
	if got := reload("envoy:\n  config: " + desc + "\n  domains: {nope: {share_wait: 1ms}}\n"); got != "envoy:edge.ip=9ms envoy:edge.user=9ms" {
		t.Errorf("a reload naming an unknown domain keeps the running rules: %s", got)
	}
	if got := reload("envoy:\n  config: " + desc + "\n  share_wait: 2s\n"); got != "envoy:edge.ip=9ms envoy:edge.user=9ms" {
		t.Errorf("a reload with an invalid share_wait keeps the running one: %s", got)
	}
	if got := reload("envoy:\n  config: " + desc + "\n"); got != "envoy:edge.ip=0s envoy:edge.user=0s" {
		t.Errorf("share_wait left out: the default: %s", got)
	}
	ex.overridden["envoy.share_wait"] = true
	ex.envoy.ShareWait = 4 * time.Millisecond
	if got := reload("envoy:\n  config: " + desc + "\n  share_wait: 8ms\n"); got != "envoy:edge.ip=4ms envoy:edge.user=4ms" {
		t.Errorf("--envoy-share-wait beats the file on reload: %s", got)
	}
}
