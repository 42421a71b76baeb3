package server

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/broker/api"

	"github.com/google/go-cmp/cmp"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/onprem/agentapi"
)

const oneGPU = `{"resources": {"gpus": 1}, "timeout": "1h", "command": ["sh", "-c", "echo hi"]}`

func TestAuth(t *testing.T) {
	h := newHarness(t)
	cases := []struct {
		name, method, path, token string
		want                      int
	}{
		{"no token", "GET", "/v1/jobs", "", http.StatusUnauthorized},
		{"unknown token", "GET", "/v1/jobs", "not-a-token-at-all", http.StatusUnauthorized},
		{"user lists jobs", "GET", "/v1/jobs", tokAlice, http.StatusOK},
		{"finance may not submit", "POST", "/v1/jobs", tokMoney, http.StatusForbidden},
		{"agent may not list jobs", "GET", "/v1/jobs", tokAgent, http.StatusForbidden},
		{"user may not sync as agent", "POST", agentapi.PathSync, tokAlice, http.StatusForbidden},
		{"health needs no token", "GET", "/healthz", "", http.StatusOK},
		{"metrics need a token (finding 8)", "GET", "/metrics", "", http.StatusUnauthorized},
		{"a user may not read metrics", "GET", "/metrics", tokAlice, http.StatusForbidden},
		{"an operator reads metrics", "GET", "/metrics", tokAdmin, http.StatusOK},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var body map[string]any
			code := h.do(tc.method, tc.path, tc.token, oneGPU, nil)
			if code != tc.want {
				t.Fatalf("%s %s = %d, want %d", tc.method, tc.path, code, tc.want)
			}
			_ = body
		})
	}
}

func TestTeamsCannotSeeEachOther(t *testing.T) {
	h := newHarness(t)
	h.agent("n1", 8)
	j := h.submit(tokAlice, oneGPU)
	if j.Spec.Team != "nlp" {
		t.Fatalf("team from token: %q", j.Spec.Team)
	}
	for _, path := range []string{"/v1/jobs/" + j.ID, "/v1/jobs/" + j.ID + "/logs"} {
		if code := h.do("GET", path, tokBob, nil, nil); code != http.StatusNotFound {
			t.Errorf("bob GET %s = %d, want 404", path, code)
		}
	}
	if code := h.do("POST", "/v1/jobs/"+j.ID+"/cancel", tokBob, nil, nil); code != http.StatusNotFound {
		t.Errorf("bob cancel = %d, want 404", code)
	}
	var list api.JobList
	h.do("GET", "/v1/jobs", tokBob, nil, &list)
	if len(list.Jobs) != 0 {
		t.Errorf("bob sees %d jobs", len(list.Jobs))
	}
	if code := h.do("GET", "/v1/jobs?team=nlp", tokBob, nil, nil); code != http.StatusForbidden {
		t.Errorf("bob listing team nlp = %d, want 403", code)
	}
	if code := h.do("POST", "/v1/jobs", tokBob, `{"team": "nlp", "resources": {"gpus": 1}, "command": ["x"]}`, nil); code != http.StatusForbidden {
		t.Errorf("bob submitting for nlp = %d, want 403", code)
	}
	if code := h.do("GET", "/v1/jobs/"+j.ID, tokAdmin, nil, nil); code != http.StatusOK {
		t.Errorf("operator get = %d", code)
	}
}

func TestRejectionNamesTheField(t *testing.T) {
	h := newHarness(t)
	h.agent("n1", 8)
	var body struct {
		Error struct{ Code, Message, Field string } `json:"error"`
	}
	code := h.do("POST", "/v1/jobs", tokAlice, `{"resources": {"gpus": 9}, "command": ["x"]}`, &body)
	if code != http.StatusBadRequest || body.Error.Field != "resources.gpus" || body.Error.Code != broker.CodeOutOfRange ||
		!strings.Contains(body.Error.Message, "at most 8") {
		t.Fatalf("9 GPUs on 8-GPU nodes: %d %+v", code, body)
	}
	code = h.do("POST", "/v1/jobs", tokAlice, strings.Repeat(" ", broker.MaxSpecBytes+10), &body)
	if code != http.StatusBadRequest || body.Error.Code != broker.CodeTooLarge {
		t.Fatalf("oversized spec: %d %+v", code, body)
	}
	var list api.JobList
	h.do("GET", "/v1/jobs", tokAdmin, nil, &list)
	if len(list.Jobs) != 0 {
		t.Fatalf("a rejected spec left %d jobs", len(list.Jobs))
	}
}

