package agent

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/spillway-dev/spillway/onprem/agentapi"
	"github.com/spillway-dev/spillway/onprem/runtime"
)

// signals maps the names a spec may use to signals.
var signals = map[string]syscall.Signal{
	"SIGTERM": syscall.SIGTERM, "SIGINT": syscall.SIGINT, "SIGHUP": syscall.SIGHUP,
	"SIGUSR1": syscall.SIGUSR1, "SIGUSR2": syscall.SIGUSR2, "SIGQUIT": syscall.SIGQUIT,
	"SIGKILL": syscall.SIGKILL,
}

// SignalName is the conventional name of a signal ("SIGKILL").
func SignalName(s syscall.Signal) string {
	for name, v := range signals {
		if v == s {
			return name
		}
	}
	return "SIG" + strings.ToUpper(s.String())
}

// baseEnv are the agent's variables a job inherits; everything else comes
// from the job's spec and the agent.
var baseEnv = []string{"PATH", "HOME", "LANG", "LC_ALL", "TZ", "USER", "LOGNAME", "SHELL", "TMPDIR", "LD_LIBRARY_PATH"}

// run is one attempt of one job on this node.
type run struct {
	a       agentapi.Assignment
	logPath string
	pgid    int
	started time.Time
	// spawned is when the process started on the monotonic clock (for
	// pacing reports, never reported).
	spawned time.Time

	mu       sync.Mutex
	state    agentapi.RunState
	ended    time.Time
	exitCode int
	signal   string
	reason   string // set when the agent itself ended the run
	message  string
	stopping bool
	log      *cappedFile
	// data is the attempt's staging (nil when it has none); stopReason is
	// the broker's reason for a stop order (preempted, cancelled…).
	data       *dataRun
	stopReason string
	// proc is the started attempt (nil while the oci runtime pulls);
	// progress says what it waits for meanwhile. proc and pgid are set
	// under the agent's lock.
	proc     runtime.Proc
	progress string
	// gate is a gang member's start barrier (nil for other jobs).
	gate *gate
	// done is closed when the process has exited and its output is copied
	// (or the copy gave up waiting for stray writers).
	done chan struct{}
}

func (r *run) report() agentapi.JobReport {
	r.mu.Lock()
	defer r.mu.Unlock()
	rep := agentapi.JobReport{JobRef: r.a.JobRef, State: r.state, StartedAt: r.started, ExitCode: r.exitCode,
		Signal: r.signal, Reason: r.reason, Message: r.message, LogSize: r.log.Size(), Progress: r.progress}
	if r.state != agentapi.RunRunning && !r.isDone() {
		// Exited, but its cards are still being checked for leftover
		// processes (afterExit): the end goes out once they are clean.
		// Reported earlier, the broker gave a card to the next job while
		// this cleanup could still take that job's process for a leftover
		// and kill it.
		rep.State = agentapi.RunRunning
		rep.ExitCode, rep.Signal, rep.Reason, rep.Message = 0, "", "", ""
	}
	if r.data != nil {
		rep.Data = r.data.reportLocked()
	}
	if r.gate != nil {
		rep.Preflight = r.gate.report()
	}
	if rep.State != agentapi.RunRunning {
		rep.EndedAt = r.ended
	}
	return rep
}

// cappedFile is a log file that stops growing at a size cap and says so.
type cappedFile struct {
	mu      sync.Mutex
	f       *os.File
	size    int64
	limit   int64
	dropped int64
}

func (c *cappedFile) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := len(p)
	room := c.limit - c.size
	if room <= 0 {
		c.dropped += int64(n)
		return n, nil
	}
	if int64(len(p)) > room {
		c.dropped += int64(len(p)) - room
		p = p[:room]
	}
	w, err := c.f.Write(p)
	c.size += int64(w)
	if err == nil && c.size >= c.limit {
		msg := fmt.Sprintf("\n[spillway: log truncated at %d bytes]\n", c.limit)
		w2, _ := c.f.WriteString(msg)
		c.size += int64(w2)
	}
	return n, err
}

// Size is the number of bytes in the file.
func (c *cappedFile) Size() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.size
}

func (c *cappedFile) Close() error { return c.f.Close() }

