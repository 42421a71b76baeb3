package server

import (
	"context"
	"fmt"
	"github.com/spillway-dev/spillway/broker/burst"
	"runtime/trace"
	"time"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/sched"
	"github.com/spillway-dev/spillway/broker/state"
	"github.com/spillway-dev/spillway/onprem/agentapi"
)

// cloneJob copies a job so that a change can be built, written and only
// then swapped into memory (broker.Job.Clone).
func cloneJob(j *broker.Job) *broker.Job { return j.Clone() }

func cloneNode(n *broker.Node) *broker.Node {
	c := *n
	if n.Unhealthy != nil {
		c.Unhealthy = make(map[int]string, len(n.Unhealthy))
		for k, v := range n.Unhealthy {
			c.Unhealthy[k] = v
		}
	}
	return &c
}

// commitLocked writes jobs, nodes and whatever extra does in one
// transaction, then applies the jobs and nodes to memory (s.view.Apply),
// with the server's side effects of each job's change. The caller holds
// s.mu. Nothing reaches memory unless the store accepted it.
func (s *Server) commitLocked(ctx context.Context, jobs []*broker.Job, nodes []*broker.Node, extra func(broker.Tx) error) error {
	if len(jobs) == 0 && len(nodes) == 0 && extra == nil {
		return nil
	}
	now := s.clock.Now()
	defer trace.StartRegion(ctx, "broker.commit").End()
	// Batch: the commit shares its fsync with the submits and the other
	// commits of the moment (group commit), and, patient, waits a moment
	// for a submit to share it with (broker.GroupCommit.Linger); fn reads
	// memory the caller's lock holds still, and writes only the
	// transaction.
	err := s.store.Batch(broker.Patient(withCommit(ctx, commitState, len(jobs))), func(tx broker.Tx) error {
		for _, j := range jobs {
			if err := broker.PutJob(tx, j); err != nil {
				return err
			}
			old := s.view.Job(j.ID)
			if err := s.allocChangesLocked(tx, old, j, now); err != nil {
				return err
			}
			if err := s.keepAllocHistoryLocked(tx, old, j, now); err != nil {
				return err
			}
		}
		for _, n := range nodes {
			if err := broker.PutNode(tx, n); err != nil {
				return err
			}
		}
		if extra != nil {
			return extra(tx)
		}
		return nil
	})
	if err != nil {
		if broker.IsStoreFailure(err) {
			s.noteStoreFailure(err)
		}
		return fmt.Errorf("commit: %w", err)
	}
	s.noteStoreSuccess()
	s.view.Apply(jobs, nodes, func(old, j *broker.Job) {
		if old != nil && old.State.Holding() && !j.State.Holding() {
			// The attempt stopped holding cards: count its fair-share usage.
			if sc, err := s.schedulingLocked(ctx); err == nil {
				sc.ledger.release(old, j)
			} else {
				s.log.Error("fair-share usage not counted", "job", j.ID, "err", err)
			}
		}
		s.trackPendingLocked(old, j)
		s.metrics.observeTransition(old, j)
	})
	if len(nodes) > 0 {
		s.noteInventoryLocked()
	}
	return nil
}

// placedOn reports whether the job runs (part of) its current attempt on
// node.
func placedOn(j *broker.Job, node string) (broker.Placement, int, bool) {
	for i, p := range j.Placements {
		if p.Node == node {
			return p, i, true
		}
	}
	return broker.Placement{}, -1, false
}

// Cycle runs one scheduling cycle: node liveness, then the scheduler core,
// then the plan applied in one transaction.
func (s *Server) Cycle(ctx context.Context) error {
	s.cycleMu.Lock()
	defer s.cycleMu.Unlock()
	s.lock()
	if !s.mayDecideLocked() {
		s.mu.Unlock()
		return nil // a standby, or the store is unreachable (leader.go)
	}
	now := s.clock.Now()
	if err := s.housekeepLocked(ctx, now); err != nil {
		s.mu.Unlock()
		return err
	}
	sc, err := s.schedulingLocked(ctx)
	if err != nil {
		s.mu.Unlock()
		return err
	}
	sc.ledger.advance(now, s.view.Held())
	snap := s.snapshotLocked(now)
	upkeep := s.telemetryUpkeepLocked(now)
	s.mu.Unlock()
	defer trace.StartRegion(ctx, "broker.cycle").End()

	// The core runs without the lock: jobs and nodes are replaced, never
	// changed in place, so the snapshot stays consistent while submits and
	// heartbeats go on. applyLocked skips whatever changed meanwhile.
	t0 := time.Now()
	r := trace.StartRegion(ctx, "broker.schedule")
	plan := sc.core.Schedule(snap)
	r.End()
	s.metrics.cycleSeconds.Observe(time.Since(t0).Seconds())

	s.lock()
	if !s.mayDecideLocked() {
		s.mu.Unlock()
		return nil
	}
	err = s.applyLocked(ctx, now, plan)
	s.mu.Unlock()
	if err != nil {
		return err
	}
	if err := s.upkeepTelemetry(ctx, now, upkeep); err != nil {
		s.log.Error("telemetry roll-up or pruning failed", "err", err)
	}
	return nil
}

