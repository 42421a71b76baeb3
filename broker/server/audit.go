package server

import (
	"context"
	"encoding/csv"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/onprem/agentapi"
)

// auditMutations is the one middleware that writes every mutating call
// (POST, PUT, PATCH, DELETE) to the audit log: who (the caller's token
// name and role), what (method, route, path, its parameters), when, from
// where, and the answer's status. Refusals (401, 403) are recorded too.
// Not recorded: agents' heartbeats and jobs' units reports (the data
// plane, many a second) and submits refused by a team limit (429, counted
// in spillway_requests_limited_total), so a flood cannot flood the log.
//
// A handler whose answer follows from its own transaction (a submit:
// 201 once the job is stored) writes the record in that transaction
// (auditInTx), so the call costs one commit, not two; the middleware then
// writes nothing more.
func (s *Server) auditMutations(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		r := c.Request()
		switch r.Method {
		case http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete:
		default:
			return next(c)
		}
		if r.URL.Path == agentapi.PathSync || strings.HasSuffix(c.Path(), "/units") {
			return next(c)
		}
		call := &auditCall{}
		c.Set(auditCallKey, call)
		err := next(c)
		if call.written {
			return err
		}
		status := c.Response().Status
		if err != nil {
			status = errorStatus(err)
		}
		if status == http.StatusTooManyRequests {
			return err
		}
		id, rec := s.auditRecord(c, status)
		// The audit write must not be undone by the request's own end.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), 10*time.Second)
		defer cancel()
		if aerr := s.store.Batch(ctx, func(tx broker.Tx) error { return broker.AppendAudit(tx, id, rec) }); aerr != nil {
			s.log.Error("audit record not written", "err", aerr, "by", rec.By, "action", rec.Action, "path", rec.Path, "status", status)
		}
		return err
	}
}

// auditCallKey holds the request's *auditCall in the echo context.
const auditCallKey = "spillway.audit"

// auditCall says whether the handler wrote the call's audit record itself.
type auditCall struct{ written bool }

// auditRecord is the audit record of the call c answered with status.
func (s *Server) auditRecord(c echo.Context, status int) (string, broker.AuditRecord) {
	r := c.Request()
	p := principal(c)
	by := p.Name
	if by == "" {
		by = "anonymous"
	}
	var target []string
	for _, n := range c.ParamNames() {
		target = append(target, n+"="+c.Param(n))
	}
	now := s.clock.Now()
	route := c.Path()
	rec := broker.AuditRecord{At: now, By: by, Role: p.Role, Action: r.Method + " " + route, Target: strings.Join(target, ","),
		Method: r.Method, Path: r.URL.Path, Status: status, Remote: c.RealIP()}
	return s.ids.next(now), rec
}

// auditInTx prepares the call's audit record for an answer of status, to
// be written by the handler's own transaction: put is nil when the call
// is not audited. done marks the record written, once that transaction
// has committed.
func (s *Server) auditInTx(c echo.Context, status int) (put func(broker.Tx) error, done func()) {
	call, _ := c.Get(auditCallKey).(*auditCall)
	if call == nil {
		return nil, func() {}
	}
	e, err := broker.EncodeAudit(s.auditRecord(c, status))
	if err != nil {
		// Not encodable (it always is): the middleware writes it after
		// the handler, and logs why it could not.
		return nil, func() {}
	}
	return e.Append, func() { call.written = true }
}

// errorStatus is the status errorHandler will answer err with.
func errorStatus(err error) int {
	var ae *apiError
	var he *echo.HTTPError
	switch {
	case errors.As(err, &ae):
		return ae.Status
	case errors.As(err, &he):
		return he.Code
	case errors.Is(err, broker.ErrNotFound):
		return http.StatusNotFound
	case errors.Is(err, broker.ErrFenced), broker.IsStoreFailure(err):
		return http.StatusServiceUnavailable
	}
	if _, ok := broker.AsValidation(err); ok {
		return http.StatusBadRequest
	}
	return http.StatusInternalServerError
}

// auditTime reads a from/to query parameter: RFC 3339, a date, or a
// duration back from now ("24h").
func (s *Server) auditTime(c echo.Context, name string) (time.Time, error) {
	v := c.QueryParam(name)
	if v == "" {
		return time.Time{}, nil
	}
	if d, err := time.ParseDuration(v); err == nil {
		return s.clock.Now().Add(-d), nil
	}
	for _, layout := range []string{time.RFC3339Nano, "2006-01-02"} {
		if t, err := time.Parse(layout, v); err == nil {
			return t, nil
		}
	}
	return time.Time{}, errBadRequest(name, broker.CodeInvalid, "want an RFC 3339 time, a date (2006-01-02) or a duration back from now (24h)")
}

// listAuditRange serves GET /v1/audit: ?from, ?to, ?limit (newest last),
// ?by, ?format=csv|json (the export).
func (s *Server) listAuditRange(c echo.Context) error {
	from, err := s.auditTime(c, "from")
	if err != nil {
		return err
	}
	to, err := s.auditTime(c, "to")
	if err != nil {
		return err
	}
	limit := 1000
	if l := c.QueryParam("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 || n > 1_000_000 {
			return errBadRequest("limit", broker.CodeOutOfRange, "must be between 1 and 1000000")
		}
		limit = n
	}
	format := c.QueryParam("format")
	if format != "" && format != "json" && format != "csv" {
		return errBadRequest("format", broker.CodeInvalid, "must be json or csv")
	}
	by := c.QueryParam("by")
	var out []broker.AuditRecord
	err = s.store.View(c.Request().Context(), func(tx broker.Tx) error {
		return broker.ScanAudit(tx, from, to, func(r broker.AuditRecord) error {
			if by != "" && r.By != by {
				return nil
			}
			out = append(out, r)
			if len(out) > limit {
				out = out[1:] // keep the newest limit records
			}
			return nil
		})
	})
	if err != nil {
		return err
	}
	if out == nil {
		out = []broker.AuditRecord{}
	}
	if format == "csv" {
		w := c.Response()
		w.Header().Set(echo.HeaderContentType, "text/csv; charset=utf-8")
		w.Header().Set("Content-Disposition", fmt.Sprintf("attachment; filename=spillway-audit-%s.csv", s.clock.Now().UTC().Format("20060102T150405Z")))
		w.WriteHeader(http.StatusOK)
		cw := csv.NewWriter(w)
		_ = cw.Write([]string{"at", "by", "role", "action", "target", "method", "path", "status", "remote", "old", "new"})
		for _, r := range out {
			_ = cw.Write([]string{r.At.UTC().Format(time.RFC3339Nano), r.By, r.Role, r.Action, r.Target, r.Method, r.Path,
				strconv.Itoa(r.Status), r.Remote, r.Old, r.New})
		}
		cw.Flush()
		return cw.Error()
	}
	return c.JSON(http.StatusOK, map[string]any{"audit": out})
}
