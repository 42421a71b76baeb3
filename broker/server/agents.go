package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"runtime/trace"
	"strconv"
	"sync"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/onprem/agentapi"
)

// maxSyncBytes bounds one agent request: log chunks are capped by the agent
// well below this.
const maxSyncBytes = 8 << 20

// nodeNameRe is what a node may be called.
var nodeNameRe = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)

// How long a stale node record keeps LastSeen unwritten: liveness lives in
// memory on the leader; the store gets it at least this often.
const lastSeenPersistEvery = 30 * time.Second

func decodeBody(c echo.Context, limit int64, v any) error {
	raw, err := readBody(c, limit)
	if err != nil {
		return err
	}
	if err := broker.CheckJSON(raw); err != nil {
		return errBadRequest("", broker.CodeMalformed, "body is not valid JSON: %v", err)
	}
	if err := json.Unmarshal(raw, v); err != nil {
		return errBadRequest("", broker.CodeMalformed, "body is not valid JSON: %v", err)
	}
	return nil
}

// decodeStrictBody reads a person's request body as a job spec is read
// (broker.DecodeStrict): a value of the wrong type or an unknown field is
// refused naming the field.
func decodeStrictBody(c echo.Context, limit int64, v any) error {
	raw, err := readBody(c, limit)
	if err != nil {
		return err
	}
	return broker.DecodeStrict(raw, v)
}

// readBody reads a request body of at most limit bytes.
func readBody(c echo.Context, limit int64) ([]byte, error) {
	raw, err := io.ReadAll(io.LimitReader(c.Request().Body, limit+1))
	if err != nil {
		return nil, errBadRequest("", "malformed", "read body: %v", err)
	}
	if int64(len(raw)) > limit {
		return nil, errBadRequest("", broker.CodeTooLarge, "body is larger than %d bytes", limit)
	}
	return raw, nil
}

// register handles an agent process start: a new generation for the node,
// and the jobs an earlier agent process held there go back to the queue
// (the new agent killed whatever the old one left behind).
func (s *Server) register(c echo.Context) error {
	var req agentapi.RegisterRequest
	if err := decodeBody(c, maxSyncBytes, &req); err != nil {
		return err
	}
	if !nodeNameRe.MatchString(req.Node) {
		return errBadRequest("node", broker.CodeInvalid, "node name must be 1-63 letters, digits, '.', '_' or '-'")
	}
	if n, max := len(req.Inventory.Devices), s.cfg().Agents.MaxCardsPerNode; n > max {
		return errBadRequest("inventory.devices", broker.CodeOutOfRange,
			"a node may report at most %d GPUs (agents.maxCardsPerNode), this one reports %d", max, n)
	}
	p := principal(c)
	if p.Node != "" && p.Node != req.Node {
		return errForbidden("this agent token belongs to node %s, not %s", p.Node, req.Node)
	}
	if p.Credential != "" && len(req.Inventory.Devices) > p.MaxGPUs {
		return errBadRequest("inventory.devices", broker.CodeOutOfRange,
			"node %s's credential allows %d GPUs, the agent reports %d", req.Node, p.MaxGPUs, len(req.Inventory.Devices))
	}
	ctx := c.Request().Context()
	s.lock()
	defer s.mu.Unlock()
	if err := s.checkLeaderLocked(); err != nil {
		return err
	}
	if old := s.view.Node(req.Node); old != nil && old.Credential != "" && old.Credential != p.Credential && !(p.Credential != "" && s.credRevoked(ctx, old.Credential)) {
		// An enrolled name is its credential's alone: a shared agent token
		// (or another node's) cannot take it over and fail its jobs.
		return errForbidden("node %s is enrolled with its own credential; this token may not register it", req.Node)
	}
	now := s.clock.Now()
	n := &broker.Node{Name: req.Node, Pool: "onprem"}
	if old := s.view.Node(req.Node); old != nil {
		n = cloneNode(old)
	} else {
		n.RegisteredAt = now
	}
	n.Generation++
	n.Labels = req.Labels
	// Only a machine's own token makes a node a burst machine; an agent
	// token from the config always registers an owned node.
	n.Pool, n.Instance = "onprem", ""
	if p.Node != "" {
		n.Instance = p.Node
		if r := s.fleet.RecordLocked(p.Node); r != nil {
			n.Pool = r.Provider
		}
	}
	n.Credential = p.Credential
	n.Inventory = req.Inventory
	n.CPU, n.Memory = req.CPU, req.Memory
	n.Unhealthy = req.Unhealthy
	n.State = broker.NodeReady
	n.LastSeen = now
	n.AgentVersion = req.AgentVersion
	n.Address = c.RealIP()
	var jobs []*broker.Job
	for _, j := range s.view.HoldingOn(n.Name) {
		jj := cloneJob(j)
		s.loseOnLocked(jj, n.Name, now, now, "agent_restarted", fmt.Sprintf("the agent on %s restarted (generation %d)", n.Name, n.Generation))
		jobs = append(jobs, jj)
	}
	if err := s.commitLocked(ctx, jobs, []*broker.Node{n}, nil); err != nil {
		return err
	}
	s.log.Info("agent registered", "node", n.Name, "generation", n.Generation, "gpus", len(n.Inventory.Devices),
		"backend", n.Inventory.Backend, "requeued", len(jobs))
	s.kick()
	return c.JSON(http.StatusOK, agentapi.RegisterResponse{Generation: n.Generation, HeartbeatInterval: s.cfg().Agents.HeartbeatInterval.D()})
}

