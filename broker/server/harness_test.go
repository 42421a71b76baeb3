package server

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/bolt"
	"github.com/spillway-dev/spillway/broker/clock"
	"github.com/spillway-dev/spillway/broker/config"
	"github.com/spillway-dev/spillway/onprem/agentapi"
	"github.com/spillway-dev/spillway/onprem/gpu"
)

// Tokens of the test config.
const (
	tokAlice = "alice-token-0123456789" // user, team nlp
	tokBob   = "bob-token-01234567890"  // user, team vision
	tokAdmin = "admin-token-012345678"  // operator
	tokMoney = "finance-token-0123456"  // finance
	tokAgent = "agent-token-012345678"  // agent
)

var t0 = time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC)

// harness is a broker on a temp store with a fake clock, served by
// httptest; scheduling cycles run only when a test calls cycle().
type harness struct {
	t     *testing.T
	srv   *Server
	http  *httptest.Server
	clock *clock.Fake
	store broker.Store
	path  string
	// opts are passed to every New (providers, bootstrap).
	opts Options
	// ctx is cancelled by restart: the burst workers of the old server
	// stop, as on a crash.
	ctx    context.Context
	cancel context.CancelFunc
	// logs is what every server this harness opened logged (text, INFO
	// and up).
	logs logBuffer
	// wrap, when set, wraps the store the server is given.
	wrap func(broker.Store) broker.Store
}

// logBuffer collects a server's log for a test to read: the first 8 MiB,
// so a long test's log cannot grow without bound.
type logBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.b.Len()+len(p) > 8<<20 {
		return len(p), nil
	}
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func testConfig(t *testing.T) *config.Config {
	cfg, err := config.Parse([]byte(fmt.Sprintf(`
listen: 127.0.0.1:0
dataDir: %s
agents: {heartbeatInterval: 1s, lostAfter: 3}
billing:
  onprem:
    rates:
      H100: [{perGPUHour: "2.50"}]
auth:
  tokens:
    - {name: alice, role: user, team: nlp, token: %s}
    - {name: bob, role: user, team: vision, token: %s}
    - {name: admin, role: operator, token: %s}
    - {name: money, role: finance, token: %s}
    - {name: agents, role: agent, token: %s}
`, t.TempDir(), tokAlice, tokBob, tokAdmin, tokMoney, tokAgent)))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func newHarness(t *testing.T) *harness {
	t.Helper()
	cfg := testConfig(t)
	h := &harness{t: t, clock: clock.NewFake(t0), path: filepath.Join(cfg.DataDir, "spillway.db")}
	h.open(cfg)
	t.Cleanup(func() {
		h.cancel()
		h.http.Close()
		h.store.Close()
	})
	return h
}

func (h *harness) open(cfg *config.Config) {
	st, err := bolt.Open(h.path)
	if err != nil {
		h.t.Fatal(err)
	}
	h.ctx, h.cancel = context.WithCancel(context.Background())
	opts := h.opts
	opts.Clock, opts.Logger = h.clock, slog.New(slog.NewTextHandler(&h.logs, nil))
	var given broker.Store = st
	if h.wrap != nil {
		given = h.wrap(st)
	}
	srv, err := New(h.ctx, cfg, given, opts)
	if err != nil {
		h.t.Fatal(err)
	}
	h.srv, h.store = srv, st
	h.http = httptest.NewServer(srv.Handler())
}

// restart simulates a broker crash and start on the same store.
func (h *harness) restart() {
	h.cancel()
	h.http.Close()
	h.store.Close()
	h.open(h.srv.cfg())
}

func (h *harness) cycle() {
	h.t.Helper()
	if err := h.srv.Cycle(context.Background()); err != nil {
		h.t.Fatal(err)
	}
}

// do sends a request and decodes a JSON answer into out (if not nil).
func (h *harness) do(method, path, token string, body any, out any) int {
	h.t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = bytes.NewBufferString(b)
	default:
		raw, _ := json.Marshal(b)
		rd = bytes.NewReader(raw)
	}
	req, _ := http.NewRequest(method, h.http.URL+path, rd)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if out != nil {
		if err := json.Unmarshal(raw, out); err != nil {
			h.t.Fatalf("%s %s: decode %q: %v", method, path, raw, err)
		}
	}
	return resp.StatusCode
}

func (h *harness) submit(token, spec string) *broker.Job {
	h.t.Helper()
	var j broker.Job
	if code := h.do("POST", "/v1/jobs", token, spec, &j); code != http.StatusCreated {
		h.t.Fatalf("submit: %d", code)
	}
	return &j
}

func (h *harness) job(id string) *broker.Job {
	h.t.Helper()
	var j broker.Job
	if code := h.do("GET", "/v1/jobs/"+id, tokAdmin, nil, &j); code != http.StatusOK {
		h.t.Fatalf("get %s: %d", id, code)
	}
	return &j
}

