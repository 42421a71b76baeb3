package api

import (
	"github.com/spillway-dev/spillway/billing"
	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/burst"
)

// InstanceView is a burst machine as the API shows it.
type InstanceView struct {
	*broker.InstanceRecord
	// Age is how long since the decision to launch it.
	Age string `json:"age"`
	// CostSoFar is the machine's cost in the ledger (usage and overhead).
	CostSoFar billing.Amount `json:"costSoFar"`
	Currency  string         `json:"currency"`
	// RunningJobs hold its cards now; WaitingJobs are bound to it.
	RunningJobs []string `json:"runningJobs,omitempty"`
	WaitingJobs []string `json:"waitingJobs,omitempty"`
}

// BurstPlan is the body of GET /v1/burst/plan.
type BurstPlan struct {
	Decision burst.Decision `json:"decision"`
	Input    *burst.Input   `json:"input"`
	// Providers are the configured providers' names; none means the
	// broker cannot burst at all.
	Providers []string `json:"providers"`
}

// BudgetView is one budget with this month's money.
type BudgetView struct {
	broker.Budget
	Month     string         `json:"month"`
	Spent     billing.Amount `json:"spent"`
	Reserved  billing.Amount `json:"reserved"`
	Remaining billing.Amount `json:"remaining"`
	UsedRatio float64        `json:"usedRatio"`
}

// BudgetRequest is the body of PUT /v1/budgets/:scope.
type BudgetRequest struct {
	// Limit is the monthly budget as a decimal string ("5000", "1250.50").
	Limit string `json:"limit"`
}
