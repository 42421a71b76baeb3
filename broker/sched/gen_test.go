package sched

import (
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/onprem/gpu"
)

// genTeams is the number of teams generated clusters use.
const genTeams = 10

// genPolicy is the default policy with quotas for half the teams and a
// reservation for the inference queue.
func genPolicy() Policy {
	p := DefaultPolicy()
	p.Queues["inference"] = QueuePolicy{Kind: Latency, Sharing: true, Reserved: 16}
	p.Teams = map[string]TeamPolicy{}
	for t := 0; t < genTeams; t += 2 {
		p.Teams[fmt.Sprintf("team-%d", t)] = TeamPolicy{Share: float64(1 + t%3), Quota: &Quota{GPUs: 64, BorrowLimit: intp(4096)}}
	}
	return p
}

// genNodes makes n 8-GPU nodes: 70% H100 80GB with all cards NVLinked, 30%
// A100 40GB with two NVLink islands of four; 10 fabrics.
func genNodes(n int) []*broker.Node {
	h100 := NVLinkTopo(8, 8)
	a100 := NVLinkTopo(8, 4)
	out := make([]*broker.Node, n)
	for i := range out {
		model, mem, topo := "NVIDIA H100 80GB HBM3", 80*gi, h100
		if i%10 >= 7 {
			model, mem, topo = "NVIDIA A100-SXM4-40GB", 40*gi, a100
		}
		nd := &broker.Node{Name: fmt.Sprintf("node-%04d", i), Pool: "onprem", State: broker.NodeReady,
			Labels:    map[string]string{"fabric": fmt.Sprintf("fab-%02d", i%10)},
			Inventory: gpu.Inventory{Backend: "test", DriverVersion: "550.54", Topology: topo}}
		for c := 0; c < 8; c++ {
			nd.Inventory.Devices = append(nd.Inventory.Devices, gpu.Device{Index: c, UUID: fmt.Sprintf("GPU-%d-%d", i, c), Model: model, MemoryBytes: mem})
		}
		out[i] = nd
	}
	return out
}

// NVLinkTopo is an n-card topology with NVLink islands of size cards.
func NVLinkTopo(n, size int) [][]gpu.Link {
	topo := make([][]gpu.Link, n)
	for i := range topo {
		topo[i] = make([]gpu.Link, n)
		for j := range topo[i] {
			switch {
			case i == j:
				topo[i][j] = gpu.LinkSelf
			case i/size == j/size:
				topo[i][j] = gpu.LinkNVLink
			default:
				topo[i][j] = gpu.LinkSys
			}
		}
	}
	return topo
}

// genJob makes one pending job of a mixed workload: sizes 1 to 8 GPUs and
// gangs of 2 and 4 nodes, three queues, three classes, ten teams, half of
// it preemptible, some sharing, some pinned to a model.
func genJob(rng *rand.Rand, id string, now time.Time) *broker.Job {
	w := MakeJob(id)
	w.j.SubmittedAt = now.Add(-time.Duration(rng.Int64N(int64(48 * time.Hour))))
	w.j.History[0].At = w.j.SubmittedAt
	w.j.Spec.Team = fmt.Sprintf("team-%d", rng.IntN(genTeams))
	switch r := rng.IntN(100); {
	case r < 40:
		w.GPUs(1)
	case r < 60:
		w.GPUs(2)
	case r < 80:
		w.GPUs(4)
	case r < 95:
		w.GPUs(8)
	case r < 99:
		w.GPUs(8).Nodes(2)
	default:
		w.GPUs(8).Nodes(4)
	}
	switch r := rng.IntN(100); {
	case r < 70:
	case r < 90:
		w.Queue("high_perf")
	default:
		w.Queue("inference").Nodes(1)
		if rng.IntN(2) == 0 {
			w.GPUs(1).GPUMemory(int64(10+rng.IntN(20)) * gi)
		}
	}
	w.Priority([]string{"low", "medium", "medium", "high"}[rng.IntN(4)])
	if rng.IntN(2) == 0 {
		w.Preemptible()
	}
	switch rng.IntN(20) {
	case 0:
		w.Model("A100")
	case 1:
		w.Model("H100")
	}
	if rng.IntN(10) == 0 {
		w.Burst(broker.BurstNever)
	}
	w.Timeout(time.Duration(1+rng.IntN(24)) * time.Hour)
	return w.Obj()
}

// applyPlan carries a plan out the way the broker would, in virtual time:
// started jobs run from now, stopped ones leave (preempted ones return to
// the queue).
func applyPlan(s *Snapshot, plan Plan) {
	byID := make(map[string]*broker.Job, len(s.Jobs))
	for _, j := range s.Jobs {
		byID[j.ID] = j
	}
	for _, st := range plan.Starts {
		j := byID[st.Job]
		now := s.Now
		j.State, j.StartedAt, j.Placements, j.Attempt = broker.StateRunning, &now, st.Placements, j.Attempt+1
		j.History = append(j.History, broker.Transition{At: now, To: broker.StateRunning})
	}
	stopped := map[string]bool{}
	for _, st := range plan.Stops {
		stopped[st.Job] = true
	}
	out := s.Jobs[:0]
	for _, j := range s.Jobs {
		if stopped[j.ID] {
			if !j.Spec.Preemptible {
				continue
			}
			now := s.Now
			j.State, j.Placements, j.StartedAt, j.LastCheckpointAt = broker.StatePending, nil, nil, &now
			j.History = append(j.History, broker.Transition{At: now, To: broker.StatePending})
		}
		out = append(out, j)
	}
	s.Jobs = out
}
