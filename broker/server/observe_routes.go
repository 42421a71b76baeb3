package server

import (
	"fmt"
	"io"
	"net/http"
	"strconv"

	"github.com/labstack/echo/v4"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/config"
	"github.com/spillway-dev/spillway/broker/report"
)

// observeRoutes registers the observability endpoints: explain, the
// reports, units of output, the store backup and the web dashboard.
// docs/openapi.yaml documents them with the rest.
func (s *Server) observeRoutes(e *echo.Echo, v1 *echo.Group) {
	people := allow(config.RoleUser, config.RoleOperator)
	reports := allow(config.RoleUser, config.RoleOperator, config.RoleFinance)
	v1.GET("/jobs/:id/explain", s.explainJob, people)
	v1.GET("/reports/utilization", s.utilizationReport, reports)
	v1.GET("/reports/delivery", s.deliveryReport, reports)
	v1.GET("/store/backup", s.backupStore, allow(config.RoleOperator))
	// Units come from inside jobs with their job token, or from people.
	e.POST("/v1/jobs/:id/units", s.reportUnits, s.unitsAuth)
	// "checkpoint saved at step N", from inside the job (docs/data.md).
	e.POST("/v1/jobs/:id/checkpoint", s.reportCheckpoint, s.unitsAuth)
	s.uiRoutes(e)
}

// explainJob serves GET /v1/jobs/{id}/explain.
func (s *Server) explainJob(c echo.Context) error {
	j, err := s.loadVisibleJob(c)
	if err != nil {
		return err
	}
	p := principal(c)
	x, err := s.reports().Explain(c.Request().Context(), j, func(team string) bool { return canSeeTeam(p, team) })
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, x)
}

// utilizationReport serves GET /v1/reports/utilization: JSON, or CSV with
// ?format=csv (?table=rows, jobs or cards).
func (s *Server) utilizationReport(c echo.Context) error {
	team, period, err := s.teamPeriod(c)
	if err != nil {
		return err
	}
	res := broker.Resolution(c.QueryParam("resolution"))
	switch res {
	case "", broker.Minute, broker.Hour:
	default:
		return errBadRequest("resolution", broker.CodeInvalid, "must be m (minute) or h (hour)")
	}
	format, table := c.QueryParam("format"), c.QueryParam("table")
	switch format {
	case "", "json", "csv":
	default:
		return errBadRequest("format", broker.CodeInvalid, "must be json or csv")
	}
	switch table {
	case "", "rows", "jobs", "cards":
	default:
		return errBadRequest("table", broker.CodeInvalid, "must be rows, jobs or cards")
	}
	rep, err := s.reports().Utilization(c.Request().Context(), period, team, res)
	if err != nil {
		return err
	}
	if format != "csv" {
		return c.JSON(http.StatusOK, rep)
	}
	w := c.Response()
	w.Header().Set(echo.HeaderContentType, "text/csv; charset=utf-8")
	w.Header().Set("Content-Disposition", fmt.Sprintf("attachment; filename=spillway-utilization-%s.csv", period.Label()))
	w.WriteHeader(http.StatusOK)
	return report.WriteUtilizationCSV(w, rep, table)
}

// deliveryReport serves GET /v1/reports/delivery.
func (s *Server) deliveryReport(c echo.Context) error {
	team, period, err := s.teamPeriod(c)
	if err != nil {
		return err
	}
	rep, err := s.reports().Delivery(c.Request().Context(), period, team)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, rep)
}

// Backuper is a store that can write a consistent copy of itself while
// the broker runs (the embedded bbolt store can; Redis is backed up with
// its own RDB/AOF files, docs/operations.md).
type Backuper interface {
	Backup(w io.Writer, size func(int64)) (int64, error)
}

// backupStore serves GET /v1/store/backup: the embedded store file as of
// now, streamed.
func (s *Server) backupStore(c echo.Context) error {
	b, ok := s.backend.(Backuper)
	if !ok {
		return newError(http.StatusNotImplemented, "not_supported",
			"this store cannot be copied through the API; back up Redis with its RDB or AOF files (docs/operations.md)")
	}
	now := s.clock.Now().UTC()
	w := c.Response()
	n, err := b.Backup(w, func(size int64) {
		// The length goes first, so a copy cut short by an error is a
		// short body the client notices.
		w.Header().Set(echo.HeaderContentType, "application/octet-stream")
		w.Header().Set(echo.HeaderContentLength, strconv.FormatInt(size, 10))
		w.Header().Set("Content-Disposition", fmt.Sprintf("attachment; filename=spillway-%s.db", now.Format("20060102T150405Z")))
		w.WriteHeader(http.StatusOK)
	})
	if err != nil {
		if !w.Committed {
			return err
		}
		s.log.Error("store backup failed", "err", err, "bytes", n)
		return nil
	}
	s.log.Info("store backed up", "bytes", n, "by", principal(c).Name)
	return nil
}
