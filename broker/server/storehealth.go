package server

import (
	"fmt"
	"sync"
	"time"

	"github.com/spillway-dev/spillway/broker"
)

// storeRetryAfter is the Retry-After (seconds) of a 503 for a failing store.
const storeRetryAfter = 5

// storeFailWindow is how long a failed store write keeps /healthz
// unhealthy (unless a later commit succeeds).
const storeFailWindow = 30 * time.Second

// storeHealth remembers the last store failure for /healthz: a full disk
// or a lost Redis shows there even while reads still work.
type storeHealth struct {
	mu  sync.Mutex
	at  time.Time
	err string
	// unreachable: the failure was one of reaching the store
	// (broker.IsStoreUnreachable), which a store answering a ping again
	// has put behind it.
	unreachable bool
}

// noteStoreFailure records a store failure now.
func (s *Server) noteStoreFailure(err error) {
	s.storeHealth.mu.Lock()
	defer s.storeHealth.mu.Unlock()
	s.storeHealth.at, s.storeHealth.err = s.clock.Now(), err.Error()
	s.storeHealth.unreachable = broker.IsStoreUnreachable(err)
}

// noteStoreSuccess clears the failure: a write went through since.
func (s *Server) noteStoreSuccess() {
	s.storeHealth.mu.Lock()
	defer s.storeHealth.mu.Unlock()
	s.storeHealth.at, s.storeHealth.err = time.Time{}, ""
}

// recentStoreFailure describes a store failure of the last
// storeFailWindow, or returns "". pinged says the store answered a ping
// just now: a failure to reach it is then over (a Redis back after an
// outage, with nothing to write since), one of it refusing writes is not.
func (s *Server) recentStoreFailure(pinged bool) string {
	s.storeHealth.mu.Lock()
	defer s.storeHealth.mu.Unlock()
	if s.storeHealth.err == "" || pinged && s.storeHealth.unreachable {
		return ""
	}
	ago := s.clock.Now().Sub(s.storeHealth.at)
	if ago > storeFailWindow {
		return ""
	}
	return fmt.Sprintf("store write failed %s ago: %s", ago.Round(time.Second), s.storeHealth.err)
}
