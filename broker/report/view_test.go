package report

import (
	"context"
	"fmt"
	"iter"
	"maps"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/api"
	"github.com/spillway-dev/spillway/broker/clock"
	"github.com/spillway-dev/spillway/broker/config"
	"github.com/spillway-dev/spillway/broker/sched"
)

// fakeView is a View over plain values, read by the tests without a
// broker.
type fakeView struct {
	jobs    map[string]*broker.Job
	reasons map[string]sched.Reason
	nodes   []api.NodeView
	// reads counts the times Source.Read handed the view out.
	reads int
}

func (v *fakeView) Job(id string) (*broker.Job, bool) {
	j, ok := v.jobs[id]
	return j, ok
}

func (v *fakeView) Jobs() iter.Seq[*broker.Job] { return maps.Values(v.jobs) }

func (v *fakeView) Reason(id string) (sched.Reason, bool) {
	r, ok := v.reasons[id]
	return r, ok
}

func (v *fakeView) Nodes() []api.NodeView { return v.nodes }

func (v *fakeView) Read(fn func(View)) {
	v.reads++
	fn(v)
}

var t0 = time.Date(2026, 3, 2, 9, 0, 0, 0, time.UTC)

// jobOf is a job of team in queue default asking for gpus on one node.
func jobOf(id, team string, gpus int, state broker.State) *broker.Job {
	return &broker.Job{ID: id, State: state, SubmittedAt: t0.Add(-time.Hour),
		Spec: broker.Spec{Name: "run-" + id, Team: team, Queue: "default", Priority: "normal",
			Resources: broker.Resources{GPUs: gpus, Nodes: 1}}}
}

// pending puts job j in the view as waiting at position pos for code.
func (v *fakeView) pending(j *broker.Job, pos int, code, msg string) {
	j.History = []broker.Transition{{At: j.SubmittedAt, To: broker.StatePending, Reason: "submitted"}}
	v.add(j)
	v.reasons[j.ID] = sched.FixedReason(broker.PendingReason{Code: code, Message: msg, Position: pos})
}

func (v *fakeView) add(j *broker.Job) {
	if v.jobs == nil {
		v.jobs, v.reasons = map[string]*broker.Job{}, map[string]sched.Reason{}
	}
	v.jobs[j.ID] = j
}

// node is a ready node of n cards, held as holders says (card → job).
func node(name string, n int, holders map[int]*broker.Job) api.NodeView {
	v := api.NodeView{Node: &broker.Node{Name: name, State: broker.NodeReady}}
	for i := range n {
		c := api.CardView{Index: i, Model: "NVIDIA H100 80GB HBM3", MemoryBytes: 80 << 30}
		if j := holders[i]; j != nil {
			c.Jobs, c.Teams = []string{j.ID}, []string{j.Spec.Team}
		} else {
			v.FreeGPUs++
		}
		v.Cards = append(v.Cards, c)
	}
	return v
}

func reportsOver(v *fakeView) *Reports {
	cfg := &config.Config{Teams: []config.Team{{Name: "nlp", Quota: &config.Quota{GPUs: 4}}}}
	cfg.Idle.Threshold = 5
	return &Reports{Store: broker.NewMemStore(), Source: v, Clock: clock.NewFake(t0), Config: cfg}
}

