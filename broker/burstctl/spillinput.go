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
// Input): the jobs holding cards on ready burst machines, the owned nodes
// with free GPUs, and the highest owned rate among them (rates, the
// meter's on-prem rates, at in.Now). home lists the owned nodes with
// free GPUs; it is called only when some job could move. Nothing is
// added while spill-back is off or a job waits unbound (the decision then
// keeps every machine). The broker and the simulator both call it.
func (c *Controller) SpillInput(in *burst.Input, rates billing.RateTable, home func() []burst.HomeNode) {
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
		_, holding := c.Fleet.OnMachine(m.ID)
		for _, j := range holding {
			if j.State.Holding() && j.StartedAt != nil {
				in.Running = append(in.Running, RunningJob(j, m.ID, *j.StartedAt))
			}
		}
	}
	if len(in.Running) == 0 {
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
	slices.SortFunc(in.Home, func(a, b burst.HomeNode) int { return strings.Compare(a.Name, b.Name) })
}
