// Package agent is what runs on every GPU node, owned or rented: it
// registers the node's GPUs with the broker, heartbeats, starts the
// attempts the broker assigns as real child processes (own process group,
// argv, env, CUDA_VISIBLE_DEVICES), ships their logs, stops them with the
// checkpoint signal and a grace period, enforces timeouts on its own, and
// cleans up processes left on a card after a job.
package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"runtime/trace"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/spillway-dev/spillway/onprem/agentapi"
	"github.com/spillway-dev/spillway/onprem/gpu"
	jobrt "github.com/spillway-dev/spillway/onprem/runtime"
	"github.com/spillway-dev/spillway/onprem/staging"
)

// Config is the agent's configuration (flags or the YAML file written by
// the bootstrap).
type Config struct {
	Broker  string            `json:"broker"`
	Token   string            `json:"token"`
	Name    string            `json:"name"`
	GPUs    string            `json:"gpus,omitempty"`
	DataDir string            `json:"dataDir"`
	Labels  map[string]string `json:"labels,omitempty"`
	// CAFile is the CA bundle the broker's certificate must chain to; CA
	// is the same inline (PEM), as the burst bootstrap writes it. Neither:
	// the CA pinned at enrolment (DataDir/broker-ca.pem), else the
	// system's roots.
	CAFile string `json:"caFile,omitempty"`
	CA     string `json:"ca,omitempty"`
	// JoinToken is a single-use enrolment token, exchanged once for the
	// node's own credential (kept in DataDir/node-credential).
	JoinToken string `json:"joinToken,omitempty"`
	// Peers are the URLs of the cluster's other brokers: the token follows
	// a standby's redirect to them (and to the broker's own host) only.
	Peers []string `json:"peers,omitempty"`
	// LogLimit caps each attempt's local log file (bytes).
	LogLimit int64 `json:"logLimit,omitempty"`
	// Version is reported to the broker.
	Version string `json:"-"`
	// Data configures object-store access and the input cache
	// (docs/data.md); the cache defaults to DataDir/cache, 50 GiB.
	Data staging.Config `json:"data,omitempty"`
	// Runtime chooses and configures how jobs run (process or oci) and
	// as which uids (docs/agent.md, "Runtimes").
	Runtime jobrt.Config `json:"runtime,omitempty"`
	// Notice is whose interruption notices a burst machine watches
	// (notice.go); the bootstrap sets it.
	Notice *agentapi.NoticeWatch `json:"notice,omitempty"`
}

// maxLogPerSync bounds the log bytes sent in one heartbeat.
const maxLogPerSync = 512 << 10

// Agent is one running agent.
type Agent struct {
	cfg     Config
	backend gpu.Backend
	rt      jobrt.Runtime
	inv     gpu.Inventory
	mps     bool
	http    *http.Client
	log     *slog.Logger
	now     func() time.Time

	mu         sync.Mutex
	runs       map[agentapi.JobRef]*run
	generation uint64
	interval   time.Duration
	// sent[ref] is how many log bytes the broker has of an attempt.
	sent      map[agentapi.JobRef]int64
	unhealthy map[int]string
	leaks     []agentapi.Leak
	wakeCh    chan struct{}
	// samples are the GPU reads shared by heartbeats and cleanups;
	// telemetryAt is when a heartbeat last carried one.
	samples     sampler
	telemetryAt time.Time

	stagerOnce sync.Once
	stager     *staging.Stager
	stagerErr  error
	// stagerReady is set once stager may be read without stagerOnce.
	stagerReady atomic.Bool
	// notice is what the provider's interruption notices said (notice.go).
	notice noticeState
}

