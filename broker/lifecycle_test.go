package broker

import (
	"testing"
	"time"
)

// A preempted or reclaimed job keeps its wait; one moved home by
// spill-back waits anew; a reclaimed attempt's end records the lost work.
func TestWaitingSinceAndEndReclaimed(t *testing.T) {
	t0 := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	newJob := func() *Job {
		j := &Job{ID: "j", State: StatePending, SubmittedAt: t0, Spec: Spec{Checkpoint: Checkpoint{Signal: "SIGTERM", Grace: Duration(time.Minute)}}}
		j.History = []Transition{{At: t0, To: StatePending, Reason: "submitted"}}
		j.Start([]Placement{{Node: "n", GPUs: []int{0}}}, t0.Add(time.Hour))
		started := t0.Add(time.Hour)
		j.StartedAt = &started
		j.Transit(started, StateRunning, "started", "")
		return j
	}
	at := t0.Add(3 * time.Hour)

	j := newJob()
	j.RequestStop("preempted", "", "scheduler", at)
	j.Preempted(at.Add(10*time.Second), "preempted", "")
	if got := j.WaitingSince(); !got.Equal(t0) {
		t.Errorf("preempted: waiting since %s, want the submit %s", got, t0)
	}

	j = newJob()
	j.RequestStop(ReasonSpillBack, "", "burst controller", at)
	j.Preempted(at.Add(10*time.Second), ReasonSpillBack, "")
	if got := j.WaitingSince(); !got.Equal(at.Add(10 * time.Second)) {
		t.Errorf("moved home: waiting since %s, want the requeue", got)
	}

	j = newJob()
	j.Stop = &StopRequest{Reason: ReasonSpotReclaim, Detail: "reclaimed", RequestedAt: at}
	cp := at.Add(-20 * time.Minute)
	j.LastCheckpointAt = &cp
	if lost := j.EndReclaimed(at, "exit 143"); lost != 20*time.Minute {
		t.Errorf("lost %s, want 20m", lost)
	}
	if got := j.WaitingSince(); !got.Equal(t0) || j.State != StatePending || j.Stop != nil || j.Placements != nil {
		t.Errorf("reclaimed: waiting since %s, state %s, stop %v", got, j.State, j.Stop)
	}
	if h := j.History[len(j.History)-2]; h.To != StatePreempted || h.Reason != ReasonSpotReclaim || h.Detail != "reclaimed; lost work: 20m since its last checkpoint; exit 143" {
		t.Errorf("history %+v", h)
	}
}
