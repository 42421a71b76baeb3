package server

import (
	"net/http"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/spillway-dev/spillway/broker/api"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/config"
)

// TestHoldReleasePriority: a held job is neither scheduled nor burst and
// says who held it; released, it starts. Only operators change priority,
// to a configured class. Each change is in the job's history and the
// audit log.
func TestHoldReleasePriority(t *testing.T) {
	h := newHarness(t)
	j := h.submit(tokAlice, oneGPU)
	var got broker.Job
	if code := h.do("POST", "/v1/jobs/"+j.ID+"/hold", tokAlice, `{"reason": "data not ready"}`, &got); code != http.StatusOK || got.Hold == nil {
		t.Fatalf("hold: %d %+v", code, got.Hold)
	}
	if code := h.do("POST", "/v1/jobs/"+j.ID+"/hold", tokBob, nil, nil); code != http.StatusNotFound {
		t.Fatalf("bob held alice's job: %d", code)
	}
	h.agent("n1", 8)
	h.cycle()
	got = *h.job(j.ID)
	if got.State != broker.StatePending || got.Pending == nil || !strings.Contains(got.Pending.Message, "held by alice (data not ready)") {
		t.Fatalf("held job: %s %+v", got.State, got.Pending)
	}
	if code := h.do("PUT", "/v1/jobs/"+j.ID+"/priority", tokAlice, `{"priority": "high"}`, nil); code != http.StatusForbidden {
		t.Fatalf("a user changed a priority: %d", code)
	}
	if code := h.do("PUT", "/v1/jobs/"+j.ID+"/priority", tokAdmin, `{"priority": "urgent"}`, nil); code != http.StatusBadRequest {
		t.Fatalf("unknown priority accepted: %d", code)
	}
	if code := h.do("PUT", "/v1/jobs/"+j.ID+"/priority", tokAdmin, `{"priority": "high"}`, &got); code != http.StatusOK || got.Spec.Priority != "high" {
		t.Fatalf("priority: %d %s", code, got.Spec.Priority)
	}
	var released broker.Job
	if code := h.do("POST", "/v1/jobs/"+j.ID+"/release", tokAlice, nil, &released); code != http.StatusOK || released.Hold != nil {
		t.Fatalf("release: %d", code)
	}
	h.cycle()
	if st := h.job(j.ID).State; st != broker.StateStarting && st != broker.StateRunning {
		t.Fatalf("released job is %s", st)
	}
	var reasons []string
	for _, tr := range h.job(j.ID).History {
		reasons = append(reasons, tr.Reason)
	}
	if s := strings.Join(reasons, ","); !strings.Contains(s, "hold,priority,release") {
		t.Fatalf("history %s", s)
	}
	assertAudit(t, h, "job.hold", "job.priority", "job.release")
}

// TestCordonDrainUndrain: a cordoned node keeps its job and takes no new
// one; drained, its jobs are asked to stop and go back to the queue;
// undrained, it takes work again. The mark survives the agent
// re-registering.
func TestCordonDrainUndrain(t *testing.T) {
	h := newHarness(t)
	a := h.agent("n1", 2)
	first := h.submit(tokAlice, oneGPU)
	h.cycle()
	if code := h.do("POST", "/v1/nodes/n1/cordon", tokAlice, nil, nil); code != http.StatusForbidden {
		t.Fatalf("a user cordoned a node: %d", code)
	}
	var n broker.Node
	if code := h.do("POST", "/v1/nodes/n1/cordon", tokAdmin, `{"reason": "fan noise"}`, &n); code != http.StatusOK || n.Cordon == nil {
		t.Fatalf("cordon: %d %+v", code, n.Cordon)
	}
	second := h.submit(tokAlice, oneGPU)
	h.cycle()
	if st := h.job(second.ID).State; st != broker.StatePending {
		t.Fatalf("a job started on a cordoned node: %s", st)
	}
	a.register(2)
	h.cycle()
	if st := h.job(second.ID).State; st != broker.StatePending {
		t.Fatalf("re-registering lifted the cordon: %s", st)
	}
	if code := h.do("POST", "/v1/nodes/n1/drain", tokAdmin, nil, nil); code != http.StatusOK {
		t.Fatalf("drain: %d", code)
	}
	if j := h.job(first.ID); j.State.Holding() && (j.Stop == nil || j.Stop.Reason != "preempted") {
		t.Fatalf("drain did not stop the running job: %s %+v", j.State, j.Stop)
	}
	var back broker.Node
	if code := h.do("POST", "/v1/nodes/n1/undrain", tokAdmin, nil, &back); code != http.StatusOK || back.Cordon != nil {
		t.Fatalf("undrain: %d", code)
	}
	h.cycle()
	if st := h.job(second.ID).State; st == broker.StatePending {
		t.Fatal("the undrained node took no work")
	}
	if code := h.do("POST", "/v1/nodes/nope/cordon", tokAdmin, nil, nil); code != http.StatusNotFound {
		t.Fatalf("unknown node: %d", code)
	}
	assertAudit(t, h, "node.cordon", "node.drain", "node.undrain")
}

