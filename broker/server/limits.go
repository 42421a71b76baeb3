package server

import (
	"math"
	"net/http"
	"sync"
	"time"

	"github.com/spillway-dev/spillway/broker"
)

// teamLimits are the per-team submit rate (a token bucket on the injected
// clock) and the pending-job cap (limits.*). Both answer 429 with
// Retry-After; neither looks at another team, so one team's flood leaves
// the others' submits alone.
type teamLimits struct {
	mu      sync.Mutex
	buckets map[string]*bucket
	// pending counts each team's pending jobs, kept equal to the pending
	// jobs in the in-memory view (trackPendingLocked).
	pending map[string]int
}

type bucket struct {
	tokens float64
	at     time.Time
}

// errTooMany is a 429 with its Retry-After (seconds).
func errTooMany(retryAfter int, format string, args ...any) *apiError {
	e := newError(http.StatusTooManyRequests, "too_many_requests", format, args...)
	e.RetryAfter = retryAfter
	return e
}

// admitSubmit takes one submit from team's bucket, or says how long to
// wait. It also refuses a team at its pending cap.
func (s *Server) admitSubmit(team string) error {
	lim := s.cfg().Limits
	now := s.clock.Now()
	l := &s.limits
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.buckets == nil {
		l.buckets = map[string]*bucket{}
	}
	if err := s.pendingRoomLocked(team, 1); err != nil {
		return err
	}
	rate := float64(lim.SubmitsPerMinute) / 60 // per second
	b, ok := l.buckets[team]
	if !ok {
		b = &bucket{tokens: float64(lim.SubmitBurst), at: now}
		l.buckets[team] = b
	}
	if dt := now.Sub(b.at).Seconds(); dt > 0 {
		b.tokens = math.Min(float64(lim.SubmitBurst), b.tokens+dt*rate)
	}
	b.at = now
	if b.tokens < 1 {
		wait := int(math.Ceil((1 - b.tokens) / rate))
		s.metrics.limited.WithLabelValues("submit_rate").Inc()
		return errTooMany(max(wait, 1), "team %s is over its submit rate (%d a minute, bursts of %d); retry in %ds",
			team, lim.SubmitsPerMinute, lim.SubmitBurst, max(wait, 1))
	}
	b.tokens--
	return nil
}

// checkPendingRoom refuses n more pending jobs for team past its cap (an
// array's elements count one by one; its single call was admitted
// already).
func (s *Server) checkPendingRoom(team string, n int) error {
	s.limits.mu.Lock()
	defer s.limits.mu.Unlock()
	return s.pendingRoomLocked(team, n)
}

func (s *Server) pendingRoomLocked(team string, n int) error {
	capN := s.cfg().Limits.MaxPendingPerTeam
	if have := s.limits.pending[team]; have+n > capN {
		s.metrics.limited.WithLabelValues("pending_cap").Inc()
		return errTooMany(30, "team %s has %d pending jobs and asks for %d more; limits.maxPendingPerTeam allows %d; wait for some to start or cancel some", team, have, n, capN)
	}
	return nil
}

// trackPendingLocked keeps limits.pending equal to the pending jobs in
// memory, and the submitted ones on their way there (submitted.go), as
// job old becomes j (either may be nil).
func (s *Server) trackPendingLocked(old, j *broker.Job) {
	was := old != nil && old.State == broker.StatePending
	is := j != nil && j.State == broker.StatePending && !j.State.Terminal()
	if was == is {
		return
	}
	team := ""
	if j != nil {
		team = j.Spec.Team
	} else {
		team = old.Spec.Team
	}
	l := &s.limits
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.pending == nil {
		l.pending = map[string]int{}
	}
	if is {
		l.pending[team]++
	} else if l.pending[team]--; l.pending[team] <= 0 {
		delete(l.pending, team)
	}
}

// recountPendingLocked rebuilds limits.pending from memory (after a load).
func (s *Server) recountPendingLocked() {
	counts := map[string]int{}
	for j := range s.view.Jobs() {
		if j.State == broker.StatePending {
			counts[j.Spec.Team]++
		}
	}
	s.limits.mu.Lock()
	s.limits.pending = counts
	s.limits.mu.Unlock()
}
