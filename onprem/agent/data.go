package agent

import (
	"context"
	"errors"
	"fmt"
	jobrt "github.com/spillway-dev/spillway/onprem/runtime"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/spillway-dev/spillway/onprem/agentapi"
	"github.com/spillway-dev/spillway/onprem/staging"
)

// defaultCacheBytes caps the input cache when the config does not.
const defaultCacheBytes = 50 << 30

// dataRun is the staging state of one attempt; its fields are guarded by
// the run's mu.
type dataRun struct {
	phase    string
	progress staging.Progress
	spans    []agentapi.Span
	restored string
	ckpt     string
	ckptAt   time.Time
	inBytes  int64
	hitBytes int64
	err      string
	cancel   context.CancelFunc
	ctx      context.Context
	// ckMu serialises checkpoint uploads (interval and final).
	ckMu sync.Mutex
}

func (d *dataRun) reportLocked() *agentapi.DataReport {
	return &agentapi.DataReport{Phase: d.phase, Done: d.progress.Done, Total: d.progress.Total,
		Spans: append([]agentapi.Span(nil), d.spans...), Restored: d.restored, Checkpoint: d.ckpt, CheckpointAt: d.ckptAt,
		InputBytes: d.inBytes, CacheHitBytes: d.hitBytes, Error: d.err}
}

// group is the attempt's process group (0 while it stages).
func (r *run) group() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.pgid
}

// spawnedAt is when the attempt's process started (zero before).
func (r *run) spawnedAt() time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.spawned
}

func (r *run) setPhase(phase string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.data.phase = phase
	r.data.progress = staging.Progress{Phase: phase}
}

func (r *run) setProgress(p staging.Progress) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.data.progress = p
}

// openSpan and closeSpan bracket staging time.
func (r *run) openSpan(at time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.data.spans = append(r.data.spans, agentapi.Span{Start: at})
}

func (r *run) closeSpan(at time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if n := len(r.data.spans); n > 0 && r.data.spans[n-1].End.IsZero() {
		r.data.spans[n-1].End = at
	}
}

func (ag *Agent) stagerOrErr() (*staging.Stager, error) {
	ag.stagerOnce.Do(func() {
		cfg := ag.cfg.Data
		if cfg.CacheDir == "" {
			cfg.CacheDir = filepath.Join(ag.cfg.DataDir, "cache")
		}
		if cfg.CacheBytes == 0 {
			cfg.CacheBytes = defaultCacheBytes
		}
		ag.stager, ag.stagerErr = staging.New(context.Background(), cfg)
		ag.stagerReady.Store(ag.stagerErr == nil)
	})
	return ag.stager, ag.stagerErr
}

// cacheStats is the node cache for the heartbeat (nil before first use).
func (ag *Agent) cacheStats() *staging.CacheStats {
	if !ag.stagerReady.Load() {
		return nil
	}
	s := ag.stager.Cache().Stats()
	return &s
}

// ckptDir is the attempt's checkpoint directory.
func ckptDir(a agentapi.Assignment, workdir string) string {
	d := a.Data.Checkpoint.Dir
	if !filepath.IsAbs(d) {
		d = filepath.Join(workdir, d)
	}
	return d
}

// prepareStaging makes the runtime restore the checkpoint and fetch the
// inputs into the attempt's directory before the job starts (the job's
// Prepare step, run in the background by startRun). The run reports state
// running with its staging phase meanwhile; a stop order cancels the
// staging. A staging failure is a failure to start with its own reason
// (input_missing is never retried).
func (ag *Agent) prepareStaging(r *run, j *jobrt.Job) {
	ctx, cancel := context.WithCancel(context.Background())
	r.data = &dataRun{phase: agentapi.PhaseRestore, cancel: cancel, ctx: ctx,
		spans: []agentapi.Span{{Start: ag.now()}}}
	unpack := j.Prepare
	j.Prepare = func(dir string) error {
		if unpack != nil {
			if err := unpack(dir); err != nil {
				return err
			}
		}
		env, reason, err := ag.stage(ctx, r, dir)
		r.closeSpan(ag.now())
		if err != nil {
			ag.log.Warn("job staging ended without a start", "job", r.a.Job, "attempt", r.a.Attempt, "err", err)
			return &jobrt.PrepareError{Reason: reason, Err: err}
		}
		j.Env = append(j.Env, ag.jobPaths(dir, env)...)
		r.setPhase(agentapi.PhaseRunning)
		return nil
	}
}