// New makes an agent over a GPU backend.
func New(cfg Config, backend gpu.Backend, log *slog.Logger) (*Agent, error) {
	if cfg.Broker == "" || cfg.Name == "" {
		return nil, errors.New("agent needs broker and name")
	}
	if cfg.DataDir == "" {
		return nil, errors.New("agent needs a data dir")
	}
	if cfg.LogLimit <= 0 {
		cfg.LogLimit = 64 << 20
	}
	inv, err := backend.Inventory()
	if err != nil {
		return nil, fmt.Errorf("read gpu inventory: %w", err)
	}
	if err := os.MkdirAll(cfg.DataDir, 0o750); err != nil {
		return nil, fmt.Errorf("create data dir: %w", err)
	}
	tc, err := agentTLS(cfg)
	if err != nil {
		return nil, err
	}
	if strings.HasPrefix(cfg.Broker, "http://") {
		log.Warn("the broker URL is plain HTTP: the agent cannot tell the broker from an impostor and its token crosses the network unencrypted", "broker", cfg.Broker)
	}
	if err := loadCredential(&cfg); err != nil {
		return nil, err
	}
	if cfg.Token == "" && cfg.JoinToken == "" {
		return nil, errors.New("agent needs a join token (spillway node token create), a node credential from an earlier enrolment, or an agent token")
	}
	rt, err := jobrt.New(cfg.Runtime, jobrt.Options{DataDir: cfg.DataDir, SimulatedGPUs: inv.Backend != "nvml"})
	if err != nil {
		return nil, fmt.Errorf("runtime: %w", err)
	}
	return &Agent{
		cfg: cfg, backend: backend, inv: inv, mps: inv.MPS, rt: rt,
		http:      brokerHTTP(cfg.Peers, tc),
		log:       log.With("node", cfg.Name),
		now:       time.Now,
		runs:      map[agentapi.JobRef]*run{},
		sent:      map[agentapi.JobRef]int64{},
		unhealthy: map[int]string{},
		interval:  2 * time.Second,
		wakeCh:    make(chan struct{}, 1),
	}, nil
}

// wake asks for a heartbeat now (a job ended).
func (ag *Agent) wake() {
	select {
	case ag.wakeCh <- struct{}{}:
	default:
	}
}

// Run registers and heartbeats until ctx ends, then stops every job.
func (ag *Agent) Run(ctx context.Context) error {
	ag.killLeftovers()
	ag.removeLeftoverContainers(ctx)
	go ag.watchNotices(ctx)
	ag.prePull(ctx)
	defer ag.shutdown()
	backoff := 250 * time.Millisecond
	registered := false
	for ctx.Err() == nil {
		if !registered {
			if err := ag.register(ctx); err != nil {
				if ctx.Err() != nil {
					break
				}
				ag.log.Warn("register failed; retrying", "err", err, "in", backoff)
				sleep(ctx, backoff)
				backoff = min(backoff*2, ag.retryCap())
				continue
			}
			registered, backoff = true, 250*time.Millisecond
		}
		err := ag.syncOnce(ctx)
		switch {
		case err == nil:
			backoff = 250 * time.Millisecond
		case errors.Is(err, errReregister):
			ag.log.Warn("broker asks to register again", "err", err)
			ag.killAll("reregister")
			registered = false
		case ctx.Err() != nil:
		default:
			// The broker is unreachable: jobs keep running and the agent
			// keeps enforcing their timeouts; reports wait until it is back.
			ag.log.Warn("sync failed; retrying", "err", err, "in", backoff)
			sleep(ctx, backoff)
			backoff = min(backoff*2, ag.retryCap())
		}
	}
	return nil
}

