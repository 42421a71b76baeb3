package burstctl

import (
	"testing"
	"time"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/sched"
)

// TestPendingJobLeavesOutWhatNoMachineWouldStart: a held job and an array
// element waiting for its array's limit are not burst demand; a job
// waiting for cards is.
func TestPendingJobLeavesOutWhatNoMachineWouldStart(t *testing.T) {
	now := time.Date(2026, 12, 4, 22, 0, 0, 0, time.UTC)
	job := func() *broker.Job {
		return &broker.Job{ID: "j", State: broker.StatePending, SubmittedAt: now.Add(-time.Hour),
			Spec: broker.Spec{Team: "nlp", Resources: broker.Resources{GPUs: 1}, Burst: broker.BurstAllowed}}
	}
	if _, ok := PendingJob(Waiting{Job: job(), Why: sched.ReasonResources}, now); !ok {
		t.Fatal("a job waiting for cards is not burst demand")
	}
	held := job()
	held.Hold = &broker.Hold{By: "alice"}
	if _, ok := PendingJob(Waiting{Job: held, Why: sched.ReasonResources}, now); ok {
		t.Fatal("a held job is burst demand")
	}
	limited := job()
	limited.ArrayID, limited.ArrayLimit = "01M91HCAHEZW2WJNY1S27DA3C3", 2
	if _, ok := PendingJob(Waiting{Job: limited, Why: sched.ReasonArrayLimit}, now); ok {
		t.Fatal("an array element waiting for its array's limit is burst demand")
	}
}
