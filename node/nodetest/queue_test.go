package nodetest

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// TestQueueOrder checks the in-flight queue against a sort: deliveries
// leave in order of time and, for equal times, of enqueueing, including
// ones pushed while a bucket is being drained.
func TestQueueOrder(t *testing.T) {
	for seed := uint64(1); seed <= 20; seed++ {
		rng := rand.New(rand.NewPCG(seed, 3))
		q := queue{buckets: make(map[int64]*bucket)}
		base := time.Unix(1000, 0)
		var want []delivery
		var seq uint64
		push := func(at time.Time) {
			seq++
			d := delivery{at: at, seq: seq}
			q.push(d)
			want = append(want, d)
		}
		for range 200 {
			push(base.Add(time.Duration(rng.IntN(10)) * time.Millisecond))
		}
		var got []delivery
		for {
			d, ok := q.pop(base.Add(5 * time.Millisecond).UnixNano())
			if !ok {
				break
			}
			got = append(got, d)
			if rng.IntN(4) == 0 { // a zero-delay reply lands in the bucket being drained
				push(d.at)
			}
		}
		for {
			d, ok := q.pop(1 << 62)
			if !ok {
				break
			}
			got = append(got, d)
		}
		slices.SortStableFunc(want, func(a, b delivery) int {
			if c := a.at.Compare(b.at); c != 0 {
				return c
			}
			return int(a.seq) - int(b.seq)
		})
		if len(got) != len(want) || q.n != 0 {
			t.Fatalf("seed %d: popped %d of %d, %d left", seed, len(got), len(want), q.n)
		}
		for i := range got {
			if got[i].seq != want[i].seq {
				t.Fatalf("seed %d: delivery %d is seq %d at %v, want seq %d at %v", seed, i, got[i].seq, got[i].at, want[i].seq, want[i].at)
			}
		}
	}
}