func TestExplainReadsTheQueueAndClusterFromTheView(t *testing.T) {
	v := &fakeView{}
	r1 := jobOf("r1", "cv", 2, broker.StateRunning)
	start := t0.Add(-30 * time.Minute)
	r1.StartedAt, r1.Spec.Timeout = &start, broker.Duration(2*time.Hour)
	r1.Placements = []broker.Placement{{Node: "n1", GPUs: []int{0, 1}}}
	v.add(r1)
	a, b, c := jobOf("a", "cv", 1, broker.StatePending), jobOf("b", "nlp", 1, broker.StatePending), jobOf("c", "nlp", 2, broker.StatePending)
	v.pending(a, 1, sched.ReasonResources, "waiting for 1 GPU")
	idx := 3
	b.ArrayIndex = &idx // an array's element
	v.pending(b, 2, sched.ReasonResources, "waiting for 1 GPU")
	v.pending(c, 3, sched.ReasonResources, "waiting for 2 GPUs on one node")
	v.nodes = []api.NodeView{node("n1", 2, map[int]*broker.Job{0: r1, 1: r1})}

	asked := c.Clone()
	asked.Pending = &broker.PendingReason{Code: sched.ReasonResources, Message: "waiting for 2 GPUs on one node", Position: 3}
	x, err := reportsOver(v).Explain(context.Background(), asked, func(team string) bool { return team == "nlp" })
	if err != nil {
		t.Fatal(err)
	}
	if v.reads != 1 {
		t.Errorf("the view was read %d times, want once", v.reads)
	}
	q := x.Queue
	if q == nil || q.Waiting != 3 || len(q.Ahead) != 2 {
		t.Fatalf("queue: %+v", q)
	}
	if a := q.Ahead[0]; a.ID != "" || a.Name != "" || a.Team != "cv" || a.Position != 1 {
		t.Errorf("another team's job ahead shows %+v; want its team and place without id or name", a)
	}
	if b := q.Ahead[1]; b.ID != "b" || b.Name != "run-b" || b.Position != 2 {
		t.Errorf("own team's job ahead: %+v", b)
	}
	// The lines say whose job is ahead by name where the viewer may see it.
	var aheadLines []string
	for _, l := range x.Steps {
		if strings.Contains(l, "ahead:") {
			aheadLines = append(aheadLines, strings.TrimSpace(l))
		}
	}
	if want := []string{"ahead: #1 - team cv normal 1 GPU(s) [resources]", "ahead: #2 b run-b[3] team nlp normal 1 GPU(s) [resources]"}; !slices.Equal(aheadLines, want) {
		t.Errorf("ahead lines %q, want %q", aheadLines, want)
	}
	cl := x.Cluster
	if cl.GPUs != 2 || cl.FreeGPUs != 0 || !cl.Full || len(cl.NodeList) != 1 || len(cl.NodeList[0].Holders) != 1 {
		t.Fatalf("cluster: %+v", cl)
	}
	h := cl.NodeList[0].Holders[0]
	if h.Job != "r1" || h.Team != "cv" || h.GPUs != 2 || h.Ends == nil || !h.Ends.Equal(start.Add(2*time.Hour)) {
		t.Errorf("holder: %+v", h)
	}
	if x.Team.Team != "nlp" || x.Team.HeldGPUs != 0 || x.Team.QuotaGPUs == nil || *x.Team.QuotaGPUs != 4 {
		t.Errorf("team load: %+v", x.Team)
	}
	if x.Verdict.Code != VerdictClusterFull || !strings.Contains(x.Verdict.Sentence, "2 of 2 matching GPUs are in use and the job needs 2; it is 3rd in queue default") {
		t.Errorf("verdict: %+v", x.Verdict)
	}
	if x.Exit != nil || len(x.Steps) < 5 || !strings.HasPrefix(x.Steps[1], "2. Queue default: 3 waiting") {
		t.Errorf("exit %+v, steps %q", x.Exit, x.Steps)
	}
}

