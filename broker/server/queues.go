package server

import (
	"cmp"
	"net/http"
	"strconv"
	"strings"

	"github.com/spillway-dev/spillway/broker/api"

	"github.com/labstack/echo/v4"

	"github.com/spillway-dev/spillway/broker"
)

// queueWaitingDefault and queueWaitingMax bound the waiting jobs GET
// /v1/queues lists per queue (?limit=): the head of each queue, in
// order, and the count of the rest. A queue of 100,000 waiting jobs is
// not one answer of 100,000 rows; where a job further back stands, its
// explain says.
const (
	queueWaitingDefault = 100
	queueWaitingMax     = 1000
)

// listQueues serves GET /v1/queues: every queue, its load, and the head
// of its waiting jobs in order. Users see other teams' waiting jobs only
// as counts.
func (s *Server) listQueues(c echo.Context) error {
	p := principal(c)
	limit := queueWaitingDefault
	if l := c.QueryParam("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 || n > queueWaitingMax {
			return errBadRequest("limit", broker.CodeOutOfRange, "must be between 1 and %d", queueWaitingMax)
		}
		limit = n
	}
	// The head of each queue's visible waiting jobs, kept while the jobs
	// are read under the lock (a job behind the head costs one
	// comparison), ordered outside it.
	s.lock()
	views := make([]api.QueueView, 0, len(s.cfg().Queues))
	index := map[string]int{}
	for i, q := range s.cfg().Queues {
		views = append(views, api.QueueView{Queue: q, Waiting: []api.WaitingJob{}})
		index[q.Name] = i
	}
	heads := make([]*broker.Head[waiting], len(views))
	seen := make([]int, len(views)) // visible waiting jobs of each queue
	for i := range heads {
		heads[i] = broker.NewHead(limit, compareWaiting)
	}
	for j, h := range s.view.JobHandles() {
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
				pos := 1 << 30 // no place yet (not seen by a cycle): last
				if r, ok := s.view.ReasonAt(h); ok && r.Position() > 0 {
					pos = r.Position()
				}
				heads[i].Offer(waiting{j, pos})
				seen[i]++
			}
		}
	}
	s.mu.Unlock()
	var shown []*broker.Job
	for i, h := range heads {
		views[i].WaitingMore = seen[i] - h.Len()
		for _, w := range h.Sorted() {
			jj := *w.j // the record is replaced, never changed, when the job changes
			shown = append(shown, &jj)
		}
	}
	s.overlayReasons(shown)
	for _, j := range shown {
		v := &views[index[j.Spec.Queue]]
		v.Waiting = append(v.Waiting, api.WaitingJob{QueueEntry: api.NewQueueEntry(j, true), State: j.State, Reason: j.Pending})
	}
	return c.JSON(http.StatusOK, map[string]any{"queues": views})
}

// waiting is a job waiting in a queue, with its place (1 << 30 when no
// cycle has placed it yet).
type waiting struct {
	j   *broker.Job
	pos int
}

func compareWaiting(a, b waiting) int {
	return cmp.Or(cmp.Compare(a.pos, b.pos), strings.Compare(a.j.ID, b.j.ID))
}
