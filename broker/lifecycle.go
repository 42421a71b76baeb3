package broker

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"
)

// The job lifecycle: how a job moves between states when the scheduler,
// the burst controller or an attempt's end moves it. The broker and the
// simulator both change jobs only through these, so a job's path is one
// set of rules wherever it runs.

// Clone copies a job so that a change can be built, written and only then
// swapped in. Slices a transition appends to are copied; Placements' inner
// slices are never changed in place.
func (j *Job) Clone() *Job {
	c := *j
	c.History = slices.Clone(j.History)
	c.Placements = slices.Clone(j.Placements)
	c.Machines = slices.Clone(j.Machines)
	if j.Stop != nil {
		st := *j.Stop
		c.Stop = &st
	}
	if j.Pending != nil {
		p := *j.Pending
		c.Pending = &p
	}
	return &c
}

// WaitingSince is when a job last entered the queue. A job that was
// preempted keeps its original wait, so once its checkpoint grace is over
// it may resume on burst capacity at once instead of waiting for on-prem —
// except a job moved home by spill-back (ReasonSpillBack): the move bet
// on the owned GPUs, so it waits for them anew before it bursts again.
func (j *Job) WaitingSince() time.Time {
	for i := len(j.History) - 1; i >= 0; i-- {
		if j.History[i].To == StatePending {
			if j.History[i].From == StatePreempted && i > 0 && j.History[i-1].Reason == ReasonSpillBack {
				return j.History[i].At
			}
			if j.History[i].From == StatePreempted || j.History[i].Reason == ReasonSpotReclaim {
				return j.SubmittedAt
			}
			return j.History[i].At
		}
	}
	return j.SubmittedAt
}

// LastQueued is when a job last entered the queue: the time the
// scheduler's starvation guard counts from.
func (j *Job) LastQueued() time.Time {
	if n := len(j.History); n > 0 && j.History[n-1].To == StatePending {
		return j.History[n-1].At
	}
	return j.SubmittedAt
}

// Start begins a new attempt on the placements the scheduler chose.
func (j *Job) Start(ps []Placement, now time.Time) {
	j.Attempt++
	j.Placements = ps
	j.Pending, j.Stop, j.ExitCode, j.Signal, j.NotBefore = nil, nil, nil, "", nil
	j.Transit(now, StateStarting, "scheduled", DescribePlacements(ps))
}

// DescribePlacements is "on NODE GPUs 0,1; NODE GPUs 2".
func DescribePlacements(ps []Placement) string {
	parts := make([]string, len(ps))
	for i, p := range ps {
		idx := make([]string, len(p.GPUs))
		for k, g := range p.GPUs {
			idx[k] = fmt.Sprint(g)
		}
		parts[i] = fmt.Sprintf("%s GPUs %s", p.Node, strings.Join(idx, ","))
	}
	return "on " + strings.Join(parts, "; ")
}

// RequestStop asks a holding job to stop with its checkpoint signal and
// grace; it reports false when the job is not holding cards or already
// asked.
func (j *Job) RequestStop(reason, detail, by string, now time.Time) bool {
	if j.Stop != nil || !j.State.Holding() {
		return false
	}
	j.Stop = &StopRequest{Reason: reason, Detail: detail, Signal: j.Spec.Checkpoint.Signal,
		Grace: j.Spec.Checkpoint.Grace.D(), RequestedAt: now, By: by}
	return true
}

// Bind moves a waiting job to provisioning on burst machine machine; it
// reports false when the job is not waiting.
func (j *Job) Bind(machine string, now time.Time, detail string) bool {
	if j.State != StatePending {
		return false
	}
	j.Machine, j.Machines = machine, nil
	j.Transit(now, StateProvisioning, "burst", detail)
	return true
}

// BindGroup moves a waiting gang to provisioning on a group of burst
// machines, one per member; it reports false when the job is not waiting.
func (j *Job) BindGroup(machines []string, now time.Time, detail string) bool {
	if j.State != StatePending || len(machines) == 0 {
		return false
	}
	j.Machine, j.Machines = machines[0], slices.Clone(machines)
	j.Transit(now, StateProvisioning, "burst", detail)
	return true
}