// TestExplainShowsHoldersProtectedByThePreemptionLimit: a waiting job's
// explanation marks the holders a higher class may preempt, and those
// scheduler.preemptionLimit protects, and the verdict counts the latter.
func TestExplainShowsHoldersProtectedByThePreemptionLimit(t *testing.T) {
	v := &fakeView{}
	running := func(id string, attempt int) *broker.Job {
		j := jobOf(id, "cv", 1, broker.StateRunning)
		j.Spec.Priority, j.Spec.Preemptible, j.Attempt = "low", true, attempt
		v.add(j)
		return j
	}
	worn := running("worn", 4) // requeued 3 times: protected under a limit of 3
	fresh := running("fresh", 2)
	plain := jobOf("plain", "cv", 1, broker.StateRunning)
	plain.Attempt = 5
	v.add(plain)
	hi := jobOf("hi", "nlp", 2, broker.StatePending)
	hi.Spec.Priority = "high"
	v.pending(hi, 1, sched.ReasonResources, "waiting for 2 GPUs")
	v.nodes = []api.NodeView{node("n1", 3, map[int]*broker.Job{0: worn, 1: fresh, 2: plain})}
	rs := reportsOver(v)
	rs.Config.Scheduler.PreemptionLimit = 3

	asked := hi.Clone()
	asked.Pending = &broker.PendingReason{Code: sched.ReasonResources, Message: "waiting for 2 GPUs", Position: 1}
	x, err := rs.Explain(context.Background(), asked, func(string) bool { return true })
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]api.ExplainHolder{}
	for _, h := range x.Cluster.NodeList[0].Holders {
		got[h.Job] = h
	}
	if h := got["worn"]; !h.Preemptible || !h.Protected || h.Requeues != 3 {
		t.Errorf("worn: %+v, want preemptible, protected, 3 requeues", h)
	}
	if h := got["fresh"]; !h.Preemptible || h.Protected || h.Requeues != 1 {
		t.Errorf("fresh: %+v, want preemptible, not protected, 1 requeue", h)
	}
	if h := got["plain"]; h.Preemptible || h.Protected {
		t.Errorf("plain: %+v, want neither preemptible nor protected (not preemptible, whatever its requeues)", h)
	}
	if !strings.Contains(x.Verdict.Sentence, "1 of them are held by 1 preemptible job(s) requeued as often as scheduler.preemptionLimit allows") {
		t.Errorf("verdict: %q", x.Verdict.Sentence)
	}
	want := "     n1 ready: 0/3 free; held by fresh (cv, 1, preemptible), plain (cv, 1), worn (cv, 1, preemptible but requeued 3 times: scheduler.preemptionLimit protects it)"
	if !slices.Contains(x.Steps, want) {
		t.Errorf("steps %q\nwant the line %q", x.Steps, want)
	}
	// docs/scheduling.md shows this line as its example.
	doc, err := os.ReadFile("../../docs/scheduling.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(doc), want+"\n") {
		t.Errorf("docs/scheduling.md does not show the line %q", want)
	}

	// With no limit nothing is protected, and the verdict says nothing of it.
	rs.Config.Scheduler.PreemptionLimit = 0
	if x, err = rs.Explain(context.Background(), asked, func(string) bool { return true }); err != nil {
		t.Fatal(err)
	}
	for _, h := range x.Cluster.NodeList[0].Holders {
		if h.Protected {
			t.Errorf("no limit: %+v protected", h)
		}
	}
	if strings.Contains(x.Verdict.Sentence, "preemptionLimit") {
		t.Errorf("no limit: verdict %q", x.Verdict.Sentence)
	}
}

