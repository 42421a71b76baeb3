package sim

import (
	"time"

	"github.com/spillway-dev/spillway/broker"
)

// TraceFromJobs turns the broker's job records into a trace: each job's
// submit time, its run time summed over its attempts (from each start to
// the attempt's end, as its history records them), its GPUs, team,
// priority and queue. Jobs that never ran are left out.
func TraceFromJobs(jobs []*broker.Job) *Trace {
	tr := &Trace{Location: time.UTC}
	for _, j := range jobs {
		d := RunTime(j)
		if d <= 0 {
			continue
		}
		tr.Jobs = append(tr.Jobs, Job{ID: j.ID, Submit: j.SubmittedAt.UTC(), Duration: d, GPUs: j.TotalGPUs(),
			Team: j.Spec.Team, Priority: j.Spec.Priority, Queue: j.Spec.Queue})
	}
	sortJobs(tr.Jobs)
	return tr
}

// RunTime is the time a job spent running, over all its attempts.
func RunTime(j *broker.Job) time.Duration {
	var total time.Duration
	var since time.Time
	running := false
	for _, tr := range j.History {
		if running && tr.To != broker.StateRunning {
			total += tr.At.Sub(since)
			running = false
		}
		if tr.To == broker.StateRunning && !running {
			since, running = tr.At, true
		}
	}
	return total
}
