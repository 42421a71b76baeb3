package server

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/broker"
)

// A submit answers once its job is durable, without waiting for the
// broker's lock (held here as a cycle or an agent report holds it across
// its commit); the job is in memory for the next holder of the lock, and
// the inventory's limits apply without the lock.
func TestSubmitAnswersWhileTheLockIsHeld(t *testing.T) {
	h := newHarness(t)
	h.agent("n1", 8)
	type answer struct {
		code int
		job  broker.Job
		body string
	}
	post := func(spec string) answer {
		done := make(chan answer, 1)
		go func() {
			req, _ := http.NewRequest("POST", h.http.URL+"/v1/jobs", strings.NewReader(spec))
			req.Header.Set("Authorization", "Bearer "+tokAlice)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				done <- answer{code: -1, body: err.Error()}
				return
			}
			defer resp.Body.Close()
			var sb strings.Builder
			_, _ = bufCopy(&sb, resp)
			a := answer{code: resp.StatusCode, body: sb.String()}
			if a.code == http.StatusCreated {
				_ = json.Unmarshal([]byte(sb.String()), &a.job)
			}
			done <- a
		}()
		select {
		case a := <-done:
			return a
		case <-time.After(30 * time.Second): // a guard against a hang, not an ordering
			t.Fatal("the submit waited for the broker's lock")
			return answer{}
		}
	}

	h.srv.lock()
	held := true
	defer func() {
		if held {
			h.srv.mu.Unlock()
		}
	}()
	ok := post(`{"command":["true"],"resources":{"gpus":8}}`)
	if ok.code != http.StatusCreated {
		t.Fatalf("8 GPUs on an 8-GPU node: %d %s", ok.code, ok.body)
	}
	tooMany := post(`{"command":["true"],"resources":{"gpus":9}}`)
	if tooMany.code != http.StatusBadRequest || !strings.Contains(tooMany.body, "resources.gpus") {
		t.Fatalf("9 GPUs on an 8-GPU node: %d %s, want 400 naming resources.gpus", tooMany.code, tooMany.body)
	}
	if h.srv.view.Job(ok.job.ID) != nil {
		t.Fatal("the job reached memory while another held the lock")
	}
	if n := h.srv.pendingOf("nlp"); n != 1 {
		t.Fatalf("team nlp has %d pending counted before the job reached memory, want 1 (the cap holds at once)", n)
	}
	h.srv.mu.Unlock()
	held = false

	h.srv.lock()
	j := h.srv.view.Job(ok.job.ID)
	h.srv.mu.Unlock()
	if j == nil || j.State != broker.StatePending {
		t.Fatalf("after the lock changed hands the job is %v, want pending in memory", j)
	}
	if n := h.srv.pendingOf("nlp"); n != 1 {
		t.Fatalf("team nlp has %d pending counted, want 1", n)
	}
	h.cycle()
	if got := h.job(ok.job.ID).State; got != broker.StateStarting {
		t.Fatalf("after a cycle the job is %s, want starting", got)
	}
}

// A job queued for memory that memory already has (load read it from the
// store first) is not applied again: not counted twice, not replaced.
func TestQueuedSubmitAlreadyLoadedIsNotAppliedTwice(t *testing.T) {
	h := newHarness(t)
	j := h.submit(tokAlice, `{"command":["true"],"resources":{"gpus":1}}`)
	h.srv.lock()
	first := h.srv.view.Job(j.ID)
	h.srv.mu.Unlock()
	if first == nil {
		t.Fatal("the submitted job is not in memory")
	}
	h.srv.queueSubmitted(first.Clone())
	h.srv.lock()
	again := h.srv.view.Job(j.ID)
	h.srv.mu.Unlock()
	if again != first {
		t.Fatal("the queued copy replaced the job in memory")
	}
	if n := h.srv.pendingOf("nlp"); n != 1 {
		t.Fatalf("team nlp has %d pending counted, want 1", n)
	}

	// load reads the store and drops what was queued before it read.
	h.srv.queueSubmitted(first.Clone())
	h.srv.lock()
	h.srv.resetLocked()
	if err := h.srv.load(ctxT()); err != nil {
		h.srv.mu.Unlock()
		t.Fatal(err)
	}
	h.srv.mu.Unlock()
	h.srv.lock()
	queued := len(h.srv.submitted.jobs)
	h.srv.mu.Unlock()
	if queued != 0 {
		t.Fatalf("%d jobs still queued after load", queued)
	}
	if n := h.srv.pendingOf("nlp"); n != 1 {
		t.Fatalf("after load team nlp has %d pending counted, want 1", n)
	}
}

// pendingOf is the pending count the team's cap is checked against.
func (s *Server) pendingOf(team string) int {
	s.limits.mu.Lock()
	defer s.limits.mu.Unlock()
	return s.limits.pending[team]
}
