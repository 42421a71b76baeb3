// Package sched is the scheduler core: a pure, deterministic function from a
// snapshot of the cluster to a plan. It does no I/O, reads no clock, starts
// no goroutines and never depends on the order of its input or of map
// iteration; the live broker and `spillway sim` drive the very same code.
//
// One cycle, in order (docs/scheduling.md explains each rule):
//
//  1. Build the cluster: ready nodes, their healthy cards, who holds what,
//     indexes of nodes by free-card count per GPU model and per gang pool.
//  2. Stop running jobs past their timeout.
//  3. Order the pending jobs: starved jobs first (FIFO), then latency
//     queues, then priority class, then the multifactor score.
//  4. Walk the order. Each job either starts (placement by the end of
//     protected work, or best fit for preemptible jobs; EASY backfill
//     against the head's reservation), waits for cards already
//     being released, preempts victims that lose the least work, becomes
//     the head with a reservation, or stays pending with a reason.
//  5. Report burst demand: every burst-eligible job left waiting.
package sched

import (
	"time"

	"github.com/spillway-dev/spillway/broker"
)

// Snapshot is everything the scheduler may look at. Schedule does not
// modify it.
type Snapshot struct {
	Now time.Time
	// Nodes are all known nodes; only ready ones receive work.
	Nodes []*broker.Node
	// Jobs are all non-terminal jobs: pending ones to place, and the ones
	// holding GPUs (starting, running).
	Jobs   []*broker.Job
	Policy Policy
	// Usage is each team's decayed GPU-seconds as of Now (see Usage); it
	// feeds the fair-share factor. Teams not present have none.
	Usage map[string]float64
}

// QueueKind separates work that can wait from work that must not.
type QueueKind uint8

// Queue kinds.
const (
	// Batch work (training) can wait.
	Batch QueueKind = iota
	// Latency work is ordered before all batch work and may preempt
	// preemptible batch jobs.
	Latency
)

// QueuePolicy is what the scheduler applies to one queue.
type QueuePolicy struct {
	Kind QueueKind
	// Reserved GPUs are held for this queue: jobs of other queues take
	// them only when preemptible, and this queue takes them back by
	// preemption.
	Reserved int
	// Sharing lets jobs asking for less memory than a card share cards.
	Sharing bool
}

// Quota is a guaranteed number of GPUs and a limit on borrowing above it.
type Quota struct {
	GPUs int
	// BorrowLimit is how many GPUs above GPUs may be used; nil is no limit.
	BorrowLimit *int
}

// TeamPolicy is one team's fair-share weight and quotas.
type TeamPolicy struct {
	// Share weighs the team in fair share; 0 counts as 1.
	Share float64
	// Quota is nil for no guarantee and no limit.
	Quota *Quota
	// Projects are per-project quotas inside the team, by project name.
	Projects map[string]Quota
}

// Weights weigh the factors of the multifactor score (each in [0, 1]).
type Weights struct {
	Age, FairShare, Size int
}

// Policy is the configuration the scheduler applies.
type Policy struct {
	// Priorities maps class name to value; higher runs first. An unknown
	// class counts as 0.
	Priorities map[string]int
	// Queues by name; an unknown queue is batch with no reservation and no
	// sharing.
	Queues map[string]QueuePolicy
	// Teams by name; an unknown team has share 1 and no quota.
	Teams   map[string]TeamPolicy
	Weights Weights
	// FairShareHalfLife is the decay of usage; the caller applies it when
	// it computes Snapshot.Usage (see Usage).
	FairShareHalfLife time.Duration
	// MaxAge is the wait at which the age factor reaches 1.
	MaxAge time.Duration
	// StarvationAge is the wait after which a job is ordered ahead of all
	// jobs that have waited less (0 turns the guard off).
	StarvationAge time.Duration
	// PreemptionLimit is how many times a job may be requeued (preempted,
	// or its node lost) before its attempts are no longer preemptible:
	// a job that loses its cards this often runs its next attempt to the
	// end, as if it were not preemptible. 0 is no limit.
	PreemptionLimit int
	// MaxSharersPerGPU caps the jobs on one shared card (0 means 4).
	MaxSharersPerGPU int
	// GangLabel is the node label a gang's nodes must agree on (with GPU
	// model, card memory, driver version and pool).
	GangLabel string
}

// DefaultPolicy is the policy of the shipped configuration: classes low,
// medium, high; queues default, inference (latency, sharing), high_perf;
// no teams configured. config.Config.Policy builds the same from a file.
func DefaultPolicy() Policy {
	return Policy{
		Priorities: map[string]int{"low": 100, "medium": 200, "high": 300},
		Queues: map[string]QueuePolicy{
			"default":   {Kind: Batch},
			"inference": {Kind: Latency, Sharing: true},
			"high_perf": {Kind: Batch},
		},
		Weights:           Weights{Age: 1000, FairShare: 1000, Size: 0},
		FairShareHalfLife: 7 * 24 * time.Hour,
		MaxAge:            7 * 24 * time.Hour,
		StarvationAge:     24 * time.Hour,
		MaxSharersPerGPU:  4,
		GangLabel:         "fabric",
	}
}

// Start places one pending job.
type Start struct {
	Job        string             `json:"job"`
	Placements []broker.Placement `json:"placements"`
}

// Stop reasons.
const (
	StopTimedOut  = "timed_out"
	StopPreempted = "preempted"
)

// Stop asks a running job to stop: its timeout passed, or it is preempted.
// The server sends the job's checkpoint signal and grace.
type Stop struct {
	Job    string `json:"job"`
	Reason string `json:"reason"` // timed_out | preempted
	Detail string `json:"detail"`
}

