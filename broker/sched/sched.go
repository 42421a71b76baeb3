// Package sched is the scheduler core: a pure, deterministic function from a
// snapshot of the cluster to a plan. It does no I/O and reads no clock; the
// live broker and `spillway sim` drive the very same code.
package sched

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/spillway-dev/spillway/broker"
)

// Snapshot is everything the scheduler may look at. It must not be
// modified by Schedule.
type Snapshot struct {
	Now time.Time
	// Nodes are all known nodes; only ready ones receive work.
	Nodes []*broker.Node
	// Jobs are all non-terminal jobs: pending ones to place, and the ones
	// holding GPUs.
	Jobs   []*broker.Job
	Policy Policy
}

// Policy is the configuration the scheduler applies.
type Policy struct {
	// Priorities maps class name to value; higher runs first.
	Priorities map[string]int
}

// Start places one pending job.
type Start struct {
	Job        string             `json:"job"`
	Placements []broker.Placement `json:"placements"`
}

// Stop ends a running job (for now: its timeout passed).
type Stop struct {
	Job    string `json:"job"`
	Reason string `json:"reason"`
	Detail string `json:"detail"`
}

// Plan is the scheduler's decision for one cycle.
type Plan struct {
	Starts []Start `json:"starts,omitempty"`
	Stops  []Stop  `json:"stops,omitempty"`
	// Pending holds a reason for every pending job left waiting.
	Pending map[string]broker.PendingReason `json:"pending,omitempty"`
}

// nodeFree tracks the cards still free on one node during a cycle.
type nodeFree struct {
	node *broker.Node
	free []int // card indexes, ascending
}

// Schedule computes one cycle's plan: timeouts first, then pending jobs in
// priority order, each placed first-fit on whole free cards.
func Schedule(s *Snapshot) Plan {
	plan := Plan{Pending: map[string]broker.PendingReason{}}
	nodes := freeCards(s)

	for _, j := range s.Jobs {
		if j.State == broker.StateRunning && j.Stop == nil && j.StartedAt != nil && j.Spec.Timeout > 0 {
			if deadline := j.StartedAt.Add(j.Spec.Timeout.D()); !s.Now.Before(deadline) {
				plan.Stops = append(plan.Stops, Stop{Job: j.ID, Reason: "timed_out",
					Detail: fmt.Sprintf("ran past its timeout of %s", j.Spec.Timeout)})
			}
		}
	}

	pending := make([]*broker.Job, 0, len(s.Jobs))
	for _, j := range s.Jobs {
		if j.State == broker.StatePending {
			pending = append(pending, j)
		}
	}
	slices.SortFunc(pending, func(a, b *broker.Job) int {
		if pa, pb := s.Policy.Priorities[a.Spec.Priority], s.Policy.Priorities[b.Spec.Priority]; pa != pb {
			return pb - pa
		}
		if c := a.SubmittedAt.Compare(b.SubmittedAt); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	position := map[string]int{}
	for _, j := range pending {
		position[j.Spec.Queue]++
		pos := position[j.Spec.Queue]
		if j.NotBefore != nil && s.Now.Before(*j.NotBefore) {
			plan.Pending[j.ID] = broker.PendingReason{Code: "backoff", Position: pos,
				Message: fmt.Sprintf("retry backoff until %s", j.NotBefore.UTC().Format(time.TimeOnly))}
			continue
		}
		placements, reason := place(nodes, j)
		if placements == nil {
			reason.Position = pos
			reason.Message += fmt.Sprintf("; %s in queue %s", ordinal(pos), j.Spec.Queue)
			plan.Pending[j.ID] = reason
			continue
		}
		plan.Starts = append(plan.Starts, Start{Job: j.ID, Placements: placements})
	}
	return plan
}

// freeCards lists ready nodes (by name) with their healthy cards not held by
// any job.
func freeCards(s *Snapshot) []*nodeFree {
	held := map[string]map[int]bool{}
	for _, j := range s.Jobs {
		if !j.State.Holding() {
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
	var out []*nodeFree
	for _, n := range s.Nodes {
		if n.State != broker.NodeReady {
			continue
		}
		nf := &nodeFree{node: n}
		for _, d := range n.HealthyGPUs() {
			if !held[n.Name][d.Index] {
				nf.free = append(nf.free, d.Index)
			}
		}
		out = append(out, nf)
	}
	slices.SortFunc(out, func(a, b *nodeFree) int { return strings.Compare(a.node.Name, b.node.Name) })
	return out
}

// modelMatches reports whether a card model satisfies a gpuModel
// constraint: "H100" matches "NVIDIA H100 80GB HBM3".
func modelMatches(have, want string) bool {
	if want == "" {
		return true
	}
	return strings.Contains(strings.ToLower(have), strings.ToLower(want))
}

func place(nodes []*nodeFree, j *broker.Job) ([]broker.Placement, broker.PendingReason) {
	want := j.Spec.Resources.GPUs
	need := j.Spec.Resources.Nodes
	var chosen []*nodeFree
	best := 0
	modelSeen := false
	for _, nf := range nodes {
		if len(nf.node.Inventory.Devices) == 0 || !modelMatches(nf.node.Inventory.Devices[0].Model, j.Spec.Resources.GPUModel) {
			continue
		}
		modelSeen = true
		best = max(best, len(nf.free))
		if len(nf.free) >= want {
			chosen = append(chosen, nf)
			if len(chosen) == need {
				break
			}
		}
	}
	if !modelSeen && j.Spec.Resources.GPUModel != "" {
		return nil, broker.PendingReason{Code: "no_model",
			Message: fmt.Sprintf("no ready node has gpuModel=%s", j.Spec.Resources.GPUModel)}
	}
	if len(chosen) < need {
		msg := fmt.Sprintf("waiting for %d free GPUs on one node (most free now: %d)", want, best)
		if need > 1 {
			msg = fmt.Sprintf("waiting for %d nodes with %d free GPUs each (%d have them now)", need, want, len(chosen))
		}
		return nil, broker.PendingReason{Code: "resources", Message: msg}
	}
	out := make([]broker.Placement, 0, need)
	for _, nf := range chosen {
		p := broker.Placement{Node: nf.node.Name, GPUs: slices.Clone(nf.free[:want])}
		for _, idx := range p.GPUs {
			p.UUIDs = append(p.UUIDs, uuidOf(nf.node, idx))
		}
		nf.free = nf.free[want:]
		out = append(out, p)
	}
	return out, broker.PendingReason{}
}

func uuidOf(n *broker.Node, idx int) string {
	for _, d := range n.Inventory.Devices {
		if d.Index == idx {
			return d.UUID
		}
	}
	return ""
}

func ordinal(n int) string {
	suffix := "th"
	switch {
	case n%100 >= 11 && n%100 <= 13:
	case n%10 == 1:
		suffix = "st"
	case n%10 == 2:
		suffix = "nd"
	case n%10 == 3:
		suffix = "rd"
	}
	return fmt.Sprintf("%d%s", n, suffix)
}
