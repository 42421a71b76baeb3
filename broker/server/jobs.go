package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"runtime/trace"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spillway-dev/spillway/broker/api"

	"github.com/labstack/echo/v4"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/config"
)

// configLimits is one config's spec limits.
type configLimits struct {
	cfg *config.Config
	lim broker.SpecLimits
}

// configSpecLimits is cfg().SpecLimits(), built once per config in force
// rather than once per submit. Its maps are shared: read them only.
func (s *Server) configSpecLimits() broker.SpecLimits {
	cfg := s.cfg()
	if l := s.specLims.Load(); l != nil && l.cfg == cfg {
		return l.lim
	}
	l := &configLimits{cfg: cfg, lim: cfg.SpecLimits()}
	s.specLims.Store(l)
	return l.lim
}

// specLimits is the config's limits plus what the live inventory and the
// burst offers allow: no job may ask for more GPUs per node than the
// largest node or cloud offer has. It reads the inventory as last
// published (noteInventoryLocked), without s.mu.
func (s *Server) specLimits() broker.SpecLimits {
	lim := s.configSpecLimits()
	if l := s.invLimits.Load(); l != nil && l.gpus > 0 {
		lim.MaxGPUs = l.gpus
		lim.MaxGPUMemory = l.mem
	}
	return lim
}

// submit validates a spec and stores the job durably before answering 201.
func (s *Server) submit(c echo.Context) error {
	p := principal(c)
	idemKey := c.Request().Header.Get(HeaderIdempotencyKey)
	if err := checkIdemKey(idemKey); err != nil {
		return err
	}
	// A user's team is known before the body is read: a team over its
	// limits is refused before any work (a flood costs the broker little).
	// A resent submit (same key) is not counted twice.
	admitted := false
	if p.Role == config.RoleUser && (idemKey == "" || !s.seenIdemKey(c.Request().Context(), p.Name, idemKey)) {
		if err := s.admitSubmit(p.Team); err != nil {
			return err
		}
		admitted = true
	}
	raw, err := io.ReadAll(io.LimitReader(c.Request().Body, broker.MaxSpecBytes+1))
	if err != nil {
		return errBadRequest("", broker.CodeMalformed, "read body: %v", err)
	}
	spec, err := broker.ParseSpec(raw)
	if err != nil {
		return err
	}
	if a := c.QueryParam("array"); a != "" {
		if spec.Array != "" && spec.Array != a {
			return errBadRequest("array", broker.CodeInvalid, "the spec says array %q and the request ?array=%q; give one", clip(spec.Array), clip(a))
		}
		spec.Array = a
	}
	callerTeam := ""
	if p.Role == config.RoleUser {
		callerTeam = p.Team
		if spec.Team != "" && spec.Team != p.Team {
			e := errForbidden("token %s acts for team %s and cannot submit for team %s", p.Name, p.Team, clip(spec.Team))
			e.Field = "team"
			return e
		}
	}
	lim := s.specLimits()
	spec.Normalize(callerTeam, lim)
	if err := spec.Validate(lim); err != nil {
		return err
	}
	if err := s.checkUpload(spec.WorkdirUpload); err != nil {
		return err
	}
	if spec.Resources.GPUModel != "" {
		s.lock()
		err = s.unsatisfiableLocked(spec)
		s.mu.Unlock()
		if err != nil {
			return err
		}
	}
	if !admitted && p.Role != config.RoleUser && (idemKey == "" || !s.seenIdemKey(c.Request().Context(), p.Name, idemKey)) {
		if err := s.admitSubmit(spec.Team); err != nil {
			return err
		}
	}
	if spec.Array != "" {
		return s.submitArray(c, p, spec)
	}
	now := s.clock.Now()
	j := &broker.Job{ID: s.ids.next(now), Spec: spec, User: p.Name, State: broker.StatePending, SubmittedAt: now}
	j.History = []broker.Transition{{At: now, To: broker.StatePending, Reason: "submitted", Detail: "by " + p.Name}}
	s.strs.job(j)
	// Encoded once: the store keeps these bytes and the answer is them.
	enc, err := json.Marshal(j)
	if err != nil {
		return fmt.Errorf("encode job: %w", err)
	}
	// The idempotency record too: the store's one writer runs the
	// transaction below, and does no hashing or encoding in it.
	var idemHash string
	var idemRec []byte
	if idemKey != "" {
		idemHash = bodyHash(raw)
		if idemRec, err = encodeIdem(j.ID, idemHash); err != nil {
			return fmt.Errorf("encode idempotency record: %w", err)
		}
	}
	ctx := c.Request().Context()
	region := trace.StartRegion(ctx, "broker.submit.store")
	var prior *broker.Job
	// The call's audit record (201) goes in the job's own transaction.
	audit, audited := s.auditInTx(c, http.StatusCreated)
	s.submitted.window.RLock()
	err = s.store.Batch(withCommit(ctx, commitSubmit, 1), func(tx broker.Tx) error {
		prior = nil
		if audit != nil {
			if err := audit(tx); err != nil {
				return err
			}
		}
		if idemKey != "" {
			var err error
			if prior, err = priorSubmit(tx, p.Name, idemKey, idemHash); err != nil || prior != nil {
				return err
			}
			if err := putIdem(tx, p.Name, idemKey, idemRec); err != nil {
				return err
			}
		}
		return broker.PutJobEncoded(tx, j, enc)
	})
	if err == nil && prior == nil {
		s.queueSubmitted(j)
	}
	s.submitted.window.RUnlock()
	region.End()
	if err == nil {
		audited()
	}
	if err != nil {
		var ae *apiError
		if errors.As(err, &ae) {
			return err
		}
		return fmt.Errorf("store job: %w", err)
	}
	if prior != nil {
		// The same submit again: the job it made, as it is now.
		c.Response().Header().Set("Idempotent-Replayed", "true")
		s.overlayReason(prior)
		return c.JSON(http.StatusCreated, prior)
	}
	s.metrics.submitted.WithLabelValues(j.Spec.Queue).Inc()
	s.metrics.observeTransition(nil, j)
	s.log.Info("job submitted", "job", j.ID, "team", j.Spec.Team, "queue", j.Spec.Queue, "gpus", j.TotalGPUs(), "user", p.Name)
	s.kick()
	return c.JSONBlob(http.StatusCreated, enc)
}