func assertAudit(t *testing.T, h *harness, actions ...string) {
	t.Helper()
	var out struct{ Audit []broker.AuditRecord }
	h.do("GET", "/v1/audit", tokAdmin, nil, &out)
	seen := map[string]bool{}
	for _, r := range out.Audit {
		seen[r.Action] = true
	}
	for _, a := range actions {
		if !seen[a] {
			t.Errorf("audit log lacks %s", a)
		}
	}
}

// TestTokensListRevokeReload: operators list tokens (never secrets),
// revoke one (refused from then on, across a restart, audited), and a
// reload replaces the config's tokens.
func TestTokensListRevokeReload(t *testing.T) {
	h := newHarness(t)
	var list struct{ Tokens []api.TokenView }
	if code := h.do("GET", "/v1/tokens", tokAdmin, nil, &list); code != http.StatusOK || len(list.Tokens) == 0 {
		t.Fatalf("list: %d %+v", code, list)
	}
	if code := h.do("GET", "/v1/tokens", tokAlice, nil, nil); code != http.StatusForbidden {
		t.Fatalf("a user listed tokens: %d", code)
	}
	if code := h.do("DELETE", "/v1/tokens/bob", tokAdmin, nil, nil); code != http.StatusOK {
		t.Fatalf("revoke: %d", code)
	}
	if code := h.do("GET", "/v1/jobs", tokBob, nil, nil); code != http.StatusUnauthorized {
		t.Fatalf("a revoked token works: %d", code)
	}
	h.restart()
	if code := h.do("GET", "/v1/jobs", tokBob, nil, nil); code != http.StatusUnauthorized {
		t.Fatalf("a revoked token works after a restart: %d", code)
	}
	assertAudit(t, h, "token.revoke")
	tokens := append([]config.Token{}, h.srv.cfg().Auth.Tokens...)
	tokens = slices.DeleteFunc(tokens, func(tk config.Token) bool { return tk.Name == "alice" })
	tokens = append(tokens, config.Token{Name: "carol", Role: config.RoleUser, Team: "nlp", Token: "carol-token-0123456789"})
	h.srv.reloadTokens(tokens)
	if code := h.do("GET", "/v1/jobs", tokAlice, nil, nil); code != http.StatusUnauthorized {
		t.Fatalf("a token removed by a reload works: %d", code)
	}
	if code := h.do("GET", "/v1/jobs", "carol-token-0123456789", nil, nil); code != http.StatusOK {
		t.Fatalf("a token added by a reload is refused: %d", code)
	}
}

// TestOperationsControlsAPI: every API call in docs/operations.md's
// "Operator controls" table is a route the server registers (the CLI
// column is checked by cmd/spillway's TestOperationsControlsTable).
func TestOperationsControlsAPI(t *testing.T) {
	raw, err := os.ReadFile("../../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(raw), "\n## Operator controls\n")
	if !ok {
		t.Fatal("docs/operations.md has no \"## Operator controls\" section")
	}
	section, _, _ = strings.Cut(section, "\n### ")
	h := newHarness(t)
	param := regexp.MustCompile(`:([A-Za-z]+)`)
	registered := map[string]bool{}
	for _, r := range h.srv.echo.Routes() {
		registered[r.Method+" "+param.ReplaceAllString(r.Path, "{$1}")] = true
	}
	calls := regexp.MustCompile("`((?:GET|POST|PUT|DELETE) /v1/[^`]*)`").FindAllStringSubmatch(section, -1)
	for _, m := range calls {
		if !registered[m[1]] {
			t.Errorf("docs/operations.md's operator controls name %s; the server has no such route", m[1])
		}
	}
	if len(calls) < 9 {
		t.Fatalf("only %d API calls found in the table", len(calls))
	}
}
