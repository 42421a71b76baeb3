package server

import (
	"context"
	"sync"
	"time"

	"github.com/spillway-dev/spillway/broker"
)

// defaultSlowCommit is slowCommits.threshold: a store write this long is
// logged, because the disk under bbolt (fsync) or the link to Redis is
// slow, and while a state commit waits every API call, agent report and
// cycle that needs the broker's lock waits with it.
const defaultSlowCommit = time.Second

// defaultSlowCommitEvery is slowCommits.every: on a disk that stays
// slow, one warning per interval (on the broker's clock) stands for every
// slow write of the interval, with their count, instead of one line per
// write: a burst of submits that share one slow group commit would
// otherwise log a line each.
const defaultSlowCommitEvery = time.Minute

// Kinds of spillway_store_commit_duration_seconds.
const (
	commitState  = "state"  // job and node changes (commitLocked), under s.mu
	commitSubmit = "submit" // a submit or an array submit, outside s.mu
	commitOther  = "other"  // every other write: ledger, telemetry, enrolment, tokens, logs, fleet
)

// timedStore is the store as the broker and its fleet use it: every write
// (Update, Batch) is timed into spillway_store_commit_duration_seconds,
// under the kind its context names (withCommit), and a slow one is logged
// (observeCommit). Reads pass through untimed. Optional interfaces of the
// store (broker.Fenced, Ping, Backuper) are asked of Server.backend.
type timedStore struct {
	broker.Store
	s *Server
}

func (t timedStore) Update(ctx context.Context, fn func(broker.Tx) error) error {
	start := time.Now()
	err := t.Store.Update(ctx, fn)
	t.s.observeCommit(ctx, start)
	return err
}

func (t timedStore) Batch(ctx context.Context, fn func(broker.Tx) error) error {
	start := time.Now()
	err := t.Store.Batch(ctx, fn)
	t.s.observeCommit(ctx, start)
	return err
}

// commitTag is what a write's context says of it: its kind and the jobs
// it carries (0 when it carries none).
type commitTag struct {
	kind string
	jobs int
}

type commitTagKey struct{}

// withCommit names the kind of the store writes made with ctx, and the
// jobs each carries.
func withCommit(ctx context.Context, kind string, jobs int) context.Context {
	return context.WithValue(ctx, commitTagKey{}, commitTag{kind, jobs})
}

// slowCommits is the slow-commit warning: a write of threshold or longer
// is slow, and slow writes are logged at most once every interval.
type slowCommits struct {
	threshold, every time.Duration

	mu      sync.Mutex
	logged  time.Time // when the last warning was logged
	skipped int       // slow writes since then, not logged
}

// observeCommit records one store write that began at start: the
// histogram always, a warning when it took slowCommits.threshold or
// longer and no warning was logged in the last slowCommits.every; the
// warning's "unlogged" counts the slow writes since the one before it.
// Real time, not the injected clock, for the duration: it is the store's
// own latency.
func (s *Server) observeCommit(ctx context.Context, start time.Time) {
	d := time.Since(start)
	tag, ok := ctx.Value(commitTagKey{}).(commitTag)
	if !ok {
		tag.kind = commitOther
	}
	s.metrics.storeCommit.WithLabelValues(tag.kind).Observe(d.Seconds())
	l := &s.slowCommits
	if d < l.threshold {
		return
	}
	now := s.clock.Now()
	l.mu.Lock()
	if !l.logged.IsZero() && now.Sub(l.logged) < l.every {
		l.skipped++
		l.mu.Unlock()
		return
	}
	skipped := l.skipped
	l.logged, l.skipped = now, 0
	l.mu.Unlock()
	what := "the caller waited for it"
	switch tag.kind {
	case commitState:
		what = "the API, agents' reports and scheduling waited for it"
	case commitSubmit:
		what = "submits waited for it"
	}
	s.log.Warn("slow store commit: "+what+"; check the store's disk (bbolt fsync) or the Redis link",
		"kind", tag.kind, "took", d.Round(time.Millisecond), "jobs", tag.jobs, "unlogged", skipped)
}