func clip(s string) string {
	if len(s) > 40 {
		return s[:40] + "…"
	}
	return s
}

// loadVisibleJob reads a job the caller may see; another team's job is
// "not found", so ids cannot be probed.
func (s *Server) loadVisibleJob(c echo.Context) (*broker.Job, error) {
	id := c.Param("id")
	var j *broker.Job
	err := s.store.View(c.Request().Context(), func(tx broker.Tx) error {
		var err error
		j, err = broker.GetJob(tx, id)
		if errors.Is(err, broker.ErrNotFound) && len(id) < 26 {
			// A unique prefix names the job too (spillway status 01M8RYGE).
			j, err = resolveJobPrefix(tx, id, func(j *broker.Job) bool { return canSeeTeam(principal(c), j.Spec.Team) })
		}
		return err
	})
	if err != nil {
		if errors.Is(err, broker.ErrNotFound) {
			return nil, newError(http.StatusNotFound, "not_found", "job %s not found", clip(id))
		}
		return nil, err
	}
	if !canSeeTeam(principal(c), j.Spec.Team) {
		return nil, newError(http.StatusNotFound, "not_found", "job %s not found", clip(id))
	}
	s.overlayReason(j)
	s.overlayProgress(j)
	return j, nil
}

// overlayReason puts the latest pending reason (with queue position) on a
// job read from the store.
func (s *Server) overlayReason(j *broker.Job) { s.overlayReasons([]*broker.Job{j}) }

// overlayReasons is overlayReason for a page of jobs, under one hold of
// the broker's lock (a listing waits for it at most once).
func (s *Server) overlayReasons(jobs []*broker.Job) {
	waiting := false
	for _, j := range jobs {
		waiting = waiting || j.State == broker.StatePending || j.State == broker.StateProvisioning
	}
	if !waiting {
		return
	}
	s.lock()
	defer s.mu.Unlock()
	s.overlayReasonsLocked(jobs)
}

