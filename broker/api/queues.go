package api

import (
	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/config"
)

// QueueView is one queue with what is in it now.
type QueueView struct {
	config.Queue
	Pending     int `json:"pending"`
	Running     int `json:"running"`
	GPUsRunning int `json:"gpusRunning"`
	GPUsWaiting int `json:"gpusWaiting"`
	// Waiting lists the head of the queue's waiting jobs in scheduling
	// order (?limit=, 100 unless said), each with its reason (position,
	// what it waits for, estimated start); a user's list holds only the
	// jobs of their own team.
	Waiting []WaitingJob `json:"waiting"`
	// WaitingMore is how many more of those jobs wait behind the list.
	WaitingMore int `json:"waitingMore,omitempty"`
}

// QueueEntry names a waiting job where a queue's order is shown (the
// queue overview, explain's jobs ahead): a viewer sees another team's
// job only by its team, priority and size, with no id or name.
type QueueEntry struct {
	ID   string `json:"id"`
	Name string `json:"name"`
	// ArrayIndex is an array element's index (its name shows as
	// name[index]).
	ArrayIndex *int   `json:"arrayIndex,omitempty"`
	Team       string `json:"team"`
	Priority   string `json:"priority"`
	GPUs       int    `json:"gpus"`
}

// NewQueueEntry names j for a viewer who may see its team's jobs
// (visible) or not.
func NewQueueEntry(j *broker.Job, visible bool) QueueEntry {
	e := QueueEntry{Team: j.Spec.Team, Priority: j.Spec.Priority, GPUs: j.TotalGPUs()}
	if visible {
		e.ID, e.Name, e.ArrayIndex = j.ID, j.Spec.Name, j.ArrayIndex
	}
	return e
}

// WaitingJob is a waiting job in a queue overview.
type WaitingJob struct {
	QueueEntry
	State  broker.State          `json:"state"`
	Reason *broker.PendingReason `json:"reason,omitempty"`
}
