package main

import (
	"bufio"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/ratemesh/ratemesh/httpapi"
	"github.com/ratemesh/ratemesh/internal/testutil"
)

// TestServeJoiningDenies: a node with a bootstrap peer that never answers
// serves its API during the join as DESIGN says — /healthz 503
// {"state":"joining"}, and /v1/allow a 200 denial whose retry_after_ms is
// the time left of join_timeout — and prints its ready line and admits
// once join_timeout has passed.
func TestServeJoiningDenies(t *testing.T) {
	bin := buildBinary(t)
	const joinTimeout = 4 * time.Second

	// An API port known before the ready line, and a bootstrap address
	// where nobody listens.
	api := freePort(t)
	priv, _, err := crypto.GenerateEd25519Key(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	id, err := peer.IDFromPrivateKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	_, deadPort, _ := net.SplitHostPort(freePort(t))
	boot := fmt.Sprintf("/ip4/127.0.0.1/tcp/%s/p2p/%s", deadPort, id)

	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "ratemesh.yaml")
	if err := os.WriteFile(cfgPath, []byte(fmt.Sprintf("node:\n  join_timeout: %s\n", joinTimeout)), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "serve", "--config", cfgPath, "--api", api, "--listen", "/ip4/127.0.0.1/tcp/0",
		"--data-dir", filepath.Join(dir, "data"), "--bootstrap", boot)
	errBuf := &lockedBuffer{}
	cmd.Stderr = errBuf
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	started := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-done
		if t.Failed() {
			t.Logf("stderr of serve:\n%s", errBuf.String())
		}
	})
	readyAt := make(chan time.Time, 1)
	go func() {
		if bufio.NewScanner(stdout).Scan() {
			readyAt <- time.Now()
		}
		close(readyAt)
	}()

	client := &http.Client{Timeout: 5 * time.Second}
	var health httpapi.HealthResponse
	testutil.Eventually(t, joinTimeout, func() (bool, string) {
		resp, err := client.Get("http://" + api + "/healthz")
		if err != nil {
			return false, "the API answers while joining: " + err.Error()
		}
		defer resp.Body.Close()
		if err := json.NewDecoder(resp.Body).Decode(&health); err != nil {
			return false, "the API answers while joining: " + err.Error()
		}
		if resp.StatusCode != http.StatusServiceUnavailable || health.State != "joining" {
			return false, fmt.Sprintf("the API answers while joining: healthz %d %+v", resp.StatusCode, health)
		}
		return true, "the API answers while joining"
	})
	// Until the store and the transport have started (a loaded machine
	// takes a while), the front answers 503; then the node decides.
	var d httpapi.AllowResponse
	var left time.Duration
	testutil.Eventually(t, joinTimeout, func() (bool, string) {
		resp, err := client.Post("http://"+api+"/v1/allow", "application/json", strings.NewReader(`{"rule":"default","key":"k"}`))
		if err != nil {
			return false, "a decision while joining: " + err.Error()
		}
		defer resp.Body.Close()
		left = joinTimeout - time.Since(started)
		if resp.StatusCode == http.StatusServiceUnavailable {
			return false, "a decision while joining: 503 before the node started"
		}
		if err := json.NewDecoder(resp.Body).Decode(&d); err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("allow while joining: %d %v", resp.StatusCode, err)
		}
		return true, "a decision while joining"
	})
	if d.Allowed || d.RetryAfterMs <= 0 || d.RetryAfterMs > joinTimeout.Milliseconds() || time.Duration(d.RetryAfterMs)*time.Millisecond < left-time.Second {
		t.Fatalf("allow while joining: %+v; want a denial retrying after the ~%v left of join_timeout", d, left.Round(time.Millisecond))
	}

	select {
	case at, ok := <-readyAt:
		if !ok {
			t.Fatal("serve exited without a ready line")
		}
		if el := at.Sub(started); el < joinTimeout-500*time.Millisecond {
			t.Errorf("ready line after %v, before join_timeout %v", el, joinTimeout)
		}
	case <-time.After(joinTimeout + 20*time.Second):
		t.Fatal("no ready line after join_timeout")
	}
	resp, err := client.Post("http://"+api+"/v1/allow", "application/json", strings.NewReader(`{"rule":"default","key":"k"}`))
	if err != nil {
		t.Fatal(err)
	}
	err = json.NewDecoder(resp.Body).Decode(&d)
	resp.Body.Close()
	if err != nil || !d.Allowed {
		t.Fatalf("allow once ready: %+v %v", d, err)
	}
}

// freePort returns a loopback HOST:PORT nobody listens on right now.
func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}