// retryCap bounds the wait between retries while the broker is away: one
// heartbeat interval, so that a restarted broker hears from every agent
// well within its node TTL.
func (ag *Agent) retryCap() time.Duration {
	ag.mu.Lock()
	defer ag.mu.Unlock()
	return max(ag.interval, 500*time.Millisecond)
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

var errReregister = errors.New("register again")

func (ag *Agent) post(ctx context.Context, path string, in, out any) error {
	body, err := json.Marshal(in)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(ag.cfg.Broker, "/")+path, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+ag.cfg.Token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := ag.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode == http.StatusConflict || resp.StatusCode == http.StatusNotFound {
		return fmt.Errorf("%w: %s", errReregister, strings.TrimSpace(string(raw)))
	}
	if resp.StatusCode/100 != 2 {
		var eb agentapi.ErrorBody
		if json.Unmarshal(raw, &eb) == nil && eb.Error.Message != "" {
			return fmt.Errorf("broker answered %d: %s", resp.StatusCode, eb.Error.Message)
		}
		return fmt.Errorf("broker answered %d", resp.StatusCode)
	}
	return json.Unmarshal(raw, out)
}

func (ag *Agent) register(ctx context.Context) error {
	if ag.cfg.JoinToken != "" {
		if err := ag.enrol(ctx); err != nil {
			return err
		}
	}
	req := agentapi.RegisterRequest{
		Node: ag.cfg.Name, Labels: ag.cfg.Labels, Inventory: ag.inv,
		CPU: float64(runtime.NumCPU()), Memory: memTotal(), AgentVersion: ag.cfg.Version,
		Unhealthy: ag.unhealthyCopy(),
	}
	var resp agentapi.RegisterResponse
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := ag.post(rctx, agentapi.PathRegister, req, &resp); err != nil {
		return err
	}
	ag.mu.Lock()
	ag.generation = resp.Generation
	if resp.HeartbeatInterval > 0 {
		ag.interval = resp.HeartbeatInterval
	}
	ag.mu.Unlock()
	ag.log.Info("registered with broker", "broker", ag.cfg.Broker, "generation", resp.Generation,
		"gpus", len(ag.inv.Devices), "backend", ag.inv.Backend)
	return nil
}

func (ag *Agent) unhealthyCopy() map[int]string {
	ag.mu.Lock()
	defer ag.mu.Unlock()
	if len(ag.unhealthy) == 0 {
		return nil
	}
	out := make(map[int]string, len(ag.unhealthy))
	for k, v := range ag.unhealthy {
		out[k] = v
	}
	return out
}

// syncOnce sends one heartbeat and carries out the answer. While nothing
// happens the broker holds the request up to one interval (long poll); a
// job ending cuts the wait short.
func (ag *Agent) syncOnce(ctx context.Context) error {
	ag.gatherEnds(ctx)
	req := ag.buildSync()
	wait := req.Wait
	pollCtx, cancel := context.WithTimeout(ctx, wait+30*time.Second)
	defer cancel()
	// A local event (a job ended) cancels the long poll so it is reported
	// at once; the cancelled request's reports were already recorded.
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		select {
		case <-ag.wakeCh:
			cancel()
		case <-stop:
		}
	}()
	var resp agentapi.SyncResponse
	region := trace.StartRegion(ctx, "agent.sync")
	err := ag.post(pollCtx, agentapi.PathSync, req, &resp)
	region.End()
	if err != nil {
		if ctx.Err() == nil && errors.Is(pollCtx.Err(), context.Canceled) {
			return nil // woken: send the next heartbeat right away
		}
		return err
	}
	ag.apply(&resp)
	return nil
}

