package server

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/spillway-dev/spillway/broker/fleet"
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

// TestBurstWorkersOwned: a burst machine's worker is work of the term:
// the term's end waits for it, and workersIdle closes only once it
// returned.
func TestBurstWorkersOwned(t *testing.T) {
	s := &Server{}
	s.fleet = fleet.New(fleet.Options{Broker: fleetState{s}})
	ctx, cancel := context.WithCancel(context.Background())
	started, done := make(chan struct{}), make(chan struct{})
	var ended atomic.Bool
	go func() {
		s.runTerm(ctx, []func(context.Context){func(ctx context.Context) {
			s.lock()
			s.fleet.StartWorkerLocked(ctx, "m1", func(wctx context.Context, id string) {
				close(started)
				<-wctx.Done()
				ended.Store(true)
			})
			s.mu.Unlock()
			<-ctx.Done()
		}})
		close(done)
	}()
	<-started
	cancel()
	<-done
	if !ended.Load() {
		t.Fatal("the term ended before its burst worker")
	}
	s.lock()
	defer s.mu.Unlock()
	if s.fleet.WorkingLocked("m1") {
		t.Fatal("the worker's id is still marked working")
	}
}

// TestWorkersSettled: workersSettled closes once every running goroutine
// is parked on an outside wait, and waits for one that still works.
func TestWorkersSettled(t *testing.T) {
	s := &Server{}
	parked, release, working := make(chan struct{}), make(chan struct{}), make(chan struct{})
	s.goWork(func(ctx context.Context) {
		unpark := s.park()
		close(parked)
		<-release
		unpark()
	})
	<-parked
	<-s.workersSettled() // the only goroutine waits outside: settled
	s.goWork(func(ctx context.Context) { <-working })
	settled := s.workersSettled()
	select {
	case <-settled:
		t.Fatal("settled while a goroutine still works")
	default:
	}
	close(working)
	<-settled
	close(release)
	<-s.workersIdle()
}
