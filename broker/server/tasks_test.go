package server

import (
	"context"
	"sync/atomic"
	"testing"
)

// TestTermWaitsForItsWork: a term ends only once the work it started has
// returned, and workersIdle says when none runs.
func TestTermWaitsForItsWork(t *testing.T) {
	s := &Server{}
	ctx, cancel := context.WithCancel(context.Background())
	started, release, done := make(chan struct{}), make(chan struct{}), make(chan struct{})
	var ended atomic.Bool
	go func() {
		s.runTerm(ctx, []func(context.Context){func(ctx context.Context) {
			s.goWork(func(wctx context.Context) {
				close(started)
				<-wctx.Done() // the work sees the term's context end
				<-release
				ended.Store(true)
			})
			<-ctx.Done()
		}})
		close(done)
	}()
	<-started
	cancel()
	close(release)
	<-done
	if !ended.Load() {
		t.Fatal("the term ended before the work it started")
	}
	<-s.workersIdle()
}