// housekeepLocked is the part of a cycle that is not placement: lost
// nodes, idle jobs, telemetry points, metering. (Rolling telemetry up and
// pruning it come at the end of the cycle, without the lock.)
func (s *Server) housekeepLocked(ctx context.Context, now time.Time) error {
	if err := s.checkNodesLocked(ctx, now); err != nil {
		return err
	}
	if err := s.checkIdleLocked(ctx, now); err != nil {
		return err
	}
	if err := s.flushTelemetryLocked(ctx, now); err != nil {
		s.log.Error("telemetry flush failed", "err", err)
	}
	if now.Sub(s.meter.last) >= s.meterEvery() {
		s.meter.last = now
		if err := s.meterLocked(ctx, now); err != nil {
			s.log.Error("metering failed", "err", err)
		}
	}
	return nil
}

// snapshotLocked is the scheduler's input: every node and non-terminal
// job (in map order: the core does not depend on it), the policy, and
// fair-share usage as of now. The caller holds s.mu and has called
// schedulingLocked.
func (s *Server) snapshotLocked(now time.Time) *sched.Snapshot {
	sc := &s.scheduling
	snap := &sched.Snapshot{Now: now, Policy: sc.policy, Usage: sc.ledger.Values(nil),
		Nodes: make([]*broker.Node, 0, s.view.NodeCount()), Jobs: make([]*broker.Job, 0, s.view.JobCount())}
	for n := range s.view.Nodes() {
		if n.Cordon != nil && n.State == broker.NodeReady {
			// Cordoned: runs what it has, takes nothing new.
			nn := *n
			nn.State = broker.NodeDraining
			n = &nn
		}
		snap.Nodes = append(snap.Nodes, n)
	}
	handles := sc.handles[:0]
	for j, h := range s.view.JobHandles() {
		if j.Hold != nil && j.State == broker.StatePending {
			continue // held: neither scheduled nor burst
		}
		snap.Jobs = append(snap.Jobs, j)
		handles = append(handles, h)
	}
	sc.handles = handles
	return snap
}

// applyLocked carries out a plan: starts become assignments for agents,
// stops (timeouts, preemptions) become stop requests with the job's
// checkpoint signal and grace, pending reasons are kept, and fair-share
// usage is written when due — all in one transaction.
func (s *Server) applyLocked(ctx context.Context, now time.Time, plan sched.Plan) error {
	s.logPreemptions(&plan)
	var changed []*broker.Job
	wake := map[string]bool{}
	for _, st := range plan.Starts {
		old := s.view.Job(st.Job)
		if old == nil || (old.State != broker.StatePending && old.State != broker.StateProvisioning) {
			continue // the plan is stale for this job; the next cycle decides again
		}
		j := cloneJob(old)
		j.Start(st.Placements, now)
		j.GangPort = 0
		if len(j.Placements) > 1 {
			j.GangPort = s.gangPortLocked(j)
		}
		changed = append(changed, j)
		for _, p := range st.Placements {
			wake[p.Node] = true
		}
	}
	for _, st := range plan.Stops {
		old := s.view.Job(st.Job)
		if old == nil || old.Stop != nil || !old.State.Holding() {
			continue
		}
		j := cloneJob(old)
		j.RequestStop(st.Reason, st.Detail, "scheduler", now)
		changed = append(changed, j)
		for _, n := range j.Nodes() {
			wake[n] = true
		}
	}
	handles := s.scheduling.handles
	for i := range plan.Pending {
		pe := &plan.Pending[i]
		id, r := pe.Job, pe.Reason
		// No lookup and no read of its record for a job of the snapshot.
		var n state.Noted
		if j, k := pe.SnapshotJob(); k >= 0 && k < len(handles) && handles[k].Job() == j {
			n = s.view.NoteReasonAt(handles[k], r)
		} else {
			n = s.view.NoteReason(id, r)
		}
		if n.Job == nil || !n.Waiting || (n.HasCode && n.Code == r.Code()) {
			continue
		}
		// The full sentence with the queue position is served from memory.
		// The store gets the reason's kind when it changes, at most every
		// reasonPersistEvery per job — counted for a job without a stored
		// reason from its entry into the queue — so codes that flip between
		// cycles, and jobs that wait only moments, do not turn into a write
		// storm; a standby still shows a recent one.
		saved := n.SavedAt
		if !n.Saved && len(n.Job.History) > 0 {
			saved = n.Job.History[len(n.Job.History)-1].At
		}
		if now.Sub(saved) >= reasonPersistEvery {
			j := cloneJob(n.Job)
			rc := r.PendingReason()
			j.Pending = &rc
			changed = append(changed, j)
			s.view.NoteReasonSaved(id, now)
		}
	}
	ledger := s.scheduling.ledger
	var flush func(broker.Tx) error
	if ledger != nil {
		flush = ledger.flush(now)
	}
	if err := s.commitLocked(ctx, changed, nil, flush); err != nil {
		return err
	}
	if flush != nil {
		ledger.flushedAt, ledger.dirty = now, false
	}
	for n := range wake {
		s.wakeNodeLocked(n)
	}
	return nil
}