// overlayReasonsLocked is overlayReasons under the broker's lock.
func (s *Server) overlayReasonsLocked(jobs []*broker.Job) {
	for _, j := range jobs {
		if j.State != broker.StatePending && j.State != broker.StateProvisioning {
			continue
		}
		sr, ok := s.view.Reason(j.ID)
		r := sr.PendingReason()
		br, bok := s.burstWhy[j.ID]
		if bok {
			// The burst controller's word first (why it does not rent, or
			// how far the machine is), then the scheduler's with the
			// position.
			if ok && r.Message != "" {
				br.Message += "; " + r.Message
				br.Position, br.EstimatedStart = r.Position, r.EstimatedStart
			}
			r, ok = br, true
		}
		if ok {
			j.Pending = &r
		}
	}
}

func (s *Server) getJob(c echo.Context) error {
	j, err := s.loadVisibleJob(c)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, j)
}

func (s *Server) listJobs(c echo.Context) error {
	p := principal(c)
	f := broker.JobFilter{Team: c.QueryParam("team"), Queue: c.QueryParam("queue"), Cursor: c.QueryParam("cursor"),
		Array: c.QueryParam("arrayId")}
	if f.Array != "" && !broker.ValidArrayID(f.Array) {
		return errBadRequest("arrayId", broker.CodeInvalid, "%q is not an array id (26 characters, as an array submit answers it)", clip(f.Array))
	}
	if p.Role == config.RoleUser {
		if f.Team != "" && f.Team != p.Team {
			return errForbidden("token %s sees only team %s", p.Name, p.Team)
		}
		f.Team = p.Team
	}
	if st := c.QueryParam("state"); st != "" {
		for _, part := range strings.Split(st, ",") {
			state := broker.State(strings.TrimSpace(part))
			if !state.Valid() {
				return errBadRequest("state", broker.CodeInvalid, "unknown state %q", clip(part))
			}
			f.States = append(f.States, state)
		}
	}
	if l := c.QueryParam("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 || n > 1000 {
			return errBadRequest("limit", broker.CodeOutOfRange, "must be between 1 and 1000")
		}
		f.Limit = n
	}
	if v := c.QueryParam("foldArrays"); v != "" {
		fold, err := strconv.ParseBool(v)
		if err != nil {
			return errBadRequest("foldArrays", broker.CodeInvalid, "must be true or false, not %q", clip(v))
		}
		f.FoldArrays = fold
	}
	pg, live := broker.JobPage{}, false
	if f.OnlyActive() && (f.FoldArrays || f.Team != "" || f.Queue != "") {
		pg, live = s.viewPage(f)
	}
	if !live {
		err := s.store.View(c.Request().Context(), func(tx broker.Tx) error {
			var err error
			pg, err = broker.ListJobs(tx, f)
			return err
		})
		if err != nil {
			return err
		}
	}
	out := api.JobList{Jobs: pg.Jobs, Next: pg.Next}
	if out.Jobs == nil {
		out.Jobs = []*broker.Job{}
	}
	if live {
		// The view's records are shared: the reasons go on copies.
		for i, j := range out.Jobs {
			c := *j
			out.Jobs[i] = &c
		}
	}
	s.overlayReasons(out.Jobs)
	for _, j := range out.Jobs {
		rest := pg.Folded[j.ArrayID]
		if j.State != broker.StatePending || len(rest) == 0 {
			continue
		}
		elems := append([]*broker.Job{j}, rest...)
		if out.Arrays == nil {
			out.Arrays = map[string]api.ArrayView{}
		}
		out.Arrays[j.ArrayID] = arrayView(j.ArrayID, elems, s.waitingCodes(elems))
	}
	return c.JSON(http.StatusOK, out)
}

