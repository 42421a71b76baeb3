package server

import (
	"cmp"
	"container/heap"
	"net/http"
	"slices"
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
	heads := make([]queueHead, len(views))
	for i := range heads {
		heads[i].n = limit
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
				heads[i].offer(waiting{j, pos})
			}
		}
	}
	s.mu.Unlock()
	var shown []*broker.Job
	for i := range heads {
		views[i].WaitingMore = heads[i].seen - len(heads[i].h)
		for _, w := range heads[i].ordered() {
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

// queueHead keeps the first n of the waiting jobs offered to it, in any
// order of offer: a max-heap of at most n, the last kept on top, so that
// a job behind them costs one comparison. seen counts every offer.
type queueHead struct {
	n    int
	seen int
	h    []waiting
}

func (q *queueHead) offer(w waiting) {
	q.seen++
	if len(q.h) < q.n {
		heap.Push((*waitingHeap)(&q.h), w)
		return
	}
	if compareWaiting(w, q.h[0]) >= 0 {
		return
	}
	q.h[0] = w
	heap.Fix((*waitingHeap)(&q.h), 0)
}

// ordered returns the kept jobs, first in the queue first.
func (q *queueHead) ordered() []waiting {
	slices.SortFunc(q.h, compareWaiting)
	return q.h
}

// waitingHeap is container/heap's view of queueHead.h: the last in the
// queue on top.
type waitingHeap []waiting

func (h waitingHeap) Len() int           { return len(h) }
func (h waitingHeap) Less(i, j int) bool { return compareWaiting(h[i], h[j]) > 0 }
func (h waitingHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *waitingHeap) Push(x any)        { *h = append(*h, x.(waiting)) }
func (h *waitingHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}
