package httpapi

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/ratemesh/ratemesh/node"
)

// TestFail: errors a node returns are answered by their types and
// sentinels: the lease errors that only a forwarding transport produces,
// a closed node, a cancelled request and a fault of ours.
func TestFail(t *testing.T) {
	s := &Server{log: slog.New(slog.DiscardHandler)}
	unreachable := &node.RequestError{Field: "lease_id", Msg: "lease owner unreachable: boom",
		Err: fmt.Errorf("%w: %w", node.ErrOwnerUnreachable, context.DeadlineExceeded)}
	notLive := &node.RequestError{Field: "lease_id", Msg: "unknown or expired lease: its owner is not a live member", Err: node.ErrUnknownLease}
	tests := []struct {
		name   string
		err    error
		status int
		body   string
	}{
		{"owner unreachable", &node.OwnerError{Owner: "QmB", Err: unreachable}, 503,
			`{"error":"lease_id: lease owner unreachable: boom (owner QmB); retry","owner":"QmB"}`},
		{"owner not live", &node.OwnerError{Owner: "QmB", Err: notLive}, 404,
			`{"error":"lease_id: unknown or expired lease: its owner is not a live member (owner QmB)","owner":"QmB"}`},
		{"unknown at the owner", &node.OwnerError{Owner: "QmB", Err: node.ErrUnknownLease}, 404,
			`{"error":"lease_id: unknown or expired lease (owner QmB)","owner":"QmB"}`},
		{"unknown here", node.ErrUnknownLease, 404, `{"error":"lease_id: unknown or expired lease"}`},
		{"closed", node.ErrClosed, 503, `{"error":"the node is shutting down"}`},
		{"cancelled", fmt.Errorf("wait: %w", context.Canceled), 503, `{"error":"request cancelled: wait: context canceled"}`},
		{"option of a check", &node.CheckError{Index: 3, Err: &node.RequestError{Msg: "option does not apply: MaxWait", Err: node.ErrBadOption}}, 400,
			`{"error":"checks[3]: option does not apply: MaxWait"}`},
		{"ours", errors.New("disk on fire"), 500, `{"error":"internal error"}`},
	}
	for _, tc := range tests {
		w := httptest.NewRecorder()
		s.fail(w, tc.err)
		if got := strings.TrimSpace(w.Body.String()); w.Code != tc.status || got != tc.body {
			t.Errorf("%s: %d %s, want %d %s", tc.name, w.Code, got, tc.status, tc.body)
		}
	}
}
