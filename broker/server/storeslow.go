package server

import "time"

// defaultSlowCommit is Server.slowCommit: a store write this long is
// logged, because the disk under bbolt (fsync) or the link to Redis is
// slow, and while a state commit waits every API call, agent report and
// cycle that needs the broker's lock waits with it.
const defaultSlowCommit = time.Second

// Kinds of spillway_store_commit_duration_seconds.
const (
	commitState  = "state"  // job and node changes (commitLocked), under s.mu
	commitSubmit = "submit" // a submit or an array submit, outside s.mu
)

// observeCommit records one store write that began at start: the
// histogram always, a warning when it took slowCommit or longer. Real
// time, not the injected clock: this is the store's own latency.
func (s *Server) observeCommit(kind string, start time.Time, jobs int) {
	d := time.Since(start)
	s.metrics.storeCommit.WithLabelValues(kind).Observe(d.Seconds())
	if d < s.slowCommit {
		return
	}
	what := "submits waited for it"
	if kind == commitState {
		what = "the API, agents' reports and scheduling waited for it"
	}
	s.log.Warn("slow store commit: "+what+"; check the store's disk (bbolt fsync) or the Redis link",
		"kind", kind, "took", d.Round(time.Millisecond), "jobs", jobs)
}