// sync is the agent heartbeat: record what the agent reports, store its log
// bytes, and answer with the node's orders — holding the answer back up to
// req.Wait when there is nothing new to say.
func (s *Server) sync(c echo.Context) error {
	var req agentapi.SyncRequest
	if err := decodeBody(c, maxSyncBytes, &req); err != nil {
		return err
	}
	p := principal(c)
	if p.Node != "" && p.Node != req.Node {
		return errForbidden("this agent token belongs to node %s, not %s", p.Node, req.Node)
	}
	ctx := c.Request().Context()
	// The job-token key for the starts this answer may carry (addJobEnv):
	// read before the lock, and only the first time.
	if _, err := s.jobTokenKey(ctx); err != nil {
		s.log.Warn("read the job-token key; starts go without job tokens", "err", err)
	}
	call := &syncCall{req: &req}
	s.syncs.push(call)
	s.lock()
	if err := s.checkLeaderLocked(); err != nil {
		s.failSyncsLocked(err)
		s.mu.Unlock()
		return err
	}
	recordedHere := !call.done
	if recordedHere {
		region := trace.StartRegion(ctx, "broker.sync.record")
		s.recordSyncsLocked(ctx, s.syncs.take())
		region.End()
	}
	resp, err := call.resp, call.err
	if err != nil {
		s.mu.Unlock()
		return err
	}
	noOrders := func() bool { return len(resp.Start) == 0 && len(resp.Stop) == 0 && len(resp.Gang) == 0 }
	if noOrders() && req.Wait > 0 && !recordedHere {
		// Another handler recorded this report in an earlier hold of the
		// lock. A cycle may have given the node orders since, and its
		// wake found nobody waiting: ask again before parking, or the
		// orders would wait out the whole poll.
		resp.Start, resp.Stop = s.ordersLocked(req.Node, reportedSet(&req))
		resp.Gang = s.gangOrdersLocked(req.Node)
	}
	if noOrders() && req.Wait > 0 {
		wait := s.nodeWaitLocked(req.Node)
		s.mu.Unlock()
		timer := time.NewTimer(min(req.Wait, time.Minute))
		region := trace.StartRegion(ctx, "broker.sync.longpoll")
		select {
		case <-wait:
		case <-timer.C:
		case <-ctx.Done():
		}
		timer.Stop()
		region.End()
		s.lock()
		if err := s.checkLeaderLocked(); err != nil {
			s.mu.Unlock()
			return err // orders never come from a broker that stopped leading
		}
		resp.Start, resp.Stop = s.ordersLocked(req.Node, reportedSet(&req))
		resp.Gang = s.gangOrdersLocked(req.Node)
	}
	s.mu.Unlock()
	return c.JSON(http.StatusOK, resp)
}

func reportedSet(req *agentapi.SyncRequest) map[agentapi.JobRef]agentapi.RunState {
	out := make(map[agentapi.JobRef]agentapi.RunState, len(req.Jobs))
	for _, r := range req.Jobs {
		out[r.JobRef] = r.State
	}
	return out
}

func refKey(r agentapi.JobRef) string { return r.Job + "/" + strconv.Itoa(r.Attempt) }

// syncCall is one agent report waiting to be recorded.
type syncCall struct {
	req *agentapi.SyncRequest
	// resp and err are the report's answer, set under s.mu; done says
	// they are set.
	resp *agentapi.SyncResponse
	err  error
	done bool
}

// syncQueue holds the agent reports waiting for the broker's lock. The
// next report handler to take the lock records every queued report in one
// commit (recordSyncsLocked), so the reports of several agents share one
// transaction and one hold of the lock, instead of each waiting in turn
// for the others' commits.
type syncQueue struct {
	mu    sync.Mutex
	calls []*syncCall
}

