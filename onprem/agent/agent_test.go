package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/onprem/agentapi"
	"github.com/spillway-dev/spillway/onprem/gpu"
	"github.com/spillway-dev/spillway/onprem/gpu/sim"
	jobrt "github.com/spillway-dev/spillway/onprem/runtime"
)

// fakeBroker speaks just enough of the agent protocol: it hands out the
// assignments a test queues, records every report, acknowledges ended
// attempts, and can go down (answer 503) to play an unreachable broker.
type fakeBroker struct {
	mu       sync.Mutex
	pending  []agentapi.Assignment
	stops    []agentapi.StopOrder
	reports  map[agentapi.JobRef]agentapi.JobReport
	last     agentapi.SyncRequest
	down     bool
	logs     map[agentapi.JobRef][]byte
	acked    map[agentapi.JobRef]bool
	syncs    int
	unheal   map[int]string
	leaks    []agentapi.Leak
	interval time.Duration
}

func newFakeBroker() *fakeBroker {
	return &fakeBroker{reports: map[agentapi.JobRef]agentapi.JobReport{}, logs: map[agentapi.JobRef][]byte{},
		acked: map[agentapi.JobRef]bool{}, interval: 100 * time.Millisecond}
}

func (f *fakeBroker) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.down {
		http.Error(w, "down", http.StatusServiceUnavailable)
		return
	}
	switch r.URL.Path {
	case agentapi.PathRegister:
		json.NewEncoder(w).Encode(agentapi.RegisterResponse{Generation: 1, HeartbeatInterval: f.interval})
	case agentapi.PathSync:
		var req agentapi.SyncRequest
		json.NewDecoder(r.Body).Decode(&req)
		f.syncs++
		f.last = req
		f.unheal = req.Unhealthy
		f.leaks = append(f.leaks, req.Leaks...)
		resp := agentapi.SyncResponse{HeartbeatInterval: f.interval, LogOffsets: map[string]int64{}}
		for _, ch := range req.Logs {
			// A chunk may repeat bytes the broker has (its answer was lost
			// to a cancelled long poll): keep only what is new.
			have := int64(len(f.logs[ch.JobRef]))
			if ch.Offset <= have && ch.Offset+int64(len(ch.Data)) > have {
				f.logs[ch.JobRef] = append(f.logs[ch.JobRef], ch.Data[have-ch.Offset:]...)
			}
		}
		for _, rep := range req.Jobs {
			// Like the broker, never let a late heartbeat undo an end.
			if old, ok := f.reports[rep.JobRef]; ok && old.State != agentapi.RunRunning {
				continue
			}
			f.reports[rep.JobRef] = rep
			resp.LogOffsets[fmt.Sprintf("%s/%d", rep.Job, rep.Attempt)] = int64(len(f.logs[rep.JobRef]))
			if rep.State != agentapi.RunRunning {
				resp.Ack = append(resp.Ack, rep.JobRef)
				f.acked[rep.JobRef] = true
			}
		}
		if req.Wait > 0 && len(f.pending) == 0 && len(f.stops) == 0 && len(resp.Ack) == 0 {
			// A long poll, as the broker does it: reports are recorded
			// first, then a quiet answer is held a little so the agent
			// does not spin. The hold stands for the broker's wait; no
			// test orders anything by it (tests wait on the reports).
			f.mu.Unlock()
			time.Sleep(min(req.Wait, 50*time.Millisecond))
			f.mu.Lock()
		}
		// Orders stay until the agent's reports show them carried out, as
		// the broker derives them from state: an answer lost to a
		// cancelled long poll loses nothing.
		var keep []agentapi.Assignment
		for _, a := range f.pending {
			if _, ok := f.reports[a.JobRef]; !ok {
				keep = append(keep, a)
			}
		}
		f.pending = keep
		var stops []agentapi.StopOrder
		for _, o := range f.stops {
			if rep, ok := f.reports[o.JobRef]; !ok || rep.State == agentapi.RunRunning {
				stops = append(stops, o)
			}
		}
		f.stops = stops
		resp.Start, resp.Stop = f.pending, f.stops
		json.NewEncoder(w).Encode(resp)
	default:
		http.NotFound(w, r)
	}
}