// viewPage answers a listing of active jobs from the leader's view, which
// holds the same jobs as the store's active index, in one pass over records
// in memory. From the store, a page that folds a 100,000-element array
// decodes 100,000 records, and a team's page may decode every active job
// of the other teams before it finds its own (a second and 200 MB on a
// small machine at 100,000). The listing calls it for folded pages and for
// pages of one team or queue; an unfiltered, unfolded page stays with the
// store, which reads only the page. ok is false on a standby, whose view
// is not kept; the store answers there.
func (s *Server) viewPage(f broker.JobFilter) (pg broker.JobPage, ok bool) {
	s.lock()
	if !s.mayDecideLocked() {
		s.mu.Unlock()
		return broker.JobPage{}, false
	}
	// The view's records are replaced, never changed: the page reads them
	// after the lock is gone, as they were when it was held.
	jobs := make([]*broker.Job, 0, s.view.JobCount())
	jobs = slices.AppendSeq(jobs, s.view.Jobs())
	s.mu.Unlock()
	return broker.PageJobs(f, jobs), true
}

// waitingCodeLocked is the code of a waiting job's reason as
// overlayReasonsLocked would set it, without formatting the sentence: a
// folded array counts its elements by code.
func (s *Server) waitingCodeLocked(j *broker.Job) string {
	r, ok := s.view.Reason(j.ID)
	return s.waitingCodeOfLocked(j, r.Code(), ok)
}

// waitingCodeOfLocked is waitingCodeLocked given the code of the
// scheduler's latest reason for j (when ok), for a caller that walks the
// view's handles: the burst controller's word first, then the
// scheduler's, then the one the record carries.
func (s *Server) waitingCodeOfLocked(j *broker.Job, code string, ok bool) string {
	if len(s.burstWhy) > 0 {
		if br, bok := s.burstWhy[j.ID]; bok {
			return br.Code
		}
	}
	if ok {
		return code
	}
	return pendingCode(j)
}

// cancel ends a pending job at once, or asks the agent to stop a running
// one (checkpoint signal, grace, kill); the job is cancelled when the
// agent reports the end.
func (s *Server) cancel(c echo.Context) error {
	j, err := s.loadVisibleJob(c)
	if err != nil {
		return err
	}
	if j.State.Terminal() {
		return newError(http.StatusConflict, "conflict", "job %s already ended (%s)", j.ID, j.State)
	}
	p := principal(c)
	ctx := c.Request().Context()
	s.lock()
	defer s.mu.Unlock()
	cur := s.view.Job(j.ID)
	if cur == nil {
		return newError(http.StatusConflict, "conflict", "job %s already ended", j.ID)
	}
	jj := cloneJob(cur)
	if !requestCancel(jj, p.Name, s.clock.Now()) {
		return c.JSON(http.StatusAccepted, jj) // already on its way
	}
	if err := s.commitLocked(ctx, []*broker.Job{jj}, nil, nil); err != nil {
		return err
	}
	for _, n := range jj.Nodes() {
		s.wakeNodeLocked(n)
	}
	s.log.Info("job cancel requested", "job", jj.ID, "by", p.Name, "state", jj.State)
	if jj.State.Terminal() {
		return c.JSON(http.StatusOK, jj)
	}
	return c.JSON(http.StatusAccepted, jj)
}

// requestCancel cancels a waiting job, or asks a running one to stop,
// in j (a copy the caller commits). It returns false when j's cancel is
// already on its way.
func requestCancel(j *broker.Job, by string, now time.Time) bool {
	switch {
	case j.Stop != nil && j.Stop.Reason == "cancelled":
		return false
	case j.State.Holding():
		j.Stop = &broker.StopRequest{Reason: "cancelled", Detail: "cancelled by " + by, Signal: j.Spec.Checkpoint.Signal,
			Grace: j.Spec.Checkpoint.Grace.D(), RequestedAt: now, By: by}
	default:
		j.Transit(now, broker.StateCancelled, "cancelled", "cancelled by "+by)
	}
	return true
}

func (s *Server) whoami(c echo.Context) error {
	w := api.Whoami{Principal: principal(c), Version: api.Version}
	for _, p := range s.cfg().Priorities {
		w.Priorities = append(w.Priorities, p.Name)
	}
	for _, t := range s.cfg().Teams {
		w.Teams = append(w.Teams, t.Name)
	}
	return c.JSON(http.StatusOK, w)
}
