package server

import (
	"cmp"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"
	"time"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/report"
	"github.com/spillway-dev/spillway/onprem/agentapi"
)

// A multi-node job (a gang) is one job with one placement per node
// (docs/jobs.md, "Multi-node jobs"):
//
//  1. Start: every member stages, then waits at the start barrier and
//     reports its preflight; rank 0 holds MASTER_PORT open. When all are
//     staged and agree, the others probe MASTER_ADDR:MASTER_PORT; when all
//     reach it the broker releases rank 0, and the others as soon as rank
//     0 reports it has left the barrier (its holder closed, its command
//     started), so no member can connect to the holder in place of rank
//     0's command. A difference or an unreachable port fails the attempt,
//     names the member and the difference, and the pairing is recorded so
//     the scheduler avoids it.
//  2. Stop: the first member to fail or be lost makes the broker stop the
//     others with the job's checkpoint signal and grace. The attempt ends
//     when the last member has ended, and the job goes back to the queue
//     once, as one job, under its one retry budget.

// Stop reasons of a gang.
const (
	reasonGangMemberFailed = "gang_member_failed"
	reasonGangMemberLost   = "gang_member_lost"
	reasonPreflightFailed  = report.ReasonPreflightFailed
)

// MASTER_PORT is taken from this range.
const (
	gangPortLow  = 29500
	gangPortHigh = 30499
)

// gangPortLocked picks the attempt's MASTER_PORT: a port of the range no
// other gang whose rank 0 runs on the same node holds, starting from a
// hash of the attempt so that a retry after a busy port tries another.
// Rank 0 checks it is free on the node in the preflight.
func (s *Server) gangPortLocked(j *broker.Job) int {
	used := map[int]bool{}
	for _, o := range s.view.HoldingOn(j.Placements[0].Node) {
		if o.ID != j.ID && o.GangPort != 0 && len(o.Placements) > 0 && o.Placements[0].Node == j.Placements[0].Node {
			used[o.GangPort] = true
		}
	}
	h := fnv.New32a()
	h.Write([]byte(j.ID + "/" + strconv.Itoa(j.Attempt)))
	span := gangPortHigh - gangPortLow + 1
	first := int(h.Sum32() % uint32(span))
	for i := range span {
		if p := gangPortLow + (first+i)%span; !used[p] {
			return p
		}
	}
	return gangPortLow + first
}

// nodeAddrLocked is the address other members reach a node at: the
// address its agent connects from.
func (s *Server) nodeAddrLocked(name string) string {
	if n := s.view.Node(name); n != nil && n.Address != "" {
		return n.Address
	}
	return name
}

// addGangContract sets the launch contract of a gang member (the
// variables torchrun and other launchers read) and the agent's barrier.
func (s *Server) addGangContract(j *broker.Job, rank int, env map[string]string, a *agentapi.Assignment) {
	if len(j.Placements) < 2 {
		return
	}
	hosts := make([]string, len(j.Placements))
	for i, p := range j.Placements {
		hosts[i] = s.nodeAddrLocked(p.Node)
	}
	gpus := j.Spec.Resources.GPUs
	env["MASTER_ADDR"] = hosts[0]
	env["MASTER_PORT"] = strconv.Itoa(j.GangPort)
	env["NNODES"] = strconv.Itoa(len(hosts))
	env["NODE_RANK"] = strconv.Itoa(rank)
	env["GPUS_PER_NODE"] = strconv.Itoa(gpus)
	env["WORLD_SIZE"] = strconv.Itoa(gpus * len(hosts))
	env["SPILLWAY_GANG_HOSTS"] = strings.Join(hosts, ",")
	a.Gang = &agentapi.Gang{MasterAddr: hosts[0], MasterPort: j.GangPort}
}

// barrier is the start barrier of one gang attempt.
type barrier struct {
	attempt int
	// pre[rank] is the member's latest preflight while it waits at the
	// barrier (nil before it is staged and after its release).
	pre []*agentapi.Preflight
	// probe: every member is staged and agrees, rank 0 listens; the others
	// are told to probe. release: every probe reached rank 0. failed: the
	// preflight failed and the members are being stopped.
	probe, release, failed bool
}

func (s *Server) barrierLocked(j *broker.Job) *barrier {
	if s.barriers == nil {
		s.barriers = map[string]*barrier{}
	}
	b := s.barriers[j.ID]
	if b == nil || b.attempt != j.Attempt {
		b = &barrier{attempt: j.Attempt, pre: make([]*agentapi.Preflight, len(j.Placements))}
		s.barriers[j.ID] = b
	}
	return b
}

func (s *Server) wakeMembersLocked(j *broker.Job) {
	for _, p := range j.Placements {
		s.wakeNodeLocked(p.Node)
	}
}

