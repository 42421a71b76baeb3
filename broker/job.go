package broker

import (
	"time"
)

// State is where a job is in its life. The legal moves are:
//
//	pending → (provisioning) → starting → running → succeeded | failed | cancelled | timed_out
//	running → preempted → pending      (checkpointed, back in the queue)
//	running → lost → pending           (its node died)
//	pending → cancelled
type State string

// Job states.
const (
	StatePending      State = "pending"
	StateProvisioning State = "provisioning"
	StateStarting     State = "starting"
	StateRunning      State = "running"
	StateSucceeded    State = "succeeded"
	StateFailed       State = "failed"
	StateCancelled    State = "cancelled"
	StateTimedOut     State = "timed_out"
	StatePreempted    State = "preempted"
	StateLost         State = "lost"
)

// AllStates lists every state, in lifecycle order.
var AllStates = []State{StatePending, StateProvisioning, StateStarting, StateRunning,
	StateSucceeded, StateFailed, StateCancelled, StateTimedOut, StatePreempted, StateLost}

// Terminal reports whether no further transition can happen.
func (s State) Terminal() bool {
	switch s {
	case StateSucceeded, StateFailed, StateCancelled, StateTimedOut:
		return true
	}
	return false
}

// Holding reports whether a job in this state holds GPUs on a node.
func (s State) Holding() bool { return s == StateStarting || s == StateRunning }

// Valid reports whether s is a known state.
func (s State) Valid() bool {
	for _, k := range AllStates {
		if s == k {
			return true
		}
	}
	return false
}

// Transition is one entry of a job's history.
type Transition struct {
	At     time.Time `json:"at"`
	From   State     `json:"from,omitempty"`
	To     State     `json:"to"`
	Reason string    `json:"reason"`           // machine-readable code, e.g. "scheduled", "exited", "node_lost"
	Detail string    `json:"detail,omitempty"` // what a person reads
}

// Placement is where one node's share of a job runs.
type Placement struct {
	Node string `json:"node"`
	// GPUs are the card indexes on the node and UUIDs their UUIDs, in the
	// same order; CUDA_VISIBLE_DEVICES is set from UUIDs.
	GPUs  []int    `json:"gpus"`
	UUIDs []string `json:"uuids"`
	// MemoryShare is the GPU memory in bytes the job may use on each card
	// when it shares cards with other jobs; 0 means whole cards.
	MemoryShare int64 `json:"memoryShare,omitempty"`
	// Ended is set when this member of a gang has ended while other
	// members still run (they are being stopped with their grace).
	Ended *MemberEnd `json:"ended,omitempty"`
}

// StopRequest records why the broker asked a running job to stop. The agent
// sends Signal, waits Grace, then kills the process group.
type StopRequest struct {
	Reason      string        `json:"reason"` // cancelled | preempted | timed_out | idle_reclaimed | node_drain
	Detail      string        `json:"detail,omitempty"`
	Signal      string        `json:"signal"`
	Grace       time.Duration `json:"grace"`
	RequestedAt time.Time     `json:"requestedAt"`
	By          string        `json:"by,omitempty"`
}

// PendingReason says why a job is not running, in a form both a program and
// a person can act on.
type PendingReason struct {
	Code string `json:"code"` // e.g. quota, resources, gang, backfill, budget, below_threshold
	// Message is the sentence shown to people, e.g. "team nlp at quota 16/16 GPUs".
	Message string `json:"message"`
	// Position is the 1-based place of the job in its queue's order.
	Position int `json:"position,omitempty"`
	// EstimatedStart is when the scheduler's reservation expects the job to
	// start, if it has one.
	EstimatedStart *time.Time `json:"estimatedStart,omitempty"`
}

