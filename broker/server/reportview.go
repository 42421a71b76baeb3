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

// lockedView is report.View over the server's maps; its methods run under
// s.mu (reportSource.Read holds it).
type lockedView struct{ s *Server }

func (v lockedView) Job(id string) (*broker.Job, bool) {
	j, ok := v.s.jobs[id]
	return j, ok
}

func (v lockedView) Jobs() iter.Seq[*broker.Job] {
	return func(yield func(*broker.Job) bool) {
		for _, j := range v.s.jobs {
			if !yield(j) {
				return
			}
		}
	}
}

func (v lockedView) Reason(id string) (sched.Reason, bool) {
	r, ok := v.s.reasons[id]
	return r, ok
}

func (v lockedView) Nodes() []api.NodeView { return v.s.nodeViewsLocked() }
