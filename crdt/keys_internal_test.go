package crdt

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// TestKeyTableMatchesMap drives a keyTable and a map through the same
// random insertions and deletions, past enough keys that segments double,
// split and the directory doubles, and checks every lookup, the count and
// a full walk against the map.
func TestKeyTableMatchesMap(t *testing.T) {
	for seed := uint64(1); seed <= 8; seed++ {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			r := rand.New(rand.NewPCG(seed, 0x6b657973))
			tab, ref := newKeyTable(), map[string]*Series{}
			space := []int{50, 3000, 40_000}[seed%3]
			check := func(step int) {
				t.Helper()
				if tab.n != len(ref) {
					t.Fatalf("step %d: %d keys, want %d", step, tab.n, len(ref))
				}
				seen := map[string]bool{}
				tab.each(func(s *Series) {
					if seen[s.Key] || ref[s.Key] != s {
						t.Fatalf("step %d: the walk gives %q twice or not its series", step, s.Key)
					}
					seen[s.Key] = true
				})
				if len(seen) != len(ref) {
					t.Fatalf("step %d: the walk gives %d keys, want %d", step, len(seen), len(ref))
				}
			}
			for step := range 60_000 {
				key := fmt.Sprintf("k%d", r.IntN(space))
				switch got := tab.get(key); {
				case got != ref[key]:
					t.Fatalf("step %d: get(%q) = %p, want %p", step, key, got, ref[key])
				case got == nil && r.IntN(3) != 0:
					s := &Series{Key: key}
					tab.put(s)
					ref[key] = s
				case got != nil && r.IntN(4) == 0:
					tab.del(key)
					delete(ref, key)
					if tab.get(key) != nil {
						t.Fatalf("step %d: %q found after del", step, key)
					}
				}
				if step%10_000 == 0 {
					check(step)
				}
			}
			check(-1)
			for key, s := range ref {
				if tab.get(key) != s {
					t.Fatalf("end: get(%q) is not its series", key)
				}
				tab.del(key)
			}
			tab.del("absent")
			if tab.n != 0 {
				t.Fatalf("%d keys left after deleting them all", tab.n)
			}
			tab.each(func(s *Series) { t.Fatalf("%q walked after deleting them all", s.Key) })
		})
	}
}

// TestKeyTableBoundsGrowth checks that no segment outgrows segMax slots
// nor seven eighths full, so that an insertion rehashes at most segMax
// keys, and that the table takes at most 16 bytes a key at 100,000.
func TestKeyTableBoundsGrowth(t *testing.T) {
	tab := newKeyTable()
	const keys = 100_000
	for i := range keys {
		tab.put(&Series{Key: fmt.Sprintf("acct:%d", i)})
	}
	segs, bytes := 0, 8*cap(tab.dir)
	for i, s := range tab.dir {
		if i > 0 && tab.dir[i-1] == s {
			continue
		}
		segs++
		bytes += 9 * len(s.slots)
		if len(s.slots) > segMax || 8*s.n > 7*len(s.slots) {
			t.Fatalf("a segment of %d slots holds %d", len(s.slots), s.n)
		}
		if int(s.depth) > int(tab.depth) {
			t.Fatalf("a segment of depth %d under a directory of %d", s.depth, tab.depth)
		}
	}
	if per := float64(bytes) / keys; per > 16 {
		t.Errorf("%.1f bytes a key in %d segments, want at most 16", per, segs)
	}
}