func (q *syncQueue) push(c *syncCall) {
	q.mu.Lock()
	q.calls = append(q.calls, c)
	q.mu.Unlock()
}

func (q *syncQueue) take() []*syncCall {
	q.mu.Lock()
	defer q.mu.Unlock()
	calls := q.calls
	q.calls = nil
	return calls
}

// failSyncsLocked answers every queued report with err: this broker does
// not lead, and a report is never recorded in a later term than it came.
func (s *Server) failSyncsLocked(err error) {
	for _, c := range s.syncs.take() {
		c.err, c.done = err, true
	}
}

// syncPrep is one report's changes, computed and not yet written.
type syncPrep struct {
	call        *syncCall
	resp        *agentapi.SyncResponse
	node        *broker.Node
	nodeChanged bool
	reported    map[agentapi.JobRef]agentapi.RunState
	extra       func(broker.Tx) error
	logs        int
}

// recordSyncsLocked applies reports to the store, in one commit, and to
// memory, and sets each call's answer. A report's job changes see those of
// the reports before it in calls (a gang's members report from several
// nodes).
func (s *Server) recordSyncsLocked(ctx context.Context, calls []*syncCall) {
	changed := map[string]*broker.Job{}
	var preps []*syncPrep
	for _, c := range calls {
		p, err := s.prepareSyncLocked(ctx, c.req, changed)
		if err != nil {
			c.err, c.done = err, true
			continue
		}
		p.call = c
		preps = append(preps, p)
	}
	if len(preps) == 0 {
		return
	}
	jobs := make([]*broker.Job, 0, len(changed))
	for _, j := range changed {
		jobs = append(jobs, j)
	}
	var nodes []*broker.Node
	logs := 0
	for _, p := range preps {
		if p.nodeChanged {
			nodes = append(nodes, p.node)
		}
		logs += p.logs
	}
	extra := func(tx broker.Tx) error {
		for _, p := range preps {
			if err := p.extra(tx); err != nil {
				return err
			}
		}
		return nil
	}
	// Not tied to the one request that records them all.
	ctx = context.WithoutCancel(ctx)
	var err error
	if len(jobs) == 0 && len(nodes) == 0 && logs == 0 {
		// Nothing to write: read the log offsets only.
		err = s.store.View(ctx, extra)
	} else {
		err = s.commitLocked(ctx, jobs, nodes, extra)
	}
	if err != nil {
		for _, p := range preps {
			p.call.err, p.call.done = err, true
		}
		return
	}
	for _, p := range preps {
		s.view.NoteSeen(p.node) // LastSeen lives in memory even when not written
		p.resp.Start, p.resp.Stop = s.ordersLocked(p.node.Name, p.reported)
		p.resp.Gang = s.gangOrdersLocked(p.node.Name)
		p.call.resp, p.call.done = p.resp, true
	}
	for _, j := range jobs {
		if !j.State.Holding() {
			s.kick() // GPUs were freed
			break
		}
	}
}