func TestJobLifecycle(t *testing.T) {
	h := newHarness(t)
	a := h.agent("n1", 8)
	j := h.submit(tokAlice, oneGPU)
	h.cycle()
	resp := a.sync()
	if len(resp.Start) != 1 || resp.Start[0].Job != j.ID || len(resp.Start[0].UUIDs) != 1 {
		t.Fatalf("start orders: %+v", resp.Start)
	}
	if env := resp.Start[0].Env; env["SPILLWAY_JOB_ID"] != j.ID {
		t.Fatalf("env: %v", env)
	}
	a.sync() // reports running
	if got := h.job(j.ID).State; got != broker.StateRunning {
		t.Fatalf("state = %s", got)
	}
	h.clock.Step(time.Minute)
	a.exit(j.ID, 0, "")
	resp = a.sync()
	if len(resp.Ack) != 1 {
		t.Fatalf("no ack: %+v", resp)
	}
	got := h.job(j.ID)
	want := []broker.State{broker.StatePending, broker.StateStarting, broker.StateRunning, broker.StateSucceeded}
	if d := cmp.Diff(want, states(got)); d != "" {
		t.Fatalf("history (-want +got):\n%s", d)
	}
	if got.EndedAt == nil || !got.EndedAt.Equal(t0.Add(time.Minute)) {
		t.Fatalf("ended at %v", got.EndedAt)
	}
}

func TestRetryWithBackoff(t *testing.T) {
	h := newHarness(t)
	a := h.agent("n1", 8)
	j := h.submit(tokAlice, `{"resources": {"gpus": 1}, "restartPolicy": "OnFailure", "maxRetries": 1, "command": ["false"]}`)
	h.cycle()
	a.sync()
	a.exit(j.ID, 1, "")
	a.sync()
	got := h.job(j.ID)
	if got.State != broker.StatePending || got.Retries != 1 || got.NotBefore == nil {
		t.Fatalf("after first failure: %s retries=%d", got.State, got.Retries)
	}
	h.cycle()
	if h.job(j.ID).State != broker.StatePending {
		t.Fatal("started before its backoff ended")
	}
	h.advance(11*time.Second, a)
	a.exit(j.ID, 2, "")
	a.sync()
	got = h.job(j.ID)
	if got.State != broker.StateFailed || got.Attempt != 2 || *got.ExitCode != 2 {
		t.Fatalf("after second failure: %s attempt=%d", got.State, got.Attempt)
	}
}

func TestCancelRunningSendsCheckpointSignal(t *testing.T) {
	h := newHarness(t)
	a := h.agent("n1", 8)
	j := h.submit(tokAlice, `{"resources": {"gpus": 1}, "checkpoint": {"signal": "SIGUSR1", "grace": "5s"}, "command": ["sleep", "100"]}`)
	h.cycle()
	a.sync()
	a.sync()
	if code := h.do("POST", "/v1/jobs/"+j.ID+"/cancel", tokAlice, nil, nil); code != http.StatusAccepted {
		t.Fatalf("cancel = %d", code)
	}
	resp := a.sync()
	if len(resp.Stop) != 1 || resp.Stop[0].Signal != "SIGUSR1" || resp.Stop[0].Grace != 5*time.Second {
		t.Fatalf("stop orders: %+v", resp.Stop)
	}
	a.exit(j.ID, 0, "SIGUSR1")
	a.sync()
	if got := h.job(j.ID); got.State != broker.StateCancelled {
		t.Fatalf("state %s", got.State)
	}
}

func TestCancelPending(t *testing.T) {
	h := newHarness(t)
	j := h.submit(tokAlice, oneGPU)
	var got broker.Job
	if code := h.do("POST", "/v1/jobs/"+j.ID+"/cancel", tokAlice, nil, &got); code != http.StatusOK || got.State != broker.StateCancelled {
		t.Fatalf("cancel pending: %d %s", code, got.State)
	}
	if code := h.do("POST", "/v1/jobs/"+j.ID+"/cancel", tokAlice, nil, nil); code != http.StatusConflict {
		t.Fatalf("second cancel = %d, want 409", code)
	}
}

func TestTimeoutEndsJob(t *testing.T) {
	h := newHarness(t)
	a := h.agent("n1", 8)
	j := h.submit(tokAlice, `{"resources": {"gpus": 1}, "timeout": "10m", "command": ["sleep", "1000"]}`)
	h.cycle()
	a.sync()
	a.sync()
	h.advance(10*time.Minute+time.Second, a)
	if resp := a.last; len(resp.Stop) != 1 || resp.Stop[0].Reason != "timed_out" {
		t.Fatalf("no timeout stop: %+v", resp)
	}
	a.exit(j.ID, 143, "SIGTERM")
	a.sync()
	if got := h.job(j.ID).State; got != broker.StateTimedOut {
		t.Fatalf("state %s", got)
	}
}

