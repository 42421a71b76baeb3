package server

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/broker/api"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/bolt"
	"github.com/spillway-dev/spillway/broker/clock"
	"github.com/spillway-dev/spillway/onprem/agentapi"
)

// fakeElector is an election whose outcome the test sets.
type fakeElector struct {
	mu sync.Mutex
	st broker.LeaderStatus
	ch chan struct{}
}

func newFakeElector() *fakeElector { return &fakeElector{ch: make(chan struct{}, 1)} }

func (f *fakeElector) Run(ctx context.Context) { <-ctx.Done() }

func (f *fakeElector) Status() broker.LeaderStatus {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.st
}

func (f *fakeElector) Changes() <-chan struct{} { return f.ch }

func (f *fakeElector) set(st broker.LeaderStatus) {
	f.mu.Lock()
	f.st = st
	f.mu.Unlock()
	select {
	case f.ch <- struct{}{}:
	default:
	}
}

const otherLeader = "http://10.0.0.2:8080"

// newHAHarness is the usual harness, with a broker that stands by under
// an elector the test drives.
func newHAHarness(t *testing.T) (*harness, *fakeElector) {
	t.Helper()
	cfg := testConfig(t)
	h := &harness{t: t, clock: clock.NewFake(t0), path: filepath.Join(cfg.DataDir, "spillway.db")}
	st, err := bolt.Open(h.path)
	if err != nil {
		t.Fatal(err)
	}
	el := newFakeElector()
	srv, err := New(context.Background(), cfg, st, Options{Clock: h.clock, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Elector: el})
	if err != nil {
		t.Fatal(err)
	}
	h.srv, h.store = srv, st
	h.http = httptest.NewServer(srv.Handler())
	t.Cleanup(func() {
		h.http.Close()
		h.store.Close()
	})
	return h, el
}

// win makes the broker lead with token.
func (h *harness) win(el *fakeElector, token uint64) {
	h.t.Helper()
	el.set(broker.LeaderStatus{Leader: true, Token: token, LeaderID: h.srv.cfg().HA.BrokerID, LeaderURL: h.srv.cfg().HA.PeerURL})
	if err := h.srv.takeOver(context.Background(), token); err != nil {
		h.t.Fatal(err)
	}
}

// lose makes another broker lead.
func (h *harness) lose(el *fakeElector) {
	el.set(broker.LeaderStatus{LeaderID: "other", LeaderURL: otherLeader})
	done := make(chan struct{})
	close(done)
	h.srv.endTerm(&term{token: h.srv.ha.term.Load(), cancel: func() {}, done: done}, "test")
}

// raw sends a request without following redirects.
func (h *harness) raw(method, path, token, body string) *http.Response {
	h.t.Helper()
	req, _ := http.NewRequest(method, h.http.URL+path, strings.NewReader(body))
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	c := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := c.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	resp.Body.Close()
	return resp
}

func TestStandbyServesReadsAndRedirectsWrites(t *testing.T) {
	h, el := newHAHarness(t)
	h.win(el, 1)
	j := h.submit(tokAlice, oneGPU)
	h.lose(el)

	if code := h.do("GET", "/v1/jobs/"+j.ID, tokAlice, nil, nil); code != http.StatusOK {
		t.Fatalf("standby GET job = %d", code)
	}
	var list api.JobList
	if h.do("GET", "/v1/jobs", tokAlice, nil, &list); len(list.Jobs) != 1 {
		t.Fatalf("standby lists %d jobs", len(list.Jobs))
	}
	for _, c := range []struct{ method, path string }{
		{"POST", "/v1/jobs"}, {"POST", "/v1/jobs/" + j.ID + "/cancel"}, {"GET", "/v1/nodes"},
		{"POST", agentapi.PathSync}, {"POST", agentapi.PathRegister},
	} {
		resp := h.raw(c.method, c.path+"?x=1", tokAlice, oneGPU)
		if resp.StatusCode != http.StatusTemporaryRedirect || resp.Header.Get("Location") != otherLeader+c.path+"?x=1" {
			t.Errorf("standby %s %s = %d to %q, want 307 to the leader", c.method, c.path, resp.StatusCode, resp.Header.Get("Location"))
		}
	}
	var hz api.Health
	if code := h.do("GET", "/healthz", "", nil, &hz); code != http.StatusOK || hz.Leader || hz.LeaderURL != otherLeader {
		t.Fatalf("standby health = %d %+v", code, hz)
	}
	// No leader known: 503 with Retry-After, never a redirect to nowhere.
	el.set(broker.LeaderStatus{})
	if resp := h.raw("POST", "/v1/jobs", tokAlice, oneGPU); resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("no leader: %d", resp.StatusCode)
	}
}

