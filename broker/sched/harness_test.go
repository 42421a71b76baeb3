package sched

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/onprem/gpu"
)

// t0 is "now" in every scheduler test unless a test moves it.
var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

const gi = int64(1) << 30

// JobWrapper builds a job: MakeJob("a").GPUs(8).Priority("high").Obj().
type JobWrapper struct{ j broker.Job }

// MakeJob is a pending 1-GPU job of team nlp, queue default, priority
// medium, timeout 1h, submitted 10 minutes before t0.
func MakeJob(id string) *JobWrapper {
	return &JobWrapper{j: broker.Job{
		ID: id, State: broker.StatePending, SubmittedAt: t0.Add(-10 * time.Minute),
		Spec: broker.Spec{Name: id, Team: "nlp", Queue: "default", Priority: "medium",
			Resources: broker.Resources{GPUs: 1, Nodes: 1}, Timeout: broker.Duration(time.Hour),
			RestartPolicy: broker.RestartNever, Checkpoint: broker.Checkpoint{Signal: "SIGUSR1", Grace: broker.Duration(2 * time.Minute)},
			Burst: broker.BurstAllowed, Command: []string{"train"}},
		History: []broker.Transition{{At: t0.Add(-10 * time.Minute), To: broker.StatePending, Reason: "submitted"}},
	}}
}

func (w *JobWrapper) GPUs(n int) *JobWrapper        { w.j.Spec.Resources.GPUs = n; return w }
func (w *JobWrapper) Nodes(n int) *JobWrapper       { w.j.Spec.Resources.Nodes = n; return w }
func (w *JobWrapper) Priority(p string) *JobWrapper { w.j.Spec.Priority = p; return w }
func (w *JobWrapper) Queue(q string) *JobWrapper    { w.j.Spec.Queue = q; return w }
func (w *JobWrapper) Team(t string) *JobWrapper     { w.j.Spec.Team = t; return w }
func (w *JobWrapper) Project(p string) *JobWrapper  { w.j.Spec.Project = p; return w }

// Array makes the job an element of array id, which runs at most limit
// elements at once (0: no limit).
func (w *JobWrapper) Array(id string, limit int) *JobWrapper {
	w.j.ArrayID, w.j.ArrayLimit = id, limit
	return w
}
func (w *JobWrapper) Preemptible() *JobWrapper   { w.j.Spec.Preemptible = true; return w }
func (w *JobWrapper) Model(m string) *JobWrapper { w.j.Spec.Resources.GPUModel = m; return w }
func (w *JobWrapper) CPU(n float64) *JobWrapper  { w.j.Spec.Resources.CPU = n; return w }
func (w *JobWrapper) Burst(b broker.BurstPolicy) *JobWrapper {
	w.j.Spec.Burst = b
	return w
}

// BoundTo makes the job wait for burst machine id (state provisioning).
func (w *JobWrapper) BoundTo(id string) *JobWrapper {
	w.j.State = broker.StateProvisioning
	w.j.Machine = id
	return w
}

// GPUMemory asks for bytes of memory per card.
func (w *JobWrapper) GPUMemory(bytes int64) *JobWrapper {
	w.j.Spec.Resources.GPUMemory = broker.Quantity(bytes)
	return w
}

func (w *JobWrapper) Timeout(d time.Duration) *JobWrapper {
	w.j.Spec.Timeout = broker.Duration(d)
	return w
}

// Attempts sets the number of starts so far and, of them, the ones that
// ended in a failure retry (call it after On, which sets one start).
func (w *JobWrapper) Attempts(starts, retries int) *JobWrapper {
	w.j.Attempt, w.j.Retries = starts, retries
	return w
}

// Waited sets the submit time to d before t0.
func (w *JobWrapper) Waited(d time.Duration) *JobWrapper {
	w.j.SubmittedAt = t0.Add(-d)
	w.j.History[0].At = w.j.SubmittedAt
	return w
}

// Requeued makes the job one that was preempted d before t0 after running:
// old by its submit time, back in the queue only since then.
func (w *JobWrapper) Requeued(d time.Duration) *JobWrapper {
	at := t0.Add(-d)
	w.j.History = append(w.j.History,
		broker.Transition{At: at, From: broker.StateRunning, To: broker.StatePreempted, Reason: "preempted"},
		broker.Transition{At: at, From: broker.StatePreempted, To: broker.StatePending, Reason: "requeued"})
	return w
}

