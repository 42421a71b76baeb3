package server

import (
	"iter"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/api"
	"github.com/spillway-dev/spillway/broker/report"
	"github.com/spillway-dev/spillway/broker/sched"
)

// reports is what the explain and report routes call: broker/report over
// this broker's view, store, clock and the config in force.
func (s *Server) reports() *report.Reports {
	return &report.Reports{Store: s.store, Source: reportSource{s}, Clock: s.clock, Config: s.cfg()}
}

// reportSource hands broker/report the in-memory view under s.mu.
type reportSource struct{ s *Server }

// Read holds s.mu while fn reads the view.
func (r reportSource) Read(fn func(report.View)) {
	r.s.lock()
	defer r.s.mu.Unlock()
	fn(lockedView{r.s})
}

// lockedView is report.View over the server's in-memory view
// (broker/state); its methods run under s.mu (reportSource.Read holds it).
type lockedView struct{ s *Server }

func (v lockedView) Job(id string) (*broker.Job, bool) {
	j := v.s.view.Job(id)
	return j, j != nil
}

func (v lockedView) Jobs() iter.Seq[*broker.Job] { return v.s.view.Jobs() }

func (v lockedView) Reason(id string) (sched.Reason, bool) {
	return v.s.view.Reason(id)
}

func (v lockedView) Nodes() []api.NodeView { return v.s.nodeViewsLocked() }
