package broker

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// GroupCommitter is implemented by stores whose Batch is a group commit
// (bbolt, Redis): one writer commits the calls that wait, together, one
// transaction and one fsync or script run at a time. Calls per commit
// tell whether concurrent writers share commits; the writer's busy time
// against the clock tells whether it is the limit: busy all the time
// means writes wait on the disk (or on Redis), not on the broker's CPU.
type GroupCommitter interface {
	GroupCommits() GroupCommitStats
}

// GroupCommitStats is what a store's group-commit writer has done since
// the store was opened.
type GroupCommitStats struct {
	Commits uint64        // transactions committed for Batch calls
	Calls   uint64        // the Batch calls they carried
	Busy    time.Duration // time spent committing them
}

// GroupCommit is a store's Batch: callers that arrive while a commit is
// in flight wait for the next one and share it (one transaction, one
// fsync or script run). A lone caller commits at once, with no timer to
// wait out, so latency stays one commit when idle while throughput grows
// with load (bbolt's own Batch holds every batch for MaxBatchDelay
// instead).
type GroupCommit struct {
	// Max bounds the calls one commit carries.
	Max int
	// Commit runs fns in one transaction, or as few as it must, and
	// returns each one's answer: nil once committed.
	Commit func(fns []func(Tx) error) []error

	commits, calls, busy atomic.Int64

	mu      sync.Mutex
	queue   []*groupCall
	running bool
}

// groupCall is one Batch caller waiting for its commit.
type groupCall struct {
	fn  func(Tx) error
	err chan error
}

// Do queues fn for the next commit and returns its answer.
func (g *GroupCommit) Do(fn func(Tx) error) error {
	c := &groupCall{fn: fn, err: make(chan error, 1)}
	g.mu.Lock()
	g.queue = append(g.queue, c)
	if !g.running {
		g.running = true
		go g.drain()
	}
	g.mu.Unlock()
	return <-c.err
}

// drain commits the queue in groups until it is empty.
func (g *GroupCommit) drain() {
	for {
		g.mu.Lock()
		n := min(len(g.queue), g.Max)
		if n == 0 {
			g.running = false
			g.mu.Unlock()
			return
		}
		calls := g.queue[:n:n]
		g.queue = g.queue[n:]
		g.mu.Unlock()
		fns := make([]func(Tx) error, n)
		for i, c := range calls {
			fns[i] = c.fn
		}
		start := time.Now()
		errs := g.Commit(fns)
		g.busy.Add(int64(time.Since(start)))
		g.commits.Add(1)
		g.calls.Add(int64(n))
		for i, c := range calls {
			c.err <- errs[i]
		}
	}
}

// GroupCommits reports the commits so far (GroupCommitter).
func (g *GroupCommit) GroupCommits() GroupCommitStats {
	return GroupCommitStats{Commits: uint64(g.commits.Load()), Calls: uint64(g.calls.Load()), Busy: time.Duration(g.busy.Load())}
}

// CallMember runs one member of a group commit, turning a panic into its
// error so that the other members still get their answer.
func CallMember(fn func(Tx) error, t Tx) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("batch member panicked: %v", r)
		}
	}()
	return fn(t)
}
