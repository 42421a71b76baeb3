package server

import (
	"sort"
	"time"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/burst"
	"github.com/spillway-dev/spillway/broker/burstctl"
	"github.com/spillway-dev/spillway/onprem/gpu"
)

// spillInputLocked adds what spill-back weighs to a burst input: the jobs
// running on ready burst machines, the owned nodes with free GPUs, and the
// highest owned rate among them. Nothing is added while spill-back is off
// or a job waits unbound (the decision then keeps every machine).
func (s *Server) spillInputLocked(in *burst.Input, now time.Time) {
	if !in.Policy.SpillBack.Enabled {
		return
	}
	for _, j := range in.Pending {
		if j.Machine == "" {
			return
		}
	}
	for _, m := range in.Machines {
		if m.State != broker.MachineReady {
			continue
		}
		for _, id := range m.Jobs {
			j := s.jobs[id]
			if j == nil || !j.State.Holding() || j.StartedAt == nil {
				continue
			}
			in.Running = append(in.Running, burstctl.RunningJob(j, m.ID, *j.StartedAt))
		}
	}
	if len(in.Running) == 0 {
		return
	}
	rates := s.cfg().BillingCompiled().Meter.OnPrem
	for _, n := range s.nodes {
		if n.Instance != "" || n.State != broker.NodeReady || n.Cordon != nil {
			continue
		}
		held := map[int]bool{}
		for id := range s.byNode[n.Name] {
			p, _, _ := placedOn(s.jobs[id], n.Name)
			for _, g := range p.GPUs {
				held[g] = true
			}
		}
		free := 0
		for _, g := range n.HealthyGPUs() {
			if !held[g.Index] {
				free++
			}
		}
		if free == 0 {
			continue
		}
		h := burst.HomeNode{Name: n.Name, Free: free}
		if d := n.Inventory.Devices; len(d) > 0 {
			h.GPUModel, h.GPUMemory = d[0].Model, d[0].MemoryBytes
		}
		// Rates are keyed by the short model ("H100"), as the ledger meters.
		if rate, ok := rates.For(gpu.ShortModel(h.GPUModel)).At(now); ok && rate > in.HomeRate {
			in.HomeRate = rate
		}
		in.Home = append(in.Home, h)
	}
	sort.Slice(in.Home, func(a, b int) bool { return in.Home[a].Name < in.Home[b].Name })
}