func (ag *Agent) buildSync() agentapi.SyncRequest {
	ag.mu.Lock()
	defer ag.mu.Unlock()
	req := agentapi.SyncRequest{Node: ag.cfg.Name, Generation: ag.generation, Wait: ag.interval}
	refs := make([]agentapi.JobRef, 0, len(ag.runs))
	for ref := range ag.runs {
		refs = append(refs, ref)
	}
	slices.SortFunc(refs, func(a, b agentapi.JobRef) int {
		if c := strings.Compare(a.Job, b.Job); c != 0 {
			return c
		}
		return a.Attempt - b.Attempt
	})
	budget := int64(maxLogPerSync)
	// Read bytes and GPU telemetry go out together, at most every
	// telemetryEvery: the broker's data-wait check needs both from the
	// same moment, and one walk of /proc serves every running attempt.
	// An attempt younger than readBytesAfter is left out: a check over
	// minutes needs no bytes of its first second, and a flood of short
	// jobs would otherwise walk /proc for nothing.
	now := time.Now()
	telemetry := now.Sub(ag.telemetryAt) >= telemetryEvery
	var readers, groups []int
	reads := map[int]int64{}
	for _, ref := range refs {
		r := ag.runs[ref]
		rep := r.report()
		from := ag.sent[ref]
		if rep.LogSize > from && budget > 0 {
			n := min(rep.LogSize-from, budget)
			data, err := readAt(r.logPath, from, n)
			if err == nil && len(data) > 0 {
				req.Logs = append(req.Logs, agentapi.LogChunk{JobRef: ref, Offset: from, Data: data})
				budget -= int64(len(data))
				from += int64(len(data))
			}
		}
		if rep.State != agentapi.RunRunning && from < rep.LogSize {
			// Report the end only once the whole log has gone out, so a
			// follower sees every line before the job turns terminal.
			rep.State, rep.EndedAt = agentapi.RunRunning, time.Time{}
		}
		if rep.State == agentapi.RunRunning && telemetry {
			if pg := r.group(); pg > 0 && now.Sub(r.spawnedAt()) >= readBytesAfter {
				reads[pg] = 0
				readers = append(readers, len(req.Jobs))
				groups = append(groups, pg)
			}
		}
		req.Jobs = append(req.Jobs, rep)
		if rep.State != agentapi.RunRunning || r.isDone() {
			req.Wait = 0
		}
	}
	if len(req.Logs) > 0 {
		req.Wait = 0
	}
	if len(readers) > 0 {
		readBytesByGroup(reads)
		for i, k := range readers {
			req.Jobs[k].ReadBytes = reads[groups[i]]
		}
	}
	if telemetry {
		ag.telemetryAt = now
		if s, _, err := ag.samples.since(ag.backend, now); err == nil {
			ag.noteEventsLocked(s)
			req.Telemetry = &s
			req.Owners = ag.ownersLocked(s)
		} else {
			ag.log.Warn("gpu sample failed", "err", err)
		}
	}
	if len(ag.unhealthy) > 0 {
		req.Unhealthy = make(map[int]string, len(ag.unhealthy))
		for k, v := range ag.unhealthy {
			req.Unhealthy[k] = v
		}
	}
	req.Leaks, ag.leaks = ag.leaks, nil
	req.Cache = ag.cacheStats()
	req.Notices = ag.Notices()
	return req
}

func (r *run) isDone() bool {
	select {
	case <-r.done:
		return true
	default:
		return false
	}
}

func readAt(path string, off, n int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	buf := make([]byte, n)
	k, err := f.ReadAt(buf, off)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	return buf[:k], nil
}

// apply carries out the broker's orders.
func (ag *Agent) apply(resp *agentapi.SyncResponse) {
	ag.mu.Lock()
	if resp.HeartbeatInterval > 0 {
		ag.interval = resp.HeartbeatInterval
	}
	for key, off := range resp.LogOffsets {
		job, att, ok := strings.Cut(key, "/")
		if !ok {
			continue
		}
		n, err := strconv.Atoi(att)
		if err != nil {
			continue
		}
		ag.sent[agentapi.JobRef{Job: job, Attempt: n}] = off
	}
	for _, ref := range resp.Ack {
		if r, ok := ag.runs[ref]; ok && r.isDone() {
			r.log.Close()
			delete(ag.runs, ref)
			delete(ag.sent, ref)
			go ag.forget(ref)
		}
	}
	var toStart []agentapi.Assignment
	ending := ag.endingNow() // the machine is being reclaimed: start nothing
	for _, a := range resp.Start {
		if _, ok := ag.runs[a.JobRef]; !ok && !ending {
			toStart = append(toStart, a)
		}
	}
	var toStop []struct {
		r *run
		o agentapi.StopOrder
	}
	for _, o := range resp.Stop {
		if r, ok := ag.runs[o.JobRef]; ok {
			toStop = append(toStop, struct {
				r *run
				o agentapi.StopOrder
			}{r, o})
		} else if o.Reason == "not_assigned" {
			ag.log.Warn("broker disowns a job this agent does not run", "job", o.Job, "attempt", o.Attempt)
		}
	}
	ag.mu.Unlock()

	for _, a := range toStart {
		region := trace.StartRegion(context.Background(), "agent.spawn")
		r := ag.startRun(a)
		region.End()
		if r.state == agentapi.RunFailedToStart {
			ag.log.Warn("job failed to start", "job", a.Job, "attempt", a.Attempt, "err", r.message)
			ag.wake()
		} else {
			ag.log.Info("job started", "job", a.Job, "attempt", a.Attempt, "pid", r.group(), "gpus", a.UUIDs)
		}
	}
	if len(toStart) > 0 {
		ag.saveRuns() // once for the whole batch of starts
	}
	ag.applyGang(resp.Gang)
	for _, s := range toStop {
		s.r.mu.Lock()
		if s.r.stopReason == "" {
			s.r.stopReason = s.o.Reason
		}
		s.r.mu.Unlock()
		reason := "stopped"
		if s.o.Reason == "not_assigned" {
			reason = "not_assigned"
		}
		ag.stopRun(s.r, s.o.Signal, s.o.Grace, reason)
	}
}

