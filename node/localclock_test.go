package node_test

import (
	"testing"
	"time"

	"github.com/ratemesh/ratemesh/limiter"
	"github.com/ratemesh/ratemesh/node"
)

// TestLocalClockSwitch: with CoreConfig.LocalClock the skewed member still
// estimates its offset, but MeshMs is its own clock, so it opens windows
// 400 ms off the others; without it (TestCoreClockSkew) they agree.
func TestLocalClockSwitch(t *testing.T) {
	const seed, skew = 73, 400 * time.Millisecond
	reportSeed(t, seed)
	net := cluster(t, 5, seed, apiRule(limiter.FixedWindow, 1000), func(c *node.CoreConfig) { c.LocalClock = true })
	net.Delay = 5 * time.Millisecond
	net.Skew(4, skew)
	run(t, net, 3200*time.Millisecond, nil)
	c := net.Core(4)
	if got := c.Offset(); got > -skew+10*time.Millisecond || got < -skew-10*time.Millisecond {
		t.Errorf("Offset() = %v, want about %v: the estimate is kept", got, -skew)
	}
	for i := range 5 {
		local := net.Local(i).UnixMilli()
		if got := net.Core(i).MeshMs(net.Local(i)); got != local {
			t.Errorf("member %d: MeshMs %d, want its local clock %d", i, got, local)
		}
	}
	if d := c.MeshMs(net.Local(4)) - net.Core(0).MeshMs(net.Local(0)); d < 390 || d > 410 {
		t.Errorf("skewed member's MeshMs is %d ms off member 0's, want about 400", d)
	}
}
