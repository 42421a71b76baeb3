package sched

import (
	"fmt"
	"slices"
	"strings"

	"github.com/spillway-dev/spillway/broker"
)

// placeBound starts the jobs the burst controller bound to a machine
// (state provisioning, Job.Machine set) on that machine's node once its
// agent has registered with enough healthy free cards. Burst nodes take no
// other work, so this pass never competes with the main one. Jobs whose
// machine is not ready yet get a reason. The bound jobs and the holding
// ones are those loadJobs found.
func (c *cycle) placeBound(plan *Plan) {
	s := c.s
	bound := c.scratch.bound
	if len(bound) == 0 {
		return
	}
	slices.SortFunc(bound, func(a, b *broker.Job) int {
		if c := a.SubmittedAt.Compare(b.SubmittedAt); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	byMachine := map[string]*broker.Node{}
	for _, n := range s.Nodes {
		if n.Instance != "" && n.State == broker.NodeReady {
			byMachine[n.Instance] = n
		}
	}
	// Only burst nodes matter here, and they hold few jobs.
	burstNode := map[string]bool{}
	for _, n := range byMachine {
		burstNode[n.Name] = true
	}
	held := map[string]map[int]bool{}
	for _, j := range c.scratch.hold {
		if len(j.Placements) == 0 || !burstNode[j.Placements[0].Node] {
			continue
		}
		for _, p := range j.Placements {
			if held[p.Node] == nil {
				held[p.Node] = map[int]bool{}
			}
			for _, g := range p.GPUs {
				held[p.Node][g] = true
			}
		}
	}
	for _, j := range bound {
		machines := j.BoundMachines()
		var nodes []*broker.Node
		for _, id := range machines {
			n := byMachine[id]
			if n == nil {
				plan.Pending = append(plan.Pending, Pending{Job: j.ID, Reason: FixedReason(broker.PendingReason{
					Code: "machine_not_ready", Message: fmt.Sprintf("waiting for burst machine %s to register", id)})})
				break
			}
			nodes = append(nodes, n)
		}
		if len(nodes) < len(machines) {
			continue
		}
		// One member on each machine of the group (one machine alone for
		// a job that is not a gang): all or none start.
		placements := make([]broker.Placement, 0, len(nodes))
		for _, n := range nodes {
			var free []int
			var uuids []string
			for _, d := range n.HealthyGPUs() {
				if !held[n.Name][d.Index] && len(free) < j.Spec.Resources.GPUs {
					free = append(free, d.Index)
					uuids = append(uuids, d.UUID)
				}
			}
			if len(free) < j.Spec.Resources.GPUs {
				plan.Pending = append(plan.Pending, Pending{Job: j.ID, Reason: FixedReason(broker.PendingReason{
					Code: "machine_busy", Message: fmt.Sprintf("waiting for %d free GPUs on burst machine %s", j.Spec.Resources.GPUs, n.Instance)})})
				placements = nil
				break
			}
			placements = append(placements, broker.Placement{Node: n.Name, GPUs: free, UUIDs: uuids})
		}
		if placements == nil {
			continue
		}
		for _, p := range placements {
			if held[p.Node] == nil {
				held[p.Node] = map[int]bool{}
			}
			for _, g := range p.GPUs {
				held[p.Node][g] = true
			}
		}
		plan.Starts = append(plan.Starts, Start{Job: j.ID, Placements: placements})
	}
}