// On places the job (running since 10 minutes before t0) on node with the
// given cards; call it once per node of a gang.
func (w *JobWrapper) On(node string, cards ...int) *JobWrapper {
	if w.j.State != broker.StateRunning {
		w.j.State = broker.StateRunning
		st := t0.Add(-10 * time.Minute)
		w.j.StartedAt = &st
		w.j.Attempt = 1
		w.j.History = append(w.j.History, broker.Transition{At: st, To: broker.StateRunning, Reason: "started"})
	}
	p := broker.Placement{Node: node, GPUs: cards}
	for _, c := range cards {
		p.UUIDs = append(p.UUIDs, fmt.Sprintf("GPU-%s-%d", node, c))
	}
	if m := int64(w.j.Spec.Resources.GPUMemory); m > 0 {
		p.MemoryShare = m
	}
	w.j.Placements = append(w.j.Placements, p)
	return w
}

// Started sets a running job's start to d before t0.
func (w *JobWrapper) Started(d time.Duration) *JobWrapper {
	st := t0.Add(-d)
	w.j.StartedAt = &st
	return w
}

// Checkpointed records a checkpoint d before t0.
func (w *JobWrapper) Checkpointed(d time.Duration) *JobWrapper {
	t := t0.Add(-d)
	w.j.LastCheckpointAt = &t
	return w
}

// Stopping gives a running job a stop request made d before t0.
func (w *JobWrapper) Stopping(reason string, d time.Duration) *JobWrapper {
	w.j.Stop = &broker.StopRequest{Reason: reason, Signal: "SIGUSR1", Grace: 2 * time.Minute, RequestedAt: t0.Add(-d)}
	return w
}

// Backoff holds the job back until d after t0.
func (w *JobWrapper) Backoff(d time.Duration) *JobWrapper {
	t := t0.Add(d)
	w.j.NotBefore = &t
	return w
}

func (w *JobWrapper) Obj() *broker.Job { j := w.j; return &j }

// NodeWrapper builds a node: MakeNode("n1").GPUs(8).Obj().
type NodeWrapper struct {
	n     broker.Node
	gpus  int
	model string
	mem   int64
}

// MakeNode is a ready on-prem node with 8 H100 80GB cards, driver 550.54.
func MakeNode(name string) *NodeWrapper {
	return &NodeWrapper{n: broker.Node{Name: name, Pool: "onprem", State: broker.NodeReady,
		Inventory: gpu.Inventory{Backend: "test", DriverVersion: "550.54"}}, gpus: 8, model: "NVIDIA H100 80GB HBM3", mem: 80 * gi}
}

func (w *NodeWrapper) GPUs(n int) *NodeWrapper         { w.gpus = n; return w }
func (w *NodeWrapper) Model(m string) *NodeWrapper     { w.model = m; return w }
func (w *NodeWrapper) CardMemory(b int64) *NodeWrapper { w.mem = b; return w }
func (w *NodeWrapper) Driver(d string) *NodeWrapper    { w.n.Inventory.DriverVersion = d; return w }
func (w *NodeWrapper) Pool(p string) *NodeWrapper      { w.n.Pool = p; return w }

// Instance makes the node the burst machine with record id id.
func (w *NodeWrapper) Instance(id string) *NodeWrapper { w.n.Instance = id; return w }
func (w *NodeWrapper) CPU(n float64) *NodeWrapper      { w.n.CPU = n; return w }
func (w *NodeWrapper) State(s broker.NodeState) *NodeWrapper {
	w.n.State = s
	return w
}

func (w *NodeWrapper) Label(k, v string) *NodeWrapper {
	if w.n.Labels == nil {
		w.n.Labels = map[string]string{}
	}
	w.n.Labels[k] = v
	return w
}

func (w *NodeWrapper) Unhealthy(card int) *NodeWrapper {
	if w.n.Unhealthy == nil {
		w.n.Unhealthy = map[int]string{}
	}
	w.n.Unhealthy[card] = "xid 79"
	return w
}

