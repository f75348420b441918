package node_test

import (
	"testing"
	"time"

	"github.com/ratemesh/ratemesh/limiter"
)

func TestPartitionSmoke(t *testing.T) {
	for _, alg := range []limiter.Algorithm{limiter.FixedWindow, limiter.SlidingWindow} {
		t.Run(string(alg), func(t *testing.T) {
			net := cluster(t, 5, 3, apiRule(alg, 1000), nil)
			net.Delay = 5 * time.Millisecond
			o := &offer{rate: 10000, members: []int{0, 1, 2, 3, 4}, key: "k", perWin: map[int64]uint64{}}
			drive := o.drive(t, net, net.Step)
			if err := net.Run(2300*time.Millisecond, drive); err != nil {
				t.Fatal(err)
			}
			net.Partition([]int{0, 1}, []int{2, 3, 4})
			if err := net.Run(1700*time.Millisecond, drive); err != nil { // suspect_after is 2s: nobody turns suspect
				t.Fatal(err)
			}
			net.Recover()
			if err := net.Run(2*time.Second, drive); err != nil {
				t.Fatal(err)
			}
			first := t0.UnixMilli() / 1000
			for w := first + 1; w < first+6; w++ {
				t.Logf("window %d: admitted %d", w-first, o.perWin[w])
				if o.perWin[w] > 1020 {
					t.Errorf("window %d admitted %d > 1020", w-first, o.perWin[w])
				}
			}
		})
	}
}
