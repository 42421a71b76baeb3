package report

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/api"
	"github.com/spillway-dev/spillway/broker/burst"
	"github.com/spillway-dev/spillway/broker/config"
	"github.com/spillway-dev/spillway/broker/sched"
	"github.com/spillway-dev/spillway/onprem/agentapi"
)

// Verdict codes of an explanation.
const (
	VerdictQuota        = "quota"
	VerdictClusterFull  = "cluster_full"
	VerdictWholeNode    = "whole_node"
	VerdictGang         = "gang"
	VerdictWaiting      = "waiting" // another scheduler reason (backfill, releasing, …)
	VerdictNoFit        = "no_fit"
	VerdictArrayLimit   = "array_limit"
	VerdictBackoff      = "backoff"
	VerdictBurstBudget  = "burst_budget"
	VerdictBurst        = "burst" // another burst reason
	VerdictNew          = "not_scheduled_yet"
	VerdictStarting     = "starting"
	VerdictIdle         = "idle"
	VerdictComputing    = "computing"
	VerdictGPUOOM       = "oom_gpu"
	VerdictHostOOM      = "oom_host"
	VerdictCrashed      = "crashed"
	VerdictTimedOut     = "timed_out"
	VerdictSucceeded    = "succeeded"
	VerdictCancelled    = "cancelled"
	VerdictReclaimed    = "idle_reclaimed"
	VerdictStopping     = "stopping"
	VerdictNodeProblems = "node_lost"
	VerdictInputMissing = "input_missing"
	VerdictOutputs      = "outputs_failed"
	VerdictStaging      = "staging"
	VerdictDataWait     = "data_wait"
)

// explainTailLines is how many log lines an explanation shows.
const explainTailLines = 20

// explainLogBytes bounds the log read for the tail and OOM evidence.
const explainLogBytes = 64 << 10

// Explain builds the walk for a job read from the store (with its pending
// reason overlaid), as a viewer who may see the teams canSee accepts sees
// it: the view first, then the log from the store, then the verdict and
// the steps from those.
func (rs *Reports) Explain(ctx context.Context, j *broker.Job, canSee func(team string) bool) (*api.Explanation, error) {
	x := &api.Explanation{Job: j, At: rs.Clock.Now()}
	x.State = explainState(j)
	rs.Source.Read(func(v View) {
		if cur, ok := v.Job(j.ID); ok && cur.IdleSince != nil && j.IdleSince == nil {
			j.IdleSince = cur.IdleSince
		}
		views := v.Nodes()
		x.Queue = explainQueue(v, j, canSee)
		x.Team = teamLoad(v, rs.Config, j.Spec.Team)
		x.Cluster = explainCluster(v, j, views, rs.Config.Scheduler.PreemptionLimit)
		x.Cards = explainCards(j, views, rs.Config.Idle.Threshold)
	})

	exit, err := explainExit(ctx, rs.Store, j)
	if err != nil {
		return nil, err
	}
	x.Exit = exit
	x.Verdict = explainVerdict(x)
	for _, t := range x.Job.History {
		switch {
		case t.To == broker.StatePreempted && t.Reason == burst.StopSpillBack:
			x.Moves = append(x.Moves, t)
		case t.To == broker.StatePreempted && t.Reason == agentapi.ReasonSpotReclaim:
			x.Reclaims = append(x.Reclaims, t)
		}
	}
	x.Steps = explainSteps(x)
	return x, nil
}

func explainState(j *broker.Job) api.ExplainState {
	st := api.ExplainState{State: j.State, Attempt: j.Attempt, Retries: j.Retries, Since: j.SubmittedAt}
	if n := len(j.History); n > 0 {
		st.Since = j.History[n-1].At
		for i := n - 1; i >= 0 && j.History[i].To == j.State; i-- {
			st.Since = j.History[i].At
		}
		st.Recent = slices.Clone(j.History[max(0, n-6):])
	}
	return st
}

