package crdt

import "testing"

// TestArraySize checks that an array by SlotID always covers what it must,
// and that a thousand members take exactly 4 KiB.
func TestArraySize(t *testing.T) {
	for n := 0; n <= 5000; n++ {
		got := arraySize(n)
		if got < n || got > n+n/16+1 {
			t.Fatalf("arraySize(%d) = %d, want within [%d, %d]", n, got, n, n+n/16+1)
		}
	}
	for _, n := range []int{965, 1000, 1001, 1024} {
		if got := arraySize(n); got != 1024 {
			t.Errorf("arraySize(%d) = %d, want 1024", n, got)
		}
	}
}