// Job is a submitted spec and everything that has happened to it since.
type Job struct {
	ID   string `json:"id"`
	Spec Spec   `json:"spec"`
	// User is the name of the token that submitted the job.
	User  string `json:"user"`
	State State  `json:"state"`

	SubmittedAt time.Time  `json:"submittedAt"`
	StartedAt   *time.Time `json:"startedAt,omitempty"` // start of the current or last attempt
	EndedAt     *time.Time `json:"endedAt,omitempty"`   // when it reached a terminal state

	// Attempt counts starts; an agent report names the attempt it is about,
	// so a report from an earlier attempt can never change a later one.
	Attempt int `json:"attempt"`
	// Retries counts restarts after failures (restartPolicy OnFailure).
	// Preemptions and lost nodes do not count.
	Retries int `json:"retries"`
	// NotBefore holds a job back from scheduling until then (retry backoff).
	NotBefore *time.Time `json:"notBefore,omitempty"`

	// Machine is the burst machine (its record id) the burst controller
	// bound the job to; the job waits for it in state provisioning.
	Machine string `json:"machine,omitempty"`
	// Machines are a gang's burst machines, one per member in member
	// order (Machine is the first); empty for a job bound to one machine.
	Machines []string `json:"machines,omitempty"`
	// Hold keeps a pending job out of scheduling and bursting until it is
	// released (spillway job hold/release).
	Hold *Hold `json:"hold,omitempty"`

	Placements []Placement `json:"placements,omitempty"`
	// GangPort is MASTER_PORT of the current attempt of a gang (0 for
	// single-node jobs); AvoidPairs are node pairs a failed preflight
	// found unfit to run this job together (broker/gang.go).
	GangPort   int            `json:"gangPort,omitempty"`
	AvoidPairs []NodePair     `json:"avoidPairs,omitempty"`
	Stop       *StopRequest   `json:"stop,omitempty"`
	ExitCode   *int           `json:"exitCode,omitempty"`
	Signal     string         `json:"signal,omitempty"` // the signal that ended the last attempt
	Pending    *PendingReason `json:"pendingReason,omitempty"`

	// LastCheckpointAt is the last time the job is known to have saved its
	// work (a completed preemption, or a report from the job); preemption
	// prefers victims that lose the least work since then.
	LastCheckpointAt *time.Time `json:"lastCheckpointAt,omitempty"`

	// IdleSince is set while the job's cards have computed under the idle
	// threshold for longer than the idle window: since when.
	IdleSince *time.Time `json:"idleSince,omitempty"`

	// ArrayID is the array this job is an element of, ArrayIndex its
	// index there (SPILLWAY_ARRAY_INDEX); both empty for a plain job.
	ArrayID    string `json:"arrayId,omitempty"`
	ArrayIndex *int   `json:"arrayIndex,omitempty"`
	// ArrayLimit is the most elements of the array that run at once
	// (--array 0-999%10), 0 for no limit.
	ArrayLimit int `json:"arrayLimit,omitempty"`
	// Data is the staging of the current attempt (inputs, checkpoint,
	// outputs); CheckpointStep is the step the job last reported saved
	// (POST /v1/jobs/{id}/checkpoint); DataWait flags GPUs waiting on data.
	Data           *JobData  `json:"data,omitempty"`
	CheckpointStep *int64    `json:"checkpointStep,omitempty"`
	DataWait       *DataWait `json:"dataWait,omitempty"`
	// Progress is what a starting attempt waits for on its node ("pulling
	// image 1.2/4.0 GB"); filled in from memory when the job is read.
	Progress string `json:"progress,omitempty"`

	History []Transition `json:"history"`
}

// Nodes returns the names of the nodes the job is placed on.
func (j *Job) Nodes() []string {
	out := make([]string, 0, len(j.Placements))
	for _, p := range j.Placements {
		out = append(out, p.Node)
	}
	return out
}

// TotalGPUs is the number of GPUs the job holds when running.
func (j *Job) TotalGPUs() int { return j.Spec.Resources.GPUs * j.Spec.Resources.Nodes }

// Transit moves the job to state to at time at and records why.
func (j *Job) Transit(at time.Time, to State, reason, detail string) {
	j.History = append(j.History, Transition{At: at, From: j.State, To: to, Reason: reason, Detail: detail})
	j.State = to
	if to.Terminal() {
		t := at
		j.EndedAt = &t
	}
}

// Hold is who held a job, when and why.
type Hold struct {
	By     string    `json:"by"`
	At     time.Time `json:"at"`
	Reason string    `json:"reason,omitempty"`
}
