package server

import "sync"

// maxLabelSets bounds the distinct label value sets one tenant-fed metric
// series family may grow to; past it, new values are counted under
// labelOther. Every series lives in the broker's memory and in every
// scrape until restart, so a tenant inventing names must not grow them.
const maxLabelSets = 500

// labelOther stands for the values past the cap.
const labelOther = "_other"

// labelCap admits label value sets up to a limit.
type labelCap struct {
	mu    sync.Mutex
	limit int
	seen  map[string]bool
}

func newLabelCap(limit int) *labelCap { return &labelCap{limit: limit, seen: map[string]bool{}} }

// admit returns values when their set was seen before or there is room,
// and else the same number of labelOther values.
func (l *labelCap) admit(values ...string) []string {
	key := ""
	for _, v := range values {
		key += v + "\x00"
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.seen[key] {
		return values
	}
	if len(l.seen) < l.limit {
		l.seen[key] = true
		return values
	}
	out := make([]string, len(values))
	for i := range out {
		out[i] = labelOther
	}
	return out
}