// notePreflightLocked records a waiting member's preflight and moves the
// barrier on. It returns the job with a stop request when the preflight
// failed, else nil.
func (s *Server) notePreflightLocked(j *broker.Job, rank int, p *agentapi.Preflight, now time.Time) *broker.Job {
	b := s.barrierLocked(j)
	pc := *p
	b.pre[rank] = &pc
	if b.release || b.failed || j.Stop != nil {
		return nil
	}
	for _, m := range b.pre {
		if m == nil || !m.Staged {
			return nil
		}
	}
	node := func(r int) string { return j.Placements[r].Node }
	m0 := b.pre[0]
	if m0.PortError != "" {
		return s.failPreflightLocked(j, b, now, fmt.Sprintf("member 0 on %s cannot listen on MASTER_PORT %d: %s", node(0), j.GangPort, m0.PortError), "", "")
	}
	for r := 1; r < len(b.pre); r++ {
		if d := preflightDiff(b.pre[r], m0); d != "" {
			return s.failPreflightLocked(j, b, now,
				fmt.Sprintf("member %d on %s differs from member 0 on %s: %s", r, node(r), node(0), d), node(0), node(r))
		}
	}
	if !m0.Listening {
		return nil
	}
	if !b.probe {
		b.probe = true
		s.wakeMembersLocked(j)
	}
	for r := 1; r < len(b.pre); r++ {
		m := b.pre[r]
		if !m.Probed {
			return nil
		}
		if m.ProbeError != "" {
			return s.failPreflightLocked(j, b, now,
				fmt.Sprintf("member %d on %s cannot reach MASTER_ADDR:MASTER_PORT %s:%d of member 0 on %s: %s",
					r, node(r), s.nodeAddrLocked(node(0)), j.GangPort, node(0), m.ProbeError), node(0), node(r))
		}
	}
	b.release = true
	s.log.Info("gang released", "job", j.ID, "attempt", j.Attempt, "members", len(b.pre))
	s.wakeNodeLocked(node(0))
	return nil
}

// preflightDiff names what differs between a member's report and rank 0's.
func preflightDiff(m, m0 *agentapi.Preflight) string {
	var out []string
	add := func(what, v, v0 string) {
		if v != v0 {
			out = append(out, fmt.Sprintf("%s %s, member 0 has %s", what, cmp.Or(v, "(none)"), cmp.Or(v0, "(none)")))
		}
	}
	add("driver", m.DriverVersion, m0.DriverVersion)
	add("CUDA", m.CUDAVersion, m0.CUDAVersion)
	add("image", m.Image, m0.Image)
	add("framework", m.Framework, m0.Framework)
	return strings.Join(out, "; ")
}

// failPreflightLocked stops every member before its command ran and, when
// the failure is between two nodes, records the pairing for the scheduler.
func (s *Server) failPreflightLocked(j *broker.Job, b *barrier, now time.Time, detail, a, c string) *broker.Job {
	b.failed = true
	jj := cloneJob(j)
	jj.Stop = &broker.StopRequest{Reason: reasonPreflightFailed, Detail: "preflight: " + detail, Signal: "SIGKILL",
		RequestedAt: now, By: "gang"}
	if a != "" && c != "" && !jj.Avoids(a, c) {
		jj.AvoidPairs = append(append([]broker.NodePair(nil), j.AvoidPairs...), broker.Pair(a, c))
	}
	s.log.Warn("gang preflight failed", "job", j.ID, "attempt", j.Attempt, "detail", detail)
	s.wakeMembersLocked(j)
	return jj
}

// gangOrdersLocked are the barrier orders for the members waiting on node.
func (s *Server) gangOrdersLocked(node string) []agentapi.GangOrder {
	var out []agentapi.GangOrder
	for _, j := range s.view.HoldingOn(node) {
		b := s.barriers[j.ID]
		if b == nil || b.attempt != j.Attempt || b.failed || j.Stop != nil {
			continue
		}
		_, rank, ok := placedOn(j, node)
		if !ok || rank >= len(b.pre) || b.pre[rank] == nil {
			continue
		}
		ref := agentapi.JobRef{Job: j.ID, Attempt: j.Attempt}
		m := b.pre[rank]
		switch {
		case b.release && (rank == 0 || b.pre[0] == nil):
			out = append(out, agentapi.GangOrder{JobRef: ref, Release: true})
		case b.probe && rank > 0 && !m.Probed && !m.Probing:
			out = append(out, agentapi.GangOrder{JobRef: ref, Probe: true})
		}
	}
	return out
}

// noteGatedLocked forgets a member's preflight once it no longer waits at
// the barrier (its command runs). Rank 0 leaving a released barrier lets
// the other members go: they are woken for their release.
func (s *Server) noteGatedLocked(j *broker.Job, rank int, p *agentapi.Preflight) {
	b := s.barriers[j.ID]
	if p != nil || b == nil || b.attempt != j.Attempt || rank >= len(b.pre) || b.pre[rank] == nil {
		return
	}
	b.pre[rank] = nil
	if rank == 0 && b.release {
		s.wakeMembersLocked(j)
	}
}