func TestExplainReadsTheLastAttemptsLogFromTheStore(t *testing.T) {
	v := &fakeView{}
	j := jobOf("f", "nlp", 1, broker.StateFailed)
	one := 1
	j.Attempt, j.ExitCode = 1, &one
	j.History = []broker.Transition{
		{At: t0.Add(-50 * time.Minute), From: broker.StatePending, To: broker.StateStarting},
		{At: t0.Add(-49 * time.Minute), From: broker.StateStarting, To: broker.StateRunning},
		{At: t0.Add(-10 * time.Minute), From: broker.StateRunning, To: broker.StateFailed, Reason: "exited", Detail: "exit code 1"},
	}
	rs := reportsOver(v)
	log := "step 1\nstep 2\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n"
	err := rs.Store.Update(context.Background(), func(tx broker.Tx) error {
		_, err := broker.AppendLog(tx, j.ID, 1, 0, []byte(log), 1<<20)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	x, err := rs.Explain(context.Background(), j, func(string) bool { return true })
	if err != nil {
		t.Fatal(err)
	}
	e := x.Exit
	if e == nil || e.OOM != "gpu" || !slices.Equal(e.LogTail, strings.Split(strings.TrimSpace(log), "\n")) {
		t.Fatalf("exit: %+v", e)
	}
	if x.Queue != nil || x.Cards != nil {
		t.Errorf("a failed job shows queue %+v and cards %+v", x.Queue, x.Cards)
	}
	if x.Verdict.Code != VerdictGPUOOM || !strings.Contains(x.Verdict.Sentence, "CUDA out of memory") {
		t.Errorf("verdict: %+v", x.Verdict)
	}
}

func TestStarvingListsLongWaitsFromTheView(t *testing.T) {
	v := &fakeView{}
	old, fresh, other := jobOf("old", "nlp", 1, broker.StatePending), jobOf("fresh", "nlp", 1, broker.StatePending), jobOf("other", "cv", 1, broker.StatePending)
	v.pending(old, 1, sched.ReasonQuota, "team nlp at quota 4/4 GPUs")
	v.pending(other, 2, sched.ReasonResources, "waiting for 1 GPU")
	v.pending(fresh, 3, sched.ReasonResources, "waiting for 1 GPU")
	fresh.History[0].At = t0.Add(-10 * time.Minute)
	v.add(jobOf("run", "nlp", 1, broker.StateRunning))

	got := starving(v, t0, 30*time.Minute, "nlp")
	want := []api.StarvingJob{{ID: "old", Team: "nlp", Queue: "default", Priority: "normal", Since: t0.Add(-time.Hour), Reason: "team nlp at quota 4/4 GPUs"}}
	if !slices.Equal(got, want) {
		t.Errorf("starving nlp = %+v, want %+v", got, want)
	}
	if all := starving(v, t0, 30*time.Minute, ""); len(all) != 2 {
		t.Errorf("starving, all teams: %+v", all)
	}
}

func TestSummariseTakesTheNearestRank(t *testing.T) {
	var ds []time.Duration
	for i := 10; i >= 1; i-- {
		ds = append(ds, time.Duration(i)*time.Second)
	}
	got := summarise(ds)
	want := api.Durations{Count: 10, Mean: 5.5, P50: 5, P90: 9, P99: 10, Max: 10}
	if got != want {
		t.Errorf("summarise = %+v, want %+v", got, want)
	}
	if z := summarise(nil); z != (api.Durations{}) {
		t.Errorf("summarise(nil) = %+v", z)
	}
}

// TestExplainListsTheTenJustAhead: a job far back in its queue is shown
// the ten jobs just ahead of it, in queue order, whatever order the view
// yields them in.
func TestExplainListsTheTenJustAhead(t *testing.T) {
	v := &fakeView{}
	var last *broker.Job
	for pos := 1; pos <= 40; pos++ {
		last = jobOf(fmt.Sprintf("j%02d", pos), "nlp", 1, broker.StatePending)
		v.pending(last, pos, sched.ReasonResources, "waiting for 1 GPU")
	}
	asked := last.Clone()
	asked.Pending = &broker.PendingReason{Code: sched.ReasonResources, Position: 40}
	x, err := reportsOver(v).Explain(context.Background(), asked, func(string) bool { return true })
	if err != nil {
		t.Fatal(err)
	}
	var got []int
	for _, a := range x.Queue.Ahead {
		got = append(got, a.Position)
	}
	if want := []int{30, 31, 32, 33, 34, 35, 36, 37, 38, 39}; x.Queue.Waiting != 40 || !slices.Equal(got, want) {
		t.Fatalf("waiting %d, ahead at %v; want 40 waiting and %v", x.Queue.Waiting, got, want)
	}
}
