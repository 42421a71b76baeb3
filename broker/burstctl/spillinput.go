package burstctl

import (
	"slices"
	"strings"

	"github.com/spillway-dev/spillway/billing"
	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/burst"
	"github.com/spillway-dev/spillway/onprem/gpu"
)

// SpillInput adds what spill-back weighs to a decision's input (built by
// Input): the owned nodes with free GPUs (home), the highest owned rate
// among them (rates, the meter's on-prem rates, at in.Now), and the jobs
// holding cards on ready burst machines. Nothing is added while
// spill-back is off or no owned GPU is free. The waiting jobs are in the
// input already: the decision weighs whether they could use the free
// owned GPUs. The broker and the simulator both call it.
func (c *Controller) SpillInput(in *burst.Input, rates billing.RateTable, home func() []burst.HomeNode) {
	if !in.Policy.SpillBack.Enabled {
		return
	}
	ready := false
	for _, m := range in.Machines {
		if m.State == broker.MachineReady && len(m.Jobs) > 0 {
			ready = true
			break
		}
	}
	if !ready {
		return
	}
	for _, h := range home() {
		if h.Free <= 0 {
			continue
		}
		// Rates are keyed by the short model ("H100"), as the ledger meters.
		if rate, ok := rates.For(gpu.ShortModel(h.GPUModel)).At(in.Now); ok && rate > in.HomeRate {
			in.HomeRate = rate
		}
		in.Home = append(in.Home, h)
	}
	if len(in.Home) == 0 {
		return
	}
	slices.SortFunc(in.Home, func(a, b burst.HomeNode) int { return strings.Compare(a.Name, b.Name) })
	for _, m := range in.Machines {
		if m.State != broker.MachineReady {
			continue
		}
		_, holding := c.Fleet.OnMachine(m.ID)
		for _, j := range holding {
			if j.State.Holding() && j.StartedAt != nil {
				in.Running = append(in.Running, RunningJob(j, m.ID, *j.StartedAt))
			}
		}
	}
}
