package server

import (
	"fmt"
	"net/http"
	"slices"
	"strconv"

	"github.com/spillway-dev/spillway/broker/api"

	"github.com/labstack/echo/v4"

	"github.com/spillway-dev/spillway/broker"
)

// submitArray stores one job per index of an array spec, all in one
// transaction (the whole array or none of it), and answers 201 with their
// ids. Each element is a job of its own: its own history, attempts,
// ledger lines and SPILLWAY_ARRAY_INDEX.
func (s *Server) submitArray(c echo.Context, p api.Principal, spec broker.Spec) error {
	idx, limit, err := broker.ParseArray(spec.Array)
	if err != nil {
		return errBadRequest("array", broker.CodeInvalid, "%v", err)
	}
	if err := s.checkPendingRoom(spec.Team, len(idx)); err != nil {
		return err
	}
	now := s.clock.Now()
	// The array's id and its elements' in one go: consecutive, in index
	// order (broker.ListJobs finds the elements by that range).
	ids := s.ids.nextN(now, len(idx)+1)
	arrayID := ids[0]
	out := api.ArraySubmitted{ArrayID: arrayID, Count: len(idx), Jobs: make([]string, len(idx)), Indexes: idx}
	jobs := make([]*broker.Job, len(idx))
	detail := "by " + p.Name + " (array " + arrayID + ")"
	for k := range idx {
		j := &broker.Job{ID: ids[k+1], Spec: spec, User: p.Name, State: broker.StatePending, SubmittedAt: now,
			ArrayID: arrayID, ArrayIndex: &idx[k], ArrayLimit: limit}
		j.Spec.Array = "" // the element is one job; ArrayID and ArrayIndex say where it belongs
		j.History = []broker.Transition{{At: now, To: broker.StatePending, Reason: "submitted", Detail: detail}}
		s.strs.job(j)
		jobs[k] = j
		out.Jobs[k] = j.ID
	}
	ctx := c.Request().Context()
	audit, audited := s.auditInTx(c, http.StatusCreated)
	s.submitted.window.RLock()
	err = s.store.Update(withCommit(ctx, commitSubmit, len(jobs)), func(tx broker.Tx) error {
		if audit != nil {
			if err := audit(tx); err != nil {
				return err
			}
		}
		for _, j := range jobs {
			if err := broker.PutJob(tx, j); err != nil {
				return err
			}
		}
		return nil
	})
	if err == nil {
		s.queueSubmitted(jobs...)
	}
	s.submitted.window.RUnlock()
	if err != nil {
		return fmt.Errorf("store array: %w", err)
	}
	audited()
	for _, j := range jobs {
		s.metrics.observeTransition(nil, j)
	}
	s.metrics.submitted.WithLabelValues(spec.Queue).Add(float64(len(jobs)))
	s.log.Info("job array submitted", "array", arrayID, "jobs", len(jobs), "team", spec.Team, "queue", spec.Queue,
		"gpus_each", jobs[0].TotalGPUs(), "user", p.Name)
	s.kick()
	return c.JSON(http.StatusCreated, out)
}

// cancelArray cancels every element of an array that has not ended, in
// one commit, as Slurm's scancel does given an array's id: waiting ones end
// at once, running ones get their checkpoint signal, grace and kill.
func (s *Server) cancelArray(c echo.Context) error {
	id := c.Param("id")
	p := principal(c)
	ctx := c.Request().Context()
	var elems []*broker.Job
	err := s.store.View(ctx, func(tx broker.Tx) error {
		var err error // an id that is no array's finds none
		elems, _, err = broker.ListJobs(tx, broker.JobFilter{Array: id, Limit: broker.MaxArraySize})
		return err
	})
	if err != nil {
		return err
	}
	if len(elems) == 0 || !canSeeTeam(p, elems[0].Spec.Team) {
		return newError(http.StatusNotFound, "not_found", "array %s not found", clip(id))
	}
	out := api.ArrayCancelled{ArrayID: id, Count: len(elems), Cancelled: []string{}, Stopping: []string{}}
	s.lock()
	defer s.mu.Unlock()
	now := s.clock.Now()
	var changed []*broker.Job
	for _, e := range slices.Backward(elems) { // the listing is newest first: highest index first
		cur := s.view.Job(e.ID)
		if cur == nil {
			out.Ended++
			continue
		}
		jj := cloneJob(cur)
		if !requestCancel(jj, p.Name, now) {
			out.Stopping = append(out.Stopping, jj.ID)
			continue
		}
		changed = append(changed, jj)
	}
	if out.Ended == len(elems) {
		return newError(http.StatusConflict, "conflict", "array %s already ended (%d jobs)", id, len(elems))
	}
	if err := s.commitLocked(ctx, changed, nil, nil); err != nil {
		return err
	}
	for _, jj := range changed {
		for _, n := range jj.Nodes() {
			s.wakeNodeLocked(n)
		}
		if jj.State.Terminal() {
			out.Cancelled = append(out.Cancelled, jj.ID)
		} else {
			out.Stopping = append(out.Stopping, jj.ID)
		}
	}
	s.log.Info("job array cancel requested", "array", id, "by", p.Name, "cancelled", len(out.Cancelled),
		"stopping", len(out.Stopping), "ended_before", out.Ended)
	return c.JSON(http.StatusOK, out)
}

// addArrayEnv gives an array element its index and its array's id.
func addArrayEnv(j *broker.Job, env map[string]string) {
	if j.ArrayIndex == nil {
		return
	}
	env["SPILLWAY_ARRAY_INDEX"] = strconv.Itoa(*j.ArrayIndex)
	env["SPILLWAY_ARRAY_JOB_ID"] = j.ArrayID
}
