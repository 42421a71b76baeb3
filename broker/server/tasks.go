package server

import (
	"context"
	"sync"
)

// workGroup owns every goroutine a leader term starts besides its loops:
// burst machine workers, alert posts, store writes that must not hold
// the caller. Each runs on the term's context through goWork; a term
// ends (endTerm, and Serve on its way out) only once the loops and every
// one of these have returned, so nothing of a term outlives it or
// overlaps the next.
type workGroup struct {
	mu sync.Mutex
	// ctx is the running term's context; nil outside a term (tests that
	// drive cycles by hand), when work runs on the background context.
	ctx context.Context
	// n counts the running goroutines; idle is closed when n drops to 0.
	n    int
	idle chan struct{}
	// parked counts those of them waiting on something outside the broker
	// (a timer, a provider's retry backoff, an agent to register);
	// settled are closed when every running goroutine is parked.
	parked  int
	settled []chan struct{}
}

// goWork runs fn in a goroutine owned by the running term. fn gets the
// term's context and must return soon after it ends. Every goroutine the
// broker starts for a term's work goes through here (TestNoStrayGoroutines).
func (s *Server) goWork(fn func(ctx context.Context)) {
	w := &s.work
	w.mu.Lock()
	defer w.mu.Unlock()
	ctx := w.ctx
	if ctx == nil {
		ctx = context.Background()
	}
	w.n++
	go func() {
		defer w.done()
		fn(ctx)
	}()
}

func (w *workGroup) done() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.n--
	if w.n == 0 && w.idle != nil {
		close(w.idle)
		w.idle = nil
	}
	w.notifySettledLocked()
}

func (w *workGroup) notifySettledLocked() {
	if w.parked < w.n {
		return
	}
	for _, ch := range w.settled {
		close(ch)
	}
	w.settled = nil
}

// park marks the calling work goroutine as waiting on something outside
// the broker until unpark is called: workersSettled counts it as done
// meanwhile.
func (s *Server) park() (unpark func()) {
	w := &s.work
	w.mu.Lock()
	w.parked++
	w.notifySettledLocked()
	w.mu.Unlock()
	return func() {
		w.mu.Lock()
		w.parked--
		w.mu.Unlock()
	}
}

// workersSettled returns a channel that is closed once every goroutine of
// the group has returned or is parked (waiting on a timer, a machine or an
// agent): a test that drives the clock and the agents by hand waits on it
// after each step instead of sleeping for the workers to catch up.
func (s *Server) workersSettled() <-chan struct{} {
	w := &s.work
	w.mu.Lock()
	defer w.mu.Unlock()
	ch := make(chan struct{})
	w.settled = append(w.settled, ch)
	w.notifySettledLocked()
	return ch
}

// workersIdle returns a channel that is closed once no goroutine of the
// group runs: a test waits on it instead of sleeping for workers to end.
func (s *Server) workersIdle() <-chan struct{} {
	w := &s.work
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.n == 0 {
		ch := make(chan struct{})
		close(ch)
		return ch
	}
	if w.idle == nil {
		w.idle = make(chan struct{})
	}
	return w.idle
}

// runTerm runs the leader tasks on ctx until they all return, with ctx
// as the context of the work they start; then waits for that work.
func (s *Server) runTerm(ctx context.Context, tasks []func(context.Context)) {
	w := &s.work
	w.mu.Lock()
	w.ctx = ctx
	w.mu.Unlock()
	var loops sync.WaitGroup
	for _, t := range tasks {
		loops.Go(func() { t(ctx) })
	}
	loops.Wait()
	w.mu.Lock()
	w.ctx = nil
	w.mu.Unlock()
	<-s.workersIdle()
}
