// Package agentapi is the wire protocol between a Spillway agent and the
// broker: JSON over HTTP under /v1/agent, authenticated with an agent token.
//
// The protocol is state-driven so that either side may restart at any
// moment. The agent reports what it runs and what has ended (until the
// broker acknowledges it); the broker answers with the complete set of
// orders for the node — attempts to start and attempts to stop — derived
// from its store each time. Repeating an order or a report is harmless:
// every one names the job and its attempt number.
package agentapi

import (
	"time"

	"github.com/spillway-dev/spillway/onprem/gpu"
	"github.com/spillway-dev/spillway/onprem/staging"
)

// Paths of the agent endpoints.
const (
	PathRegister = "/v1/agent/register"
	PathSync     = "/v1/agent/sync"
)

// RegisterRequest is sent once per agent process start.
type RegisterRequest struct {
	Node         string            `json:"node"`
	Labels       map[string]string `json:"labels,omitempty"`
	Inventory    gpu.Inventory     `json:"inventory"`
	CPU          float64           `json:"cpu"`
	Memory       int64             `json:"memory"`
	AgentVersion string            `json:"agentVersion"`
	// Unhealthy carries cards the agent already knows are bad (index → why).
	Unhealthy map[int]string `json:"unhealthy,omitempty"`
}

// RegisterResponse gives the agent its generation and cadence.
type RegisterResponse struct {
	Generation        uint64        `json:"generation"`
	HeartbeatInterval time.Duration `json:"heartbeatInterval"`
}

// JobRef names one attempt of one job.
type JobRef struct {
	Job     string `json:"job"`
	Attempt int    `json:"attempt"`
}

// RunState is what the agent knows of an attempt.
type RunState string

// Run states reported by the agent.
const (
	RunRunning RunState = "running"
	RunExited  RunState = "exited" // the process group is gone; see ExitCode/Signal
	// RunFailedToStart: the process could not be started (bad path,
	// permission); ExitCode is 127 by convention.
	RunFailedToStart RunState = "failed_to_start"
)

// JobReport is the agent's account of one attempt.
type JobReport struct {
	JobRef
	State     RunState  `json:"state"`
	StartedAt time.Time `json:"startedAt"`
	EndedAt   time.Time `json:"endedAt,omitempty"`
	ExitCode  int       `json:"exitCode"`
	Signal    string    `json:"signal,omitempty"` // the signal that killed it
	// Reason explains an end the agent caused itself: timed_out (the
	// agent's own timeout), stopped (a broker stop order), not_assigned
	// (the broker gave the job away), leak_cleanup…
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
	// LogSize is how many bytes of log the agent holds for the attempt.
	LogSize int64 `json:"logSize"`
	// Data is the attempt's staging: inputs, checkpoint, outputs.
	Data *DataReport `json:"data,omitempty"`
	// Preflight is a gang member's report from the start barrier.
	Preflight *Preflight `json:"preflight,omitempty"`
	// ReadBytes is what the job's processes have read from storage so far
	// (/proc/PID/io read_bytes, summed over its process group).
	ReadBytes int64 `json:"readBytes,omitempty"`
	// Progress is what a starting attempt waits for ("pulling image
	// 1.2/4.0 GB"); empty once it runs.
	Progress string `json:"progress,omitempty"`
}

// LogChunk is a piece of an attempt's log starting at byte Offset.
type LogChunk struct {
	JobRef
	Offset int64  `json:"offset"`
	Data   []byte `json:"data"`
}

