package api

import (
	"time"

	"github.com/spillway-dev/spillway/broker"
)

// ArraySubmitted is the answer to an array submit: the array's id and its
// elements' job ids, in index order.
type ArraySubmitted struct {
	ArrayID string   `json:"arrayId"`
	Count   int      `json:"count"`
	Jobs    []string `json:"jobs"`
	Indexes []int    `json:"indexes"`
}

// ArrayCancelled is the answer to cancelling an array: its jobs that
// ended now (they were waiting), those asked to stop (they ran: checkpoint
// signal, grace, kill; each is cancelled when its agent reports the end),
// and how many had ended before. Ids are in index order.
type ArrayCancelled struct {
	ArrayID   string   `json:"arrayId"`
	Count     int      `json:"count"`
	Cancelled []string `json:"cancelled"`
	Stopping  []string `json:"stopping"`
	Ended     int      `json:"ended"`
}

// ArrayView is one array at a glance (GET /v1/arrays/{id}): what its
// elements share, how many are in each state, which indexes still wait
// and why, as Slurm's squeue shows an array's waiting elements on one
// line.
type ArrayView struct {
	ArrayID     string    `json:"arrayId"`
	Name        string    `json:"name,omitempty"`
	Team        string    `json:"team"`
	Queue       string    `json:"queue"`
	Priority    string    `json:"priority"`
	User        string    `json:"user"`
	GPUs        int       `json:"gpus"` // each element's
	SubmittedAt time.Time `json:"submittedAt"`
	Count       int       `json:"count"`
	// Limit is the most elements running at once (0: no limit).
	Limit int `json:"limit"`
	// Indexes are the array's indexes, PendingIndexes those still
	// waiting, both as ranges ("0-999", "12,15-999").
	Indexes        string `json:"indexes"`
	PendingIndexes string `json:"pendingIndexes"`
	// States counts the elements in each state; Waiting the waiting ones
	// by the code of their reason (held, array_limit, no_capacity, …);
	// Held those held.
	States  map[broker.State]int `json:"states"`
	Waiting map[string]int       `json:"waiting"`
	Held    int                  `json:"held"`
}

// Active is how many of the array's elements have not ended.
func (v ArrayView) Active() int {
	n := 0
	for st, k := range v.States {
		if !st.Terminal() {
			n += k
		}
	}
	return n
}

// ArrayChanged is the answer to holding or releasing an array or setting
// its limit: the elements changed by the call, in index order, and the
// array as it is after it.
type ArrayChanged struct {
	ArrayID string    `json:"arrayId"`
	Changed []string  `json:"changed"`
	Array   ArrayView `json:"array"`
}

// ArrayLimitRequest is the body of PUT /v1/arrays/{id}/limit.
type ArrayLimitRequest struct {
	// Limit is the most elements running at once from now on; 0 lifts
	// the limit. Required.
	Limit  *int   `json:"limit"`
	Reason string `json:"reason,omitempty"`
}
