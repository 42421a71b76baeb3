package server

import (
	"net/http"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/spillway-dev/spillway/broker/config"
	"github.com/spillway-dev/spillway/onprem/agentapi"
)

// routes registers every endpoint. docs/openapi.yaml documents exactly
// these; a test compares the two.
func (s *Server) routes(reg *prometheus.Registry) *echo.Echo {
	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	e.HTTPErrorHandler = errorHandler(s.log, s.noteStoreFailure)
	e.Use(middleware.Recover())
	e.Use(s.observe)
	e.Use(s.leaderGate)
	e.Use(s.limitBody)
	e.Use(s.auditMutations)

	e.GET("/healthz", s.healthz)
	// Metrics name teams and jobs: operators' tokens and metrics-role
	// tokens (Prometheus's) read them.
	e.GET("/metrics", echo.WrapHandler(promhttp.HandlerFor(reg, promhttp.HandlerOpts{})),
		s.authenticate, allow(config.RoleOperator, config.RoleMetrics))

	v1 := e.Group("/v1", s.authenticate)
	v1.GET("/whoami", s.whoami)

	people := allow(config.RoleUser, config.RoleOperator)
	v1.POST("/jobs", s.submit, people)
	v1.GET("/jobs", s.listJobs, people)
	v1.GET("/jobs/:id", s.getJob, people)
	v1.POST("/jobs/:id/cancel", s.cancel, people)
	v1.GET("/arrays/:id", s.getArray, people)
	v1.POST("/arrays/:id/cancel", s.cancelArray, people)
	v1.POST("/arrays/:id/hold", s.arrayControl("hold"), people)
	v1.POST("/arrays/:id/release", s.arrayControl("release"), people)
	v1.PUT("/arrays/:id/limit", s.setArrayLimit, people)
	v1.GET("/jobs/:id/logs", s.logs, people)
	v1.HEAD("/uploads/:hash", s.hasUpload, people)
	v1.PUT("/uploads/:hash", s.putUpload, people)

	v1.GET("/queues", s.listQueues, people)
	v1.GET("/nodes", s.listNodes, people)
	v1.GET("/nodes/:name", s.getNode, people)
	v1.GET("/telemetry", s.getTelemetry, people)

	ops := allow(config.RoleOperator)
	v1.GET("/instances", s.listInstances, people)
	v1.GET("/offers", s.listOffers, people)
	v1.POST("/offers/refresh", s.refreshPrices, ops)
	v1.DELETE("/offers/prices", s.clearPrices, ops)
	v1.GET("/instances/:id", s.getInstance, people)
	v1.GET("/burst/plan", s.burstPlan, ops)
	// Operator controls (operator.go, tokens.go).
	v1.GET("/tokens", s.listTokens, ops)
	v1.DELETE("/tokens/:name", s.revokeToken, ops)
	v1.POST("/config/reload", s.reloadConfig, ops)
	v1.POST("/nodes/:name/cordon", s.nodeControl("cordon"), ops)
	v1.POST("/nodes/:name/drain", s.nodeControl("drain"), ops)
	v1.POST("/nodes/:name/undrain", s.nodeControl("undrain"), ops)
	v1.POST("/jobs/:id/hold", s.jobControl("hold"), people)
	v1.POST("/jobs/:id/release", s.jobControl("release"), people)
	v1.PUT("/jobs/:id/priority", s.jobControl("priority"), ops)
	v1.GET("/budgets", s.listBudgets, allow(config.RoleUser, config.RoleOperator, config.RoleFinance))
	v1.PUT("/budgets/:scope", s.setBudget, ops)
	v1.GET("/audit", s.listAuditRange, allow(config.RoleOperator, config.RoleFinance))
	v1.POST("/slurm/resume", s.slurmResume, ops)
	v1.POST("/slurm/suspend", s.slurmSuspend, ops)

	billingRoles := allow(config.RoleUser, config.RoleOperator, config.RoleFinance)
	v1.GET("/billing/usage", s.usage, billingRoles)
	v1.GET("/billing/export", s.export, billingRoles)

	agents := allow(config.RoleAgent)
	v1.POST(agentapi.PathRegister[len("/v1"):], s.register, agents)
	v1.POST(agentapi.PathSync[len("/v1"):], s.sync, agents)
	v1.GET(agentapi.PathUploads[len("/v1"):]+":hash", s.getUpload, agents)

	s.observeRoutes(e, v1)
	s.enrolRoutes(e, v1)
	s.oidcRoutes(e)

	e.RouteNotFound("/*", func(c echo.Context) error { return errNotFound })
	return e
}

// observe records request counts and latencies by route template.
func (s *Server) observe(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		start := time.Now()
		err := next(c)
		if err != nil {
			c.Error(err)
		}
		route := c.Path()
		if route == "" {
			route = "unmatched"
		}
		s.metrics.requests.WithLabelValues(c.Request().Method, route, strconv.Itoa(c.Response().Status)).Inc()
		s.metrics.latency.WithLabelValues(c.Request().Method, route).Observe(time.Since(start).Seconds())
		return nil
	}
}

func (s *Server) healthz(c echo.Context) error {
	h, status, pinged := s.health(c.Request().Context())
	if status == http.StatusOK {
		if msg := s.recentStoreFailure(pinged); msg != "" {
			h.Status, h.Error, status = "unhealthy", msg, http.StatusServiceUnavailable
		}
	}
	return c.JSON(status, h)
}