// endedMachineLocked reports whether name is a burst machine the
// controller is ending or has ended.
func (s *Server) endedMachineLocked(name string) bool {
	r := s.fleet.RecordLocked(name)
	if r == nil {
		return false
	}
	switch r.State {
	case broker.MachineDraining, broker.MachineTerminating, broker.MachineTerminated, broker.MachineFailed:
		return true
	}
	return false
}

// checkNodesLocked declares nodes lost when they have been silent past the
// TTL and returns their jobs to the queue.
func (s *Server) checkNodesLocked(ctx context.Context, now time.Time) error {
	ttl := s.cfg().Agents.LostTimeout()
	var nodes []*broker.Node
	var jobs []*broker.Job
	byID := map[string]*broker.Job{}
	for n := range s.view.Nodes() {
		if n.State == broker.NodeLost {
			continue
		}
		seen := n.LastSeen
		if seen.Before(s.started) {
			seen = s.started // grace after a broker restart
		}
		if now.Sub(seen) <= ttl {
			continue
		}
		nn := cloneNode(n)
		nn.State = broker.NodeLost
		nodes = append(nodes, nn)
		if s.endedMachineLocked(n.Name) {
			// A burst machine the controller ended on purpose (scale-down,
			// a failed bootstrap): its silence is expected.
			s.log.Info("burst machine's node gone after it was ended", "node", n.Name, "last_seen", n.LastSeen)
		} else {
			s.log.Warn("node lost", "node", n.Name, "last_seen", n.LastSeen, "ttl", ttl)
		}
		for _, j := range s.view.HoldingOn(n.Name) {
			jj := byID[j.ID] // a gang may lose several members at once
			if jj == nil {
				jj = cloneJob(j)
				byID[j.ID] = jj
				jobs = append(jobs, jj)
			}
			// The job is lost as of the node's last heartbeat: that is
			// also where its GPU-time stops being metered.
			lostAt := n.LastSeen
			if last := jj.History[len(jj.History)-1].At; lostAt.Before(last) {
				lostAt = last
			}
			s.loseOnLocked(jj, n.Name, lostAt, now, "node_lost", fmt.Sprintf("node %s missed its heartbeats (last seen %s)", n.Name, n.LastSeen.UTC().Format(time.RFC3339)))
		}
	}
	if len(nodes) == 0 {
		return nil
	}
	if err := s.commitLocked(ctx, jobs, nodes, nil); err != nil {
		return err
	}
	for _, j := range jobs {
		for _, p := range j.Placements {
			s.wakeNodeLocked(p.Node)
		}
	}
	return nil
}

// loseJob records that a job's attempt vanished with its node (or agent)
// at lostAt, noticed now: back to the queue, unless the job must never be
// restarted.
func (s *Server) loseJob(j *broker.Job, lostAt, now time.Time, reason, detail string) {
	j.Lose(lostAt, now, reason, detail)
}

