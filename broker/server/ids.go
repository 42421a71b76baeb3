package server

import (
	"crypto/rand"
	"io"
	"sync"
	"time"

	"github.com/oklog/ulid/v2"
)

// idSource makes job ids: ULIDs, which sort by creation time, so a listing
// in id order is a listing in submit order. Ids made in the same
// millisecond are monotonic.
type idSource struct {
	mu      sync.Mutex
	entropy io.Reader
}

func newIDSource() *idSource {
	return &idSource{entropy: ulid.Monotonic(rand.Reader, 0)}
}

func (ids *idSource) next(now time.Time) string {
	ids.mu.Lock()
	defer ids.mu.Unlock()
	return ulid.MustNew(ulid.Timestamp(now), ids.entropy).String()
}

// nextN makes n ids in one go: consecutive, with nothing made between
// them, so they sort in the order made and share now's millisecond (an
// array's id and its elements': listing an array scans just that range).
func (ids *idSource) nextN(now time.Time, n int) []string {
	ids.mu.Lock()
	defer ids.mu.Unlock()
	out := make([]string, n)
	for i := range out {
		out[i] = ulid.MustNew(ulid.Timestamp(now), ids.entropy).String()
	}
	return out
}
