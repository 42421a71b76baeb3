package server

import (
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/spillway-dev/spillway/broker/api"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/onprem/agentapi"
)

// TestAuditMutations: every mutating call lands in the audit log with who,
// what, when, from where and the answer, refusals included; heartbeats
// and limit refusals do not; the log exports as CSV.
func TestAuditMutations(t *testing.T) {
	h := newHarness(t)
	a := h.agent("gpu-a", 1)
	j := h.submit(tokAlice, oneGPU)
	h.do("POST", "/v1/jobs/"+j.ID+"/cancel", tokAlice, nil, nil)
	h.do("POST", "/v1/jobs/"+j.ID+"/cancel", "", nil, nil)                 // 401
	h.do("POST", "/v1/jobs", tokAlice, `{"resources": {"gpus": -1}}`, nil) // 400
	h.do("PUT", "/v1/budgets/global", tokAlice, `{"limit": "5"}`, nil)     // 403
	h.do("PUT", "/v1/budgets/global", tokAdmin, `{"limit": "5"}`, nil)
	h.do("POST", "/v1/jointokens", tokAdmin, api.JoinTokenRequest{}, nil)
	a.sync()
	h.srv.cfg().Limits.SubmitBurst, h.srv.cfg().Limits.SubmitsPerMinute = 1, 1
	h.srv.limits.buckets = nil
	h.submitCode(tokBob, oneGPU)
	if code, _ := h.submitCode(tokBob, oneGPU); code != http.StatusTooManyRequests {
		t.Fatalf("want a 429: %d", code)
	}

	var out struct{ Audit []broker.AuditRecord }
	if code := h.do("GET", "/v1/audit", tokAlice, nil, nil); code != http.StatusForbidden {
		t.Fatalf("a user read the audit log: %d", code)
	}
	if code := h.do("GET", "/v1/audit", tokAdmin, nil, &out); code != http.StatusOK {
		t.Fatalf("audit: %d", code)
	}
	var lines []string
	for _, r := range out.Audit {
		lines = append(lines, r.By+" "+r.Action+" "+r.Target+" "+strconv.Itoa(r.Status))
		if r.Action != "budget.set" && (r.Remote == "" || r.At.IsZero()) {
			t.Errorf("record without where or when: %+v", r)
		}
	}
	got := strings.Join(lines, "\n")
	for _, want := range []string{
		"agents POST /v1/agent/register  200",
		"alice POST /v1/jobs  201",
		"alice POST /v1/jobs  400",
		"alice POST /v1/jobs/:id/cancel id=" + j.ID + " 200",
		"anonymous POST /v1/jobs/:id/cancel id=" + j.ID + " 401",
		"alice PUT /v1/budgets/:scope scope=global 403",
		"admin PUT /v1/budgets/:scope scope=global 200",
		"admin POST /v1/jointokens  201",
		"bob POST /v1/jobs  201",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("audit lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, agentapi.PathSync) || strings.Count(got, "bob POST /v1/jobs") != 1 {
		t.Errorf("heartbeats or 429s in the audit log:\n%s", got)
	}
	// A submit writes its record in its own transaction: once, not again
	// by the middleware.
	if n := strings.Count(got, "alice POST /v1/jobs  201"); n != 1 {
		t.Errorf("%d records of alice's one submit:\n%s", n, got)
	}
	// The export.
	req, _ := http.NewRequest("GET", h.http.URL+"/v1/audit?format=csv&from=2020-01-01", nil)
	req.Header.Set("Authorization", "Bearer "+tokMoney)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(string(raw), "at,by,role,action,target,method,path,status,remote") ||
		!strings.Contains(string(raw), "alice,user,POST /v1/jobs/:id/cancel") {
		t.Fatalf("csv export: %d\n%s", resp.StatusCode, raw)
	}
}