// explainQueue lists the waiting jobs ahead of a pending one. As in
// GET /v1/queues, a viewer does not see the ids and names of the waiting
// jobs of teams canSee refuses — only their team, priority, size and
// reason.
func explainQueue(v View, j *broker.Job, canSee func(team string) bool) *api.ExplainQueue {
	if j.State != broker.StatePending {
		return nil
	}
	q := &api.ExplainQueue{Queue: j.Spec.Queue, Priority: j.Spec.Priority, Reason: j.Pending}
	pos := 0
	if j.Pending != nil {
		pos = j.Pending.Position
	}
	// The explainAhead jobs just ahead, kept while the queue is read: a
	// job far back in a queue of 100,000 does not sort them all.
	type waiting struct {
		o *broker.Job
		r sched.Reason
	}
	closest := broker.NewHead(explainAhead, func(a, b waiting) int {
		return cmp.Or(cmp.Compare(b.r.Position(), a.r.Position()), strings.Compare(b.o.ID, a.o.ID))
	})
	for o := range v.Jobs() {
		if o.State != broker.StatePending || o.Spec.Queue != j.Spec.Queue {
			continue
		}
		q.Waiting++
		r, ok := v.Reason(o.ID)
		if o.ID == j.ID || !ok || pos == 0 || r.Position() == 0 || r.Position() >= pos {
			continue
		}
		closest.Offer(waiting{o, r})
	}
	kept := closest.Sorted()
	slices.Reverse(kept) // in queue order
	for _, w := range kept {
		q.Ahead = append(q.Ahead, api.QueuedJob{QueueEntry: api.NewQueueEntry(w.o, canSee(w.o.Spec.Team)), Position: w.r.Position(), Reason: w.r.Code()})
	}
	return q
}

// explainAhead is how many of the jobs ahead of a waiting one explain
// lists: those just ahead of it.
const explainAhead = 10

// teamLoad is what a team holds now, next to its quota.
func teamLoad(v View, cfg *config.Config, team string) api.ExplainTeamLoad {
	out := api.ExplainTeamLoad{Team: team}
	for o := range v.Jobs() {
		if o.Spec.Team == team && o.State.Holding() {
			out.HeldGPUs += o.TotalGPUs()
			out.RunningJobs++
		}
	}
	for _, t := range cfg.Teams {
		if t.Name == team && t.Quota != nil {
			g := t.Quota.GPUs
			out.QuotaGPUs = &g
			out.BorrowLimit = t.Quota.BorrowLimit
		}
	}
	return out
}

// modelMatches is the scheduler's gpuModel rule: a case-insensitive
// substring of the card model.
func modelMatches(want, model string) bool {
	return want == "" || strings.Contains(strings.ToLower(model), strings.ToLower(want))
}

