package api

import (
	"time"

	"github.com/spillway-dev/spillway/billing"
)

// UnitsReport is one report of output a job produced.
type UnitsReport struct {
	Job     string    `json:"job"`
	Team    string    `json:"team"`
	Project string    `json:"project,omitempty"`
	Queue   string    `json:"queue"`
	Kind    string    `json:"kind"`
	Units   int64     `json:"units"`
	At      time.Time `json:"at"`
	By      string    `json:"by"`
	// ID is the sender's idempotency id, if it gave one: a report sent
	// twice with the same id counts once.
	ID string `json:"id,omitempty"`
}

// UnitsRequest is the body of POST /v1/jobs/{id}/units.
type UnitsRequest struct {
	Units int64  `json:"units"`
	Kind  string `json:"kind"`
	ID    string `json:"id,omitempty"`
}

// UnitsAnswer is the body of a units report's answer: the report and the
// job's total of that kind so far.
type UnitsAnswer struct {
	UnitsReport
	Total int64 `json:"total"`
	// Duplicate is true when the id was seen before and nothing was added.
	Duplicate bool `json:"duplicate,omitempty"`
}

// Durations summarises a set of durations in seconds.
type Durations struct {
	Count int     `json:"count"`
	Mean  float64 `json:"meanSeconds"`
	P50   float64 `json:"p50Seconds"`
	P90   float64 `json:"p90Seconds"`
	P99   float64 `json:"p99Seconds"`
	Max   float64 `json:"maxSeconds"`
}

// DeliveryRow is one queue and priority class over the period.
type DeliveryRow struct {
	Queue    string `json:"queue"`
	Priority string `json:"priority"`
	// Wait is every wait that ended with a start in the period: from
	// submit (or the return to the queue) to being scheduled.
	Wait Durations `json:"wait"`
	// Completion is submit to end of the jobs that ended in the period.
	Completion Durations `json:"completion"`
	Succeeded  int       `json:"succeeded"`
	Failed     int       `json:"failed"`
	TimedOut   int       `json:"timedOut"`
	Cancelled  int       `json:"cancelled"`
	// SuccessRate is succeeded / (succeeded + failed + timed out), 0..1;
	// cancelled jobs are the user's choice and do not count.
	SuccessRate float64 `json:"successRate"`
	Preemptions int     `json:"preemptions"`
	// Resumes counts attempts started after a preemption.
	Resumes int `json:"resumes"`
	// Starved counts waits that passed reports.starvationAfter within the
	// period.
	Starved int `json:"starved"`
}

// StarvingJob is a job waiting past the starvation bound now.
type StarvingJob struct {
	ID       string    `json:"id"`
	Team     string    `json:"team"`
	Queue    string    `json:"queue"`
	Priority string    `json:"priority"`
	Since    time.Time `json:"since"`
	Reason   string    `json:"reason,omitempty"`
}

// UnitCost is the output a team reported of one kind and what the jobs
// that produced it cost in the period.
type UnitCost struct {
	Team  string `json:"team"`
	Kind  string `json:"kind"`
	Units int64  `json:"units"`
	Jobs  int    `json:"jobs"`
	// GPUMillis and Cost are the ledger's for those jobs in the period.
	GPUMillis int64          `json:"gpuMillis"`
	Cost      billing.Amount `json:"cost"`
	// CostPer1000 is Cost per 1,000 units, rounded half away from zero.
	CostPer1000 billing.Amount `json:"costPer1000"`
	// GPUSecondsPer1000 is GPU-time per 1,000 units.
	GPUSecondsPer1000 float64 `json:"gpuSecondsPer1000"`
}

// DeliveryReport is the body of GET /v1/reports/delivery.
type DeliveryReport struct {
	Period          billing.Period `json:"period"`
	Team            string         `json:"team,omitempty"`
	StarvationAfter string         `json:"starvationAfter"`
	Rows            []DeliveryRow  `json:"rows"`
	Total           DeliveryRow    `json:"total"`
	Starving        []StarvingJob  `json:"starving"`
	Units           []UnitCost     `json:"units"`
	Currency        string         `json:"currency,omitempty"`
}
