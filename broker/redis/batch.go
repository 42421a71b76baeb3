package redis

import (
	"context"

	"github.com/spillway-dev/spillway/broker"
)

// Batch is Update with group commit (broker.GroupCommit): callers that
// arrive while a commit is in flight share the next one (one script run
// for all of them). Each member runs against a savepoint: a member that
// fails leaves nothing of its own in the commit and gets its error; the
// others commit. Every member may run more than once (after a conflict).
func (s *Store) Batch(ctx context.Context, fn func(broker.Tx) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.inflight.Add(1)
	defer s.inflight.Done()
	return s.group.Do(ctx, fn)
}

// GroupCommits reports the group commits of Batch (broker.GroupCommitter).
func (s *Store) GroupCommits() broker.GroupCommitStats { return s.group.GroupCommits() }

// commitGroup is the store's broker.GroupCommit.Commit.
func (s *Store) commitGroup(fns []func(broker.Tx) error) []error {
	errs := make([]error, len(fns))
	// The group is not tied to any one caller's context: like bbolt's
	// Batch, a member that stops waiting may still be committed.
	err := s.update(context.Background(), func(t *tx) error {
		for i, fn := range fns {
			sp := t.savepoint()
			errs[i] = broker.CallMember(fn, t)
			if errs[i] != nil {
				t.rollbackTo(sp)
			}
		}
		return nil
	})
	if err != nil {
		for i := range errs {
			errs[i] = err
		}
	}
	return errs
}