// jobPaths rewrites KEY=PATH variables that name a place in the attempt's
// directory as the job sees it: the same path for the process runtime,
// under /workspace inside an oci container.
func (ag *Agent) jobPaths(dir string, env []string) []string {
	if ag.rt.Kind() != jobrt.KindOCI {
		return env
	}
	out := make([]string, len(env))
	for i, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		if rel, err := filepath.Rel(dir, v); err == nil && filepath.IsAbs(v) && !strings.HasPrefix(rel, "..") {
			v = filepath.Join(jobrt.WorkspaceDir, rel)
		}
		out[i] = k + "=" + v
	}
	return out
}

// stage restores the checkpoint and fetches the inputs, returning the
// environment the job gets from it.
func (ag *Agent) stage(ctx context.Context, r *run, workdir string) ([]string, string, error) {
	st, err := ag.stagerOrErr()
	if err != nil {
		return nil, agentapi.ReasonStagingFailed, err
	}
	a := r.a
	var env []string
	if c := a.Data.Checkpoint; c != nil {
		dir := ckptDir(a, workdir)
		env = append(env, "SPILLWAY_CHECKPOINT_DIR="+dir)
		m, err := st.RestoreCheckpoint(ctx, dir, c.To, r.setProgress)
		if err != nil {
			return nil, agentapi.ReasonStagingFailed, fmt.Errorf("restore checkpoint from %s: %w", c.To, err)
		}
		if m != nil {
			env = append(env, "SPILLWAY_RESUME=1")
			r.mu.Lock()
			r.data.restored = m.Seq
			r.mu.Unlock()
			ag.log.Info("checkpoint restored", "job", a.Job, "attempt", a.Attempt, "checkpoint", m.Seq, "from", c.To)
		} else if err := os.MkdirAll(dir, 0o750); err != nil {
			return nil, agentapi.ReasonStagingFailed, err
		}
	}
	if len(a.Data.Inputs) > 0 {
		r.setPhase(agentapi.PhaseInputs)
		res, err := st.StageInputs(ctx, a.Data.Inputs, workdir, r.setProgress)
		var me *staging.MissingError
		if errors.As(err, &me) {
			return nil, agentapi.ReasonInputMissing, err
		}
		if err != nil {
			return nil, agentapi.ReasonStagingFailed, err
		}
		r.mu.Lock()
		r.data.inBytes, r.data.hitBytes = res.Bytes, res.HitBytes
		r.mu.Unlock()
		ag.log.Info("inputs staged", "job", a.Job, "attempt", a.Attempt, "bytes", res.Bytes, "cache_hit_bytes", res.HitBytes, "took", res.Duration)
	}
	if ctx.Err() != nil {
		return nil, "", ctx.Err()
	}
	return env, "", nil
}

// syncEvery uploads the checkpoint every interval while the job runs.
func (ag *Agent) syncEvery(r *run, workdir string) {
	c := r.a.Data.Checkpoint
	if c == nil || c.Interval <= 0 || c.RestoreOnly {
		return
	}
	t := time.NewTicker(c.Interval)
	defer t.Stop()
	for {
		select {
		case <-r.done:
			return
		case <-t.C:
			_ = ag.syncCheckpoint(r, workdir) // logged; the next interval tries again
		}
	}
}