// TestFailoverKeepsRunningJobs: a broker that takes over reloads every job
// from the store and gives agents ha.agentGrace before any node is lost;
// the agent that reconnects within it keeps its job.
func TestFailoverKeepsRunningJobs(t *testing.T) {
	h, el := newHAHarness(t)
	h.win(el, 1)
	a := h.agent("n1", 8)
	j := h.submit(tokAlice, oneGPU)
	h.cycle()
	a.sync()
	h.cycle()
	a.sync()
	if got := h.job(j.ID); got.State != broker.StateRunning {
		t.Fatalf("before failover: %s", got.State)
	}
	h.lose(el)
	if n := h.srv.view.JobCount(); n != 0 {
		t.Fatalf("standby kept %d jobs in memory", n)
	}
	// Takeover (as the new leader would, on the same store), then silence
	// from the agent well past the lost timeout but within the grace.
	h.win(el, 2)
	h.advance(30 * time.Second)
	if got := h.job(j.ID); got.State != broker.StateRunning {
		t.Fatalf("job %s after a takeover and 30s of agent silence (grace 40s)", got.State)
	}
	a.sync()
	h.advance(30*time.Second, a)
	got := h.job(j.ID)
	if got.State != broker.StateRunning || got.Attempt != 1 {
		t.Fatalf("job after the agent came back: %s attempt %d", got.State, got.Attempt)
	}
	if len(a.last.Start) != 0 || len(a.last.Stop) != 0 {
		t.Fatalf("the new leader sent orders for a running job: %+v", a.last)
	}
	// Without the agent the node is lost once the grace is over.
	h.lose(el)
	h.win(el, 3)
	h.advance(45 * time.Second)
	got = h.job(j.ID)
	if got.State == broker.StateRunning || got.History[len(got.History)-1].Reason != "node_lost" {
		t.Fatalf("job on a node silent past the grace: %s (%s)", got.State, got.History[len(got.History)-1].Reason)
	}
}

