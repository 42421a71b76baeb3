package server

import (
	"net/http"
	"slices"
	"strings"

	"github.com/spillway-dev/spillway/broker/api"

	"github.com/labstack/echo/v4"

	"github.com/spillway-dev/spillway/broker"
)

// listQueues serves GET /v1/queues: every queue, its load, and its
// waiting jobs in order. Users see other teams' waiting jobs only as
// counts.
func (s *Server) listQueues(c echo.Context) error {
	p := principal(c)
	s.lock()
	views := make([]api.QueueView, 0, len(s.cfg().Queues))
	index := map[string]int{}
	for i, q := range s.cfg().Queues {
		views = append(views, api.QueueView{Queue: q, Waiting: []api.WaitingJob{}})
		index[q.Name] = i
	}
	var jobs []*broker.Job
	for j := range s.view.Jobs() {
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
		views[index[j.Spec.Queue]].Waiting = append(views[index[j.Spec.Queue]].Waiting, api.WaitingJob{ID: j.ID, Name: j.Spec.Name,
			Team: j.Spec.Team, Priority: j.Spec.Priority, GPUs: j.TotalGPUs(), State: j.State, Reason: jj.Pending})
	}
	for i := range views {
		slices.SortFunc(views[i].Waiting, func(a, b api.WaitingJob) int {
			pa, pb := position(a), position(b)
			if pa != pb {
				return pa - pb
			}
			return strings.Compare(a.ID, b.ID)
		})
	}
	return c.JSON(http.StatusOK, map[string]any{"queues": views})
}

func position(w api.WaitingJob) int {
	if w.Reason == nil || w.Reason.Position == 0 {
		return 1 << 30
	}
	return w.Reason.Position
}
