package redis

import (
	"context"
	"fmt"
	"time"

	"github.com/spillway-dev/spillway/broker"
)

// call is one Batch caller waiting for its commit.
type call struct {
	fn  func(broker.Tx) error
	err chan error
}

// Batch is Update with group commit: callers that arrive while a commit is
// in flight share the next one (one script run for all of them), so
// throughput grows with concurrency without a fixed delay for a lone
// caller. Each member runs against a savepoint: a member that fails leaves
// nothing of its own in the commit and gets its error; the others commit.
// Every member may run more than once (after a conflict).
func (s *Store) Batch(ctx context.Context, fn func(broker.Tx) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.inflight.Add(1)
	defer s.inflight.Done()
	c := &call{fn: fn, err: make(chan error, 1)}
	s.bmu.Lock()
	s.queue = append(s.queue, c)
	if !s.draining {
		s.draining = true
		go s.drain()
	}
	s.bmu.Unlock()
	return <-c.err
}

// GroupCommits reports the group commits of Batch (broker.GroupCommitter).
func (s *Store) GroupCommits() broker.GroupCommitStats { return s.groupStats.Stats() }

// drain commits the queue in groups until it is empty.
func (s *Store) drain() {
	for {
		s.bmu.Lock()
		n := min(len(s.queue), s.maxBatch)
		if n == 0 {
			s.draining = false
			s.bmu.Unlock()
			return
		}
		calls := s.queue[:n:n]
		s.queue = s.queue[n:]
		s.bmu.Unlock()
		start := time.Now()
		s.commitGroup(calls)
		s.groupStats.Add(len(calls), time.Since(start))
	}
}

func (s *Store) commitGroup(calls []*call) {
	errs := make([]error, len(calls))
	// The group is not tied to any one caller's context: like bbolt's
	// Batch, a member that stops waiting may still be committed.
	err := s.update(context.Background(), func(t *tx) error {
		for i, c := range calls {
			sp := t.savepoint()
			errs[i] = runMember(c.fn, t)
			if errs[i] != nil {
				t.rollbackTo(sp)
			}
		}
		return nil
	})
	for i, c := range calls {
		if err != nil {
			c.err <- err
		} else {
			c.err <- errs[i]
		}
	}
}

// runMember runs one member, turning a panic into its error so that the
// other members still get their answer.
func runMember(fn func(broker.Tx) error, t *tx) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("batch member panicked: %v", r)
		}
	}()
	return fn(t)
}
