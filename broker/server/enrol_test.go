package server

import (
	"net/http"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/broker/api"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/onprem/agentapi"
)

func (h *harness) joinToken(req api.JoinTokenRequest) string {
	h.t.Helper()
	var ans api.JoinTokenAnswer
	if code := h.do("POST", "/v1/jointokens", tokAdmin, req, &ans); code != http.StatusCreated || ans.Token == "" {
		h.t.Fatalf("create join token: %d %+v", code, ans)
	}
	return ans.Token
}

func (h *harness) enrol(token, node string) (int, agentapi.EnrolResponse) {
	h.t.Helper()
	var er agentapi.EnrolResponse
	code := h.do("POST", agentapi.PathEnrol, "", agentapi.EnrolRequest{JoinToken: token, Node: node}, &er)
	return code, er
}

// TestFinding2NodeIdentity: a node enrolled with a single-use join token
// has a credential bound to its name. It cannot register another name or
// end jobs of other nodes; the shared agent token cannot take its name
// over (the loop that failed a node's running job); a revoked credential
// gets 401.
func TestFinding2NodeIdentity(t *testing.T) {
	h := newHarness(t)
	if code := h.do("POST", "/v1/jointokens", tokAlice, api.JoinTokenRequest{}, nil); code != http.StatusForbidden {
		t.Fatalf("a user created a join token: %d", code)
	}
	tok := h.joinToken(api.JoinTokenRequest{Expires: broker.Duration(time.Hour), MaxGPUs: 2})
	code, er := h.enrol(tok, "gpu-a")
	if code != http.StatusOK || er.Credential == "" || er.Node != "gpu-a" {
		t.Fatalf("enrol: %d %+v", code, er)
	}
	if code, _ := h.enrol(tok, "gpu-a"); code != http.StatusUnauthorized {
		t.Fatalf("a join token worked twice: %d", code)
	}
	cred := er.Credential

	// The credential registers its own name, within its class.
	a := &fakeAgent{h: h, name: "gpu-a", jobs: map[agentapi.JobRef]*agentapi.JobReport{}, gpus: 1, token: cred}
	if err := a.tryRegister(3); err == nil {
		t.Fatal("a 2-GPU credential registered a node with 3 cards")
	}
	if err := a.tryRegister(1); err != nil {
		t.Fatal(err)
	}
	// Not another name.
	if code := h.do("POST", agentapi.PathRegister, cred, agentapi.RegisterRequest{Node: "gpu-b", Inventory: simInventory("gpu-b", 1)}, nil); code != http.StatusForbidden {
		t.Fatalf("the credential registered gpu-b: %d", code)
	}
	j := h.submit(tokAlice, oneGPU)
	h.settle(a)
	if got := h.job(j.ID); got.State != broker.StateRunning || got.Placements[0].Node != "gpu-a" {
		t.Fatalf("job %s on %v", got.State, got.Placements)
	}
	// The shared agent token cannot re-register the enrolled name.
	for i := 0; i < 3; i++ {
		if code := h.do("POST", agentapi.PathRegister, tokAgent, agentapi.RegisterRequest{Node: "gpu-a", Inventory: simInventory("gpu-a", 1)}, nil); code != http.StatusForbidden {
			t.Fatalf("the shared token re-registered gpu-a: %d", code)
		}
	}
	if got := h.job(j.ID); got.State != broker.StateRunning || got.Attempt != 1 {
		t.Fatalf("gpu-a's job after the takeover tries: %s attempt %d", got.State, got.Attempt)
	}
	// A job on another node: gpu-a's credential cannot end it.
	b := h.agent("gpu-x", 1)
	k := h.submit(tokBob, oneGPU)
	h.settle(a, b)
	if got := h.job(k.ID); got.State != broker.StateRunning || got.Placements[0].Node != "gpu-x" {
		t.Fatalf("job k %s on %v", got.State, got.Placements)
	}
	forged := agentapi.SyncRequest{Node: "gpu-a", Generation: a.gen, Jobs: []agentapi.JobReport{
		*a.jobs[agentapi.JobRef{Job: j.ID, Attempt: 1}],
		{JobRef: agentapi.JobRef{Job: k.ID, Attempt: 1}, State: agentapi.RunExited, ExitCode: 1, EndedAt: h.clock.Now()},
	}}
	if code := h.do("POST", agentapi.PathSync, cred, forged, nil); code != http.StatusOK {
		t.Fatalf("sync: %d", code)
	}
	if got := h.job(k.ID); got.State != broker.StateRunning {
		t.Fatalf("gpu-a's credential ended gpu-x's job: %s", got.State)
	}
	forged.Node = "gpu-x"
	if code := h.do("POST", agentapi.PathSync, cred, forged, nil); code != http.StatusForbidden {
		t.Fatalf("gpu-a's credential synced as gpu-x: %d", code)
	}

	// Revoked: 401 from now on, the node's job goes back to the queue.
	if code := h.do("POST", "/v1/nodes/gpu-a/revoke", tokAdmin, nil, nil); code != http.StatusOK {
		t.Fatalf("revoke: %d", code)
	}
	if code := h.do("POST", agentapi.PathSync, cred, agentapi.SyncRequest{Node: "gpu-a", Generation: a.gen}, nil); code != http.StatusUnauthorized {
		t.Fatalf("a revoked credential synced: %d", code)
	}
	if err := a.tryRegister(1); err == nil {
		t.Fatal("a revoked credential registered")
	}
	if got := h.job(j.ID); got.State.Holding() {
		t.Fatalf("gpu-a's job still holds its cards after the revoke: %s", got.State)
	}
	// The name can be enrolled again with a new token.
	if code, _ := h.enrol(h.joinToken(api.JoinTokenRequest{}), "gpu-a"); code != http.StatusOK {
		t.Fatalf("re-enrol after revoke: %d", code)
	}
}

