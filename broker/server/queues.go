package server

import (
	"net/http"
	"slices"
	"strings"

	"github.com/labstack/echo/v4"

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

// listQueues serves GET /v1/queues: every queue, its load, and its
// waiting jobs in order. Users see other teams' waiting jobs only as
// counts.
func (s *Server) listQueues(c echo.Context) error {
	p := principal(c)
	s.mu.Lock()
	views := make([]QueueView, 0, len(s.cfg().Queues))
	index := map[string]int{}
	for i, q := range s.cfg().Queues {
		views = append(views, QueueView{Queue: q, Waiting: []WaitingJob{}})
		index[q.Name] = i
	}
	var jobs []*broker.Job
	for _, j := range s.jobs {
		i, ok := index[j.Spec.Queue]
		if !ok {
			continue
		}
		v := &views[i]
		switch {
		case j.State.Holding():
			v.Running++
			v.GPUsRunning += j.TotalGPUs()
		case j.State == broker.StatePending || j.State == broker.StateProvisioning:
			v.Pending++
			v.GPUsWaiting += j.TotalGPUs()
			if canSeeTeam(p, j.Spec.Team) {
				jobs = append(jobs, j)
			}
		}
	}
	s.mu.Unlock()
	for _, j := range jobs {
		jj := *j
		s.overlayReason(&jj)
		views[index[j.Spec.Queue]].Waiting = append(views[index[j.Spec.Queue]].Waiting, WaitingJob{ID: j.ID, Name: j.Spec.Name,
			Team: j.Spec.Team, Priority: j.Spec.Priority, GPUs: j.TotalGPUs(), State: j.State, Reason: jj.Pending})
	}
	for i := range views {
		slices.SortFunc(views[i].Waiting, func(a, b WaitingJob) int {
			pa, pb := position(a), position(b)
			if pa != pb {
				return pa - pb
			}
			return strings.Compare(a.ID, b.ID)
		})
	}
	return c.JSON(http.StatusOK, map[string]any{"queues": views})
}

func position(w WaitingJob) int {
	if w.Reason == nil || w.Reason.Position == 0 {
		return 1 << 30
	}
	return w.Reason.Position
}