// jobEnv builds the environment of an attempt; a container gets its
// image's own PATH and the like, not the agent's (inherit false).
func jobEnv(a agentapi.Assignment, mps, inherit bool) []string {
	var env []string
	for _, k := range baseEnv {
		if v, ok := os.LookupEnv(k); ok && inherit {
			env = append(env, k+"="+v)
		}
	}
	for k, v := range a.Env {
		env = append(env, k+"="+v)
	}
	env = append(env,
		"CUDA_VISIBLE_DEVICES="+strings.Join(a.UUIDs, ","),
		"NVIDIA_VISIBLE_DEVICES="+strings.Join(a.UUIDs, ","),
		"CUDA_DEVICE_ORDER=PCI_BUS_ID",
	)
	if a.MemoryShare > 0 {
		env = append(env, "SPILLWAY_GPU_MEMORY_LIMIT="+strconv.FormatInt(a.MemoryShare, 10))
		if mps && a.ComputeShare > 0 {
			env = append(env, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE="+strconv.Itoa(a.ComputeShare))
		}
	}
	return env
}

// startRun enters an attempt in ag.runs and starts it through the node's
// runtime, with its output in a capped log file the agent alone can read.
// An attempt that cannot start yields a run already in state
// failed_to_start. The oci runtime may have to pull the image first: that
// happens in the background, and the run reports the pull's progress until
// the container starts.
func (ag *Agent) startRun(a agentapi.Assignment) *run {
	now := ag.now()
	id := attemptID(a.JobRef)
	r := &run{a: a, started: now, state: agentapi.RunRunning, done: make(chan struct{}),
		logPath: filepath.Join(ag.cfg.DataDir, "logs", id+".log")}
	// The run is known before its process exists: a neighbour's cleanup on
	// a shared card (afterExit) spares only the processes of runs it knows,
	// and would otherwise kill this one as a leftover.
	ag.mu.Lock()
	ag.runs[a.JobRef] = r
	ag.mu.Unlock()
	fail := func(e *runtime.Exit) *run {
		r.state, r.ended, r.exitCode, r.reason, r.message = agentapi.RunFailedToStart, ag.now(), e.Code, e.Reason, e.Message
		if r.log == nil {
			r.log = &cappedFile{limit: ag.cfg.LogLimit}
			if f, ferr := os.OpenFile(os.DevNull, os.O_WRONLY, 0); ferr == nil {
				r.log.f = f
			}
		}
		close(r.done)
		return r
	}
	if err := os.MkdirAll(filepath.Dir(r.logPath), 0o700); err != nil {
		return fail(&runtime.Exit{Code: 127, Message: fmt.Sprintf("create log dir: %v", err)})
	}
	f, err := os.OpenFile(r.logPath, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return fail(&runtime.Exit{Code: 127, Message: fmt.Sprintf("create log: %v", err)})
	}
	r.log = &cappedFile{f: f, limit: ag.cfg.LogLimit}
	if len(a.Argv) == 0 {
		return fail(&runtime.Exit{Code: 127, Message: "empty command"})
	}
	job := ag.runtimeJob(r, id)
	if a.Data != nil {
		ag.prepareStaging(r, job)
	}
	if a.Gang != nil {
		r.gate = newGate(a)
		job.Barrier = func(image string) error { return ag.barrier(r, r.gate, image) }
		r.progress = "staging before the gang's start barrier"
	}
	if ag.rt.Kind() != runtime.KindOCI && a.Data == nil && a.Gang == nil {
		if e := ag.launch(r, job); e != nil {
			return fail(e)
		}
		return r
	}
	// Until the container runs (its image pulled) or the process starts
	// (its data staged) the broker keeps the job starting.
	if a.Data == nil && a.Gang == nil {
		r.progress = "preparing the container"
	}
	go func() {
		if e := ag.launch(r, job); e != nil {
			r.mu.Lock()
			r.ended, r.progress = ag.now(), ""
			if r.stopping {
				// Stopped before it started: an ordinary end of a stopped
				// attempt, not a failure to start.
				r.state, r.exitCode, r.signal = agentapi.RunExited, 128+15, "SIGTERM"
			} else {
				r.state, r.exitCode, r.reason, r.message = agentapi.RunFailedToStart, e.Code, e.Reason, e.Message
			}
			if r.data != nil {
				r.data.phase = agentapi.PhaseDone
				r.data.err = ""
				if !r.stopping {
					r.data.err = e.Message
				}
			}
			r.mu.Unlock()
			close(r.done)
			ag.log.Warn("job failed to start", "job", a.Job, "attempt", a.Attempt, "err", e.Message)
			ag.wake()
		}
	}()
	return r
}

// attemptID names an attempt's files on the node.
func attemptID(ref agentapi.JobRef) string { return fmt.Sprintf("%s-%d", ref.Job, ref.Attempt) }

// runtimeJob describes the attempt to the runtime.
func (ag *Agent) runtimeJob(r *run, id string) *runtime.Job {
	a := r.a
	j := &runtime.Job{ID: id, Team: a.Team, User: a.User, Argv: a.Argv, Env: jobEnv(a, ag.mps, ag.rt.Kind() != runtime.KindOCI),
		Image: a.Image, Workdir: a.Workdir, Memory: a.Memory, ShmSize: a.ShmSize, GPUs: a.UUIDs,
		HostNetwork: len(a.Peers) > 1, Output: r.log,
		Progress: func(p string) {
			r.mu.Lock()
			r.progress = p
			r.mu.Unlock()
			ag.wake()
		}}
	for _, m := range a.Mounts {
		j.Mounts = append(j.Mounts, runtime.Mount{Source: m.Source, Target: m.Target, ReadOnly: m.ReadOnly})
	}
	if a.WorkdirUpload != "" {
		j.Prepare = func(dir string) error { return ag.unpackUpload(a.WorkdirUpload, dir) }
	}
	ag.handCAToJob(j)
	return j
}

// launch starts the attempt and the goroutines that wait for it and
// enforce its timeout.
func (ag *Agent) launch(r *run, j *runtime.Job) *runtime.Exit {
	a := r.a
	proc, e := ag.rt.Start(context.Background(), j)
	if e != nil {
		return e
	}
	ag.mu.Lock()
	r.mu.Lock()
	r.proc, r.pgid, r.spawned = proc, proc.PGID(), time.Now()
	r.mu.Unlock()
	ag.mu.Unlock()
	if r.data != nil {
		go ag.syncEvery(r, proc.Dir())
	}
	r.mu.Lock()
	r.progress = ""
	stopping := r.stopping
	r.mu.Unlock()
	if stopping {
		// A stop came while the image was being pulled.
		_ = proc.Signal(syscall.SIGKILL)
	}
	go func() {
		exit := proc.Wait()
		if r.data != nil {
			ag.finishData(r, proc.Dir(), exit.Code, exit.Signal)
		}
		r.mu.Lock()
		r.ended = ag.now()
		r.state = agentapi.RunExited
		r.exitCode, r.signal = exit.Code, exit.Signal
		if exit.Reason != "" && r.reason == "" {
			r.reason = exit.Reason
		}
		if exit.Message != "" {
			r.message = exit.Message
		}
		r.mu.Unlock()
		ag.afterExit(r)
		close(r.done)
		ag.wake()
	}()
	if a.Timeout > 0 {
		go func() {
			select {
			case <-r.done:
			case <-time.After(a.Timeout):
				ag.log.Info("job timed out on the agent", "job", a.Job, "attempt", a.Attempt, "timeout", a.Timeout)
				ag.stopRun(r, a.Signal, a.Grace, "timed_out")
			}
		}()
	}
	return nil
}

// stopRun sends the stop signal to the attempt's process group, waits the
// grace period, then kills the group. Repeated calls are harmless.
func (ag *Agent) stopRun(r *run, sig string, grace time.Duration, reason string) {
	r.mu.Lock()
	if r.stopping || r.state != agentapi.RunRunning {
		r.mu.Unlock()
		return
	}
	r.stopping = true
	if r.reason == "" {
		r.reason = reason
	}
	pgid := r.pgid
	r.mu.Unlock()
	if pgid == 0 {
		// Still staging or at the gang's barrier: no process yet; end
		// the staging and the wait instead.
		if r.data != nil {
			r.data.cancel()
		}
		if r.gate != nil {
			r.gate.cancel()
		}
		return
	}
	s, ok := signals[sig]
	if !ok {
		s = syscall.SIGTERM
	}
	ag.log.Info("stopping job", "job", r.a.Job, "attempt", r.a.Attempt, "signal", sig, "grace", grace, "reason", reason)
	ag.mu.Lock()
	proc := r.proc
	ag.mu.Unlock()
	if proc == nil {
		// Still pulling its image: launch kills it once it starts, and
		// the start fails if it never does.
		return
	}
	_ = proc.Signal(s)
	if s == syscall.SIGKILL {
		return
	}
	go func() {
		select {
		case <-r.done:
		case <-time.After(grace):
			_ = proc.Signal(syscall.SIGKILL)
		}
	}()
}