// SyncRequest is the heartbeat: the agent's whole state, new log bytes and
// a telemetry sample.
type SyncRequest struct {
	Node       string      `json:"node"`
	Generation uint64      `json:"generation"`
	Jobs       []JobReport `json:"jobs"`
	Logs       []LogChunk  `json:"logs,omitempty"`
	Telemetry  *gpu.Sample `json:"telemetry,omitempty"`
	// Owners maps the PIDs in Telemetry to the job each belongs to, as far
	// as the agent can tell (process group or inherited SPILLWAY_JOB_ID).
	Owners    map[int]string `json:"owners,omitempty"`
	Unhealthy map[int]string `json:"unhealthy,omitempty"`
	Leaks     []Leak         `json:"leaks,omitempty"`
	// Cache is the node's input cache.
	Cache *staging.CacheStats `json:"cache,omitempty"`
	// Notices are the provider's interruption notices this agent has
	// read (a burst machine only), repeated in every heartbeat.
	Notices []Notice `json:"notices,omitempty"`
	// Wait asks the broker to hold the answer up to this long when it has
	// no new orders (long poll).
	Wait time.Duration `json:"wait,omitempty"`
}

// Leak is a process the agent found on a card after the job that owned it
// ended, and what it did about it.
type Leak struct {
	GPU    string `json:"gpu"`
	PID    int    `json:"pid"`
	Job    string `json:"job,omitempty"`
	Killed bool   `json:"killed"`
	Error  string `json:"error,omitempty"`
}

// Assignment orders the agent to start one attempt.
type Assignment struct {
	JobRef
	Name    string            `json:"name"`
	Team    string            `json:"team"`
	Argv    []string          `json:"argv"`
	Env     map[string]string `json:"env,omitempty"`
	Workdir string            `json:"workdir,omitempty"`
	// GPUs are the card indexes and UUIDs on this node.
	GPUs  []int    `json:"gpus"`
	UUIDs []string `json:"uuids"`
	// MemoryShare is the per-card memory the job may use when it shares
	// cards (bytes; 0 for whole cards).
	MemoryShare int64 `json:"memoryShare,omitempty"`
	// ComputeShare is the percentage of each card's compute for a shared
	// card, exported as CUDA_MPS_ACTIVE_THREAD_PERCENTAGE where MPS runs.
	ComputeShare int           `json:"computeShare,omitempty"`
	Timeout      time.Duration `json:"timeout"`
	Signal       string        `json:"signal"`
	Grace        time.Duration `json:"grace"`
	// Gang describes a multi-node job: this node's rank and all peers.
	Rank  int      `json:"rank,omitempty"`
	Peers []string `json:"peers,omitempty"`
	// Gang is set for a member of a multi-node job: the agent holds the
	// command at the start barrier until the broker releases it.
	Gang *Gang `json:"gang,omitempty"`
	// Data is what the agent stages around the attempt.
	Data *Data `json:"data,omitempty"`
	// Runtime fields: the user the node maps to a uid, the image (oci
	// runtime), the allowed mounts, the memory limit and /dev/shm size in
	// bytes, and the uploaded workdir to unpack (GET PathUploads+hash).
	User          string  `json:"user,omitempty"`
	Image         string  `json:"image,omitempty"`
	Mounts        []Mount `json:"mounts,omitempty"`
	Memory        int64   `json:"memory,omitempty"`
	ShmSize       int64   `json:"shmSize,omitempty"`
	WorkdirUpload string  `json:"workdirUpload,omitempty"`
}

// Data is what the agent stages around an attempt (docs/data.md).
type Data struct {
	Inputs     []staging.Input  `json:"inputs,omitempty"`
	Outputs    []staging.Output `json:"outputs,omitempty"`
	Checkpoint *DataCheckpoint  `json:"checkpoint,omitempty"`
}

// DataCheckpoint is a checkpoint that travels: Dir synced to To after the
// stop signal and grace and every Interval, restored before the attempt.
type DataCheckpoint struct {
	Dir      string        `json:"dir"`
	To       string        `json:"to"`
	Keep     int           `json:"keep"`
	Interval time.Duration `json:"interval,omitempty"`
	// RestoreOnly: restore, but leave uploads to rank 0 of a gang.
	RestoreOnly bool `json:"restoreOnly,omitempty"`
}

