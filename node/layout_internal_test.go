package node

import (
	"testing"
	"unsafe"
)

// TestMemberLayout pins what member's comment relies on: it fits the
// 320-byte size class, whose objects start on a cache line. A member that
// grew past it would take the 352-byte class and straddle one more line.
func TestMemberLayout(t *testing.T) {
	if got := unsafe.Sizeof(member{}); got > 320 {
		t.Errorf("member is %d bytes, want at most 320 (five cache lines)", got)
	}
}