// gangMemberEndedLocked records the end one member's agent reported.
func (s *Server) gangMemberEndedLocked(j *broker.Job, rank int, r agentapi.JobReport, now time.Time) {
	at := r.EndedAt
	if at.IsZero() {
		at = now
	}
	e := &broker.MemberEnd{At: at, ExitCode: r.ExitCode, Signal: r.Signal, Reason: r.Reason, Message: r.Message}
	if r.State == agentapi.RunFailedToStart && e.Reason == "" {
		e.Reason = "failed_to_start"
	}
	if j.State == broker.StateStarting && r.State != agentapi.RunFailedToStart && j.Stop == nil {
		started := r.StartedAt
		if started.IsZero() {
			started = at
		}
		j.StartedAt = &started
		j.Transit(started, broker.StateRunning, "started", "on "+j.Placements[rank].Node)
	}
	s.gangMemberEndLocked(j, rank, e, reasonGangMemberFailed, now)
}

// loseOnLocked records that a job's share on node vanished with the node
// or its agent: a gang's other members are stopped with their grace
// first; any other job goes back to the queue at once.
func (s *Server) loseOnLocked(j *broker.Job, node string, lostAt, now time.Time, reason, detail string) {
	_, rank, ok := placedOn(j, node)
	if len(j.Placements) < 2 || !ok {
		s.loseJob(j, lostAt, now, reason, detail)
		return
	}
	s.gangMemberEndLocked(j, rank, &broker.MemberEnd{At: lostAt, Reason: "lost", Message: reason + ": " + detail}, reasonGangMemberLost, now)
}

// gangMemberEndLocked records a member's end; the first failure stops
// the rest with the job's checkpoint signal and grace; the last end ends
// the attempt.
func (s *Server) gangMemberEndLocked(j *broker.Job, rank int, e *broker.MemberEnd, stopReason string, now time.Time) {
	if j.Placements[rank].Ended != nil {
		return
	}
	j.Placements[rank].Ended = e
	node := j.Placements[rank].Node
	if e.Failed() && j.Stop == nil {
		j.Stop = &broker.StopRequest{Reason: stopReason, Detail: fmt.Sprintf("gang member %d on %s %s", rank, node, describeMember(e)),
			Signal: j.Spec.Checkpoint.Signal, Grace: j.Spec.Checkpoint.Grace.D(), RequestedAt: now, By: "gang"}
		s.log.Info("stopping gang", "job", j.ID, "attempt", j.Attempt, "member", rank, "node", node, "reason", stopReason)
		s.wakeMembersLocked(j)
	}
	for _, p := range j.Placements {
		if p.Ended == nil {
			return
		}
	}
	s.finishGangLocked(j, now)
}

func describeMember(e *broker.MemberEnd) string {
	var s string
	switch {
	case e.Reason == "lost":
		return "was lost (" + e.Message + ")"
	case e.Reason == "failed_to_start":
		s = "could not start"
	case e.Signal != "":
		s = "was killed by " + e.Signal
	default:
		s = fmt.Sprintf("exited with code %d", e.ExitCode)
	}
	if e.Message != "" {
		s += ": " + e.Message
	}
	return s
}

// finishGangLocked ends a gang's attempt once every member has ended.
func (s *Server) finishGangLocked(j *broker.Job, now time.Time) {
	delete(s.barriers, j.ID)
	// The attempt ends with its last member; its cause is the first
	// member that failed (rank 0 when none did).
	last, cause := j.Placements[0].Ended.At, 0
	for i, p := range j.Placements {
		if p.Ended.At.After(last) {
			last = p.Ended.At
		}
		if p.Ended.Failed() && (!j.Placements[cause].Ended.Failed() || p.Ended.At.Before(j.Placements[cause].Ended.At)) {
			cause = i
		}
	}
	c := j.Placements[cause].Ended
	rep := agentapi.JobReport{JobRef: agentapi.JobRef{Job: j.ID, Attempt: j.Attempt}, State: agentapi.RunExited,
		EndedAt: last, ExitCode: c.ExitCode, Signal: c.Signal, Reason: c.Reason, Message: c.Message}
	stop := j.Stop
	switch {
	case stop != nil && stop.Reason == reasonPreflightFailed:
		// Nothing ran: back to the queue, away from the pairing.
		j.Placements, j.Stop, j.Machine, j.Machines = nil, nil, "", nil
		j.Transit(last, broker.StatePending, reasonPreflightFailed, stop.Detail+"; requeued")
	case stop != nil && stop.Reason == reasonGangMemberLost:
		j.Stop = nil
		s.loseJob(j, last, now, reasonGangMemberLost, stop.Detail)
	case stop != nil && stop.Reason == reasonGangMemberFailed:
		// One job, one retry budget: the failing member's end decides.
		j.Stop = nil
		if rep.Reason == "failed_to_start" {
			rep.State, rep.Reason = agentapi.RunFailedToStart, ""
		}
		rep.Message = stop.Detail
		rep.ExitCode = max(rep.ExitCode, 1)
		s.endAttempt(j, rep, now)
	default:
		s.endAttempt(j, rep, now)
	}
}