// explainCluster is the cluster as the job sees it: each node, whether its
// cards match, who holds them, until when, and whether they may be
// preempted (limit is scheduler.preemptionLimit).
func explainCluster(view View, j *broker.Job, views []api.NodeView, limit int) api.ExplainCluster {
	r := j.Spec.Resources
	out := api.ExplainCluster{Nodes: len(views), NeedsPerNode: r.GPUs, NeedsNodes: max(1, r.Nodes)}
	for _, v := range views {
		n := api.ExplainNode{Name: v.Name, State: v.State, Labels: v.Labels, Sampled: v.SampledAt}
		if len(v.Cards) > 0 {
			n.Model = v.Cards[0].Model
		}
		n.Matches = modelMatches(r.GPUModel, n.Model)
		held := map[string]int{}
		for _, cv := range v.Cards {
			switch {
			case cv.Unhealthy != "":
				n.Unusable++
			default:
				n.GPUs++
				if len(cv.Jobs) == 0 && v.State == broker.NodeReady {
					n.Free++
				}
			}
			for _, id := range cv.Jobs {
				held[id]++
			}
		}
		for id, g := range held {
			h := api.ExplainHolder{Job: id, GPUs: g}
			if o, ok := view.Job(id); ok {
				h.Team, h.Priority = o.Spec.Team, o.Spec.Priority
				h.Preemptible = o.Spec.Preemptible
				h.Requeues, h.Protected = sched.Requeues(o, limit)
				if o.StartedAt != nil && o.Spec.Timeout > 0 {
					e := o.StartedAt.Add(o.Spec.Timeout.D())
					h.Ends = &e
				}
			}
			n.Holders = append(n.Holders, h)
		}
		slices.SortFunc(n.Holders, func(a, b api.ExplainHolder) int { return strings.Compare(a.Job, b.Job) })
		if v.State == broker.NodeReady {
			out.ReadyNodes++
			if n.Matches {
				out.GPUs += n.GPUs
				out.FreeGPUs += n.Free
				out.HeldGPUs += n.GPUs - n.Free
				out.MostFreeOnOneNode = max(out.MostFreeOnOneNode, n.Free)
			}
		}
		out.Unhealthy += n.Unusable
		out.NodeList = append(out.NodeList, n)
	}
	out.Full = out.FreeGPUs < r.GPUs*max(1, r.Nodes)
	return out
}

// explainCards shows the job's own cards while it holds them.
func explainCards(j *broker.Job, views []api.NodeView, threshold int) []api.ExplainCard {
	if !j.State.Holding() {
		return nil
	}
	byName := map[string]api.NodeView{}
	for _, v := range views {
		byName[v.Name] = v
	}
	var out []api.ExplainCard
	for _, p := range j.Placements {
		v, ok := byName[p.Node]
		for _, g := range p.GPUs {
			c := api.ExplainCard{Node: p.Node, Index: g}
			if ok {
				c.SampledAt = v.SampledAt
				for _, cv := range v.Cards {
					if cv.Index != g {
						continue
					}
					c.Model, c.MemoryBytes = cv.Model, cv.MemoryBytes
					if t := cv.Telemetry; t != nil {
						u := t.SMUtil
						c.SMUtil = &u
						c.MemoryUsedBytes = t.MemoryUsedBytes
						c.Computing = u >= threshold
						for _, pr := range t.Processes {
							c.Processes = append(c.Processes, api.ExplainProcess{PID: pr.PID, MemoryBytes: pr.UsedMemoryBytes, Job: cv.ProcessJobs[pr.PID]})
						}
					}
				}
			}
			out = append(out, c)
		}
	}
	return out
}

