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
}

// goWork runs fn in a goroutine owned by the running term. fn gets the
// term's context and must return soon after it ends.
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
