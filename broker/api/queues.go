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
	// Waiting lists the queue's waiting jobs in scheduling order, each with
	// its reason (position, what it waits for, estimated start).
	Waiting []WaitingJob `json:"waiting"`
}

// WaitingJob is a waiting job in a queue overview.
type WaitingJob struct {
	ID       string                `json:"id"`
	Name     string                `json:"name"`
	Team     string                `json:"team"`
	Priority string                `json:"priority"`
	GPUs     int                   `json:"gpus"`
	State    broker.State          `json:"state"`
	Reason   *broker.PendingReason `json:"reason,omitempty"`
}