// Staging phases of an attempt.
const (
	PhaseRestore    = "restore"    // fetching the last checkpoint
	PhaseInputs     = "inputs"     // fetching inputs
	PhaseRunning    = "running"    // the job's process runs
	PhaseCheckpoint = "checkpoint" // uploading the checkpoint after a stop
	PhaseOutputs    = "outputs"    // uploading outputs
	PhaseDone       = "done"
)

// DataReport is the staging state of an attempt.
type DataReport struct {
	Phase string `json:"phase"`
	// Done and Total are the bytes of the current phase.
	Done  int64 `json:"done"`
	Total int64 `json:"total"`
	// Spans are the times the agent spent staging (before the start and
	// after the end), charged as the job's staging overhead.
	Spans []Span `json:"spans,omitempty"`
	// Restored is the checkpoint the attempt started from, if any.
	Restored string `json:"restored,omitempty"`
	// Checkpoint is the newest checkpoint this attempt committed, and when.
	Checkpoint   string    `json:"checkpoint,omitempty"`
	CheckpointAt time.Time `json:"checkpointAt,omitempty"`
	// InputBytes, CacheHitBytes: what the inputs weighed and how much of
	// it the node's cache held.
	InputBytes    int64 `json:"inputBytes,omitempty"`
	CacheHitBytes int64 `json:"cacheHitBytes,omitempty"`
	// Error is the staging failure, with the location it concerns.
	Error string `json:"error,omitempty"`
}

// Span is a stretch of time; an open one has a zero End.
type Span struct {
	Start time.Time `json:"start"`
	End   time.Time `json:"end,omitempty"`
}

// Reasons an agent gives for data failures.
const (
	// ReasonInputMissing: an input does not exist; not retried.
	ReasonInputMissing = "input_missing"
	// ReasonStagingFailed: inputs or the checkpoint could not be fetched.
	ReasonStagingFailed = "staging_failed"
	// ReasonOutputsFailed: the outputs could not be uploaded.
	ReasonOutputsFailed = "outputs_failed"
)

// Mount is one mount of an attempt, already checked against the
// operator's allow-list by the broker.
type Mount struct {
	Source   string `json:"source"`
	Target   string `json:"target"`
	ReadOnly bool   `json:"readOnly,omitempty"`
}

// PathUploads is where an agent fetches an uploaded workdir archive:
// GET PathUploads + "sha256:<hex>".
const PathUploads = "/v1/agent/uploads/"

// Runtime failure reasons an agent reports in JobReport.Reason.
const (
	ReasonImageNotFound = "image_not_found"
	ReasonPullDenied    = "pull_denied"
	ReasonPullFailed    = "pull_failed"
	ReasonOOMLimit      = "oom_limit"
	ReasonOOMNode       = "oom_node"
	ReasonRuntimeError  = "runtime_error"
)

// StopOrder orders the agent to stop one attempt: Signal, then Grace, then
// SIGKILL of the process group.
type StopOrder struct {
	JobRef
	Signal string        `json:"signal"`
	Grace  time.Duration `json:"grace"`
	Reason string        `json:"reason"`
}

// SyncResponse is the broker's full set of orders for the node.
type SyncResponse struct {
	Start []Assignment `json:"start,omitempty"`
	Stop  []StopOrder  `json:"stop,omitempty"`
	// Gang are orders for gang members held at the start barrier.
	Gang []GangOrder `json:"gang,omitempty"`
	// Ack lists ended attempts the broker has recorded; the agent may
	// forget them.
	Ack []JobRef `json:"ack,omitempty"`
	// LogOffsets tells, per attempt ("job/attempt"), how many log bytes
	// the broker holds, so the agent sends only the rest.
	LogOffsets        map[string]int64 `json:"logOffsets,omitempty"`
	HeartbeatInterval time.Duration    `json:"heartbeatInterval"`
}

// ErrorBody is the JSON error shape of every API response.
type ErrorBody struct {
	Error struct {
		Code    string `json:"code"`
		Message string `json:"message"`
		Field   string `json:"field,omitempty"`
	} `json:"error"`
}
