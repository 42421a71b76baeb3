package server

import (
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/broker/api"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/burst"
	"github.com/spillway-dev/spillway/broker/config"
	"github.com/spillway-dev/spillway/broker/report"
)

func (h *harness) explain(token, id string) *api.Explanation {
	h.t.Helper()
	var x api.Explanation
	if code := h.do("GET", "/v1/jobs/"+id+"/explain", token, nil, &x); code != http.StatusOK {
		h.t.Fatalf("explain %s: %d", id, code)
	}
	return &x
}

// running starts whatever the last cycle placed on the agents.
func (h *harness) settle(agents ...*fakeAgent) {
	h.t.Helper()
	h.cycle()
	for i := 0; i < 2; i++ {
		for _, a := range agents {
			a.sync()
		}
	}
}

// writeLog stores log bytes of a job's current attempt, as an agent's
// sync would.
func (h *harness) writeLog(id string, text string) {
	h.t.Helper()
	j := h.job(id)
	err := h.store.Update(ctxT(), func(tx broker.Tx) error {
		m, err := broker.GetLogMeta(tx, id, j.Attempt)
		if err != nil {
			return err
		}
		_, err = broker.AppendLog(tx, id, j.Attempt, m.Size, []byte(text), 1<<20)
		return err
	})
	if err != nil {
		h.t.Fatal(err)
	}
}

func wantVerdict(t *testing.T, x *api.Explanation, code string, words ...string) {
	t.Helper()
	t.Log("\n" + strings.Join(x.Steps, "\n") + "\n=> " + x.Verdict.Sentence)
	if x.Verdict.Code != code {
		t.Fatalf("verdict %q (%s), want %q\n%s", x.Verdict.Code, x.Verdict.Sentence, code, strings.Join(x.Steps, "\n"))
	}
	for _, w := range words {
		if !strings.Contains(x.Verdict.Sentence, w) {
			t.Errorf("verdict %q lacks %q", x.Verdict.Sentence, w)
		}
	}
	// One sentence: no full stop inside it, outside quoted log lines.
	unquoted := regexp.MustCompile(`"[^"]*"`).ReplaceAllString(x.Verdict.Sentence, `""`)
	unquoted = strings.ReplaceAll(unquoted, "est. start", "estimated start")
	if strings.Contains(unquoted, ". ") || !strings.HasSuffix(x.Verdict.Sentence, ".") {
		t.Errorf("verdict is not one sentence: %q", x.Verdict.Sentence)
	}
	if len(x.Steps) < 5 || !strings.HasPrefix(x.Steps[0], "1. State") {
		t.Errorf("steps: %q", x.Steps)
	}
}

func TestExplainQuota(t *testing.T) {
	h := newHarness(t)
	zero := 0
	h.srv.cfg().Teams = []config.Team{{Name: "nlp", Share: 1, Quota: &config.Quota{GPUs: 2, BorrowLimit: &zero}}}
	a := h.agent("n1", 8)
	h.submit(tokAlice, `{"resources": {"gpus": 2}, "timeout": "2h", "command": ["train"]}`)
	h.settle(a)
	j := h.submit(tokAlice, `{"resources": {"gpus": 1}, "timeout": "1h", "command": ["eval"]}`)
	h.cycle()
	x := h.explain(tokAlice, j.ID)
	wantVerdict(t, x, report.VerdictQuota, "waits for its team's quota (team nlp at quota 2/2 GPUs", "1 running job(s) hold 2 GPUs", "guaranteed 2 GPUs")
	if x.Queue == nil || x.Queue.Reason == nil || x.Queue.Reason.Code != "quota" || x.Team.HeldGPUs != 2 || x.Team.RunningJobs != 1 {
		t.Fatalf("queue step %+v team %+v", x.Queue, x.Team)
	}
	if x.Cluster.FreeGPUs != 6 || x.Cluster.Full {
		t.Fatalf("cluster step: %+v", x.Cluster)
	}
	// Another team's token cannot explain the job.
	if code := h.do("GET", "/v1/jobs/"+j.ID+"/explain", tokBob, nil, nil); code != http.StatusNotFound {
		t.Fatalf("bob explains alice's job: %d", code)
	}
}

