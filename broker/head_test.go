package broker

import (
	"cmp"
	"math/rand/v2"
	"slices"
	"testing"
)

// TestHeadKeepsTheFirst: whatever the order of offer, a Head holds the
// first k of everything offered, equal values included.
func TestHeadKeepsTheFirst(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, c := range []struct{ n, k int }{{0, 3}, {2, 3}, {3, 3}, {1, 0}, {2, -1}, {50, 1}, {500, 20}, {500, 500}, {1000, 999}} {
		var all []int
		for range c.n {
			all = append(all, rng.IntN(max(1, c.n/3))) // repeats
		}
		h := NewHead(c.k, cmp.Compare[int])
		for _, v := range all {
			h.Offer(v)
		}
		want := slices.Sorted(slices.Values(all))[:max(0, min(c.k, c.n))]
		if got := h.Sorted(); !slices.Equal(got, want) || h.Len() != len(want) {
			t.Fatalf("%d values, head of %d: got %v, want %v", c.n, c.k, got, want)
		}
	}
}
