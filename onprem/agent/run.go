package agent

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/spillway-dev/spillway/onprem/agentapi"
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

	mu       sync.Mutex
	state    agentapi.RunState
	ended    time.Time
	exitCode int
	signal   string
	reason   string // set when the agent itself ended the run
	message  string
	stopping bool
	log      *cappedFile
	// done is closed when the process has exited and its output is copied
	// (or the copy gave up waiting for stray writers).
	done chan struct{}
}

func (r *run) report() agentapi.JobReport {
	r.mu.Lock()
	defer r.mu.Unlock()
	rep := agentapi.JobReport{JobRef: r.a.JobRef, State: r.state, StartedAt: r.started, ExitCode: r.exitCode,
		Signal: r.signal, Reason: r.reason, Message: r.message, LogSize: r.log.Size()}
	if r.state != agentapi.RunRunning {
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

// jobEnv builds the environment of an attempt.
func jobEnv(a agentapi.Assignment, mps bool) []string {
	var env []string
	for _, k := range baseEnv {
		if v, ok := os.LookupEnv(k); ok {
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

// startRun starts an attempt in its own process group with its output in
// a capped log file. A process that cannot start yields a run already in
// state failed_to_start.
func (ag *Agent) startRun(a agentapi.Assignment) *run {
	now := ag.now()
	dir := filepath.Join(ag.cfg.DataDir, "jobs", fmt.Sprintf("%s-%d", a.Job, a.Attempt))
	r := &run{a: a, started: now, state: agentapi.RunRunning, done: make(chan struct{}),
		logPath: filepath.Join(dir, "output.log")}
	fail := func(err error) *run {
		r.state, r.ended, r.exitCode, r.message = agentapi.RunFailedToStart, ag.now(), 127, err.Error()
		if r.log == nil {
			r.log = &cappedFile{limit: ag.cfg.LogLimit}
			if f, ferr := os.OpenFile(os.DevNull, os.O_WRONLY, 0); ferr == nil {
				r.log.f = f
			}
		}
		close(r.done)
		return r
	}
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return fail(fmt.Errorf("create job dir: %w", err))
	}
	f, err := os.OpenFile(r.logPath, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o640)
	if err != nil {
		return fail(fmt.Errorf("create log: %w", err))
	}
	r.log = &cappedFile{f: f, limit: ag.cfg.LogLimit}
	workdir := a.Workdir
	if workdir == "" {
		workdir = dir
	}
	if len(a.Argv) == 0 {
		return fail(errors.New("empty command"))
	}
	cmd := exec.Command(a.Argv[0], a.Argv[1:]...)
	cmd.Dir = workdir
	cmd.Env = jobEnv(a, ag.mps)
	// Pdeathsig: the job's main process dies with the agent. An agent
	// killed with SIGKILL cannot stop its jobs, and the broker retries a
	// lost node's jobs elsewhere: without this the old copy would run on
	// beside its retry (finding 8). A restarted agent kills what is left
	// of the group (killLeftovers).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	pr, pw, err := os.Pipe()
	if err != nil {
		return fail(fmt.Errorf("create pipe: %w", err))
	}
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := startCmd(cmd); err != nil {
		pr.Close()
		pw.Close()
		return fail(err)
	}
	pw.Close() // the child has its copy
	r.pgid = cmd.Process.Pid
	copied := make(chan struct{})
	go func() {
		_, _ = io.Copy(r.log, pr)
		pr.Close()
		close(copied)
	}()
	go func() {
		err := cmd.Wait()
		// Stray grandchildren may keep the pipe open; give the copy a
		// moment, then report anyway (leak cleanup deals with them).
		select {
		case <-copied:
		case <-time.After(2 * time.Second):
		}
		r.mu.Lock()
		r.ended = ag.now()
		r.state = agentapi.RunExited
		r.exitCode, r.signal = exitStatus(cmd.ProcessState, err)
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
	return r
}

func exitStatus(ps *os.ProcessState, err error) (int, string) {
	if ps == nil {
		return 127, ""
	}
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal()), SignalName(ws.Signal())
	}
	return ps.ExitCode(), ""
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
	r.mu.Unlock()
	s, ok := signals[sig]
	if !ok {
		s = syscall.SIGTERM
	}
	ag.log.Info("stopping job", "job", r.a.Job, "attempt", r.a.Attempt, "signal", sig, "grace", grace, "reason", reason)
	_ = syscall.Kill(-r.pgid, s)
	if s == syscall.SIGKILL {
		return
	}
	go func() {
		select {
		case <-r.done:
		case <-time.After(grace):
			_ = syscall.Kill(-r.pgid, syscall.SIGKILL)
		}
	}()
}
