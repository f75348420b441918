package mesh

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/ratemesh/ratemesh/internal/testutil"
	"github.com/ratemesh/ratemesh/limiter"
	"github.com/ratemesh/ratemesh/node"
)

// fwdRecorder is a node.Handler that also serves forwarded requests: it
// remembers each with its sender and answers with reply.
type fwdRecorder struct {
	recorder
	fmu   sync.Mutex
	from  []string
	reqs  []node.ForwardRequest
	reply node.ForwardResponse
	block chan struct{} // when set, HandleForward waits for it or ctx
}

func (r *fwdRecorder) HandleForward(ctx context.Context, from string, req *node.ForwardRequest) *node.ForwardResponse {
	r.fmu.Lock()
	r.from, r.reqs = append(r.from, from), append(r.reqs, *req)
	block := r.block
	r.fmu.Unlock()
	if block != nil {
		select {
		case <-block:
		case <-ctx.Done():
		}
	}
	r.fmu.Lock()
	resp := r.reply
	r.fmu.Unlock()
	return &resp
}

// fwdPair starts two meshes, b serving forwarded requests with rec, a
// connected to b.
func fwdPair(t *testing.T) (a, b *Mesh, rec *fwdRecorder) {
	t.Helper()
	rec = &fwdRecorder{}
	b = newMesh(t, testConfig(t))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := b.Start(ctx, rec); err != nil {
		t.Fatal(err)
	}
	acfg := testConfig(t)
	acfg.Bootstrap = []string{tcpAddr(t, b)}
	a, _ = startMesh(t, acfg)
	testutil.Eventually(t, 5*time.Second, func() (bool, string) { return connected(a, b), "a connects to b" })
	return a, b, rec
}

// TestForwardRoundTrip: every field of a request and an answer crosses
// the forward stream intact, and the receiver learns the sender's
// authenticated peer ID.
func TestForwardRoundTrip(t *testing.T) {
	a, b, rec := fwdPair(t)
	rec.fmu.Lock()
	rec.reply = node.ForwardResponse{
		Status: node.ForwardOK,
		Decision: node.Decision{Allowed: false, Limit: 7, Remaining: 3, ResetAfter: 1500 * time.Millisecond,
			RetryAfter: node.Never, Shadow: true, Reason: limiter.ReasonCost},
		LeaseID: "lease~1~2", TTL: 42 * time.Second,
	}
	want := rec.reply
	rec.fmu.Unlock()
	req := &node.ForwardRequest{Op: node.ForwardAllow, Rule: "api", Key: "acct:42",
		Request: limiter.Request{Cost: 3, HasCost: true, Type: "publish", Units: 9, Class: "payer"},
		LeaseID: "x~1~1", Hold: 120 * time.Millisecond}
	resp, err := a.Forward(context.Background(), b.PeerID(), req)
	if err != nil {
		t.Fatal(err)
	}
	if *resp != want {
		t.Errorf("answer %+v, want %+v", *resp, want)
	}
	rec.fmu.Lock()
	if len(rec.reqs) != 1 || rec.reqs[0] != *req || rec.from[0] != a.PeerID() {
		t.Errorf("received %+v from %v, want %+v from %s", rec.reqs, rec.from, *req, a.PeerID())
	}
	rec.reply.Decision.RetryAfter = 40 * time.Millisecond
	rec.fmu.Unlock()
	if resp, err := a.Forward(context.Background(), b.PeerID(), req); err != nil || resp.Decision.RetryAfter != 40*time.Millisecond {
		t.Errorf("retry after 40ms: %+v, %v", resp, err)
	}
}

// TestForwardBounds: the caller's context bounds a forward the receiver
// does not answer; an oversized request is refused before it is sent, and
// one sent anyway (a raw stream) is reset unread; a malformed peer ID is
// ErrBadPeer; a mesh without a forward handler does not serve the
// protocol.
func TestForwardBounds(t *testing.T) {
	a, b, rec := fwdPair(t)
	rec.block = make(chan struct{})
	defer close(rec.block)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	start := time.Now()
	_, err := a.Forward(ctx, b.PeerID(), &node.ForwardRequest{Op: node.ForwardRenew, LeaseID: "x~1~1"})
	cancel()
	if err == nil || time.Since(start) > 2*time.Second {
		t.Errorf("unanswered forward: %v after %v, want an error at the caller's deadline", err, time.Since(start))
	}

	big := make([]byte, maxForwardFrame+1)
	for i := range big {
		big[i] = 'k'
	}
	if _, err := a.Forward(context.Background(), b.PeerID(), &node.ForwardRequest{Op: node.ForwardAllow, Rule: "api", Key: string(big)}); !errors.Is(err, ErrTooLarge) {
		t.Errorf("oversized request: %v, want ErrTooLarge", err)
	}
	s, err := a.Host().NewStream(context.Background(), pid(t, b), b.ForwardProtocol())
	if err != nil {
		t.Fatal(err)
	}
	var hdr [binary.MaxVarintLen64]byte
	_, _ = s.Write(hdr[:binary.PutUvarint(hdr[:], maxForwardFrame+1)])
	_, _ = s.Write(big)
	_ = s.CloseWrite()
	_ = s.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := readFrame(bufio.NewReader(s)); err == nil {
		t.Error("an oversized frame was answered")
	}
	rec.fmu.Lock()
	n := len(rec.reqs)
	rec.fmu.Unlock()
	if n != 1 {
		t.Errorf("the handler saw %d requests, want only the first", n)
	}

	if _, err := a.Forward(context.Background(), "garbage", &node.ForwardRequest{Op: node.ForwardRenew}); !errors.Is(err, node.ErrBadPeer) {
		t.Errorf("Forward to garbage: %v, want ErrBadPeer", err)
	}
	if err := a.CheckPeer("garbage"); !errors.Is(err, node.ErrBadPeer) {
		t.Errorf("CheckPeer(garbage): %v, want ErrBadPeer", err)
	}
	if err := a.CheckPeer(b.PeerID()); err != nil {
		t.Errorf("CheckPeer(b): %v", err)
	}
	// a's handler is a plain recorder: a does not serve the protocol.
	if _, err := b.Forward(context.Background(), a.PeerID(), &node.ForwardRequest{Op: node.ForwardRenew, LeaseID: "x~1~1"}); err == nil {
		t.Error("a mesh without a ForwardHandler answered a forward")
	}
}