// TestStepDownDropsState: losing the lease empties every map of the
// leader's in-memory view (a field added later and forgotten in
// resetLocked fails here), and an agent's waiting sync hears "not the
// leader" instead of orders computed from an empty view.
func TestStepDownDropsState(t *testing.T) {
	h, el := newHAHarness(t)
	h.win(el, 1)
	a := h.agent("n1", 8)
	h.submit(tokAlice, oneGPU)
	h.cycle()
	a.sync()
	h.cycle()
	a.sync() // the job runs
	// A long poll waiting for news when the lease is lost.
	req := agentapi.SyncRequest{Node: "n1", Generation: a.gen, Wait: 5 * time.Second}
	for _, r := range a.jobs {
		req.Jobs = append(req.Jobs, *r)
	}
	raw, _ := json.Marshal(req)
	type result struct {
		code int
		body string
	}
	got := make(chan result, 1)
	go func() {
		r, _ := http.NewRequest("POST", h.http.URL+agentapi.PathSync, strings.NewReader(string(raw)))
		r.Header.Set("Authorization", "Bearer "+tokAgent)
		c := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
		resp, err := c.Do(r)
		if err != nil {
			got <- result{0, err.Error()}
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		got <- result{resp.StatusCode, string(b)}
	}()
	// Give the sync time to park (it has nothing new to hear for 5s),
	// then lose the lease.
	select {
	case r := <-got:
		t.Fatalf("sync answered before the step-down: %d %s", r.code, r.body)
	case <-time.After(300 * time.Millisecond):
	}
	h.lose(el)
	select {
	case r := <-got:
		if r.code != http.StatusServiceUnavailable || !strings.Contains(r.body, "not_leader") {
			t.Fatalf("parked sync after step-down = %d %s, want 503 not_leader", r.code, r.body)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("parked sync not woken by the step-down")
	}
	v := reflect.ValueOf(h.srv).Elem()
	h.srv.lock()
	defer h.srv.mu.Unlock()
	for i := 0; i < v.NumField(); i++ {
		if f := v.Field(i); nonEmptyMaps(f) {
			t.Errorf("field %s still holds state after step-down", v.Type().Field(i).Name)
		}
	}
	// The in-memory view (broker/state) is behind a pointer.
	if nonEmptyMaps(reflect.ValueOf(h.srv.view).Elem()) {
		t.Error("the in-memory view still holds state after step-down")
	}
	// The fleet's memory too (fleet.ResetLocked), but for what comes
	// from the config and the workers still running.
	fv := reflect.ValueOf(h.srv.fleet).Elem()
	for i := 0; i < fv.NumField(); i++ {
		name := fv.Type().Field(i).Name
		if name == "providers" || name == "kinds" || name == "working" {
			continue
		}
		if nonEmptyMaps(fv.Field(i)) {
			t.Errorf("fleet field %s still holds state after step-down", name)
		}
	}
}

// nonEmptyMaps reports whether v is, or is a struct holding, a non-empty
// map.
func nonEmptyMaps(v reflect.Value) bool {
	switch v.Kind() {
	case reflect.Map:
		return v.Len() > 0
	case reflect.Struct:
		for i := 0; i < v.NumField(); i++ {
			if nonEmptyMaps(v.Field(i)) {
				return true
			}
		}
	}
	return false
}

// TestStoreOutageStopsDecisions: while the store is unreachable the leader
// starts nothing and loses no node, refuses writes, reports unhealthy;
// when the store is back agents get a new grace period and work resumes.
func TestStoreOutageStopsDecisions(t *testing.T) {
	h, el := newHAHarness(t)
	h.win(el, 1)
	a := h.agent("n1", 8)
	running := h.submit(tokAlice, oneGPU)
	h.cycle()
	a.sync()
	h.cycle()
	a.sync()
	waiting := h.submit(tokAlice, oneGPU)

	down := errors.New("dial tcp 127.0.0.1:6379: connection refused")
	st := el.Status()
	st.Err = down
	el.set(st)
	h.srv.noteStore(down)
	h.advance(20 * time.Second) // no agent heartbeats meanwhile
	if got := h.job(waiting.ID); got.State != broker.StatePending {
		t.Fatalf("a job started while the store was down: %s", got.State)
	}
	if got := h.job(running.ID); got.State != broker.StateRunning {
		t.Fatalf("running job %s while the store was down", got.State)
	}
	var hz api.Health
	if code := h.do("GET", "/healthz", "", nil, &hz); code != http.StatusServiceUnavailable || hz.Status != "unhealthy" || !strings.Contains(hz.Error, "connection refused") {
		t.Fatalf("health during the outage = %d %+v", code, hz)
	}
	if resp := h.raw("POST", "/v1/jobs", tokAlice, oneGPU); resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("submit during the outage = %d", resp.StatusCode)
	}

	st.Err = nil
	el.set(st)
	h.srv.noteStore(nil)
	h.advance(10 * time.Second) // silent agent, but within the new grace
	if got := h.job(running.ID); got.State != broker.StateRunning {
		t.Fatalf("running job %s right after the store came back", got.State)
	}
	a.sync()
	h.cycle()
	a.sync()
	if got := h.job(waiting.ID); got.State != broker.StateRunning {
		t.Fatalf("waiting job after the store came back: %s", got.State)
	}
	if code := h.do("GET", "/healthz", "", nil, &hz); code != http.StatusOK || !hz.Leader {
		t.Fatalf("health after the outage = %d %+v", code, hz)
	}
}

// TestLeadRunsTasksPerTerm: lead takes over when the elector reports a
// won lease and stands by when it is lost, and its tasks stop with the
// term.
func TestLeadRunsTasksPerTerm(t *testing.T) {
	h, el := newHAHarness(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { h.srv.lead(ctx); close(done) }()
	waitTerm := func(want uint64) {
		t.Helper()
		deadline := time.Now().Add(3 * time.Second)
		for h.srv.ha.term.Load() != want {
			if time.Now().After(deadline) {
				t.Fatalf("term = %d, want %d", h.srv.ha.term.Load(), want)
			}
			time.Sleep(time.Millisecond)
		}
	}
	el.set(broker.LeaderStatus{Leader: true, Token: 7, LeaderURL: h.srv.cfg().HA.PeerURL})
	waitTerm(7)
	el.set(broker.LeaderStatus{LeaderURL: otherLeader})
	waitTerm(0)
	el.set(broker.LeaderStatus{Leader: true, Token: 9, LeaderURL: h.srv.cfg().HA.PeerURL})
	waitTerm(9)
	cancel()
	select {
	case <-done:
	case <-time.After(3 * time.Second):
		t.Fatal("lead did not return after its context ended")
	}
	if h.srv.ha.term.Load() != 0 {
		t.Fatal("still leading after the broker stopped")
	}
}
