package server

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/sched"
)

// TestPreemptCheckpointAndResume: a high-priority job preempts a
// preemptible low one; the victim's stop order carries its checkpoint
// signal and grace; its exit returns it to the queue (no retry counted,
// its submit time kept); it restarts after the high job with
// SPILLWAY_RESUME=1.
func TestPreemptCheckpointAndResume(t *testing.T) {
	h := newHarness(t)
	a := h.agent("n1", 2)
	low := h.submit(tokAlice, `{"resources": {"gpus": 2}, "priority": "low", "preemptible": true, "timeout": "4h",
		"checkpoint": {"signal": "SIGUSR1", "grace": "90s"}, "command": ["train"]}`)
	h.cycle()
	a.sync()
	a.sync()
	if got := h.job(low.ID); got.State != broker.StateRunning {
		t.Fatalf("low job: %s", got.State)
	}
	h.clock.Step(time.Second)
	a.sync()
	high := h.submit(tokBob, `{"resources": {"gpus": 2}, "priority": "high", "timeout": "1h", "command": ["serve"]}`)
	h.cycle()

	got := h.job(high.ID)
	if got.State != broker.StatePending || got.Pending == nil || got.Pending.Code != sched.ReasonPreempting ||
		!strings.Contains(got.Pending.Message, "preempting 1 job ("+low.ID+") on n1") {
		t.Fatalf("high job: %s %+v", got.State, got.Pending)
	}
	resp := a.sync()
	want := []string{low.ID + " SIGUSR1 1m30s preempted"}
	var orders []string
	for _, o := range resp.Stop {
		orders = append(orders, o.Job+" "+o.Signal+" "+broker.FormatDuration(o.Grace)+" "+o.Reason)
	}
	if d := cmp.Diff(want, orders); d != "" {
		t.Fatalf("stop orders (-want +got):\n%s", d)
	}
	if st := h.job(low.ID).Stop; st == nil || !strings.Contains(st.Detail, "preempted by job "+high.ID+" (priority high over low)") {
		t.Fatalf("stop request: %+v", st)
	}

	// The job checkpoints on SIGUSR1 and exits; it is back in the queue.
	h.clock.Step(10 * time.Second)
	a.exit(low.ID, 0, "")
	a.sync()
	got = h.job(low.ID)
	wantStates := []broker.State{broker.StatePending, broker.StateStarting, broker.StateRunning, broker.StatePreempted, broker.StatePending}
	if d := cmp.Diff(wantStates, states(got)); d != "" {
		t.Fatalf("low job history (-want +got):\n%s", d)
	}
	if got.Retries != 0 || !got.SubmittedAt.Equal(low.SubmittedAt) || got.LastCheckpointAt == nil {
		t.Fatalf("low job after preemption: retries=%d submitted=%v checkpoint=%v", got.Retries, got.SubmittedAt, got.LastCheckpointAt)
	}

	// The high job takes the cards; the low one waits with a reason.
	h.cycle()
	a.sync()
	a.sync()
	if s := h.job(high.ID).State; s != broker.StateRunning {
		t.Fatalf("high job: %s", s)
	}
	if r := h.job(low.ID).Pending; r == nil || r.Code != sched.ReasonResources || r.Position != 1 {
		t.Fatalf("low job's reason: %+v", r)
	}

	// When the high job ends, the low one resumes from its checkpoint.
	a.exit(high.ID, 0, "")
	a.sync()
	h.cycle()
	resp = a.sync()
	if len(resp.Start) != 1 || resp.Start[0].Job != low.ID || resp.Start[0].Attempt != 2 ||
		resp.Start[0].Env["SPILLWAY_RESUME"] != "1" || resp.Start[0].Signal != "SIGUSR1" {
		t.Fatalf("resume order: %+v", resp.Start)
	}
}

// TestSchedFairShareUsageSurvivesRestart: GPU-seconds held by a team's
// jobs are counted from their holding time, decayed, written to the store
// and read back by a restarted broker.
func TestSchedFairShareUsageSurvivesRestart(t *testing.T) {
	h := newHarness(t)
	a := h.agent("n1", 8)
	j := h.submit(tokAlice, `{"resources": {"gpus": 8}, "timeout": "4h", "command": ["train"]}`)
	h.cycle()
	a.sync()
	a.sync()
	h.clock.Step(time.Hour)
	a.sync()
	h.cycle()
	halfLife := h.srv.cfg().Scheduler.FairShareHalfLife.D()
	want := sched.Usage{At: t0}.AddHeld(8, t0, t0.Add(time.Hour), halfLife).GPUSeconds
	before := h.srv.scheduling.ledger.Teams["nlp"]
	if math.Abs(before.GPUSeconds-want) > 1e-6*want || want < 8*3600*0.99 {
		t.Fatalf("usage after an hour of 8 GPUs: %v, want %v", before.GPUSeconds, want)
	}

	h.restart()
	h.cycle()
	after := h.srv.scheduling.ledger.Teams["nlp"]
	if math.Abs(after.GPUSeconds-before.GPUSeconds) > 1e-6*want || !after.At.Equal(before.At) {
		t.Fatalf("usage after restart: %+v, before %+v", after, before)
	}
	if got := h.srv.snapshotLocked(h.clock.Now()).Usage["nlp"]; got != after.GPUSeconds {
		t.Fatalf("snapshot usage %v, ledger %v", got, after.GPUSeconds)
	}

	// The job ends half an hour later: its whole holding time counts, the
	// part before the restart once.
	h.clock.Step(30 * time.Minute)
	a.exit(j.ID, 0, "")
	a.sync()
	h.clock.Step(time.Minute)
	h.cycle()
	want = sched.Usage{At: t0}.AddHeld(8, t0, t0.Add(90*time.Minute), halfLife).DecayTo(t0.Add(91*time.Minute), halfLife).GPUSeconds
	if got := h.srv.scheduling.ledger.Teams["nlp"].GPUSeconds; math.Abs(got-want) > 1e-6*want {
		t.Fatalf("usage after the job ended: %v, want %v", got, want)
	}
}

// TestSchedPendingReasonsServed: every pending job carries its reason with
// its place in the queue, and the head its reservation estimate; team
// vision, which used nothing yet, goes ahead of team nlp (fair share).
func TestSchedPendingReasonsServed(t *testing.T) {
	h := newHarness(t)
	a := h.agent("n1", 8)
	h.submit(tokAlice, `{"resources": {"gpus": 6}, "timeout": "2h", "command": ["train"]}`)
	h.cycle()
	a.sync()
	a.sync()
	h.clock.Step(time.Second)
	a.sync()
	second := h.submit(tokAlice, `{"resources": {"gpus": 8}, "timeout": "1h", "command": ["big"]}`)
	h.clock.Step(time.Second)
	a.sync()
	head := h.submit(tokBob, `{"resources": {"gpus": 8}, "timeout": "1h", "command": ["big"]}`)
	h.cycle()
	r := h.job(head.ID).Pending
	if r == nil || r.Code != sched.ReasonResources || r.Position != 1 || r.EstimatedStart == nil ||
		!r.EstimatedStart.Equal(t0.Add(2*time.Hour)) || !strings.HasSuffix(r.Message, "by reservation") {
		t.Fatalf("head's reason: %+v", r)
	}
	if r := h.job(second.ID).Pending; r == nil || r.Position != 2 || r.EstimatedStart != nil ||
		r.Message != "waiting for 8 GPUs on one node; 2nd in queue default" {
		t.Fatalf("second's reason: %+v", r)
	}
}