func TestExplainClusterFull(t *testing.T) {
	h := newHarness(t)
	a := h.agent("n1", 2)
	held := h.submit(tokBob, `{"resources": {"gpus": 2}, "timeout": "2h", "command": ["train"]}`)
	h.settle(a)
	ahead := h.submit(tokBob, `{"resources": {"gpus": 1}, "priority": "high", "timeout": "1h", "command": ["first"]}`)
	j := h.submit(tokAlice, `{"resources": {"gpus": 1}, "timeout": "1h", "command": ["eval"]}`)
	h.cycle()
	x := h.explain(tokAlice, j.ID)
	// Who is ahead: bob's high-priority job, without its id for alice.
	if q := x.Queue; q == nil || len(q.Ahead) != 1 || q.Ahead[0].Team != "vision" || q.Ahead[0].Priority != "high" || q.Ahead[0].ID != "" {
		t.Fatalf("ahead for alice: %+v", x.Queue)
	}
	if q := h.explain(tokAdmin, j.ID).Queue; len(q.Ahead) != 1 || q.Ahead[0].ID != ahead.ID {
		t.Fatalf("ahead for an operator: %+v", q)
	}
	wantVerdict(t, x, report.VerdictClusterFull, "The cluster is full: 2 of 2 matching GPUs are in use", "2nd in queue default")
	if !x.Cluster.Full || len(x.Cluster.NodeList) != 1 || len(x.Cluster.NodeList[0].Holders) != 1 ||
		x.Cluster.NodeList[0].Holders[0].Job != held.ID || x.Cluster.NodeList[0].Holders[0].Team != "vision" {
		t.Fatalf("who holds the cards: %+v", x.Cluster.NodeList)
	}
}

func TestExplainWaitingForWholeNode(t *testing.T) {
	h := newHarness(t)
	a, b := h.agent("n1", 4), h.agent("n2", 4)
	h.submit(tokBob, `{"resources": {"gpus": 3}, "timeout": "2h", "command": ["a"]}`)
	h.submit(tokBob, `{"resources": {"gpus": 3}, "timeout": "2h", "command": ["b"]}`)
	h.settle(a, b)
	j := h.submit(tokAlice, `{"resources": {"gpus": 2}, "timeout": "1h", "command": ["c"]}`)
	h.cycle()
	x := h.explain(tokAlice, j.ID)
	wantVerdict(t, x, report.VerdictWholeNode, "needs 2 GPUs on one node", "2 GPUs are free but spread out (at most 1 on one node)")
	if x.Cluster.FreeGPUs != 2 || x.Cluster.MostFreeOnOneNode != 1 {
		t.Fatalf("cluster: %+v", x.Cluster)
	}
}

func TestExplainBurstBlockedByBudget(t *testing.T) {
	h := newHarness(t)
	a := h.agent("n1", 2)
	h.submit(tokBob, `{"resources": {"gpus": 2}, "timeout": "2h", "command": ["train"]}`)
	h.settle(a)
	j := h.submit(tokAlice, `{"resources": {"gpus": 2}, "timeout": "1h", "burst": "allowed", "command": ["eval"]}`)
	h.cycle()
	// The burst controller's reason, as its decision leaves it, comes first
	// in the pending-reason field, followed by the scheduler's.
	h.srv.lock()
	h.srv.burstWhy[j.ID] = broker.PendingReason{Code: burst.CodeBudget, Message: "burst blocked: budget nlp 4,980/5,000 USD this month"}
	h.srv.mu.Unlock()
	x := h.explain(tokAlice, j.ID)
	wantVerdict(t, x, report.VerdictBurstBudget, "blocked by the budget", "budget nlp 4,980/5,000 USD this month; waiting for 2 GPUs on one node", "0 free, it needs 2", "spillway budget set")
	if m := h.scrape(); m[`spillway_pending_jobs{queue="default",reason="budget"}`] != 1 {
		t.Errorf("the pending gauge does not count the burst reason")
	}
}

