package server

import (
	"context"
	"net/http"
	"path/filepath"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/clock"
	"github.com/spillway-dev/spillway/onprem/agentapi"
)

// countingStore counts write transactions (Update and Batch calls).
type countingStore struct {
	broker.Store
	writes atomic.Int64
}

func (c *countingStore) Update(ctx context.Context, fn func(broker.Tx) error) error {
	c.writes.Add(1)
	return c.Store.Update(ctx, fn)
}

func (c *countingStore) Batch(ctx context.Context, fn func(broker.Tx) error) error {
	c.writes.Add(1)
	return c.Store.Batch(ctx, fn)
}

// Reports of several agents that wait for the broker's lock are recorded
// together by the first to get it: one commit, every report answered.
func TestReportsWaitingForTheLockShareOneCommit(t *testing.T) {
	counting := &countingStore{}
	cfg := testConfig(t)
	h := &harness{t: t, clock: clock.NewFake(t0), path: filepath.Join(cfg.DataDir, "spillway.db"),
		wrap: func(st broker.Store) broker.Store { counting.Store = st; return counting }}
	h.open(cfg)
	t.Cleanup(func() {
		h.cancel()
		h.http.Close()
		h.store.Close()
	})
	a1, a2 := h.agent("n1", 1), h.agent("n2", 1)
	j1, j2 := h.submit(tokAlice, oneGPU), h.submit(tokBob, oneGPU)
	h.cycle()
	a1.sync() // starts
	a2.sync()
	a1.sync() // running
	a2.sync()
	a1.exit(j1.ID, 0, "")
	a2.exit(j2.ID, 0, "")

	h.srv.lock()
	counting.writes.Store(0)
	codes := make(chan int, 2)
	for _, a := range []*fakeAgent{a1, a2} {
		req := a.request()
		go func() {
			var resp agentapi.SyncResponse
			code := h.do("POST", agentapi.PathSync, tokAgent, req, &resp)
			if code == http.StatusOK && len(resp.Ack) != 1 {
				code = -len(resp.Ack)
			}
			codes <- code
		}()
	}
	for queued := 0; queued < 2; runtime.Gosched() { // both wait for the lock
		h.srv.syncs.mu.Lock()
		queued = len(h.srv.syncs.calls)
		h.srv.syncs.mu.Unlock()
	}
	h.srv.mu.Unlock()
	for range 2 {
		select {
		case code := <-codes:
			if code != http.StatusOK {
				t.Fatalf("a report answered %d (negative: that many acks, want 1)", code)
			}
		case <-time.After(30 * time.Second): // a guard against a hang, not an ordering
			t.Fatal("a report was never answered")
		}
	}
	if n := counting.writes.Load(); n != 1 {
		t.Fatalf("the two reports took %d commits, want 1", n)
	}
	for _, id := range []string{j1.ID, j2.ID} {
		if got := h.job(id).State; got != broker.StateSucceeded {
			t.Fatalf("job %s is %s, want succeeded", id, got)
		}
	}
}

// A report recorded in another handler's batch, then a cycle that gives
// its node a start before its own handler gets the lock: the handler
// answers with the start at once. It used to park its long poll, since
// the cycle's wake had found nobody waiting, and the agent sat idle with
// orders for the whole poll (seen in make bench-e2e's trace as 2 s
// stalls).
func TestOrdersGivenAfterABatchedReportAreNotHeldBack(t *testing.T) {
	h := newHarness(t)
	a := h.agent("n1", 8)
	j := h.submit(tokAlice, oneGPU)

	h.srv.lock()
	req := a.request()
	req.Wait = 10 * time.Minute // the broker holds a poll at most a minute
	got := make(chan agentapi.SyncResponse, 1)
	go func() {
		var resp agentapi.SyncResponse
		h.do("POST", agentapi.PathSync, tokAgent, req, &resp)
		got <- resp
	}()
	for queued := 0; queued < 1; runtime.Gosched() { // the report waits for the lock
		h.srv.syncs.mu.Lock()
		queued = len(h.srv.syncs.calls)
		h.srv.syncs.mu.Unlock()
	}
	// Another handler records it: nothing to start yet.
	h.srv.recordSyncsLocked(context.Background(), h.srv.syncs.take())
	// Then a cycle places the job on n1, while that handler still waits
	// for the lock.
	now := h.clock.Now()
	sc, err := h.srv.schedulingLocked(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	plan := sc.core.Schedule(h.srv.snapshotLocked(now))
	if err := h.srv.applyLocked(context.Background(), now, plan); err != nil {
		t.Fatal(err)
	}
	h.srv.mu.Unlock()
	select {
	case resp := <-got:
		if len(resp.Start) != 1 || resp.Start[0].Job != j.ID {
			t.Fatalf("answer starts %+v, want %s", resp.Start, j.ID)
		}
	case <-time.After(30 * time.Second): // a guard against the minute-long poll, not an ordering
		t.Fatal("the start waited out the long poll")
	}
}