// killAll stops every attempt at once (the broker gave them away).
func (ag *Agent) killAll(reason string) {
	ag.mu.Lock()
	runs := make([]*run, 0, len(ag.runs))
	for _, r := range ag.runs {
		runs = append(runs, r)
	}
	ag.mu.Unlock()
	for _, r := range runs {
		ag.stopRun(r, "SIGKILL", 0, reason)
	}
	for _, r := range runs {
		select {
		case <-r.done:
		case <-time.After(5 * time.Second):
		}
	}
	ag.mu.Lock()
	for ref, r := range ag.runs {
		if r.isDone() {
			r.log.Close()
			delete(ag.runs, ref)
			delete(ag.sent, ref)
		}
	}
	ag.mu.Unlock()
	ag.saveRuns()
}

// shutdown stops every job when the agent itself stops: each gets its
// checkpoint signal and grace period.
func (ag *Agent) shutdown() {
	ag.mu.Lock()
	runs := make([]*run, 0, len(ag.runs))
	for _, r := range ag.runs {
		runs = append(runs, r)
	}
	ag.mu.Unlock()
	for _, r := range runs {
		ag.stopRun(r, r.a.Signal, r.a.Grace, "agent_stopped")
	}
	for _, r := range runs {
		<-r.done
	}
	ag.saveRuns()
}

// runsFile records the process groups of running attempts so that an agent
// restarted after a crash can kill what its predecessor left behind.
func (ag *Agent) runsFile() string { return filepath.Join(ag.cfg.DataDir, "runs.json") }

type savedRun struct {
	Job     string `json:"job"`
	Attempt int    `json:"attempt"`
	PGID    int    `json:"pgid"`
}

func (ag *Agent) saveRuns() {
	ag.mu.Lock()
	var saved []savedRun
	for ref, r := range ag.runs {
		if pg := r.group(); !r.isDone() && pg > 0 {
			saved = append(saved, savedRun{Job: ref.Job, Attempt: ref.Attempt, PGID: pg})
		}
	}
	ag.mu.Unlock()
	raw, _ := json.Marshal(saved)
	tmp := ag.runsFile() + ".tmp"
	if err := os.WriteFile(tmp, raw, 0o640); err == nil {
		_ = os.Rename(tmp, ag.runsFile())
	}
}

// killLeftovers kills the process groups a previous agent process left
// running. A group is killed only if its leader still carries the job's
// SPILLWAY_JOB_ID, so a recycled pid is never hit.
func (ag *Agent) killLeftovers() {
	raw, err := os.ReadFile(ag.runsFile())
	if err != nil {
		return
	}
	var saved []savedRun
	if json.Unmarshal(raw, &saved) != nil {
		return
	}
	for _, s := range saved {
		if procHasJob(s.PGID, s.Job) {
			ag.log.Warn("killing job left by a previous agent process", "job", s.Job, "attempt", s.Attempt, "pgid", s.PGID)
			_ = syscall.Kill(-s.PGID, syscall.SIGKILL)
		}
	}
	_ = os.Remove(ag.runsFile())
}

// procHasJob reports whether process pid carries SPILLWAY_JOB_ID=job.
func procHasJob(pid int, job string) bool {
	env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
	if err != nil {
		return false
	}
	return bytes.Contains(env, []byte("SPILLWAY_JOB_ID="+job+"\x00"))
}

func memTotal() int64 {
	raw, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if rest, ok := strings.CutPrefix(line, "MemTotal:"); ok {
			f := strings.Fields(rest)
			if len(f) > 0 {
				kb, _ := strconv.ParseInt(f[0], 10, 64)
				return kb << 10
			}
		}
	}
	return 0
}
