package server

import (
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/spillway-dev/spillway/broker/api"

	"github.com/labstack/echo/v4"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/sched"
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
	if capN := s.cfg().Limits.MaxPendingPerTeam; len(idx) > capN {
		// No wait makes room for it: not a 429 to retry.
		return errBadRequest("array", broker.CodeOutOfRange, "has %d elements, more than the %d pending jobs limits.maxPendingPerTeam allows a team; submit it in parts of at most %d, or ask an operator to raise the limit", len(idx), capN, capN)
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

// loadArray reads the elements of the array named by the path's id, in
// index order; an id that names no array, or another team's, is "not
// found", as a job's is.
func (s *Server) loadArray(c echo.Context) (string, []*broker.Job, error) {
	id := c.Param("id")
	var elems []*broker.Job
	err := s.store.View(c.Request().Context(), func(tx broker.Tx) error {
		// An id that is no array's finds none.
		pg, err := broker.ListJobs(tx, broker.JobFilter{Array: id, Limit: broker.MaxArraySize})
		elems = pg.Jobs
		return err
	})
	if err != nil {
		return "", nil, err
	}
	if len(elems) == 0 || !canSeeTeam(principal(c), elems[0].Spec.Team) {
		return "", nil, newError(http.StatusNotFound, "not_found", "array %s not found", clip(id))
	}
	slices.Reverse(elems) // the listing is newest first: highest index first
	return id, elems, nil
}

// getArray answers GET /v1/arrays/{id}: the array at a glance, as
// Slurm's squeue shows an array's pending elements on one line.
func (s *Server) getArray(c echo.Context) error {
	id, elems, err := s.loadArray(c)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, arrayView(id, elems, s.waitingCodes(elems)))
}

// fillCodes sets codes[i] to code(elems[i]) for each waiting element.
func fillCodes(codes []string, elems []*broker.Job, code func(*broker.Job) string) []string {
	for i, j := range elems {
		if j.State == broker.StatePending {
			codes[i] = code(j)
		}
	}
	return codes
}

// waitingCodes is the code of each waiting element's reason (arrayView's
// codes), read under the lock waitingCodesChunk elements at a time: an
// array or a folded page may have 100,000 waiting elements, and the
// look-ups take tens of milliseconds that submits and agents would
// otherwise wait for.
func (s *Server) waitingCodes(elems []*broker.Job) []string {
	codes := make([]string, len(elems))
	for from := 0; from < len(elems); from += waitingCodesChunk {
		to := min(len(elems), from+waitingCodesChunk)
		s.lock()
		fillCodes(codes[from:to], elems[from:to], s.waitingCodeLocked)
		s.mu.Unlock()
	}
	return codes
}

// waitingCodesChunk is how many reasons waitingCodes reads a lock.
const waitingCodesChunk = 4096

// arrayView sums up an array's elements (in any order), counting the
// waiting ones by their reason's code, codes[i] for elems[i].
func arrayView(id string, elems []*broker.Job, codes []string) api.ArrayView {
	first := elems[0]
	v := api.ArrayView{ArrayID: id, Name: first.Spec.Name, Team: first.Spec.Team, Queue: first.Spec.Queue,
		Priority: first.Spec.Priority, User: first.User, GPUs: first.TotalGPUs(), SubmittedAt: first.SubmittedAt,
		Count: len(elems), States: map[broker.State]int{}, Waiting: map[string]int{}}
	pending, all := make([]int, 0, len(elems)), make([]int, 0, len(elems))
	var lastEnd time.Time
	active := false
	for i, j := range elems {
		v.States[j.State]++
		if j.ArrayIndex != nil {
			all = append(all, *j.ArrayIndex)
		}
		// The active elements carry the array's limit now; once all have
		// ended, the last to end carries the last limit set.
		switch {
		case !j.State.Terminal():
			v.Limit, active = j.ArrayLimit, true
		case !active && j.EndedAt != nil && !j.EndedAt.Before(lastEnd):
			v.Limit, lastEnd = j.ArrayLimit, *j.EndedAt
		}
		if j.State != broker.StatePending {
			continue
		}
		if j.ArrayIndex != nil {
			pending = append(pending, *j.ArrayIndex)
		}
		if j.Hold != nil {
			v.Held++
		}
		c := codes[i]
		if c == "" {
			c = "waiting"
		}
		v.Waiting[c]++
	}
	slices.Sort(all)
	slices.Sort(pending)
	v.Indexes, v.PendingIndexes = broker.FormatIndexes(all), broker.FormatIndexes(pending)
	return v
}

// cancelArray cancels every element of an array that has not ended, in
// one commit, as Slurm's scancel does given an array's id: waiting ones end
// at once, running ones get their checkpoint signal, grace and kill.
func (s *Server) cancelArray(c echo.Context) error {
	id, elems, err := s.loadArray(c)
	if err != nil {
		return err
	}
	p := principal(c)
	ctx := c.Request().Context()
	out := api.ArrayCancelled{ArrayID: id, Count: len(elems), Cancelled: []string{}, Stopping: []string{}}
	s.lock()
	defer s.mu.Unlock()
	now := s.clock.Now()
	var changed []*broker.Job
	for _, e := range elems {
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

// arrayControl handles POST /v1/arrays/{id}/hold and /release, as
// Slurm's scontrol hold and release given an array's id: every waiting
// element is held (or released) in one commit; elements that run or
// ended are left as they are.
func (s *Server) arrayControl(action string) echo.HandlerFunc {
	hold := action == "hold"
	return func(c echo.Context) error {
		req, err := readControl(c)
		if err != nil {
			return err
		}
		return s.changeArray(c, "array."+action, func(j *broker.Job, by string, now time.Time) (string, bool) {
			if j.State != broker.StatePending {
				return "", false
			}
			return setHold(j, hold, by, req.Reason, now)
		}, func(view api.ArrayView, changed int) (string, string, error) {
			if view.States[broker.StatePending] == 0 {
				return "", "", newError(http.StatusConflict, "conflict", "array %s has no waiting jobs to %s (only a waiting job can be held; cancel the others)", view.ArrayID, action)
			}
			return "", fmt.Sprintf("%sd %d jobs%s", map[bool]string{true: "hel", false: "release"}[hold], changed, reasonSuffix(req.Reason)), nil
		})
	}
}

// setArrayLimit handles PUT /v1/arrays/{id}/limit: the most elements of
// the array running at once from now on (0: no limit), as Slurm's
// scontrol update ArrayTaskThrottle. Elements already running above a
// lowered limit go on; no more start until fewer run.
func (s *Server) setArrayLimit(c echo.Context) error {
	var req api.ArrayLimitRequest
	if err := decodeStrictBody(c, 4096, &req); err != nil {
		return err
	}
	switch {
	case req.Limit == nil:
		return errBadRequest("limit", broker.CodeRequired, "is required: the most elements running at once, or 0 for no limit")
	case *req.Limit < 0 || *req.Limit > broker.MaxArraySize:
		return errBadRequest("limit", broker.CodeOutOfRange, "must be a whole number from 0 (no limit) to %d", broker.MaxArraySize)
	case len(req.Reason) > 200:
		return errBadRequest("reason", broker.CodeTooLong, "must be at most 200 characters")
	}
	limit := *req.Limit
	var old int
	return s.changeArray(c, "array.limit", func(j *broker.Job, by string, now time.Time) (string, bool) {
		old = j.ArrayLimit
		if j.ArrayLimit == limit {
			return "", false
		}
		j.ArrayLimit = limit
		return fmt.Sprintf("array limit %s → %s by %s%s", limitText(old), limitText(limit), by, reasonSuffix(req.Reason)), true
	}, func(view api.ArrayView, changed int) (string, string, error) {
		if view.Active() == 0 {
			return "", "", newError(http.StatusConflict, "conflict", "array %s already ended (%d jobs)", view.ArrayID, view.Count)
		}
		return limitText(old), limitText(limit), nil
	})
}

// limitText is an array limit as people read it.
func limitText(n int) string {
	if n == 0 {
		return "none"
	}
	return "%" + strconv.Itoa(n)
}

// changeArray applies change to a copy of every element of the array
// that has not ended and commits the elements it changed, with one audit
// record, in one commit. change edits j and says what it did (the
// element's history detail), or false to leave it. check sees the array
// as it was and how many elements changed, and says the audit record's
// old and new values, or refuses the call. The answer is the array as it
// is now, with the ids changed.
func (s *Server) changeArray(c echo.Context, action string, change func(j *broker.Job, by string, now time.Time) (string, bool),
	check func(view api.ArrayView, changed int) (string, string, error)) error {
	id, elems, err := s.loadArray(c)
	if err != nil {
		return err
	}
	p := principal(c)
	ctx := c.Request().Context()
	s.lock()
	defer s.mu.Unlock()
	if err := s.checkLeaderLocked(); err != nil {
		return err
	}
	now := s.clock.Now()
	var changed []*broker.Job
	for k, e := range elems {
		cur := s.view.Job(e.ID)
		if cur == nil {
			continue // ended: the store's record is the last word
		}
		jj := cloneJob(cur)
		elems[k] = jj
		detail, ok := change(jj, p.Name, now)
		if !ok {
			continue
		}
		jj.History = append(jj.History, broker.Transition{At: now, From: jj.State, To: jj.State, Reason: action[len("array."):], Detail: detail})
		changed = append(changed, jj)
	}
	view := arrayView(id, elems, fillCodes(make([]string, len(elems)), elems, pendingCode))
	oldVal, newVal, err := check(view, len(changed))
	if err != nil {
		return err
	}
	rec := broker.AuditRecord{At: now, By: p.Name, Action: action, Target: id, Old: oldVal, New: newVal}
	if err := s.commitLocked(ctx, changed, nil, func(tx broker.Tx) error { return broker.Audit(tx, rec) }); err != nil {
		return err
	}
	out := api.ArrayChanged{ArrayID: id, Changed: make([]string, 0, len(changed))}
	for _, j := range changed {
		out.Changed = append(out.Changed, j.ID)
		switch {
		case action == "array.hold":
			s.view.SetReason(j.ID, sched.FixedReason(*j.Pending))
		case action == "array.release":
			s.view.DropReason(j.ID)
		}
	}
	s.log.Info("job array "+action[len("array."):], "array", id, "by", p.Name, "changed", len(changed), "old", oldVal, "new", newVal)
	s.kick()
	out.Array = arrayView(id, elems, fillCodes(make([]string, len(elems)), elems, s.waitingCodeLocked))
	return c.JSON(http.StatusOK, out)
}

// pendingCode is the code of the reason a job carries ("" if none).
func pendingCode(j *broker.Job) string {
	if j.Pending == nil {
		return ""
	}
	return j.Pending.Code
}

// addArrayEnv gives an array element its index and its array's id.
func addArrayEnv(j *broker.Job, env map[string]string) {
	if j.ArrayIndex == nil {
		return
	}
	env["SPILLWAY_ARRAY_INDEX"] = strconv.Itoa(*j.ArrayIndex)
	env["SPILLWAY_ARRAY_JOB_ID"] = j.ArrayID
}
