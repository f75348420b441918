package main

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

func TestParseFlags(t *testing.T) {
	o, err := parseFlags([]string{"--scenario", "crash", "--duration", "20s", "--cpu-max", "50000/200000", "--busy", "4", "--pauses"}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if o.Scenario != "crash" || o.Duration != 20*time.Second || o.quota != 50000 || o.period != 200000 || o.Busy != 4 || !o.Pauses {
		t.Errorf("parsed %+v", o)
	}
	if got := o.hotRate(); got != 1000 {
		t.Errorf("hotRate %v, want 10 × 100 per 1 s", got)
	}
	if o, err = parseFlags(nil, &bytes.Buffer{}); err != nil || o.Scenario != "soak" || o.Nodes != 3 || o.Keys != 20000 || o.Flood != 10 || o.Bound != 1.02 {
		t.Errorf("defaults: %+v %v", o, err)
	}
	if o, err := parseFlags([]string{"--scenario", "upgrade", "--old-bin", "/tmp/old", "--bin", "/tmp/new", "--signal", "term"}, &bytes.Buffer{}); err != nil || o.OldBin != "/tmp/old" || o.Bin != "/tmp/new" || o.Scenario != "upgrade" {
		t.Errorf("upgrade: %+v %v", o, err)
	}
	cfg := o.config()
	for _, want := range []string{"partition_policy: strict", "{name: hot, algorithm: fixed_window, limit: 100, window: 1000ms}", "{name: burst, algorithm: fixed_window, limit: 1000, window: 1000ms}"} {
		if !strings.Contains(cfg, want) {
			t.Errorf("config %q lacks %q", cfg, want)
		}
	}
	o.ShareWait = time.Second
	if cfg := o.config(); !strings.Contains(cfg, "{name: burst, algorithm: fixed_window, limit: 1000, window: 1000ms, share_wait: 1000ms}") {
		t.Errorf("--share-wait 1s: config %q", cfg)
	}
}

func TestParseFlagsErrorsNameTheFlag(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"--scenario", "storm"}, `--scenario: "storm" is not soak`},
		{[]string{"--nodes", "0"}, "--nodes: 0 is not within 1 to 9"},
		{[]string{"--nodes", "2", "--scenario", "crash"}, "--nodes: a crash under strict needs at least 3 nodes"},
		{[]string{"--nodes", "1", "--scenario", "rolling"}, "--nodes: a rolling restart needs at least 2"},
		{[]string{"--limit", "0"}, "--limit: 0 is not within"},
		{[]string{"--window", "50ms"}, "--window: 50ms is not"},
		{[]string{"--window", "1500us"}, "--window: 1.5ms is not"},
		{[]string{"--policy", "lenient"}, `--policy: "lenient" is not strict or available`},
		{[]string{"--duration", "1s"}, "--duration: 1s is not within 2s to 30m"},
		{[]string{"--duration", "5s", "--scenario", "crash"}, "--duration: a crash needs at least 6s"},
		{[]string{"--flood", "NaN"}, "--flood: NaN is not within 0 to 100"},
		{[]string{"--flood", "-1"}, "--flood: -1 is not within"},
		{[]string{"--keys", "-5"}, "--keys: -5 is not within"},
		{[]string{"--key-rate", "1e9"}, "--key-rate: 1e+09 is not within"},
		{[]string{"--workers", "0"}, "--workers: 0 is not within"},
		{[]string{"--busy", "65"}, "--busy: 65 is not within 0 to 64"},
		{[]string{"--cpu-max", "abc"}, `--cpu-max: quota "abc" is not a number`},
		{[]string{"--cpu-max", "50000/10"}, `--cpu-max: period "10" is not`},
		{[]string{"--cpu-max", "max/100000"}, `--cpu-max: quota "max"`},
		{[]string{"--pause-every", "1ms"}, "--pause-every: 1ms is not within"},
		{[]string{"--signal", "hup"}, `--signal: "hup" is not kill or term`},
		{[]string{"--burst", "1001"}, "--burst: 1001 is not within 1 to --burst-limit (1000)"},
		{[]string{"--burst-limit", "0"}, "--burst-limit: 0 is not within"},
		{[]string{"--share-wait", "2s"}, "--share-wait: 2s is not a whole number of milliseconds within 0 to 1s"},
		{[]string{"--bound", "0.5"}, "--bound: 0.5 is not within 1 to 10"},
		{[]string{"--scenario", "upgrade"}, "--old-bin: the upgrade scenario needs the old release's binary"},
		{[]string{"--old-bin", "/tmp/old"}, "--old-bin: only the upgrade scenario starts on another binary, not soak"},
		{[]string{"--scenario", "upgrade", "--old-bin", "/tmp/old", "--nodes", "1"}, "--nodes: a rolling restart needs at least 2"},
		{[]string{"--busy", "x"}, `invalid value "x" for flag -busy`},
		{[]string{"extra"}, `unexpected argument "extra"`},
	}
	for _, tt := range tests {
		_, err := parseFlags(tt.args, &bytes.Buffer{})
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%v: error %v, want it to contain %q", tt.args, err, tt.want)
		}
	}
	// Every bad flag is named at once.
	_, err := parseFlags([]string{"--nodes", "0", "--busy", "-1"}, &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), "--nodes") || !strings.Contains(err.Error(), "--busy") {
		t.Errorf("two bad flags: %v, want both named", err)
	}
}

func TestRealMainExitStatus(t *testing.T) {
	var out, errOut bytes.Buffer
	if got := realMain([]string{"--nodes", "12"}, &out, &errOut); got != 2 || !strings.Contains(errOut.String(), "starve: --nodes: 12") {
		t.Errorf("bad flag: exit %d, stderr %q; want 2 naming --nodes", got, errOut.String())
	}
	errOut.Reset()
	if got := realMain([]string{"-h"}, &out, &errOut); got != 0 || !strings.Contains(errOut.String(), "--scenario") && !strings.Contains(errOut.String(), "-scenario") {
		t.Errorf("-h: exit %d, stderr %q", got, errOut.String())
	}
}

func TestParseCPUMax(t *testing.T) {
	for _, tt := range []struct {
		in            string
		quota, period int
	}{{"50000/100000", 50000, 100000}, {"25000", 25000, 100000}, {"200000/100000", 200000, 100000}} {
		q, p, err := parseCPUMax(tt.in)
		if err != nil || q != tt.quota || p != tt.period {
			t.Errorf("%q: %d %d %v; want %d %d", tt.in, q, p, err, tt.quota, tt.period)
		}
	}
	for _, in := range []string{"", "/", "0/100000", "999", "100000/0", "1000/x", "10000000/100000"} {
		if _, _, err := parseCPUMax(in); err == nil {
			t.Errorf("%q: no error", in)
		}
	}
}