// BoundTo reports whether the job waits for burst machine id (alone or
// as one of its gang's machines).
func (j *Job) BoundTo(id string) bool {
	if j.State != StateProvisioning || j.Machine == "" {
		return false
	}
	return j.Machine == id || slices.Contains(j.Machines, id)
}

// BoundMachines are the burst machines the job waits for: its gang's
// group, or its one machine.
func (j *Job) BoundMachines() []string {
	if len(j.Machines) > 0 {
		return j.Machines
	}
	if j.Machine != "" {
		return []string{j.Machine}
	}
	return nil
}

// Unbind returns a job waiting for a burst machine to the queue.
func (j *Job) Unbind(now time.Time, why string) {
	j.Machine, j.Machines = "", nil
	j.Transit(now, StatePending, "burst_failed", why)
}

// Preempted ends an attempt that stopped for a preemption at ended: its
// work is saved in its checkpoint, and it goes back to the queue unbound,
// to resume on-prem or burst anew.
func (j *Job) Preempted(ended time.Time, reason, detail string) {
	j.Transit(ended, StatePreempted, reason, detail)
	t := ended
	j.LastCheckpointAt = &t
	j.Placements, j.Stop, j.Machine, j.Machines = nil, nil, "", nil
	j.Transit(ended, StatePending, "requeued", "resumes from its checkpoint when placed again")
}

// Lose records that a job's attempt vanished with its node (or agent) at
// lostAt, noticed now: back to the queue, unless the job must never be
// restarted.
func (j *Job) Lose(lostAt, now time.Time, reason, detail string) {
	j.Transit(lostAt, StateLost, reason, detail)
	if j.Spec.RestartPolicy == RestartNever && !j.Spec.Preemptible {
		j.Transit(now, StateFailed, reason, "restartPolicy Never: not requeued")
		return
	}
	j.Placements, j.Stop, j.Machine, j.Machines = nil, nil, "", nil
	j.Transit(now, StatePending, "requeued", "back in the queue after "+reason)
}

// ReasonSpotReclaim is the stop reason of an attempt stopped because its
// burst machine is being reclaimed by the provider (agentapi uses the
// same word on the wire). Such a job keeps its original wait.
const ReasonSpotReclaim = "spot_reclaim"

// ReasonSpillBack is the stop reason of an attempt stopped to move the job
// from a burst machine home (burst.StopSpillBack).
const ReasonSpillBack = "spill_back"

// EndReclaimed ends an attempt stopped because its spot machine was taken
// back by the provider (Stop.Reason ReasonSpotReclaim), at ended: back to
// the queue at the head of its class (ReasonSpotReclaim keeps the job's
// wait, WaitingSince), to resume from its last committed checkpoint on
// another machine. exit describes how the attempt ended. It returns the
// work lost: the time from the last committed checkpoint (or the
// attempt's start) to ended, recorded in the history. The broker (an
// agent's end report) and the simulator both end reclaimed attempts with
// it.
func (j *Job) EndReclaimed(ended time.Time, exit string) time.Duration {
	saved := j.StartedAt
	if j.LastCheckpointAt != nil && (saved == nil || j.LastCheckpointAt.After(*saved)) {
		saved = j.LastCheckpointAt
	}
	var lost time.Duration
	why := "no work lost: the checkpoint was committed after the job stopped"
	if saved != nil && ended.After(*saved) {
		lost = ended.Sub(*saved)
		why = fmt.Sprintf("lost work: %s since its last checkpoint", FormatDuration(lost.Truncate(time.Second)))
	}
	detail := ""
	if j.Stop != nil {
		detail = j.Stop.Detail
	}
	j.Transit(ended, StatePreempted, ReasonSpotReclaim, JoinDetail(detail, JoinDetail(why, exit)))
	from := "its last checkpoint"
	if j.Data != nil && cmp.Or(j.Data.Checkpoint, j.Data.Restored) != "" {
		from = "checkpoint " + cmp.Or(j.Data.Checkpoint, j.Data.Restored)
	}
	j.Placements, j.Stop, j.Machine, j.Machines = nil, nil, "", nil
	j.Transit(ended, StatePending, "requeued", "resumes from "+from+" on another machine")
	return lost
}

// JoinDetail joins two parts of a transition's detail with "; ",
// leaving out an empty one.
func JoinDetail(a, b string) string {
	switch {
	case a == "":
		return b
	case b == "":
		return a
	}
	return a + "; " + b
}