// explainExit reads the last attempt's log tail and looks for the reason
// it ended, OOM first.
func explainExit(ctx context.Context, store broker.Store, j *broker.Job) (*api.ExplainExit, error) {
	if j.Attempt == 0 {
		return nil, nil
	}
	x := &api.ExplainExit{Attempt: j.Attempt, ExitCode: j.ExitCode, Signal: j.Signal}
	for i := len(j.History) - 1; i >= 0; i-- {
		t := j.History[i]
		if t.From.Holding() && !t.To.Holding() {
			x.Reason, x.Detail = t.Reason, t.Detail
			break
		}
	}
	var raw []byte
	err := store.View(ctx, func(tx broker.Tx) error {
		m, err := broker.GetLogMeta(tx, j.ID, j.Attempt)
		if err != nil {
			return err
		}
		raw, err = broker.ReadLog(tx, j.ID, j.Attempt, max(0, m.Size-explainLogBytes), explainLogBytes)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("read log: %w", err)
	}
	for _, l := range strings.Split(string(broker.LastLines(raw, explainTailLines)), "\n") {
		if l != "" {
			x.LogTail = append(x.LogTail, strings.TrimRight(l, "\r"))
		}
	}
	ended := x.ExitCode != nil || x.Signal != ""
	if ended && !stoppedByBroker(x.Reason) {
		x.OOM, x.Evidence = detectOOM(raw, x.ExitCode, x.Signal)
	}
	explainRuntime(x)
	return x, nil
}

// stoppedByBroker reports whether an attempt's end was the broker's doing
// (a kill then is no crash).
func stoppedByBroker(reason string) bool {
	switch reason {
	case "cancelled", "preempted", burst.StopSpillBack, "timed_out", "idle_reclaimed", "node_lost", "agent_restarted", "agent_forgot":
		return true
	}
	return false
}

// GPU and host out-of-memory markers, matched case-insensitively on one
// log line. GPU markers come from PyTorch, CUDA, cuBLAS, JAX/XLA and
// TensorFlow; host markers from the kernel's OOM killer as a shell prints
// it, Python and C++.
var (
	gpuOOMMarkers = []string{"cuda out of memory", "torch.cuda.outofmemoryerror", "torch.outofmemoryerror",
		"cuda_error_out_of_memory", "cudaerrormemoryallocation", "cublas_status_alloc_failed",
		"resource_exhausted: out of memory", "out of memory on device", "failed to allocate memory on gpu"}
	hostOOMMarkers = []string{"memoryerror", "std::bad_alloc", "cannot allocate memory", "out of memory: killed process", "java.lang.outofmemoryerror"}
)

// detectOOM looks for an out-of-memory end: a GPU marker in the log, else
// a host marker, else the kernel OOM killer's signature — SIGKILL (or exit
// 137 from a shell) that nobody sent, with "Killed" as the last words.
func detectOOM(log []byte, exit *int, signal string) (kind, evidence string) {
	lines := bytes.Split(log, []byte("\n"))
	find := func(markers []string) string {
		for i := len(lines) - 1; i >= 0; i-- {
			l := bytes.ToLower(lines[i])
			for _, m := range markers {
				if bytes.Contains(l, []byte(m)) {
					return clipLine(string(bytes.TrimSpace(lines[i])))
				}
			}
		}
		return ""
	}
	if e := find(gpuOOMMarkers); e != "" {
		return "gpu", e
	}
	if bytes.Contains(bytes.ToLower(log), []byte("outofmemoryerror")) {
		if e := find([]string{"outofmemoryerror"}); e != "" {
			return "gpu", e
		}
	}
	if e := find(hostOOMMarkers); e != "" {
		return "host", e
	}
	killed := signal == "SIGKILL" || (exit != nil && *exit == 137)
	if killed {
		for i := len(lines) - 1; i >= 0; i-- {
			l := strings.TrimSpace(string(lines[i]))
			if l == "" {
				continue
			}
			if l == "Killed" || strings.HasSuffix(l, " Killed") {
				return "host", l
			}
			break
		}
		what := "SIGKILL"
		if signal == "" {
			what = "exit code 137 (128 + SIGKILL)"
		}
		return "host", what + " that neither Spillway nor a person sent: the kernel's OOM killer"
	}
	return "", ""
}

func clipLine(s string) string {
	if len(s) > 200 {
		return s[:200] + "…"
	}
	return s
}

// explainVerdict picks the most likely reason and says what to do, in one
// sentence.
func explainVerdict(x *api.Explanation) api.ExplainVerdict {
	j := x.Job
	switch j.State {
	case broker.StateSucceeded:
		return verdict(VerdictSucceeded, fmt.Sprintf("The job finished successfully %s; nothing to do.", at(*j.EndedAt)))
	case broker.StateCancelled:
		return verdict(VerdictCancelled, fmt.Sprintf("The job was cancelled (%s); submit it again if that was a mistake.", lastDetail(j)))
	case broker.StateTimedOut:
		return verdict(VerdictTimedOut, fmt.Sprintf("The job ran past its timeout of %s and was stopped; ask for a longer timeout (up to the queue's maximum) or checkpoint and resume.", j.Spec.Timeout))
	case broker.StateFailed:
		if v, ok := runtimeVerdict(x); ok {
			return v
		}
		if v, ok := dataFailVerdict(j); ok {
			return v
		}
		if v, ok := crashVerdict(x, ""); ok {
			return v
		}
		if x.Exit != nil && x.Exit.Reason == "idle_reclaimed" {
			return verdict(VerdictReclaimed, "The job was ended because its GPUs computed almost nothing for the idle window; make sure it keeps its cards busy, or run interactive work elsewhere.")
		}
		if x.Exit != nil && x.Exit.Reason == "node_lost" {
			return verdict(VerdictNodeProblems, fmt.Sprintf("The job's node went silent (%s) and restartPolicy Never kept it from being requeued; submit it again.", x.Exit.Detail))
		}
		return verdict(VerdictCrashed, fmt.Sprintf("The job failed (%s); read the log tail above and `spillway logs %s`.", lastDetail(j), j.ID))
	case broker.StatePending:
		return pendingVerdict(x)
	case broker.StateProvisioning:
		return verdict(VerdictStarting, fmt.Sprintf("The job is bound to burst machine %s, which is being started for it; `spillway instances` shows each step.", dash0(j.Machine)))
	case broker.StateStarting:
		node := strings.Join(j.Nodes(), ", ")
		return verdict(VerdictStarting, fmt.Sprintf("The job was placed on %s %s and the agent is starting it; if it stays here, check that node with `spillway nodes`.", dash0(node), ago0(x.At, x.State.Since)))
	}
	// Running.
	if v, ok := dataRunVerdict(j); ok && j.Stop == nil {
		return v
	}
	if j.Stop != nil {
		return verdict(VerdictStopping, fmt.Sprintf("The job is being stopped (%s: %s); it got %s and has %s to save its work.", j.Stop.Reason, j.Stop.Detail, j.Stop.Signal, broker.FormatDuration(j.Stop.Grace)))
	}
	busy, measured, util, mem := 0, 0, 0, int64(0)
	for _, c := range x.Cards {
		if c.SMUtil == nil {
			continue
		}
		measured++
		util += *c.SMUtil
		mem += c.MemoryUsedBytes
		if c.Computing {
			busy++
		}
	}
	if j.IdleSince != nil || (measured > 0 && busy == 0) {
		since := ""
		if j.IdleSince != nil {
			since = " since " + j.IdleSince.UTC().Format("15:04 UTC Jan 2")
		}
		return verdict(VerdictIdle, fmt.Sprintf("The job holds %d GPU(s) and %s of GPU memory but computes almost nothing (%d%% compute)%s; check it is not stuck (data loading, a debugger, a finished notebook), and cancel it to give the cards back.",
			len(x.Cards), gibs(mem), util/max(1, measured), since))
	}
	if measured == 0 {
		return verdict(VerdictComputing, "The job is running; its node has sent no GPU telemetry yet, so whether it computes is not known — look again in a minute.")
	}
	return verdict(VerdictComputing, fmt.Sprintf("The job is running and computing (%d%% compute on %d of %d GPUs); nothing is wrong.", util/measured, busy, len(x.Cards)))
}

// crashVerdict names an out-of-memory or crashed last attempt; then says
// what happens next (nothing, or the retry).
func crashVerdict(x *api.Explanation, next string) (api.ExplainVerdict, bool) {
	e := x.Exit
	if e == nil || stoppedByBroker(e.Reason) {
		return api.ExplainVerdict{}, false
	}
	switch e.OOM {
	case "gpu":
		return verdict(VerdictGPUOOM, fmt.Sprintf("The job crashed because the GPU ran out of memory (%q)%s; lower the batch size or model size, or ask for a card with more memory (resources.gpuModel) or more GPUs.", e.Evidence, next)), true
	case "host":
		return verdict(VerdictHostOOM, fmt.Sprintf("The job was killed for running out of host memory (%s)%s; ask for more memory (resources.memory) or load less data at once.", e.Evidence, next)), true
	}
	if e.Signal != "" || (e.ExitCode != nil && *e.ExitCode != 0) {
		what := e.Signal
		if what == "" {
			what = fmt.Sprintf("exit code %d", *e.ExitCode)
		}
		return verdict(VerdictCrashed, fmt.Sprintf("The job's last attempt crashed (%s)%s; read the log tail above and `spillway logs %s --attempt %d`.", what, next, x.Job.ID, e.Attempt)), true
	}
	return api.ExplainVerdict{}, false
}

// pendingVerdict says why a pending job waits, from its reason's code.
func pendingVerdict(x *api.Explanation) api.ExplainVerdict {
	j := x.Job
	r := j.Pending
	if r == nil {
		return verdict(VerdictNew, "The job was just submitted and the scheduler has not looked at it yet; look again in a few seconds.")
	}
	c := x.Cluster
	need := c.NeedsPerNode * c.NeedsNodes
	pos := ""
	if r.Position > 0 {
		pos = fmt.Sprintf("; it is %s in queue %s", ordinal(r.Position), j.Spec.Queue)
	}
	eta := ""
	if r.EstimatedStart != nil {
		eta = ", expected to start around " + r.EstimatedStart.UTC().Format("15:04 UTC Jan 2")
	}
	switch r.Code {
	case sched.ReasonBackoff:
		next := fmt.Sprintf(", and waits out its retry backoff (retry %d/%d)", j.Retries, j.Spec.MaxRetries)
		if v, ok := crashVerdict(x, next); ok {
			return v
		}
		return verdict(VerdictBackoff, fmt.Sprintf("The job failed and waits out its retry backoff (%s); read the log tail above.", r.Message))
	case sched.ReasonQuota:
		t := x.Team
		quota := ""
		if t.QuotaGPUs != nil {
			quota = fmt.Sprintf(" (guaranteed %d GPUs", *t.QuotaGPUs)
			if t.BorrowLimit != nil {
				quota += fmt.Sprintf(", may borrow %d more", *t.BorrowLimit)
			}
			quota += ")"
		}
		return verdict(VerdictQuota, fmt.Sprintf("The job waits for its team's quota (%s): team %s's %d running job(s) hold %d GPUs%s, and it starts when they end — or ask an operator to raise the quota.",
			r.Message, j.Spec.Team, t.RunningJobs, t.HeldGPUs, quota))
	case sched.ReasonResources:
		if c.FreeGPUs >= need && c.MostFreeOnOneNode < c.NeedsPerNode {
			return verdict(VerdictWholeNode, fmt.Sprintf("The job needs %d GPUs on one node: %d GPUs are free but spread out (at most %d on one node)%s%s; it starts when a node frees up, or ask for fewer GPUs per node (resources.gpus with resources.nodes).",
				c.NeedsPerNode, c.FreeGPUs, c.MostFreeOnOneNode, pos, eta))
		}
		return verdict(VerdictClusterFull, fmt.Sprintf("The cluster is full: %d of %d matching GPUs are in use and the job needs %d%s%s; it starts when running jobs end.%s",
			c.HeldGPUs, c.GPUs, need, pos, eta, protectedNote(c)))
	case sched.ReasonGang:
		return verdict(VerdictGang, fmt.Sprintf("The job needs %d nodes with %d free GPUs each in one pool (%s)%s%s; it starts when enough whole nodes free up.%s", c.NeedsNodes, c.NeedsPerNode, r.Message, pos, eta, preflightNote(j)))
	case sched.ReasonArrayLimit:
		return verdict(VerdictArrayLimit, fmt.Sprintf("The job is an element of array %s, which runs at most %d of its elements at once (its limit, %%%d)%s; it starts when one of them ends or the limit is raised (spillway job limit %s N) — nothing is wrong with it.",
			j.ArrayID, j.ArrayLimit, j.ArrayLimit, pos, j.ArrayID))
	case sched.ReasonNoFit:
		return verdict(VerdictNoFit, fmt.Sprintf("No ready node can ever hold this job (%s); change its resources (gpuModel, gpus, memory) or ask an operator whether such nodes exist.", r.Message))
	case burst.CodeBudget:
		return verdict(VerdictBurstBudget, fmt.Sprintf("On-prem GPUs are taken (%d free, it needs %d) and bursting to the cloud is blocked by the budget (%s); it waits for on-prem GPUs, or an operator raises the budget with `spillway budget set`.",
			c.FreeGPUs, need, r.Message))
	case burst.CodeBelowThreshold, burst.CodeMinWait, burst.CodeInProgress, burst.CodeNoOffer, burst.CodeCapped, burst.CodeNotEligible:
		return verdict(VerdictBurst, fmt.Sprintf("The job waits for GPUs (%d free, it needs %d) and will not burst yet: %s%s.", c.FreeGPUs, need, r.Message, pos))
	}
	return verdict(VerdictWaiting, fmt.Sprintf("The job waits: %s%s; nothing is wrong with it.", r.Message, eta))
}

// protectedNote says how many of the held matching GPUs belong to
// preemptible jobs that scheduler.preemptionLimit protects: a user who
// expects a higher class to take them learns why it does not.
func protectedNote(c api.ExplainCluster) string {
	gpus, jobs := 0, 0
	for _, n := range c.NodeList {
		if n.State != broker.NodeReady || !n.Matches {
			continue
		}
		for _, h := range n.Holders {
			if h.Protected {
				gpus += h.GPUs
				jobs++
			}
		}
	}
	if jobs == 0 {
		return ""
	}
	return fmt.Sprintf(" %d of them are held by %d preemptible job(s) requeued as often as scheduler.preemptionLimit allows, which are not preempted again.", gpus, jobs)
}

// explainSteps prints the walk as lines a CLI and a page show in order.
func explainSteps(x *api.Explanation) []string {
	j := x.Job
	var out []string
	add := func(format string, args ...any) { out = append(out, fmt.Sprintf(format, args...)) }
	add("1. State: %s %s (attempt %d, retries %d/%d)", j.State, ago0(x.At, x.State.Since), j.Attempt, j.Retries, j.Spec.MaxRetries)
	for _, m := range x.Moves {
		add("   Moved home %s ago: %s", broker.FormatDuration(x.At.Sub(m.At).Truncate(time.Second)), m.Detail)
	}
	for _, r := range x.Reclaims {
		add("   Reclaimed by its provider %s ago: %s", broker.FormatDuration(x.At.Sub(r.At).Truncate(time.Second)), r.Detail)
	}
	if q := x.Queue; q != nil {
		line := fmt.Sprintf("2. Queue %s: %d waiting", q.Queue, q.Waiting)
		if q.Reason != nil {
			line += fmt.Sprintf("; this job: %s [%s]", q.Reason.Message, q.Reason.Code)
		}
		add("%s", line)
		for _, a := range q.Ahead {
			who := dash0(a.ID)
			if a.Name != "" {
				who += " " + broker.ElementName(a.Name, a.ArrayIndex)
			}
			add("     ahead: #%d %s team %s %s %d GPU(s) [%s]", a.Position, who, a.Team, a.Priority, a.GPUs, a.Reason)
		}
		add("   Team %s holds %d GPUs in %d running job(s)", x.Team.Team, x.Team.HeldGPUs, x.Team.RunningJobs)
	} else {
		add("2. Queue: not waiting")
	}
	c := x.Cluster
	add("3. Cluster: %d/%d nodes ready; %d of %d matching GPUs free (most on one node: %d); needs %d × %d", c.ReadyNodes, c.Nodes, c.FreeGPUs, c.GPUs, c.MostFreeOnOneNode, c.NeedsNodes, c.NeedsPerNode)
	for _, n := range c.NodeList {
		var hs []string
		for _, h := range n.Holders {
			switch {
			case h.Protected:
				hs = append(hs, fmt.Sprintf("%s (%s, %d, preemptible but requeued %d times: scheduler.preemptionLimit protects it)", h.Job, h.Team, h.GPUs, h.Requeues))
			case h.Preemptible:
				hs = append(hs, fmt.Sprintf("%s (%s, %d, preemptible)", h.Job, h.Team, h.GPUs))
			default:
				hs = append(hs, fmt.Sprintf("%s (%s, %d)", h.Job, h.Team, h.GPUs))
			}
		}
		add("     %s %s: %d/%d free; held by %s", n.Name, n.State, n.Free, n.GPUs, dash0(strings.Join(hs, ", ")))
	}
	if len(x.Cards) == 0 {
		add("4. Cards: the job holds none")
	} else {
		add("4. Cards of the job:")
		for _, cd := range x.Cards {
			util := "no telemetry"
			if cd.SMUtil != nil {
				state := "idle"
				if cd.Computing {
					state = "computing"
				}
				util = fmt.Sprintf("%d%% compute (%s), %s/%s memory", *cd.SMUtil, state, gibs(cd.MemoryUsedBytes), gibs(cd.MemoryBytes))
			}
			var ps []string
			for _, p := range cd.Processes {
				ps = append(ps, fmt.Sprintf("pid %d %s %s", p.PID, gibs(p.MemoryBytes), dash0(p.Job)))
			}
			add("     %s GPU %d: %s; processes: %s", cd.Node, cd.Index, util, dash0(strings.Join(ps, ", ")))
		}
	}
	if e := x.Exit; e != nil && (e.ExitCode != nil || e.Signal != "" || len(e.LogTail) > 0) {
		line := fmt.Sprintf("5. Attempt %d", e.Attempt)
		switch {
		case e.Detail != "":
			line += " ended: " + e.Detail
		case e.Signal != "":
			line += " ended: killed by " + e.Signal
		case e.ExitCode != nil:
			line += fmt.Sprintf(" ended: exit code %d", *e.ExitCode)
		default:
			line += " is running; its log ends"
		}
		if e.OOM != "" {
			line += fmt.Sprintf("; out of %s memory: %s", e.OOM, e.Evidence)
		}
		add("%s", strings.TrimSpace(line))
		if e.Runtime != "" {
			add("     runtime: %s", e.Runtime)
		}
		for _, l := range e.LogTail {
			add("     | %s", l)
		}
	} else {
		add("5. Log: nothing yet")
	}
	return out
}

func lastDetail(j *broker.Job) string {
	if n := len(j.History); n > 0 {
		t := j.History[n-1]
		if t.Detail != "" {
			return t.Detail
		}
		return t.Reason
	}
	return string(j.State)
}

func at(t time.Time) string { return "at " + t.UTC().Format("15:04 UTC Jan 2") }

func ago0(now, t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return "for " + broker.FormatDuration(now.Sub(t).Truncate(time.Second))
}

func dash0(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func gibs(b int64) string { return fmt.Sprintf("%.1f GiB", float64(b)/(1<<30)) }

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

// verdict is an explanation's verdict: its code and the sentence for people.
func verdict(code, sentence string) api.ExplainVerdict {
	return api.ExplainVerdict{Code: code, Sentence: sentence}
}

// ReasonPreflightFailed is the stop reason of a gang attempt whose
// preflight failed (the server's gang start, broker/server/gang.go).
const ReasonPreflightFailed = "preflight_failed"

// preflightNote is explain's account of the gang's last failed preflight,
// if its last attempt ended in one.
func preflightNote(j *broker.Job) string {
	for i := len(j.History) - 1; i >= 0; i-- {
		t := j.History[i]
		if t.To == broker.StateStarting {
			return ""
		}
		if t.Reason == ReasonPreflightFailed {
			return fmt.Sprintf(" Its last attempt failed the gang preflight (%s); the scheduler no longer puts those nodes together for it.",
				strings.TrimSuffix(t.Detail, "; requeued"))
		}
	}
	return ""
}