// endAttempt records the end of a job's current attempt from the agent's
// report and decides what comes next: a terminal state, the queue again
// after a preemption, or a retry with backoff.
func (s *Server) endAttempt(j *broker.Job, r agentapi.JobReport, now time.Time) {
	ended := r.EndedAt
	if ended.IsZero() {
		ended = now
	}
	if j.State == broker.StateStarting && r.State != agentapi.RunFailedToStart {
		started := r.StartedAt
		if started.IsZero() {
			started = ended
		}
		j.StartedAt = &started
		j.Transit(started, broker.StateRunning, "started", "")
	}
	code := r.ExitCode
	j.ExitCode = &code
	j.Signal = r.Signal
	exit := describeExit(r)
	stop := j.Stop
	switch {
	case stop != nil && stop.Reason == "cancelled":
		j.Transit(ended, broker.StateCancelled, "cancelled", broker.JoinDetail(stop.Detail, exit))
	case stop != nil && (stop.Reason == "preempted" || stop.Reason == burst.StopSpillBack):
		// A job moved home (spill-back) keeps the reason in its history,
		// where the next decision reads when it last moved.
		j.Preempted(ended, stop.Reason, broker.JoinDetail(stop.Detail, exit))
	case stop != nil && stop.Reason == agentapi.ReasonSpotReclaim:
		j.EndReclaimed(ended, exit)
	case (stop != nil && stop.Reason == "timed_out") || r.Reason == "timed_out":
		j.Transit(ended, broker.StateTimedOut, "timed_out", broker.JoinDetail(fmt.Sprintf("ran past its timeout of %s", j.Spec.Timeout), exit))
	case stop != nil:
		j.Transit(ended, broker.StateFailed, stop.Reason, broker.JoinDetail(stop.Detail, exit))
	case r.Reason == agentapi.ReasonInputMissing:
		// A missing input stays missing: no retry loop.
		j.Transit(ended, broker.StateFailed, agentapi.ReasonInputMissing, r.Message+"; not retried: fix the job's inputs and submit it again")
	case r.Reason == agentapi.ReasonOutputsFailed:
		j.Transit(ended, broker.StateFailed, agentapi.ReasonOutputsFailed, broker.JoinDetail(r.Message, exit))
	case r.State == agentapi.RunExited && code == 0 && r.Signal == "":
		j.Transit(ended, broker.StateSucceeded, "exited", exit)
	case r.Reason == agentapi.ReasonImageNotFound || r.Reason == agentapi.ReasonPullDenied:
		// Retrying cannot find an image that is not there: fail now.
		j.Transit(ended, broker.StateFailed, r.Reason, r.Message)
	case j.Spec.RestartPolicy == broker.RestartOnFailure && j.Retries < j.Spec.MaxRetries:
		j.Retries++
		backoff := retryBackoff(j.Retries)
		nb := ended.Add(backoff)
		j.NotBefore = &nb
		j.Placements, j.Machine, j.Machines = nil, "", nil
		j.Transit(ended, broker.StatePending, "retry",
			fmt.Sprintf("%s; retry %d/%d after %s", exit, j.Retries, j.Spec.MaxRetries, broker.FormatDuration(backoff)))
	default:
		reason := "exited"
		if r.State == agentapi.RunFailedToStart {
			reason = "failed_to_start"
		}
		if runtimeReason(r.Reason) {
			reason = r.Reason
		}
		j.Transit(ended, broker.StateFailed, reason, exit)
	}
}

// runtimeReason reports whether an agent's reason is the runtime's own
// account of an end (image not found, OOM by the limit, …).
func runtimeReason(r string) bool {
	switch r {
	case agentapi.ReasonImageNotFound, agentapi.ReasonPullDenied, agentapi.ReasonPullFailed,
		agentapi.ReasonOOMLimit, agentapi.ReasonOOMNode, agentapi.ReasonRuntimeError:
		return true
	}
	return false
}

// retryBackoff is 10s, 20s, 40s … capped at 10 minutes.
func retryBackoff(n int) time.Duration {
	d := 10 * time.Second
	for i := 1; i < n && d < 10*time.Minute; i++ {
		d *= 2
	}
	return min(d, 10*time.Minute)
}

func describeExit(r agentapi.JobReport) string {
	var s string
	switch {
	case r.State == agentapi.RunFailedToStart:
		s = "could not start"
	case r.Signal != "":
		s = "killed by " + r.Signal
	default:
		s = fmt.Sprintf("exit code %d", r.ExitCode)
	}
	if r.Message != "" {
		s += ": " + r.Message
	}
	return s
}
