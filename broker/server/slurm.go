package server

import (
	"errors"
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/api"
	"github.com/spillway-dev/spillway/broker/slurm"
	"github.com/spillway-dev/spillway/broker/slurmdoor"
)

// The broker as Slurm's burst provider (docs/slurm.md) is
// broker/slurmdoor. The server keeps the two routes slurmctld's
// ResumeProgram and SuspendProgram call (parse, authorise, answer) and
// the wiring: the door over the fleet and this broker's lock, its loop
// among the leader's tasks, its allocations in the meter cycle.

var errSlurmOff = newError(http.StatusNotFound, "slurm_not_configured", "this broker has no slurm: section in its config (docs/slurm.md)")

// initSlurm builds the Slurm door over the fleet (initFleet made it).
func (s *Server) initSlurm() {
	s.slurm = slurmdoor.New(slurmdoor.Options{Broker: fleetState{s}, Fleet: s.fleet, Clock: s.clock, Logger: s.log,
		Config: s.cfg, Adapters: s.adapt, BurstLead: s.metrics.burstLead})
}

func (s *Server) slurmRequest(c echo.Context) (api.SlurmRequest, []string, error) {
	var req api.SlurmRequest
	if s.cfg().Slurm == nil {
		return req, nil, errSlurmOff
	}
	if err := decodeBody(c, 1<<20, &req); err != nil {
		return req, nil, err
	}
	names, err := slurm.Expand(req.Nodes)
	if err != nil {
		return req, nil, errBadRequest("nodes", broker.CodeInvalid, "%v", err)
	}
	if len(names) > 4096 {
		return req, nil, errBadRequest("nodes", broker.CodeOutOfRange, "at most 4096 nodes at once, got %d", len(names))
	}
	return req, names, nil
}

// slurmResume is POST /v1/slurm/resume.
func (s *Server) slurmResume(c echo.Context) error {
	req, names, err := s.slurmRequest(c)
	if err != nil {
		return err
	}
	res, err := s.slurm.Resume(c.Request().Context(), names, req.Jobs)
	if err != nil {
		return slurmError(err)
	}
	return c.JSON(http.StatusOK, res)
}

// slurmSuspend is POST /v1/slurm/suspend.
func (s *Server) slurmSuspend(c echo.Context) error {
	_, names, err := s.slurmRequest(c)
	if err != nil {
		return err
	}
	res, err := s.slurm.Suspend(c.Request().Context(), names)
	if err != nil {
		return slurmError(err)
	}
	return c.JSON(http.StatusOK, res)
}

// slurmError is the door's error as the API answers it: no leader term
// holds the door on a broker that stopped leading.
func slurmError(err error) error {
	if errors.Is(err, slurmdoor.ErrNotLeader) {
		return errNotLeader
	}
	return err
}