// NVLinkGroups gives the node a topology where cards in the same group of
// size are NVLinked and all others are across NUMA nodes.
func (w *NodeWrapper) NVLinkGroups(size int) *NodeWrapper {
	topo := make([][]gpu.Link, w.gpus)
	for i := range topo {
		topo[i] = make([]gpu.Link, w.gpus)
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
	w.n.Inventory.Topology = topo
	return w
}

func (w *NodeWrapper) Obj() *broker.Node {
	n := w.n
	n.Inventory.Devices = nil
	for i := 0; i < w.gpus; i++ {
		n.Inventory.Devices = append(n.Inventory.Devices, gpu.Device{Index: i, UUID: fmt.Sprintf("GPU-%s-%d", n.Name, i),
			Model: w.model, MemoryBytes: w.mem})
	}
	return &n
}

// outcome is a plan in a form a table test can spell out.
type outcome struct {
	// Starts maps job to "n1:0,1" ("n1:0,1 n2:0,1" for gangs; "@20Gi"
	// appended for a memory share).
	Starts map[string]string
	// Stops maps job to stop reason.
	Stops map[string]string
	// Pending maps job to reason code.
	Pending map[string]string
}

func summarize(p Plan) outcome {
	o := outcome{}
	for _, s := range p.Starts {
		if o.Starts == nil {
			o.Starts = map[string]string{}
		}
		var parts []string
		for _, pl := range s.Placements {
			idx := make([]string, len(pl.GPUs))
			for k, g := range pl.GPUs {
				idx[k] = fmt.Sprint(g)
			}
			part := pl.Node + ":" + strings.Join(idx, ",")
			if pl.MemoryShare > 0 {
				part += "@" + broker.FormatQuantity(pl.MemoryShare)
			}
			parts = append(parts, part)
		}
		o.Starts[s.Job] = strings.Join(parts, " ")
	}
	for _, s := range p.Stops {
		if o.Stops == nil {
			o.Stops = map[string]string{}
		}
		o.Stops[s.Job] = s.Reason
	}
	for _, pe := range p.Pending {
		if o.Pending == nil {
			o.Pending = map[string]string{}
		}
		o.Pending[pe.Job] = pe.Reason.Code()
	}
	return o
}

// snap builds a snapshot at t0 with the default policy.
func snap(nodes []*broker.Node, jobs []*broker.Job) *Snapshot {
	return &Snapshot{Now: t0, Nodes: nodes, Jobs: jobs, Policy: DefaultPolicy()}
}

func nodes(ws ...*NodeWrapper) []*broker.Node {
	out := make([]*broker.Node, len(ws))
	for i, w := range ws {
		out[i] = w.Obj()
	}
	return out
}

func jobs(ws ...*JobWrapper) []*broker.Job {
	out := make([]*broker.Job, len(ws))
	for i, w := range ws {
		out[i] = w.Obj()
	}
	return out
}

func reasonOf(t *testing.T, p Plan, job string) broker.PendingReason {
	t.Helper()
	for _, pe := range p.Pending {
		if pe.Job == job {
			return pe.Reason.PendingReason()
		}
	}
	t.Fatalf("job %s has no pending reason in %+v", job, p.Pending)
	return broker.PendingReason{}
}

func intp(v int) *int { return &v }

// pendingView is a plan's pending entry with its reason as the API shows
// it.
type pendingView struct {
	Job, Queue string
	Reason     broker.PendingReason
}

func viewPending(p Plan) []pendingView {
	var out []pendingView
	for _, pe := range p.Pending {
		out = append(out, pendingView{Job: pe.Job, Queue: pe.Reason.Queue(), Reason: pe.Reason.PendingReason()})
	}
	return out
}

// planView is a plan with its reasons and burst demand as callers read
// them, for comparing plans.
type planView struct {
	Starts      []Start
	Stops       []Stop
	Preemptions []Preemption
	Pending     []pendingView
	Reservation *Reservation
	BurstDemand []BurstDemand
}

func viewPlan(p Plan) planView {
	return planView{Starts: p.Starts, Stops: p.Stops, Preemptions: p.Preemptions, Pending: viewPending(p),
		Reservation: p.Reservation, BurstDemand: p.BurstDemand()}
}