func TestNodeLostRequeues(t *testing.T) {
	h := newHarness(t)
	a := h.agent("n1", 8)
	j := h.submit(tokAlice, `{"resources": {"gpus": 1}, "preemptible": true, "command": ["sleep", "1000"]}`)
	never := h.submit(tokAlice, `{"resources": {"gpus": 1}, "command": ["sleep", "1000"]}`)
	h.cycle()
	a.sync()
	a.sync()
	h.clock.Step(4 * time.Second) // lostAfter 3 × 1s
	h.cycle()
	got := h.job(j.ID)
	if d := cmp.Diff([]broker.State{broker.StatePending, broker.StateStarting, broker.StateRunning, broker.StateLost, broker.StatePending}, states(got)); d != "" {
		t.Fatalf("history (-want +got):\n%s", d)
	}
	if h.job(never.ID).State != broker.StateFailed {
		t.Fatalf("restartPolicy Never job: %s", h.job(never.ID).State)
	}
	// An owned node that goes silent is a WARN (a scale-down is not:
	// TestBurstIdleScaleDownAndBilling).
	if !strings.Contains(h.logs.String(), `level=WARN msg="node lost" node=n1`) {
		t.Errorf("no WARN for the lost node:\n%s", h.logs.String())
	}
	// The agent comes back still running the old attempt: it is told to kill it.
	resp := a.sync()
	if len(resp.Stop) != 2 || resp.Stop[0].Reason != "not_assigned" {
		t.Fatalf("returning agent's orders: %+v", resp.Stop)
	}
}

func TestBrokerRestartKeepsJobsAndReconciles(t *testing.T) {
	h := newHarness(t)
	a := h.agent("n1", 8)
	running := h.submit(tokAlice, `{"resources": {"gpus": 2}, "command": ["sleep", "1000"]}`)
	finishing := h.submit(tokAlice, `{"resources": {"gpus": 1}, "command": ["sleep", "1"]}`)
	pending := h.submit(tokAlice, `{"resources": {"gpus": 8}, "command": ["sleep", "1"]}`)
	h.cycle()
	a.sync()
	a.sync()
	before := h.job(running.ID)

	h.restart()
	// While the broker was down, one job ended.
	a.exit(finishing.ID, 0, "")
	h.clock.Step(2 * time.Second) // the node TTL counts from the broker's start
	h.cycle()
	if got := h.job(running.ID); got.State != broker.StateRunning {
		t.Fatalf("running job after restart: %s (node declared lost too early?)", got.State)
	}
	a.sync()
	if got := h.job(finishing.ID); got.State != broker.StateSucceeded {
		t.Fatalf("job that ended during the outage: %s", got.State)
	}
	got := h.job(running.ID)
	if d := cmp.Diff(before.History, got.History); d != "" {
		t.Fatalf("history changed across restart (-before +after):\n%s", d)
	}
	if h.job(pending.ID).State != broker.StatePending {
		t.Fatal("pending job lost")
	}
}

func TestAgentRestartRequeuesItsJobs(t *testing.T) {
	h := newHarness(t)
	a := h.agent("n1", 8)
	j := h.submit(tokAlice, `{"resources": {"gpus": 1}, "restartPolicy": "OnFailure", "command": ["sleep", "1000"]}`)
	h.cycle()
	a.sync()
	a.sync()
	a.register(8) // new agent process, new generation
	got := h.job(j.ID)
	if got.State != broker.StatePending || got.History[len(got.History)-2].Reason != "agent_restarted" {
		t.Fatalf("after agent restart: %s %+v", got.State, got.History)
	}
	// The old generation's heartbeat is refused.
	stale := agentapi.SyncRequest{Node: "n1", Generation: a.gen - 1}
	if code := h.do("POST", agentapi.PathSync, tokAgent, stale, nil); code != http.StatusConflict {
		t.Fatalf("stale generation = %d", code)
	}
}

func TestLogsAreStoredAndServed(t *testing.T) {
	h := newHarness(t)
	a := h.agent("n1", 8)
	j := h.submit(tokAlice, oneGPU)
	h.cycle()
	a.sync()
	req := agentapi.SyncRequest{Node: "n1", Generation: a.gen,
		Jobs: []agentapi.JobReport{{JobRef: agentapi.JobRef{Job: j.ID, Attempt: 1}, State: agentapi.RunRunning, LogSize: 12}},
		Logs: []agentapi.LogChunk{{JobRef: agentapi.JobRef{Job: j.ID, Attempt: 1}, Offset: 0, Data: []byte("line1\nline2\n")}}}
	var resp agentapi.SyncResponse
	h.do("POST", agentapi.PathSync, tokAgent, req, &resp)
	if resp.LogOffsets[j.ID+"/1"] != 12 {
		t.Fatalf("offsets: %v", resp.LogOffsets)
	}
	req2, _ := http.NewRequest("GET", h.http.URL+"/v1/jobs/"+j.ID+"/logs?tail=1", nil)
	req2.Header.Set("Authorization", "Bearer "+tokAlice)
	r, err := http.DefaultClient.Do(req2)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	buf := new(strings.Builder)
	_, _ = bufCopy(buf, r)
	if buf.String() != "line2\n" {
		t.Fatalf("tail=1: %q", buf.String())
	}
}
