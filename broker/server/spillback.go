package server

import (
	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/burst"
)

// homeNodesLocked are the owned nodes that are ready and not cordoned,
// with their free GPUs (spill-back's home, burstctl.SpillInput).
func (s *Server) homeNodesLocked() []burst.HomeNode {
	var out []burst.HomeNode
	for n := range s.view.Nodes() {
		if n.Instance != "" || n.State != broker.NodeReady || n.Cordon != nil {
			continue
		}
		held := map[int]bool{}
		for j := range s.view.Holders(n.Name) {
			p, _, _ := placedOn(j, n.Name)
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
		h := burst.HomeNode{Name: n.Name, Free: free}
		if d := n.Inventory.Devices; len(d) > 0 {
			h.GPUModel, h.GPUMemory = d[0].Model, d[0].MemoryBytes
		}
		out = append(out, h)
	}
	return out
}
