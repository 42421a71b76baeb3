package broker

import "slices"

// Head keeps the first k of the values offered to it under cmp, offered
// in any order: a heap of at most k with the last kept on top, so that a
// value behind the ones kept costs one comparison. A page of the newest
// jobs and the head of a queue of 100,000 are kept this way, instead of
// sorting every value to cut the first k.
type Head[T any] struct {
	k   int
	cmp func(a, b T) int
	h   []T
}

// NewHead returns an empty Head of k values under cmp (negative: a
// comes first); with k of 0 or less it keeps none.
func NewHead[T any](k int, cmp func(a, b T) int) *Head[T] {
	return &Head[T]{k: k, cmp: cmp}
}

// Offer keeps v if it is among the first k offered so far.
func (h *Head[T]) Offer(v T) {
	if len(h.h) < h.k {
		h.h = append(h.h, v)
		h.up(len(h.h) - 1)
		return
	}
	if h.k <= 0 || h.cmp(v, h.h[0]) >= 0 {
		return
	}
	h.h[0] = v
	h.down(0)
}

// Len is how many values are kept.
func (h *Head[T]) Len() int { return len(h.h) }

// Sorted returns the kept values, first first.
func (h *Head[T]) Sorted() []T {
	out := slices.Clone(h.h)
	slices.SortFunc(out, h.cmp)
	return out
}

// after reports whether the i-th kept value comes after the j-th: the
// heap keeps the last on top.
func (h *Head[T]) after(i, j int) bool { return h.cmp(h.h[i], h.h[j]) > 0 }

func (h *Head[T]) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if !h.after(i, p) {
			return
		}
		h.h[i], h.h[p] = h.h[p], h.h[i]
		i = p
	}
}

func (h *Head[T]) down(i int) {
	for {
		l := 2*i + 1
		if l >= len(h.h) {
			return
		}
		c := l
		if r := l + 1; r < len(h.h) && h.after(r, l) {
			c = r
		}
		if !h.after(c, i) {
			return
		}
		h.h[i], h.h[c] = h.h[c], h.h[i]
		i = c
	}
}