// fakeAgent speaks the agent protocol without running anything.
type fakeAgent struct {
	h    *harness
	name string
	gen  uint64
	jobs map[agentapi.JobRef]*agentapi.JobReport
	last agentapi.SyncResponse
	// util, when set, is sent as every card's compute utilisation.
	util *int
	gpus int
	// token is the agent's token (tokAgent when empty).
	token string
	// stale, when set, says whether this agent has been replaced.
	stale func() bool
	// notices are the provider notices it reports (a burst machine).
	notices []agentapi.Notice
	// started lists every attempt the broker asked it to start.
	started []agentapi.JobRef
}

func simInventory(name string, n int) gpu.Inventory {
	inv := gpu.Inventory{Backend: "test", DriverVersion: "550.54", CUDAVersion: "12.4"}
	for i := 0; i < n; i++ {
		inv.Devices = append(inv.Devices, gpu.Device{Index: i, UUID: fmt.Sprintf("GPU-%s-%d", name, i),
			Model: "NVIDIA H100 80GB HBM3", MemoryBytes: 80 << 30})
	}
	return inv
}

func (h *harness) agent(name string, gpus int) *fakeAgent {
	h.t.Helper()
	a := &fakeAgent{h: h, name: name, jobs: map[agentapi.JobRef]*agentapi.JobReport{}, gpus: gpus}
	a.register(gpus)
	return a
}

func (a *fakeAgent) register(gpus int) {
	a.h.t.Helper()
	var resp agentapi.RegisterResponse
	code := a.h.do("POST", agentapi.PathRegister, tokAgent, agentapi.RegisterRequest{Node: a.name, Inventory: simInventory(a.name, gpus)}, &resp)
	if code != http.StatusOK {
		a.h.t.Fatalf("register %s: %d", a.name, code)
	}
	a.gen = resp.Generation
	a.jobs = map[agentapi.JobRef]*agentapi.JobReport{}
}

// sync sends the agent's state; starts the assigned attempts (as running),
// applies stop orders as immediate exits by signal, forgets acked ones.
func (a *fakeAgent) sync() agentapi.SyncResponse {
	a.h.t.Helper()
	req := a.request()
	var resp agentapi.SyncResponse
	tok := tokAgent
	if a.token != "" {
		tok = a.token
	}
	if code := a.h.do("POST", agentapi.PathSync, tok, req, &resp); code != http.StatusOK {
		if a.replaced() {
			// A burst machine whose bootstrap ran again (after a broker
			// restart) has a new agent with a new token; this one is gone.
			return resp
		}
		a.h.t.Fatalf("sync %s: %d", a.name, code)
	}
	for _, ref := range resp.Ack {
		delete(a.jobs, ref)
	}
	for _, s := range resp.Start {
		a.jobs[s.JobRef] = &agentapi.JobReport{JobRef: s.JobRef, State: agentapi.RunRunning, StartedAt: a.h.clock.Now()}
		a.started = append(a.started, s.JobRef)
	}
	a.last = resp
	return resp
}

// request is the heartbeat the agent sends next.
func (a *fakeAgent) request() agentapi.SyncRequest {
	req := agentapi.SyncRequest{Node: a.name, Generation: a.gen}
	if a.util != nil {
		s := gpu.Sample{At: a.h.clock.Now()}
		for i := 0; i < a.gpus; i++ {
			s.Devices = append(s.Devices, gpu.DeviceSample{Index: i, UUID: fmt.Sprintf("GPU-%s-%d", a.name, i),
				SMUtil: *a.util, MemoryUsedBytes: int64(i) << 30})
		}
		req.Telemetry = &s
	}
	for _, r := range a.jobs {
		req.Jobs = append(req.Jobs, *r)
	}
	req.Notices = a.notices
	return req
}

// replaced reports whether a newer agent took over this burst machine.
func (a *fakeAgent) replaced() bool { return a.stale != nil && a.stale() }

func (a *fakeAgent) exit(id string, code int, signal string) {
	for ref, r := range a.jobs {
		if ref.Job == id {
			r.State, r.ExitCode, r.Signal, r.EndedAt = agentapi.RunExited, code, signal, a.h.clock.Now()
		}
	}
}

// advance moves the clock by d in heartbeat-sized steps, with every agent
// syncing and a scheduling cycle at each step, as in a live cluster.
func (h *harness) advance(d time.Duration, agents ...*fakeAgent) {
	h.t.Helper()
	for step := time.Second; d > 0; d -= step {
		h.clock.Step(min(step, d))
		for _, a := range agents {
			a.sync()
		}
		h.cycle()
	}
}

func states(j *broker.Job) []broker.State {
	out := make([]broker.State, len(j.History))
	for i, t := range j.History {
		out[i] = t.To
	}
	return out
}