// TestJoinTokenExpiresAndBinds: an expired join token and one for another
// name are refused.
func TestJoinTokenExpiresAndBinds(t *testing.T) {
	h := newHarness(t)
	tok := h.joinToken(api.JoinTokenRequest{Expires: broker.Duration(time.Hour)})
	bound := h.joinToken(api.JoinTokenRequest{Node: "gpu-c"})
	if code, _ := h.enrol(bound, "gpu-d"); code != http.StatusForbidden {
		t.Fatalf("a token for gpu-c enrolled gpu-d: %d", code)
	}
	h.clock.Step(time.Hour + time.Second)
	if code, _ := h.enrol(tok, "gpu-a"); code != http.StatusUnauthorized {
		t.Fatalf("an expired join token worked: %d", code)
	}
	if code := h.do("POST", "/v1/jointokens", tokAdmin, api.JoinTokenRequest{Expires: broker.Duration(30 * 24 * time.Hour)}, nil); code != http.StatusBadRequest {
		t.Fatalf("a 30-day join token: %d", code)
	}
	var list struct{ Tokens []api.JoinToken }
	if code := h.do("GET", "/v1/jointokens", tokAdmin, nil, &list); code != http.StatusOK || len(list.Tokens) != 2 {
		t.Fatalf("list: %d %+v", code, list)
	}
}

// TestEndedMachineTokenUnauthorized: a burst machine's own token gets 401
// once its machine has ended.
func TestEndedMachineTokenUnauthorized(t *testing.T) {
	r := newBurstRig(t)
	r.fill()
	j := r.submit(tokAlice, `{"resources": {"gpus": 1}, "timeout": "2h", "command": ["train"]}`)
	r.until("running", 300, func() bool { return r.job(j.ID).State == broker.StateRunning })
	id := r.records()[0].ID
	m := r.machine(id)
	if code := r.do("POST", agentapi.PathSync, m.token, agentapi.SyncRequest{Node: id, Generation: m.gen}, nil); code != http.StatusOK {
		t.Fatalf("live machine sync: %d", code)
	}
	m.exit(j.ID, 0, "")
	r.step()
	r.run(9 * time.Minute)
	r.until("terminated", 200, func() bool { return r.rec(id).State == broker.MachineTerminated })
	if code := r.do("POST", agentapi.PathSync, m.token, agentapi.SyncRequest{Node: id, Generation: m.gen}, nil); code != http.StatusUnauthorized {
		t.Fatalf("ended machine's token: %d, want 401", code)
	}
}
