package server

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/spillway-dev/spillway/broker/api"

	"github.com/labstack/echo/v4"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/config"
	"github.com/spillway-dev/spillway/broker/sched"
)

// Operator controls (docs/operations.md, "Operator controls"): cordon,
// drain and undrain a node; hold, release and re-prioritise a job. Each
// writes an audit record in the same transaction as the change.

func readControl(c echo.Context) (api.ControlRequest, error) {
	var req api.ControlRequest
	if c.Request().ContentLength == 0 {
		return req, nil
	}
	if err := decodeBody(c, 4096, &req); err != nil {
		return req, err
	}
	if len(req.Reason) > 200 {
		return req, errBadRequest("reason", broker.CodeTooLong, "must be at most 200 characters")
	}
	return req, nil
}

// nodeControl handles POST /v1/nodes/{name}/cordon|drain|undrain.
func (s *Server) nodeControl(action string) echo.HandlerFunc {
	return func(c echo.Context) error {
		req, err := readControl(c)
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
		old := s.view.Node(c.Param("name"))
		if old == nil {
			return newError(http.StatusNotFound, "not_found", "node %s not found", clip(c.Param("name")))
		}
		now := s.clock.Now()
		n := cloneNode(old)
		var jobs []*broker.Job
		switch action {
		case "cordon", "drain":
			n.Cordon = &broker.Cordon{By: p.Name, At: now, Reason: req.Reason, Drain: action == "drain"}
			if action == "drain" {
				for _, j := range s.view.HoldingOn(n.Name) {
					if j.Stop != nil {
						continue
					}
					jj := cloneJob(j)
					jj.Stop = &broker.StopRequest{Reason: "preempted", Detail: fmt.Sprintf("node %s drained by %s", n.Name, p.Name),
						Signal: jj.Spec.Checkpoint.Signal, Grace: jj.Spec.Checkpoint.Grace.D(), RequestedAt: now, By: p.Name}
					jobs = append(jobs, jj)
				}
			}
		case "undrain":
			n.Cordon = nil
		}
		rec := broker.AuditRecord{At: now, By: p.Name, Action: "node." + action, Target: n.Name, Old: cordonText(old.Cordon), New: cordonText(n.Cordon)}
		if err := s.commitLocked(ctx, jobs, []*broker.Node{n}, func(tx broker.Tx) error { return broker.Audit(tx, rec) }); err != nil {
			return err
		}
		s.log.Info("node "+action, "node", n.Name, "by", p.Name, "reason", req.Reason, "requeued", len(jobs))
		s.kick()
		return c.JSON(http.StatusOK, n)
	}
}

func cordonText(c *broker.Cordon) string {
	switch {
	case c == nil:
		return "schedulable"
	case c.Drain:
		return "drained: " + c.Reason
	}
	return "cordoned: " + c.Reason
}

// jobControl handles POST /v1/jobs/{id}/hold|release and PUT
// /v1/jobs/{id}/priority.
func (s *Server) jobControl(action string) echo.HandlerFunc {
	return func(c echo.Context) error {
		req, err := readControl(c)
		if err != nil {
			return err
		}
		found, err := s.loadVisibleJob(c)
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
		old := s.view.Job(found.ID)
		if old == nil {
			return newError(http.StatusConflict, "conflict", "job %s already ended (%s)", found.ID, found.State)
		}
		now := s.clock.Now()
		j := cloneJob(old)
		var from, to, detail string
		switch action {
		case "hold", "release":
			if j.State != broker.StatePending && action == "hold" {
				return newError(http.StatusConflict, "conflict", "job %s is %s: only a pending job can be held (cancel it instead)", j.ID, j.State)
			}
			var changed bool
			if detail, changed = setHold(j, action == "hold", p.Name, req.Reason, now); !changed {
				return c.JSON(http.StatusOK, j)
			}
			from, to = "released", "held"
			if action == "release" {
				from, to = to, from
			}
		case "priority":
			if p.Role != config.RoleOperator {
				return errForbidden("only operators change a job's priority")
			}
			if prios := s.configSpecLimits().Priorities; !slices.Contains(prios, req.Priority) {
				return errBadRequest("priority", broker.CodeInvalid, "must be one of %s, got %q", strings.Join(prios, ", "), clip(req.Priority))
			}
			from, to = j.Spec.Priority, req.Priority
			j.Spec.Priority = req.Priority
			detail = fmt.Sprintf("priority %s → %s by %s%s", from, to, p.Name, reasonSuffix(req.Reason))
		}
		j.History = append(j.History, broker.Transition{At: now, From: j.State, To: j.State, Reason: action, Detail: detail})
		rec := broker.AuditRecord{At: now, By: p.Name, Action: "job." + action, Target: j.ID, Old: from, New: to}
		if err := s.commitLocked(ctx, []*broker.Job{j}, nil, func(tx broker.Tx) error { return broker.Audit(tx, rec) }); err != nil {
			return err
		}
		if action == "hold" {
			s.view.SetReason(j.ID, sched.FixedReason(*j.Pending))
		} else {
			s.view.DropReason(j.ID)
		}
		s.log.Info("job "+action, "job", j.ID, "by", p.Name, "detail", detail)
		s.kick()
		return c.JSON(http.StatusOK, j)
	}
}

// setHold holds (hold true) or releases the pending job j, a copy the
// caller commits, and says so for its history; false when j already is
// as asked.
func setHold(j *broker.Job, hold bool, by, reason string, now time.Time) (string, bool) {
	if (j.Hold != nil) == hold {
		return "", false
	}
	if !hold {
		j.Hold, j.Pending = nil, nil
		return "released by " + by, true
	}
	j.Hold = &broker.Hold{By: by, At: now, Reason: reason}
	release := "spillway job release " + j.ID
	if j.ArrayID != "" {
		release += " (or the whole array: spillway job release " + j.ArrayID + ")"
	}
	j.Pending = &broker.PendingReason{Code: "held", Message: fmt.Sprintf("held by %s%s; %s", by, reasonSuffix(reason), release)}
	return "held by " + by + reasonSuffix(reason), true
}

func reasonSuffix(r string) string {
	if r == "" {
		return ""
	}
	return " (" + r + ")"
}
