package api

import (
	"time"

	"github.com/spillway-dev/spillway/broker"
)

// Explanation is the body of GET /v1/jobs/{id}/explain: the walk an
// operator does by hand when someone asks "why is my job not running" —
// the job's state and history, the queue ahead of it, the nodes and who
// holds their cards, the processes on the job's own cards, its log tail
// and exit — ending in one verdict.
type Explanation struct {
	Job     *broker.Job    `json:"job"`
	State   ExplainState   `json:"state"`
	Queue   *ExplainQueue  `json:"queue,omitempty"`
	Cluster ExplainCluster `json:"cluster"`
	Cards   []ExplainCard  `json:"cards,omitempty"`
	Exit    *ExplainExit   `json:"exit,omitempty"`
	// Moves are the job's spill-backs: its moves from a burst machine
	// home, each with the expected saving that decided it.
	Moves []broker.Transition `json:"moves,omitempty"`
	// Reclaims are the attempts its provider took back (spot
	// interruptions), each with the work lost since the last checkpoint.
	Reclaims []broker.Transition `json:"reclaims,omitempty"`
	Verdict  ExplainVerdict      `json:"verdict"`
	At       time.Time           `json:"at"`
	Steps    []string            `json:"steps"`
	Team     ExplainTeamLoad     `json:"team"`
}

// ExplainState is step 1: where the job is and how it got there.
type ExplainState struct {
	State broker.State `json:"state"`
	// Since is when the job entered its state.
	Since time.Time `json:"since"`
	// Recent are the last transitions, oldest first.
	Recent  []broker.Transition `json:"recent"`
	Attempt int                 `json:"attempt"`
	Retries int                 `json:"retries"`
}

// ExplainQueue is step 2: the job's place among the waiting.
type ExplainQueue struct {
	Queue    string                `json:"queue"`
	Priority string                `json:"priority"`
	Reason   *broker.PendingReason `json:"reason,omitempty"`
	// Waiting counts the pending jobs of the queue.
	Waiting int `json:"waiting"`
	// Ahead are the queue's pending jobs placed before this one (at most
	// 10, nearest last).
	Ahead []QueuedJob `json:"ahead,omitempty"`
}

// QueuedJob is one waiting job ahead of the explained one.
type QueuedJob struct {
	QueueEntry
	Position int    `json:"position"`
	Reason   string `json:"reason,omitempty"`
}

// ExplainTeamLoad is what the job's team holds now, for quota answers.
type ExplainTeamLoad struct {
	Team        string `json:"team"`
	HeldGPUs    int    `json:"heldGpus"`
	RunningJobs int    `json:"runningJobs"`
	// QuotaGPUs and BorrowLimit echo the config (nil: none).
	QuotaGPUs   *int `json:"quotaGpus,omitempty"`
	BorrowLimit *int `json:"borrowLimit,omitempty"`
}

// ExplainCluster is step 3: is the cluster full, and who holds the cards
// the job could use (cards of its gpuModel when it names one).
type ExplainCluster struct {
	Nodes      int `json:"nodes"`
	ReadyNodes int `json:"readyNodes"`
	// GPUs counts healthy cards on ready nodes that match the job's model.
	GPUs      int `json:"gpus"`
	FreeGPUs  int `json:"freeGpus"`
	HeldGPUs  int `json:"heldGpus"`
	Unhealthy int `json:"unhealthyGpus"`
	// MostFreeOnOneNode is the largest number of free matching cards on
	// one node.
	MostFreeOnOneNode int  `json:"mostFreeOnOneNode"`
	Full              bool `json:"full"`
	// NeedsPerNode and NeedsNodes repeat what the job asks for.
	NeedsPerNode int           `json:"needsPerNode"`
	NeedsNodes   int           `json:"needsNodes"`
	NodeList     []ExplainNode `json:"nodeList"`
}

// ExplainNode is one node of the overview.
type ExplainNode struct {
	Name     string            `json:"name"`
	State    broker.NodeState  `json:"state"`
	Model    string            `json:"model,omitempty"`
	GPUs     int               `json:"gpus"`
	Free     int               `json:"free"`
	Matches  bool              `json:"matches"`
	Holders  []ExplainHolder   `json:"holders,omitempty"`
	Sampled  *time.Time        `json:"sampledAt,omitempty"`
	Labels   map[string]string `json:"labels,omitempty"`
	Unusable int               `json:"unhealthy,omitempty"`
}

// ExplainHolder is a job holding cards on a node.
type ExplainHolder struct {
	Job      string `json:"job"`
	Team     string `json:"team"`
	Priority string `json:"priority"`
	GPUs     int    `json:"gpus"`
	// Ends is when its timeout ends it at the latest.
	Ends *time.Time `json:"ends,omitempty"`
	// Preemptible: the job asked to be preemptible (spec.preemptible), and
	// a higher class may take its cards — unless Protected.
	Preemptible bool `json:"preemptible,omitempty"`
	// Requeues is how many times it was requeued (preempted, node lost).
	Requeues int `json:"requeues,omitempty"`
	// Protected: a preemptible job requeued scheduler.preemptionLimit
	// times, which is not preempted again.
	Protected bool `json:"protected,omitempty"`
}

// ExplainCard is step 4: one of the job's cards, and whether it computes.
type ExplainCard struct {
	Node            string `json:"node"`
	Index           int    `json:"index"`
	Model           string `json:"model"`
	MemoryBytes     int64  `json:"memoryBytes"`
	MemoryUsedBytes int64  `json:"memoryUsedBytes"`
	// SMUtil is the latest compute utilisation (nil: no telemetry).
	SMUtil    *int             `json:"smUtil,omitempty"`
	Computing bool             `json:"computing"`
	Processes []ExplainProcess `json:"processes,omitempty"`
	SampledAt *time.Time       `json:"sampledAt,omitempty"`
}

// ExplainProcess is a compute process on a card and the job it belongs to
// ("" when it is no Spillway job's).
type ExplainProcess struct {
	PID         int    `json:"pid"`
	MemoryBytes int64  `json:"memoryBytes"`
	Job         string `json:"job,omitempty"`
}

// ExplainExit is step 5: how the last attempt ended.
type ExplainExit struct {
	Attempt  int    `json:"attempt"`
	ExitCode *int   `json:"exitCode,omitempty"`
	Signal   string `json:"signal,omitempty"`
	Reason   string `json:"reason,omitempty"`
	Detail   string `json:"detail,omitempty"`
	// OOM is "gpu" or "host" when the attempt ran out of memory.
	OOM string `json:"oom,omitempty"`
	// Evidence is the log line (or exit) the OOM verdict rests on.
	Evidence string   `json:"evidence,omitempty"`
	LogTail  []string `json:"logTail,omitempty"`
	// Runtime is the node runtime's own account of the end (image not
	// found, pull denied, OOM-killed by the memory limit, exit code),
	// shown before the log.
	Runtime string `json:"runtime,omitempty"`
}

// ExplainVerdict is the most likely reason, as a code and one sentence
// saying what to do.
type ExplainVerdict struct {
	Code     string `json:"code"`
	Sentence string `json:"sentence"`
}
