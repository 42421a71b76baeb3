package bolt

import (
	"errors"
	"fmt"
	"sync"
	"time"

	bbolt "go.etcd.io/bbolt"

	"github.com/spillway-dev/spillway/broker"
)

// groupCommit is the store's Batch: callers that arrive while a commit is
// in flight wait for the next one and share it (one transaction, one
// fsync). A lone caller commits at once, with no timer to wait out, so
// latency stays one commit when idle while throughput grows with load:
// bbolt's own Batch holds every batch for MaxBatchDelay instead.
type groupCommit struct {
	db  *bbolt.DB
	max int

	stats broker.GroupCommitCounter

	mu      sync.Mutex
	queue   []*member
	running bool
}

// member is one Batch caller.
type member struct {
	fn  func(broker.Tx) error
	err chan error
}

// errMember marks a transaction rolled back because one member failed.
var errMember = errors.New("batch member failed")

func (g *groupCommit) do(fn func(broker.Tx) error) error {
	m := &member{fn: fn, err: make(chan error, 1)}
	g.mu.Lock()
	g.queue = append(g.queue, m)
	if !g.running {
		g.running = true
		go g.drain()
	}
	g.mu.Unlock()
	return <-m.err
}

// drain commits the queue in groups until it is empty.
func (g *groupCommit) drain() {
	for {
		g.mu.Lock()
		n := min(len(g.queue), g.max)
		if n == 0 {
			g.running = false
			g.mu.Unlock()
			return
		}
		ms := g.queue[:n:n]
		g.queue = g.queue[n:]
		g.mu.Unlock()
		start := time.Now()
		g.commit(ms)
		g.stats.Add(len(ms), time.Since(start))
	}
}

// commit runs every member in one transaction. When one fails the
// transaction rolls back; that member runs alone for its own answer and
// the others commit together again.
func (g *groupCommit) commit(ms []*member) {
	for len(ms) > 0 {
		failed := -1
		err := g.db.Update(func(btx *bbolt.Tx) error {
			for i, m := range ms {
				if err := safeCall(m.fn, &tx{btx}); err != nil {
					failed = i
					return errMember
				}
			}
			return nil
		})
		if failed < 0 {
			for _, m := range ms {
				m.err <- err
			}
			return
		}
		solo := ms[failed]
		ms = append(ms[:failed:failed], ms[failed+1:]...)
		solo.err <- g.db.Update(func(btx *bbolt.Tx) error { return safeCall(solo.fn, &tx{btx}) })
	}
}

// safeCall turns a member's panic into its error, so the others still get
// their answer.
func safeCall(fn func(broker.Tx) error, t broker.Tx) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("batch member panicked: %v", r)
		}
	}()
	return fn(t)
}