func (f *fakeBroker) report(job string) (agentapi.JobReport, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	r, ok := f.reports[agentapi.JobRef{Job: job, Attempt: 1}]
	return r, ok
}

// rig is an agent on a simulated 2-card node talking to a fakeBroker.
type rig struct {
	t      *testing.T
	fb     *fakeBroker
	ag     *Agent
	sim    *sim.Backend
	cancel context.CancelFunc
	done   chan struct{}
}

func newRig(t *testing.T) *rig {
	t.Helper()
	return newRigWith(t, nil)
}

// newRigWith is newRig with the agent's config changed by mod first, and
// the agent by each of hooks before it runs.
func newRigWith(t *testing.T, mod func(*Config), hooks ...func(*Agent)) *rig {
	t.Helper()
	fb := newFakeBroker()
	srv := httptest.NewServer(fb)
	t.Cleanup(srv.Close)
	be, err := sim.New("2xH100-80GB", "node-"+strings.ToLower(t.Name()), sim.Options{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Broker: srv.URL, Token: "t", Name: "n1", DataDir: t.TempDir()}
	if mod != nil {
		mod(&cfg)
	}
	ag, err := New(cfg, be, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range hooks {
		h(ag)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &rig{t: t, fb: fb, ag: ag, sim: be, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		ag.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-r.done
	})
	return r
}

func (r *rig) assign(job string, gpu int, timeout time.Duration, argv ...string) {
	r.fb.mu.Lock()
	defer r.fb.mu.Unlock()
	r.fb.pending = append(r.fb.pending, agentapi.Assignment{
		JobRef: agentapi.JobRef{Job: job, Attempt: 1}, Argv: argv, Env: map[string]string{"SPILLWAY_JOB_ID": job},
		GPUs: []int{gpu}, UUIDs: []string{r.sim.UUIDs()[gpu]}, Timeout: timeout, Signal: "SIGTERM", Grace: time.Second,
	})
}

func (r *rig) waitEnded(job string, within time.Duration) agentapi.JobReport {
	r.t.Helper()
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		if rep, ok := r.fb.report(job); ok && rep.State != agentapi.RunRunning {
			return rep
		}
		time.Sleep(20 * time.Millisecond)
	}
	rep, ok := r.fb.report(job)
	r.fb.mu.Lock()
	last := r.fb.last
	r.fb.mu.Unlock()
	r.t.Fatalf("job %s did not end within %s (its last report %+v, known %v; last sync %+v)", job, within, rep, ok, last)
	return agentapi.JobReport{}
}

func holders(t *testing.T, be gpu.Backend, uuid string) []gpu.Process {
	t.Helper()
	s, err := be.Sample()
	if err != nil {
		t.Fatal(err)
	}
	return gpu.Holders(s, []string{uuid})
}

func alive(pid int) bool { return syscall.Kill(pid, 0) == nil }

func TestJobEnvironmentAndLog(t *testing.T) {
	r := newRig(t)
	r.assign("env", 1, time.Minute, "sh", "-c", `echo "$CUDA_VISIBLE_DEVICES $CUDA_DEVICE_ORDER $SPILLWAY_JOB_ID"; pwd; exit 3`)
	rep := r.waitEnded("env", 30*time.Second)
	if rep.ExitCode != 3 || rep.Signal != "" {
		t.Fatalf("report %+v", rep)
	}
	r.fb.mu.Lock()
	log := string(r.fb.logs[rep.JobRef])
	r.fb.mu.Unlock()
	want := r.sim.UUIDs()[1] + " PCI_BUS_ID env\n"
	if !strings.HasPrefix(log, want) || !strings.Contains(log, "jobs-") && !strings.Contains(log, "/jobs/") || !strings.Contains(log, "/env-1") {
		t.Fatalf("log %q, want it to start with %q and show the per-attempt workdir", log, want)
	}
}

func TestFailedToStart(t *testing.T) {
	r := newRig(t)
	r.assign("nope", 0, time.Minute, "/no/such/program")
	rep := r.waitEnded("nope", 30*time.Second)
	if rep.State != agentapi.RunFailedToStart || rep.ExitCode != 127 || rep.Message == "" {
		t.Fatalf("report %+v", rep)
	}
}

// TestEndIsReportedAfterTheCleanup: an attempt that exited is reported
// running until its cards have been checked for leftovers (done closed),
// then exited with its end time. Reported at the exit, the broker gave a
// card to the next job while this cleanup could still kill that job's
// process as a leftover: zero-length jobs died "killed by SIGKILL" in
// make bench-e2e under load.
func TestEndIsReportedAfterTheCleanup(t *testing.T) {
	ended := time.Date(2026, 12, 2, 11, 0, 0, 0, time.UTC)
	r := &run{a: agentapi.Assignment{JobRef: agentapi.JobRef{Job: "j1", Attempt: 1}}, log: &cappedFile{},
		state: agentapi.RunExited, exitCode: 137, signal: "SIGKILL", ended: ended, done: make(chan struct{})}
	if rep := r.report(); rep.State != agentapi.RunRunning || !rep.EndedAt.IsZero() || rep.Signal != "" || rep.ExitCode != 0 {
		t.Fatalf("during the cleanup: %+v, want running without an end", rep)
	}
	close(r.done)
	if rep := r.report(); rep.State != agentapi.RunExited || !rep.EndedAt.Equal(ended) || rep.Signal != "SIGKILL" || rep.ExitCode != 137 {
		t.Fatalf("after the cleanup: %+v, want exited at %s by SIGKILL", rep, ended)
	}
}

// startHook is the node's runtime with started called once each attempt's
// process exists, before the agent hears back from Start.
type startHook struct {
	jobrt.Runtime
	started func(*jobrt.Job, jobrt.Proc)
}

func (h startHook) Start(ctx context.Context, j *jobrt.Job) (jobrt.Proc, *jobrt.Exit) {
	p, e := h.Runtime.Start(ctx, j)
	if e == nil {
		h.started(j, p)
	}
	return p, e
}

// TestNewSharerIsNotANeighboursLeftover: a job sharing a card with one that
// has just ended starts while the ended job's cleanup samples the card.
// Its process is on the card from the moment the runtime creates it; the
// cleanup must know it for a running job's, not the ended job's leftover.
func TestNewSharerIsNotANeighboursLeftover(t *testing.T) {
	type seen struct {
		pid    int
		strays map[int][]int
		err    error
	}
	got := make(chan seen, 1)
	r := newRigWith(t, nil, func(ag *Agent) {
		ag.rt = startHook{Runtime: ag.rt, started: func(j *jobrt.Job, p jobrt.Proc) {
			// The simulated cards may have listed the process before its
			// exec, without CUDA_VISIBLE_DEVICES; wait until they show it
			// on its card, as NVML would from the start.
			held := func() bool {
				smp, err := ag.backend.Sample()
				return err == nil && slices.ContainsFunc(gpu.Holders(smp, j.GPUs), func(h gpu.Process) bool { return h.PID == p.PGID() })
			}
			for deadline := time.Now().Add(10 * time.Second); !held(); {
				if time.Now().After(deadline) {
					got <- seen{pid: p.PGID(), err: fmt.Errorf("pid %d never showed on its card", p.PGID())}
					return
				}
				time.Sleep(20 * time.Millisecond)
			}
			ended := &run{a: agentapi.Assignment{JobRef: agentapi.JobRef{Job: "ended", Attempt: 1}, UUIDs: j.GPUs},
				state: agentapi.RunExited, done: make(chan struct{})}
			s, err := ag.strays(ended)
			got <- seen{pid: p.PGID(), strays: s, err: err}
		}}
	})
	r.assign("fresh", 1, time.Minute, "sleep", "300")
	var s seen
	select {
	case s = <-got:
	case <-time.After(30 * time.Second):
		t.Fatal("the job did not start")
	}
	if s.err != nil {
		t.Fatal(s.err)
	}
	for idx, pids := range s.strays {
		if slices.Contains(pids, s.pid) {
			t.Fatalf("the ended job's cleanup takes the new job's pid %d on card %d for its leftover", s.pid, idx)
		}
	}
}

// TestLeakedGrandchildIsKilled: the job forks a grandchild that leaves the
// job's process group (setsid) and keeps the card; when the job exits the
// agent finds it through the GPU backend and kills it, and the card comes
// back clean.
func TestLeakedGrandchildIsKilled(t *testing.T) {
	r := newRig(t)
	pidFile := filepath.Join(sharedDir(t), "grandchild.pid")
	r.assign("leaky", 0, time.Minute, "sh", "-c",
		fmt.Sprintf(`setsid sh -c 'echo $$ > %[1]s; exec sleep 300' & while [ ! -s %[1]s ]; do sleep 0.05; done; exit 0`, pidFile))
	rep := r.waitEnded("leaky", 30*time.Second)
	if rep.ExitCode != 0 {
		t.Fatalf("report %+v", rep)
	}
	raw, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	var pid int
	fmt.Sscan(string(raw), &pid)
	t.Cleanup(func() { syscall.Kill(pid, syscall.SIGKILL) })
	waitFor(t, fmt.Sprintf("the agent to kill grandchild %d after the job ended", pid), func() bool { return !alive(pid) })
	if h := holders(t, r.sim, r.sim.UUIDs()[0]); len(h) != 0 {
		t.Fatalf("card still held by %+v", h)
	}
	// The leak is reported; two syncs after that carry no second report
	// and no unhealthy card.
	var seen int
	waitFor(t, "the leak report", func() bool {
		r.fb.mu.Lock()
		defer r.fb.mu.Unlock()
		seen = r.fb.syncs
		return len(r.fb.leaks) > 0
	})
	waitFor(t, "two syncs after the leak report", func() bool {
		r.fb.mu.Lock()
		defer r.fb.mu.Unlock()
		return r.fb.syncs >= seen+2
	})
	r.fb.mu.Lock()
	leaks, unhealthy := r.fb.leaks, r.fb.unheal
	r.fb.mu.Unlock()
	if len(leaks) != 1 || leaks[0].PID != pid || !leaks[0].Killed || leaks[0].Job != "leaky" {
		t.Fatalf("leaks reported: %+v", leaks)
	}
	if len(unhealthy) != 0 {
		t.Fatalf("card marked unhealthy after a clean kill: %v", unhealthy)
	}
}

// TestUncleanCardLeavesPool: after the job ends its card still shows
// memory in use that no process holds; the agent cannot clean it, so the
// card leaves the pool with the reason. A card shared with a job that is
// still running is left alone.
func TestUncleanCardLeavesPool(t *testing.T) {
	old := cleanWait
	cleanWait = 500 * time.Millisecond
	t.Cleanup(func() { cleanWait = old })
	r := newRig(t)
	r.assign("neighbour", 1, time.Minute, "sleep", "300")
	r.assign("sharer", 1, time.Minute, "sh", "-c", "sleep 0.3")
	r.waitEnded("sharer", 30*time.Second)
	// The card's memory sticks while "stuck" runs; then the job ends.
	release := filepath.Join(sharedDir(t), "release")
	r.assign("stuck", 0, time.Minute, "sh", "-c", fmt.Sprintf("while [ ! -e %s ]; do sleep 0.05; done", release))
	waitFor(t, "job stuck to run", func() bool {
		rep, ok := r.fb.report("stuck")
		return ok && rep.State == agentapi.RunRunning
	})
	if err := r.sim.SetStuckMemory(0, 4<<30); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(release, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	r.waitEnded("stuck", 30*time.Second)
	var unhealthy map[int]string
	waitFor(t, "card 0 to leave the pool", func() bool {
		r.fb.mu.Lock()
		defer r.fb.mu.Unlock()
		unhealthy = r.fb.unheal
		return unhealthy[0] != ""
	})
	if !strings.Contains(unhealthy[0], "held by no process") {
		t.Fatalf("card 0 not taken out of the pool: %v", unhealthy)
	}
	if _, bad := unhealthy[1]; bad {
		t.Fatalf("the card shared with a running job was declared unhealthy: %v", unhealthy)
	}
}

// TestTimeoutWithoutBroker: the broker goes away; the job still ends at its
// timeout (checkpoint signal, grace, kill), and the agent reports it once
// the broker is back.
func TestTimeoutWithoutBroker(t *testing.T) {
	r := newRig(t)
	marker := filepath.Join(sharedDir(t), "term")
	r.assign("slow", 0, 700*time.Millisecond, "sh", "-c", fmt.Sprintf(`trap 'echo got-term > %s; exit 143' TERM; while true; do sleep 0.05; done`, marker))
	waitFor(t, "job slow to run", func() bool {
		rep, ok := r.fb.report("slow")
		return ok && rep.State == agentapi.RunRunning
	})
	r.fb.mu.Lock()
	r.fb.down = true
	r.fb.mu.Unlock()
	waitFor(t, "the job's signal at its timeout while the broker is down", func() bool {
		_, err := os.Stat(marker)
		return err == nil
	})
	r.fb.mu.Lock()
	r.fb.down = false
	r.fb.mu.Unlock()
	rep := r.waitEnded("slow", 30*time.Second)
	if rep.Reason != "timed_out" || rep.ExitCode != 143 {
		t.Fatalf("report %+v", rep)
	}
}

// TestCriticalXIDMarksCardUnhealthy: a critical XID on a card takes it out
// of the pool; a benign one does not.
func TestCriticalXIDMarksCardUnhealthy(t *testing.T) {
	r := newRig(t)
	if err := r.sim.InjectXID(1, 13); err != nil { // graphics engine exception: the app's fault
		t.Fatal(err)
	}
	if err := r.sim.InjectXID(0, 79); err != nil {
		t.Fatal(err)
	}
	// The agent reads events in the order they came: once the XID 79
	// has taken card 0 out, it has read the XID 13 as well.
	var unhealthy map[int]string
	waitFor(t, "XID 79 to mark card 0 unhealthy", func() bool {
		r.fb.mu.Lock()
		defer r.fb.mu.Unlock()
		unhealthy = r.fb.unheal
		return strings.Contains(unhealthy[0], "XID 79")
	})
	if why, bad := unhealthy[1]; bad {
		t.Fatalf("XID 13 made card 1 unhealthy: %s", why)
	}
}

// TestRestartKillsLeftovers: an agent process that died left a job
// running; the next agent process kills it before registering.
func TestRestartKillsLeftovers(t *testing.T) {
	dir := t.TempDir()
	cmd := execSleep(t, "orphan")
	saved, _ := json.Marshal([]savedRun{{Job: "orphan", Attempt: 1, PGID: cmd.Process.Pid}})
	os.WriteFile(filepath.Join(dir, "runs.json"), saved, 0o640)
	innocent := execSleep(t, "someone-else")
	savedInnocent, _ := json.Marshal([]savedRun{{Job: "orphan", Attempt: 1, PGID: cmd.Process.Pid}, {Job: "other", Attempt: 1, PGID: innocent.Process.Pid}})
	os.WriteFile(filepath.Join(dir, "runs.json"), savedInnocent, 0o640)
	be, _ := sim.New("1xH100-80GB", "n", sim.Options{})
	ag, err := New(Config{Broker: "http://127.0.0.1:1", Token: "t", Name: "n", DataDir: dir}, be, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	ag.killLeftovers()
	if err := waitExit(cmd, 2*time.Second); err != nil {
		t.Fatalf("leftover job not killed: %v", err)
	}
	if !alive(innocent.Process.Pid) {
		t.Fatal("a process whose pid was recorded but which carries another job id was killed")
	}
}
