package server

import (
	"net/http"
	"slices"
	"strings"

	"github.com/spillway-dev/spillway/broker/api"

	"github.com/labstack/echo/v4"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/config"
)

func (s *Server) nodeViewsLocked() []api.NodeView {
	holders := map[string]map[int][]*broker.Job{}
	for node, j := range s.view.Held() {
		p, _, _ := placedOn(j, node)
		if holders[node] == nil {
			holders[node] = map[int][]*broker.Job{}
		}
		for _, g := range p.GPUs {
			holders[node][g] = append(holders[node][g], j)
		}
	}
	out := make([]api.NodeView, 0, s.view.NodeCount())
	for n := range s.view.Nodes() {
		v := api.NodeView{Node: n}
		sample := s.telemetry[n.Name]
		if sample != nil {
			at := sample.At
			v.SampledAt = &at
		}
		for _, d := range n.Inventory.Devices {
			cv := api.CardView{Index: d.Index, UUID: d.UUID, Model: d.Model, MemoryBytes: d.MemoryBytes, Unhealthy: n.Unhealthy[d.Index]}
			hs := holders[n.Name][d.Index]
			slices.SortFunc(hs, func(a, b *broker.Job) int { return strings.Compare(a.ID, b.ID) })
			for _, j := range hs {
				cv.Jobs = append(cv.Jobs, j.ID)
				cv.Teams = append(cv.Teams, j.Spec.Team)
			}
			if sample != nil {
				for i := range sample.Devices {
					if sample.Devices[i].Index == d.Index {
						ds := sample.Devices[i]
						cv.Telemetry = &ds
						for _, p := range ds.Processes {
							if job, ok := s.owners[n.Name][p.PID]; ok {
								if cv.ProcessJobs == nil {
									cv.ProcessJobs = map[int]string{}
								}
								cv.ProcessJobs[p.PID] = job
							}
						}
					}
				}
			}
			if len(hs) == 0 && cv.Unhealthy == "" && n.State == broker.NodeReady {
				v.FreeGPUs++
			}
			v.Cards = append(v.Cards, cv)
		}
		out = append(out, v)
	}
	slices.SortFunc(out, func(a, b api.NodeView) int { return strings.Compare(a.Name, b.Name) })
	return out
}

func (s *Server) listNodes(c echo.Context) error {
	s.lock()
	views := s.nodeViewsLocked()
	s.mu.Unlock()
	return c.JSON(http.StatusOK, map[string]any{"nodes": redactNodeViews(views, principal(c))})
}

func (s *Server) getNode(c echo.Context) error {
	s.lock()
	views := s.nodeViewsLocked()
	s.mu.Unlock()
	views = redactNodeViews(views, principal(c))
	for _, v := range views {
		if v.Name == c.Param("name") {
			return c.JSON(http.StatusOK, v)
		}
	}
	return newError(http.StatusNotFound, "not_found", "node %s not found", clip(c.Param("name")))
}

// HiddenJob stands in a user's node view for a job of another team.
const HiddenJob = "(another team's job)"

// redactNodeViews hides what a user may not see of other teams: their job
// ids on the cards and the names of their processes (the team holding a
// card stays: "who holds that card" is the question the view answers).
// Operators see everything.
func redactNodeViews(views []api.NodeView, p api.Principal) []api.NodeView {
	if p.Role == config.RoleOperator {
		return views
	}
	out := make([]api.NodeView, len(views))
	for i, v := range views {
		v.Cards = slices.Clone(v.Cards)
		for ci := range v.Cards {
			cv := &v.Cards[ci]
			own := map[string]bool{}
			if len(cv.Jobs) > 0 {
				jobs := slices.Clone(cv.Jobs)
				for k := range jobs {
					if k < len(cv.Teams) && canSeeTeam(p, cv.Teams[k]) {
						own[jobs[k]] = true
					} else {
						jobs[k] = HiddenJob
					}
				}
				cv.Jobs = jobs
			}
			var pj map[int]string
			for pid, job := range cv.ProcessJobs {
				if own[job] {
					if pj == nil {
						pj = map[int]string{}
					}
					pj[pid] = job
				}
			}
			if cv.Telemetry != nil {
				t := *cv.Telemetry
				t.Processes = slices.Clone(t.Processes)
				for k := range t.Processes {
					if !own[cv.ProcessJobs[t.Processes[k].PID]] {
						t.Processes[k].Name = ""
					}
				}
				cv.Telemetry = &t
			}
			cv.ProcessJobs = pj
		}
		out[i] = v
	}
	return out
}
