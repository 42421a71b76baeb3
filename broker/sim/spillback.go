package sim

import (
	"cmp"
	"slices"

	"github.com/spillway-dev/spillway/broker/burst"
)

// homeIndex maps the on-prem nodes' names to their index in e.nodes, and
// sizes homeUsed (GPUs held per on-prem node).
func (e *engine) homeIndex() {
	e.homeIdx = make(map[string]int, e.onPremNodes)
	for i, n := range e.nodes[:e.onPremNodes] {
		e.homeIdx[n.Name] = i
	}
	e.homeUsed = make([]int, e.onPremNodes)
}

// holdHome adds (sign 1) or removes (-1) a job's on-prem GPUs per node.
func (e *engine) holdHome(sj *sjob, sign int) {
	for _, p := range sj.j.Placements {
		if i, ok := e.homeIdx[p.Node]; ok {
			e.homeUsed[i] += sign * len(p.GPUs)
		}
	}
}

// homeNodes are the on-prem nodes with their free GPUs (spill-back's
// home, burstctl.SpillInput).
func (e *engine) homeNodes() []burst.HomeNode {
	out := make([]burst.HomeNode, 0, e.onPremNodes)
	for i, n := range e.nodes[:e.onPremNodes] {
		h := burst.HomeNode{Name: n.Name, Free: len(n.Inventory.Devices) - e.homeUsed[i]}
		if d := n.Inventory.Devices; len(d) > 0 {
			h.GPUModel, h.GPUMemory = d[0].Model, d[0].MemoryBytes
		}
		out = append(out, h)
	}
	return out
}

// ownedIdleForBurst is the GPUs of jobs running on burst machines that
// the idle owned GPUs could hold now: the jobs, largest first, each put
// on the fullest owned node it fits.
func (e *engine) ownedIdleForBurst() int {
	if e.onPremHeld >= e.onPremGPUs {
		return 0
	}
	var sizes []int
	for _, m := range e.alive {
		if m.rec.Group != "" {
			continue // gangs are left out, as before gangs could move home, so the measure stays comparable
		}
		for _, sj := range m.running {
			sizes = append(sizes, sj.j.TotalGPUs())
		}
	}
	if len(sizes) == 0 {
		return 0
	}
	free := make([]int, 0, e.onPremNodes)
	for i, n := range e.nodes[:e.onPremNodes] {
		if f := len(n.Inventory.Devices) - e.homeUsed[i]; f > 0 {
			free = append(free, f)
		}
	}
	slices.SortFunc(sizes, func(a, b int) int { return cmp.Compare(b, a) })
	placed := 0
	for _, g := range sizes {
		best := -1
		for i, f := range free {
			if f >= g && (best < 0 || f < free[best]) {
				best = i
			}
		}
		if best >= 0 {
			free[best] -= g
			placed += g
		}
	}
	return placed
}