func (ag *Agent) syncCheckpoint(r *run, workdir string) error {
	c := r.a.Data.Checkpoint
	st, err := ag.stagerOrErr()
	if err != nil {
		return err
	}
	r.data.ckMu.Lock()
	defer r.data.ckMu.Unlock()
	m, err := st.SyncCheckpoint(context.Background(), ckptDir(r.a, workdir), c.To, c.Keep,
		staging.CheckpointMeta{Job: r.a.Job, Attempt: r.a.Attempt})
	if err != nil {
		ag.log.Warn("checkpoint upload failed", "job", r.a.Job, "attempt", r.a.Attempt, "to", c.To, "err", err)
		return err
	}
	if m != nil {
		r.mu.Lock()
		r.data.ckpt, r.data.ckptAt = m.Seq, m.CreatedAt
		r.mu.Unlock()
		ag.log.Info("checkpoint uploaded", "job", r.a.Job, "attempt", r.a.Attempt, "checkpoint", m.Seq, "to", c.To, "files", len(m.Files))
	}
	return nil
}

// finishData runs after the process ended: the checkpoint goes up when the
// attempt was stopped (after its signal and grace) or failed, then the
// outputs due. The attempt is reported ended only afterwards, so a job is
// never done before its outputs are in the bucket.
func (ag *Agent) finishData(r *run, workdir string, code int, sig string) {
	r.openSpan(ag.now())
	defer r.closeSpan(ag.now())
	r.mu.Lock()
	stopping, stopReason := r.stopping, r.stopReason
	r.mu.Unlock()
	if c := r.a.Data.Checkpoint; c != nil && !c.RestoreOnly && (stopping || code != 0 || sig != "") {
		r.setPhase(agentapi.PhaseCheckpoint)
		if err := ag.syncCheckpoint(r, workdir); err != nil && stopReason == agentapi.ReasonSpotReclaim {
			// The machine goes anyway: the job resumes from its previous
			// checkpoint, and the broker records the work lost.
			r.mu.Lock()
			r.message = "checkpoint upload failed before the reclaim: " + err.Error()
			r.mu.Unlock()
		}
	}
	requeued := stopping && stopReason != "cancelled" && stopReason != "timed_out" && stopReason != ""
	if len(r.a.Data.Outputs) > 0 && !requeued {
		st, err := ag.stagerOrErr()
		if err == nil {
			r.setPhase(agentapi.PhaseOutputs)
			ok := code == 0 && sig == "" && !stopping
			err = st.UploadOutputs(context.Background(), r.a.Data.Outputs, workdir, ok, r.setProgress)
		}
		if err != nil {
			ag.log.Warn("outputs not uploaded", "job", r.a.Job, "attempt", r.a.Attempt, "err", err)
			r.mu.Lock()
			if r.reason == "" {
				r.reason = agentapi.ReasonOutputsFailed
			}
			r.message = "outputs not uploaded: " + err.Error()
			r.data.err = r.message
			r.mu.Unlock()
		}
	}
	r.setPhase(agentapi.PhaseDone)
}

// readBytesAfter is how long an attempt runs before the agent reports
// its read bytes (with the GPU telemetry).
const readBytesAfter = time.Second

// readBytesByGroup sets groups[pgid] to the sum of read_bytes of
// /proc/PID/io over the processes of each process group in groups: what
// each job has read from storage. One walk of /proc serves all groups.
func readBytesByGroup(groups map[int]int64) {
	if len(groups) == 0 {
		return
	}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		pg, ok := procGroup(pid)
		if !ok {
			continue
		}
		if _, want := groups[pg]; !want {
			continue
		}
		raw, err := os.ReadFile("/proc/" + e.Name() + "/io")
		if err != nil {
			continue
		}
		groups[pg] += parseReadBytes(string(raw))
	}
}

// parseReadBytes reads the read_bytes line of a /proc/PID/io file.
func parseReadBytes(io string) int64 {
	for _, line := range strings.Split(io, "\n") {
		if v, ok := strings.CutPrefix(line, "read_bytes:"); ok {
			n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			return n
		}
	}
	return 0
}

// procGroup is a process's process group from /proc/PID/stat.
func procGroup(pid int) (int, bool) {
	raw, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, false
	}
	s := string(raw)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 3 {
		return 0, false
	}
	pg, err := strconv.Atoi(f[2])
	return pg, err == nil
}