func TestExplainIdleOnItsCard(t *testing.T) {
	h := newHarness(t)
	h.srv.cfg().Idle.Window = broker.Duration(2 * time.Minute)
	a := h.agent("n1", 2)
	zero := 0
	a.util = &zero
	j := h.submit(tokAlice, `{"resources": {"gpus": 1}, "timeout": "4h", "command": ["notebook"]}`)
	h.settle(a)
	h.advance(3*time.Minute, a)
	x := h.explain(tokAlice, j.ID)
	wantVerdict(t, x, report.VerdictIdle, "holds 1 GPU(s)", "computes almost nothing (0% compute) since", "cancel it")
	if len(x.Cards) != 1 || x.Cards[0].SMUtil == nil || x.Cards[0].Computing {
		t.Fatalf("cards: %+v", x.Cards)
	}
	// The same job computing reads as healthy.
	busy := 87
	a.util = &busy
	h.advance(2*time.Second, a)
	x = h.explain(tokAlice, j.ID)
	wantVerdict(t, x, report.VerdictComputing, "87% compute on 1 of 1 GPUs")
}

func TestExplainCrashedWithOOM(t *testing.T) {
	h := newHarness(t)
	a := h.agent("n1", 2)
	j := h.submit(tokAlice, `{"resources": {"gpus": 1}, "timeout": "1h", "command": ["train"]}`)
	h.settle(a)
	h.writeLog(j.ID, "epoch 1 loss 2.31\nTraceback (most recent call last):\n"+
		"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.11 GiB\n")
	a.exit(j.ID, 1, "")
	a.sync()
	x := h.explain(tokAlice, j.ID)
	wantVerdict(t, x, report.VerdictGPUOOM, "GPU ran out of memory", "CUDA out of memory", "lower the batch size")
	if x.Exit == nil || x.Exit.OOM != "gpu" || len(x.Exit.LogTail) != 3 || *x.Exit.ExitCode != 1 {
		t.Fatalf("exit step: %+v", x.Exit)
	}

	// The kernel's OOM killer: SIGKILL nobody sent, "Killed" last; with a
	// retry pending, the verdict says so.
	r := h.submit(tokAlice, `{"resources": {"gpus": 1}, "timeout": "1h", "restartPolicy": "OnFailure", "maxRetries": 2, "command": ["load"]}`)
	h.settle(a)
	h.writeLog(r.ID, "loading 900 GB into RAM\nKilled\n")
	a.exit(r.ID, 137, "")
	a.sync()
	h.cycle()
	x = h.explain(tokAlice, r.ID)
	if x.Job.State != broker.StatePending {
		t.Fatalf("state %s", x.Job.State)
	}
	wantVerdict(t, x, report.VerdictHostOOM, "out of host memory (Killed)", "retry 1/2", "resources.memory")
}

func TestExplainNotOOMWhenTheBrokerStoppedIt(t *testing.T) {
	h := newHarness(t)
	a := h.agent("n1", 1)
	j := h.submit(tokAlice, `{"resources": {"gpus": 1}, "timeout": "1h", "command": ["train"]}`)
	h.settle(a)
	if code := h.do("POST", "/v1/jobs/"+j.ID+"/cancel", tokAlice, nil, nil); code != http.StatusAccepted {
		t.Fatalf("cancel: %d", code)
	}
	a.sync()
	a.exit(j.ID, 137, "SIGKILL")
	a.sync()
	x := h.explain(tokAlice, j.ID)
	wantVerdict(t, x, report.VerdictCancelled, "cancelled by alice")
	if x.Exit == nil || x.Exit.OOM != "" {
		t.Fatalf("a cancel read as OOM: %+v", x.Exit)
	}
}