// prepareSyncLocked computes what one heartbeat changes: jobs into
// changed (read there first), the node, and the log writes.
func (s *Server) prepareSyncLocked(ctx context.Context, req *agentapi.SyncRequest, changed map[string]*broker.Job) (*syncPrep, error) {
	old := s.view.Node(req.Node)
	if old == nil {
		return nil, newError(http.StatusNotFound, "unknown_node", "node %s is not registered; register first", req.Node)
	}
	if req.Generation != old.Generation {
		return nil, newError(http.StatusConflict, "stale_generation",
			"generation %d is not the node's current %d; register again", req.Generation, old.Generation)
	}
	now := s.clock.Now()
	if err := s.fleet.NoteNoticesLocked(ctx, req.Node, req.Notices, now); err != nil {
		return nil, err
	}
	n := cloneNode(old)
	n.LastSeen = now
	nodeChanged := now.Sub(old.LastSeen) >= lastSeenPersistEvery
	if old.State == broker.NodeLost {
		n.State = broker.NodeReady
		nodeChanged = true
		s.log.Info("node back", "node", n.Name)
	}
	if !mapsEqual(old.Unhealthy, req.Unhealthy) {
		n.Unhealthy = req.Unhealthy
		nodeChanged = true
		for idx, why := range req.Unhealthy {
			if _, was := old.Unhealthy[idx]; !was {
				s.log.Warn("gpu unhealthy", "node", n.Name, "gpu", idx, "reason", why)
			}
		}
	}
	if req.Telemetry != nil {
		s.recordTelemetryLocked(n.Name, req.Telemetry, req.Owners)
	}
	if c := nodeCache(req.Cache); c != nil && cacheChanged(old.Cache, c) {
		n.Cache = c
		nodeChanged = true
	}

	resp := &agentapi.SyncResponse{HeartbeatInterval: s.cfg().Agents.HeartbeatInterval.D(), LogOffsets: map[string]int64{}}
	reported := reportedSet(req)
	get := func(id string) *broker.Job {
		if j, ok := changed[id]; ok {
			return j
		}
		return s.view.Job(id)
	}
	mine := func(r agentapi.JobRef) *broker.Job {
		j := get(r.Job)
		if j == nil || j.Attempt != r.Attempt || !j.State.Holding() {
			return nil
		}
		if _, _, ok := placedOn(j, n.Name); !ok {
			return nil
		}
		return j
	}
	for _, r := range req.Jobs {
		j := mine(r.JobRef)
		if j == nil {
			if r.State != agentapi.RunRunning {
				resp.Ack = append(resp.Ack, r.JobRef) // about an attempt we no longer track
			}
			continue
		}
		if jj := s.noteDataLocked(j, r, n.Name, req.Telemetry, now); jj != nil {
			changed[j.ID], j = jj, jj
		}
		_, rank, _ := placedOn(j, n.Name)
		if len(j.Placements) > 1 {
			// A member reported without its preflight has left the
			// barrier: its command runs, or has already ended (a
			// command that exits at once can end before its agent
			// reports it running).
			s.noteGatedLocked(j, rank, r.Preflight)
			if r.State == agentapi.RunRunning && r.Preflight != nil {
				if jj := s.notePreflightLocked(j, rank, r.Preflight, now); jj != nil {
					changed[j.ID], j = jj, jj
				}
			}
		}
		switch r.State {
		case agentapi.RunRunning:
			if s.noteProgress(j, r) {
				continue // still preparing (pulling its image)
			}
			if j.State == broker.StateStarting {
				jj := cloneJob(j)
				started := r.StartedAt
				if started.IsZero() {
					started = now
				}
				jj.StartedAt = &started
				jj.Transit(started, broker.StateRunning, "started", "on "+n.Name)
				changed[j.ID] = jj
			}
		default:
			jj := cloneJob(j)
			if len(jj.Placements) > 1 {
				s.gangMemberEndedLocked(jj, rank, r, now)
			} else {
				s.endAttempt(jj, r, now)
			}
			changed[j.ID] = jj
			resp.Ack = append(resp.Ack, r.JobRef)
		}
	}
	// Jobs the broker has on this node that the agent does not report. A
	// gang member is checked on its job as the reports before this one in
	// the batch left it (another member's report may have changed it).
	for _, held := range s.view.HoldingOn(n.Name) {
		ref := agentapi.JobRef{Job: held.ID, Attempt: held.Attempt}
		if _, ok := reported[ref]; ok {
			continue
		}
		j := get(held.ID)
		p, rank, ok := placedOn(j, n.Name)
		if j.Attempt != held.Attempt || !j.State.Holding() || !ok {
			continue
		}
		if p.Ended != nil {
			continue // this gang member has ended; the others are stopping
		}
		switch {
		case j.State == broker.StateStarting && j.Stop != nil:
			// Never started, and will not be now.
			jj := cloneJob(j)
			rep := agentapi.JobReport{JobRef: ref, State: agentapi.RunFailedToStart, EndedAt: now, Message: "stopped before it started"}
			if len(jj.Placements) > 1 {
				s.gangMemberEndedLocked(jj, rank, rep, now)
			} else {
				s.endAttempt(jj, rep, now)
			}
			changed[j.ID] = jj
		case j.State == broker.StateRunning:
			jj := cloneJob(j)
			s.loseOnLocked(jj, n.Name, now, now, "agent_forgot", fmt.Sprintf("the agent on %s no longer reports this attempt", n.Name))
			changed[j.ID] = jj
		}
	}

	logLimit := int64(s.cfg().Agents.LogLimit)
	extra := func(tx broker.Tx) error {
		for _, ch := range req.Logs {
			j := s.view.Job(ch.Job)
			if j == nil || j.Attempt != ch.Attempt {
				continue // a chunk of an attempt the broker no longer tracks
			}
			if _, _, ok := placedOn(j, n.Name); !ok {
				continue
			}
			if _, err := broker.AppendLog(tx, ch.Job, ch.Attempt, ch.Offset, ch.Data, logLimit); err != nil && !errors.Is(err, broker.ErrConflict) {
				return err
			}
		}
		for _, r := range req.Jobs {
			m, err := broker.GetLogMeta(tx, r.Job, r.Attempt)
			if err != nil {
				return err
			}
			// Bytes past the cap count as delivered so the agent stops
			// resending them.
			resp.LogOffsets[refKey(r.JobRef)] = m.Received()
		}
		return nil
	}
	return &syncPrep{resp: resp, node: n, nodeChanged: nodeChanged, reported: reported, extra: extra, logs: len(req.Logs)}, nil
}