// Preemption rules: why a victim could be taken.
const (
	RulePriority = "priority" // the preemptor's class is higher
	RuleLatency  = "latency"  // a latency-queue job takes a batch job's cards
	RuleReclaim  = "reclaim"  // a team (or project) takes back its guarantee from a borrower
	RuleQueue    = "queue"    // a queue takes back its reserved capacity
	RuleQuota    = "quota"    // a job at its team's quota takes its own team's lower-class cards
)

// Preemption explains one victim of the cycle; its Stop is in Plan.Stops.
type Preemption struct {
	Victim string `json:"victim"`
	// For is the pending job the victim makes room for.
	For  string `json:"for"`
	Rule string `json:"rule"`
	// GPUs the victim holds, all its nodes together.
	GPUs int `json:"gpus"`
	// LostWork is the time since the victim's last checkpoint (or start).
	LostWork time.Duration `json:"lostWork"`
}

// Pending reason codes.
const (
	ReasonBackoff       = "backoff"        // retry backoff after a failure
	ReasonQuota         = "quota"          // team or project at its limit
	ReasonArrayLimit    = "array_limit"    // its array runs the most elements it may at once
	ReasonQueueReserved = "queue_reserved" // free cards are reserved for other queues
	ReasonResources     = "resources"      // not enough free cards on one node
	ReasonGang          = "gang"           // not enough nodes for a multi-node job
	ReasonBackfill      = "backfill"       // would delay the head's reservation
	ReasonReleasing     = "releasing"      // cards held for it are being released by stopping jobs
	ReasonPreempting    = "preempting"     // victims were told to stop for it
	ReasonNoFit         = "no_fit"         // no ready node (set) could ever hold it
)

// Pending is the reason one job stays pending (Reason.Queue is its queue).
type Pending struct {
	Job    string `json:"job"`
	Reason Reason `json:"reason"`
	// j is the snapshot's job, for BurstDemand.
	j *broker.Job
	// at1 is the job's index in the snapshot's Jobs plus one (0: not
	// known).
	at1 int32
}

// SnapshotJob is the job as the snapshot had it and its index in the
// snapshot's Jobs, so that a caller holding something per snapshot job
// finds it without a lookup by id; i is -1 (and j nil) when not known.
func (p *Pending) SnapshotJob() (j *broker.Job, i int) {
	if p.at1 == 0 {
		return nil, -1
	}
	return p.j, int(p.at1) - 1
}

// Reservation is the EASY backfill reservation of the head job: when and
// where it is expected to start. Backfilled jobs may not delay it.
type Reservation struct {
	Job   string    `json:"job"`
	At    time.Time `json:"at"`
	Nodes []string  `json:"nodes"`
}

// BurstDemand is one pending job that may run on rented capacity
// (burst: allowed or prefer), with what it needs; the burst controller
// reads it; Plan.BurstDemand lists them.
type BurstDemand struct {
	Job      string             `json:"job"`
	Team     string             `json:"team"`
	Queue    string             `json:"queue"`
	Priority string             `json:"priority"`
	Burst    broker.BurstPolicy `json:"burst"`
	// GPUs per node and Nodes, as in the spec.
	GPUs      int           `json:"gpus"`
	Nodes     int           `json:"nodes"`
	GPUModel  string        `json:"gpuModel,omitempty"`
	GPUMemory int64         `json:"gpuMemory,omitempty"`
	CPU       float64       `json:"cpu,omitempty"`
	Memory    int64         `json:"memory,omitempty"`
	Timeout   time.Duration `json:"timeout"`
	// Preemptible jobs may run on spot capacity.
	Preemptible bool `json:"preemptible"`
	// Waited is how long since the job last entered the queue (submit,
	// requeue after preemption or a lost node, retry): that moment is
	// Snapshot.Now minus Waited.
	Waited time.Duration `json:"waited"`
	// Reason is the job's pending reason code on-prem; EstimatedStart
	// the on-prem estimate, if any.
	Reason         string     `json:"reason"`
	EstimatedStart *time.Time `json:"estimatedStart,omitempty"`
}

// Plan is the scheduler's decision for one cycle.
type Plan struct {
	Starts []Start `json:"starts,omitempty"`
	// Stops are timeouts first (by job id), then preemptions in the order
	// they were decided.
	Stops       []Stop       `json:"stops,omitempty"`
	Preemptions []Preemption `json:"preemptions,omitempty"`
	// Pending holds a reason for every pending job left waiting, in
	// scheduling order.
	Pending []Pending `json:"pending,omitempty"`
	// Reservation is the head job's reservation, if one exists.
	Reservation *Reservation `json:"reservation,omitempty"`
}

// Schedule computes one cycle's plan. It is New().Schedule(s); callers
// that run many cycles keep a Scheduler to reuse its buffers.
func Schedule(s *Snapshot) Plan { return New().Schedule(s) }

// Scheduler runs cycles. It keeps only buffers between cycles, never
// decisions: its plan depends on the snapshot alone. It is not safe for
// concurrent use.
type Scheduler struct {
	c cycle
}

// New returns a Scheduler.
func New() *Scheduler { return &Scheduler{} }

// Schedule computes one cycle's plan from s. The backing array of the
// plan's Pending belongs to the Scheduler and is reused by its next
// Schedule call: copy what must outlive the cycle (the values themselves —
// strings, Reasons — stay valid).
func (sc *Scheduler) Schedule(s *Snapshot) Plan {
	c := &sc.c
	c.reset(s)
	c.buildCluster()
	c.loadJobs()
	c.stopTimedOut()
	c.order()
	c.walk()
	plan := c.finish()
	c.placeBound(&plan)
	return plan
}
