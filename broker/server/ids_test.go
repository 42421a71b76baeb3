package server

import (
	"sync"
	"testing"
	"time"
)

// TestIDRunsAreConsecutive: an array's ids, made in one go while other
// submits make ids at other milliseconds, sort in the order made and share
// their millisecond's prefix (what listing an array's elements relies on).
func TestIDRunsAreConsecutive(t *testing.T) {
	ids := newIDSource()
	t0 := time.Date(2026, 12, 4, 21, 0, 0, 0, time.UTC)
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for g := range 4 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
					ids.next(t0.Add(time.Duration(g*1000+i%7) * time.Millisecond))
				}
			}
		})
	}
	for range 200 {
		run := ids.nextN(t0, 50)
		for k, id := range run {
			if k > 0 && id <= run[k-1] {
				t.Fatalf("ids not in the order made: %s after %s", id, run[k-1])
			}
			if id[:10] != run[0][:10] {
				t.Fatalf("%s and %s do not share a millisecond", id, run[0])
			}
		}
	}
	close(stop)
	wg.Wait()
}
