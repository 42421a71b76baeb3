package broker

import (
	"context"
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
// fsync or script run). A caller that finds the writer idle, with no
// commit ended within Linger, commits at once: latency stays one commit
// when idle while throughput grows with load (bbolt's own Batch holds
// every batch for MaxBatchDelay instead).
//
// The one wait is Linger. The callers a commit answers are mostly
// clients (a submit, an API call's audit record) whose next write comes
// a fraction of a millisecond after the answer. So after a commit that
// answered n impatient calls (any not marked Patient), the next one
// waits until n impatient calls have queued again, or until Linger after
// its end.
// Without the wait, 16 clients split into two groups that take turns:
// the callers that queued during a commit commit without those just
// answered, who then wait a whole commit behind them; half the calls a
// commit, twice the commits. Calls marked Patient (the broker's state
// changes: a cycle's starts, agents' reports, cancels, for which a
// millisecond more costs less than it does a submit) do not count as
// returned, so a commit of them alone right after a submit waits to share
// the next submit's commit; without that, one client submitting job
// after job finds the cycle's commit of the job before in the writer and
// waits a whole commit behind it.
type GroupCommit struct {
	// Max bounds the calls one commit carries.
	Max int
	// Linger is how long, after a commit with impatient calls ends, the
	// next commit waits for as many impatient calls to queue (0: none).
	// It is real time: it paces the writer and decides nothing.
	Linger time.Duration
	// Commit runs fns in one transaction, or as few as it must, and
	// returns each one's answer: nil once committed.
	Commit func(fns []func(Tx) error) []error

	commits, calls, busy atomic.Int64

	mu        sync.Mutex
	queue     []*groupCall
	running   bool
	lastDone  time.Time     // when the last commit with an impatient call ended
	answered  int           // the impatient calls that commit answered
	returned  int           // impatient calls queued since it ended
	lingering chan struct{} // while the writer waits: closed once returned reaches answered
}

// groupCall is one Batch caller waiting for its commit.
type groupCall struct {
	fn      func(Tx) error
	err     chan error
	patient bool
}

// Do queues fn for the next commit and returns its answer. A ctx marked
// by Patient makes the call patient.
func (g *GroupCommit) Do(ctx context.Context, fn func(Tx) error) error {
	c := &groupCall{fn: fn, err: make(chan error, 1), patient: IsPatient(ctx)}
	g.mu.Lock()
	g.queue = append(g.queue, c)
	if !c.patient {
		g.returned++
		if g.lingering != nil && g.returned >= g.answered {
			close(g.lingering)
			g.lingering = nil
		}
	}
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
		if wait := time.Until(g.lastDone.Add(g.Linger)); wait > 0 && g.returned < g.answered && n < g.Max {
			ch := make(chan struct{})
			g.lingering = ch
			g.mu.Unlock()
			linger(ch, wait)
			g.mu.Lock()
			g.lingering = nil
			n = min(len(g.queue), g.Max)
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
		end := time.Now()
		g.busy.Add(int64(end.Sub(start)))
		if m := impatient(calls); m > 0 {
			g.mu.Lock()
			g.lastDone, g.answered, g.returned = end, m, 0
			g.mu.Unlock()
		}
		g.commits.Add(1)
		g.calls.Add(int64(n))
		for i, c := range calls {
			c.err <- errs[i]
		}
	}
}

// linger waits until ch is closed (the answered callers are back) or d
// passed.
func linger(ch <-chan struct{}, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ch:
	case <-t.C:
	}
}

// impatient counts the calls not marked Patient.
func impatient(calls []*groupCall) int {
	n := 0
	for _, c := range calls {
		if !c.patient {
			n++
		}
	}
	return n
}

type patientKey struct{}

// Patient marks the store writes made with ctx as patient: a group
// commit of them alone may wait a moment to share the next submit's
// commit (GroupCommit.Linger).
func Patient(ctx context.Context) context.Context {
	return context.WithValue(ctx, patientKey{}, true)
}

// IsPatient reports whether ctx was marked by Patient.
func IsPatient(ctx context.Context) bool {
	v, _ := ctx.Value(patientKey{}).(bool)
	return v
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