// ordersLocked derives the node's complete orders from state: start every
// attempt placed here that the agent does not run yet, stop every attempt
// with a stop request, kill whatever the agent runs that is not ours.
func (s *Server) ordersLocked(node string, reported map[agentapi.JobRef]agentapi.RunState) ([]agentapi.Assignment, []agentapi.StopOrder) {
	var starts []agentapi.Assignment
	var stops []agentapi.StopOrder
	ours := map[agentapi.JobRef]bool{}
	for _, j := range s.view.HoldingOn(node) {
		ref := agentapi.JobRef{Job: j.ID, Attempt: j.Attempt}
		ours[ref] = true
		if p, _, _ := placedOn(j, node); p.Ended != nil {
			continue // an ended gang member: nothing more to do here
		}
		_, isReported := reported[ref]
		switch {
		case j.Stop != nil:
			if reported[ref] == agentapi.RunRunning {
				stops = append(stops, agentapi.StopOrder{JobRef: ref, Signal: j.Stop.Signal, Grace: j.Stop.Grace, Reason: j.Stop.Reason})
			}
		case j.State == broker.StateStarting && !isReported:
			starts = append(starts, s.assignment(j, node))
		}
	}
	for ref, st := range reported {
		if st == agentapi.RunRunning && !ours[ref] {
			stops = append(stops, agentapi.StopOrder{JobRef: ref, Signal: "SIGKILL", Reason: "not_assigned"})
		}
	}
	return starts, stops
}

// assignment is what the agent needs to start one attempt on node.
func (s *Server) assignment(j *broker.Job, node string) agentapi.Assignment {
	p, rank, _ := placedOn(j, node)
	env := make(map[string]string, len(j.Spec.Env)+6)
	for k, v := range j.Spec.Env {
		env[k] = v
	}
	env["SPILLWAY_JOB_ID"] = j.ID
	env["SPILLWAY_JOB_NAME"] = j.Spec.Name
	env["SPILLWAY_ATTEMPT"] = strconv.Itoa(j.Attempt)
	env["SPILLWAY_TEAM"] = j.Spec.Team
	env["SPILLWAY_NODE_RANK"] = strconv.Itoa(rank)
	env["SPILLWAY_NUM_NODES"] = strconv.Itoa(len(j.Placements))
	if j.LastCheckpointAt != nil && j.Spec.Checkpoint.To == "" {
		// With checkpoint.to the agent sets it, only once it restored one.
		env["SPILLWAY_RESUME"] = "1"
	}
	s.addJobEnv(j, env)
	addArrayEnv(j, env)
	a := agentapi.Assignment{
		JobRef:      agentapi.JobRef{Job: j.ID, Attempt: j.Attempt},
		Name:        j.Spec.Name,
		Team:        j.Spec.Team,
		Argv:        j.Spec.Command,
		Env:         env,
		Workdir:     j.Spec.Workdir,
		GPUs:        p.GPUs,
		UUIDs:       p.UUIDs,
		MemoryShare: p.MemoryShare,
		Timeout:     j.Spec.Timeout.D(),
		Signal:      j.Spec.Checkpoint.Signal,
		Grace:       j.Spec.Checkpoint.Grace.D(),
		Rank:        rank,
	}
	s.addRuntimeFields(j, &a)
	s.addGangContract(j, rank, env, &a)
	if len(j.Placements) > 1 {
		a.Peers = j.Nodes()
	}
	a.Data = dataAssignment(j, rank)
	if p.MemoryShare > 0 {
		// A sharer's compute share follows its memory share; the agent
		// exports it where MPS runs.
		if n := s.view.Node(node); n != nil && len(n.Inventory.Devices) > 0 && n.Inventory.Devices[0].MemoryBytes > 0 {
			a.ComputeShare = int(min(100, max(1, p.MemoryShare*100/n.Inventory.Devices[0].MemoryBytes)))
		}
	}
	return a
}

func mapsEqual(a, b map[int]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if bv, ok := b[k]; !ok || bv != v {
			return false
		}
	}
	return true
}
