package server

import (
	"net/http"
	"slices"
	"time"

	"github.com/spillway-dev/spillway/broker/api"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/spillway-dev/spillway/billing"
	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/state"
	"github.com/spillway-dev/spillway/onprem/agentapi"
	"github.com/spillway-dev/spillway/onprem/gpu"
	"github.com/spillway-dev/spillway/onprem/staging"
)

// Data that follows a job (docs/data.md): what the agent is told to stage,
// what it reports back, the job's own "checkpoint saved at step N", and
// the detection of GPUs that wait on data.

// dataAssignment is the staging order for one attempt on one rank. Only
// rank 0 uploads outputs and the checkpoint; every rank restores it.
func dataAssignment(j *broker.Job, rank int) *agentapi.Data {
	sp := j.Spec
	if !sp.HasData() {
		return nil
	}
	d := &agentapi.Data{}
	for _, in := range sp.Inputs {
		d.Inputs = append(d.Inputs, staging.Input{From: in.From, To: in.To, Cache: in.Cache})
	}
	if rank == 0 {
		for _, o := range sp.Outputs {
			d.Outputs = append(d.Outputs, staging.Output{From: o.From, To: o.To, When: o.When})
		}
	}
	if c := sp.Checkpoint; c.To != "" {
		d.Checkpoint = &agentapi.DataCheckpoint{Dir: c.Dir, To: c.To, Keep: c.Keep, Interval: c.Interval.D(), RestoreOnly: rank > 0}
	}
	return d
}

// jobData turns an agent's staging report into the job's record.
func jobData(attempt int, r *agentapi.DataReport, prev *broker.JobData, now time.Time) *broker.JobData {
	d := &broker.JobData{Attempt: attempt, Phase: r.Phase, Done: r.Done, Total: r.Total, Restored: r.Restored,
		Checkpoint: r.Checkpoint, InputBytes: r.InputBytes, CacheHitBytes: r.CacheHitBytes, Error: r.Error}
	for _, sp := range r.Spans {
		ds := broker.DataSpan{Start: sp.Start.UTC()}
		if !sp.End.IsZero() {
			e := sp.End.UTC()
			ds.End = &e
		}
		d.Spans = append(d.Spans, ds)
	}
	switch {
	case r.Checkpoint == "":
	case prev != nil && prev.Attempt == attempt && prev.Checkpoint == r.Checkpoint && prev.CheckpointAt != nil:
		d.CheckpointAt = prev.CheckpointAt
	default:
		// The broker's clock says when a new checkpoint became known.
		t := now
		d.CheckpointAt = &t
	}
	return d
}

func dataEqual(a, b *broker.JobData) bool {
	if a == nil || b == nil {
		return a == b
	}
	if a.Attempt != b.Attempt || a.Phase != b.Phase || a.Done != b.Done || a.Total != b.Total || a.Restored != b.Restored ||
		a.Checkpoint != b.Checkpoint || a.InputBytes != b.InputBytes || a.CacheHitBytes != b.CacheHitBytes || a.Error != b.Error ||
		len(a.Spans) != len(b.Spans) {
		return false
	}
	for i := range a.Spans {
		x, y := a.Spans[i], b.Spans[i]
		if !x.Start.Equal(y.Start) || (x.End == nil) != (y.End == nil) || (x.End != nil && !x.End.Equal(*y.End)) {
			return false
		}
	}
	return true
}

// stagingSpans are the staging stretches of one attempt, for the meter.
func stagingSpans(d *broker.JobData, attempt int) []billing.Span {
	if d == nil || d.Attempt != attempt {
		return nil
	}
	out := make([]billing.Span, 0, len(d.Spans))
	for _, sp := range d.Spans {
		bs := billing.Span{Start: ms(sp.Start)}
		if sp.End != nil {
			bs.End = ms(*sp.End)
		}
		out = append(out, bs)
	}
	return out
}

// Thresholds of "GPU waits on data": the job's cards compute under
// dataWaitMaxUtil percent while it reads at least dataWaitMinRate bytes a
// second from storage, for dataWaitWindow.
var (
	dataWaitMaxUtil       = 30
	dataWaitMinRate int64 = 20 << 20
	dataWaitWindow        = time.Minute
)

// dataWaitStep is the detector, pure: the next state, whether the job's
// GPUs wait on data now, and the read rate.
func dataWaitStep(prev state.IO, attempt int, now time.Time, bytes int64, util int, haveUtil bool) (state.IO, bool, int64) {
	next := state.IO{Attempt: attempt, At: now, Bytes: bytes}
	if prev.Attempt != attempt || prev.At.IsZero() || !now.After(prev.At) || bytes < prev.Bytes {
		return next, false, 0
	}
	rate := (bytes - prev.Bytes) * int64(time.Second) / int64(now.Sub(prev.At))
	if haveUtil && util < dataWaitMaxUtil && rate >= dataWaitMinRate {
		next.Since = prev.Since
		if next.Since.IsZero() {
			next.Since = prev.At
		}
	}
	waiting := !next.Since.IsZero() && now.Sub(next.Since) >= dataWaitWindow
	return next, waiting, rate
}

// jobUtil is the mean compute of the job's cards on node in a sample.
func jobUtil(j *broker.Job, node string, t *gpu.Sample) (int, bool) {
	if t == nil {
		return 0, false
	}
	p, _, ok := placedOn(j, node)
	if !ok || len(p.GPUs) == 0 {
		return 0, false
	}
	sum, n := 0, 0
	for _, d := range t.Devices {
		if slices.Contains(p.GPUs, d.Index) {
			sum += d.SMUtil
			n++
		}
	}
	if n == 0 {
		return 0, false
	}
	return sum / n, true
}

// noteDataLocked applies a report's staging state and I/O reading to a job
// the node holds; it returns the changed job, or nil.
func (s *Server) noteDataLocked(j *broker.Job, r agentapi.JobReport, node string, t *gpu.Sample, now time.Time) *broker.Job {
	var jj *broker.Job
	edit := func() *broker.Job {
		if jj == nil {
			jj = cloneJob(j)
		}
		return jj
	}
	if r.Data != nil {
		d := jobData(r.Attempt, r.Data, j.Data, now)
		if !dataEqual(j.Data, d) {
			e := edit()
			e.Data = d
			if d.CheckpointAt != nil && (j.Data == nil || j.Data.CheckpointAt == nil || j.Data.Checkpoint != d.Checkpoint) &&
				(e.LastCheckpointAt == nil || d.CheckpointAt.After(*e.LastCheckpointAt)) {
				at := *d.CheckpointAt
				e.LastCheckpointAt = &at
			}
		}
	}
	if r.State != agentapi.RunRunning {
		s.view.DropIO(j.ID)
	}
	// The agent sends read bytes with its GPU telemetry (at most every
	// 250 ms, from the same moment), once the attempt has run a second; a
	// heartbeat without either says nothing about the rate.
	if t != nil && r.ReadBytes > 0 && r.State == agentapi.RunRunning && (r.Data == nil || r.Data.Phase == agentapi.PhaseRunning) {
		util, haveUtil := jobUtil(j, node, t)
		st, waiting, rate := dataWaitStep(s.view.IO(j.ID), r.Attempt, now, r.ReadBytes, util, haveUtil)
		s.view.SetIO(j.ID, st)
		w := j.DataWait
		switch {
		case waiting && (w == nil || !w.Active):
			e := edit()
			e.DataWait = &broker.DataWait{Since: st.Since, Last: now, ReadBytesPerSec: rate, SMUtil: util, Active: true}
			s.log.Info("GPU waits on data", "job", j.ID, "read_bytes_per_sec", rate, "sm_util", util)
		case waiting && now.Sub(w.Last) >= time.Minute:
			e := edit()
			e.DataWait = &broker.DataWait{Since: w.Since, Last: now, ReadBytesPerSec: rate, SMUtil: util, Active: true}
		case !waiting && w != nil && w.Active && st.Since.IsZero():
			e := edit()
			e.DataWait = &broker.DataWait{Since: w.Since, Last: now, ReadBytesPerSec: rate, SMUtil: util, Active: false}
		}
	}
	return jj
}

// nodeCache is the broker's record of an agent's cache report.
func nodeCache(c *staging.CacheStats) *broker.NodeCache {
	if c == nil {
		return nil
	}
	return &broker.NodeCache{Bytes: c.Bytes, CapBytes: c.CapBytes, Objects: c.Objects, Hits: c.Hits, Misses: c.Misses,
		Evictions: c.Evictions, HitRatio: c.HitRatio()}
}

func cacheChanged(a, b *broker.NodeCache) bool {
	if a == nil || b == nil {
		return a != b
	}
	return *a != *b
}

// reportCheckpoint serves POST /v1/jobs/{id}/checkpoint, with the job's
// token (or a person's): preemption then counts the job's lost work from
// now instead of from its start.
func (s *Server) reportCheckpoint(c echo.Context) error {
	var in api.CheckpointReport
	if err := decodeBody(c, 4<<10, &in); err != nil {
		return err
	}
	if in.Step < 0 {
		return errBadRequest("step", broker.CodeOutOfRange, "must be 0 or more, got %d", in.Step)
	}
	id := c.Param("id")
	if principal(c).Role != roleJob {
		if _, err := s.loadVisibleJob(c); err != nil {
			return err
		}
	}
	s.lock()
	defer s.mu.Unlock()
	j := s.view.Job(id)
	if j == nil {
		return newError(http.StatusNotFound, "not_found", "job %s not found or not running", clip(id))
	}
	if !j.State.Holding() {
		return newError(http.StatusConflict, "conflict", "job %s is %s; only a running job saves checkpoints", j.ID, j.State)
	}
	now := s.clock.Now()
	jj := cloneJob(j)
	at, step := now, in.Step
	jj.LastCheckpointAt, jj.CheckpointStep = &at, &step
	if err := s.commitLocked(c.Request().Context(), []*broker.Job{jj}, nil, nil); err != nil {
		return err
	}
	return c.JSON(http.StatusOK, api.CheckpointAnswer{Job: j.ID, Step: step, At: now})
}

// dataCollector exports the node caches, read from memory at scrape time
// (the jobs staging or waiting on data are stateCollector's, counted in
// its pass over the jobs).
type dataCollector struct{ s *Server }

var (
	descCacheHitRatio = prometheus.NewDesc("spillway_node_cache_hit_ratio", "Input-cache hits over lookups on each node since its agent started.", []string{"node"}, nil)
	descCacheBytes    = prometheus.NewDesc("spillway_node_cache_bytes", "Bytes held in each node's input cache.", []string{"node"}, nil)
	descCacheCap      = prometheus.NewDesc("spillway_node_cache_capacity_bytes", "Each node's input-cache size cap.", []string{"node"}, nil)
	descCacheEvicted  = prometheus.NewDesc("spillway_node_cache_evictions", "Objects evicted from each node's input cache since its agent started.", []string{"node"}, nil)
	descDataWait      = prometheus.NewDesc("spillway_jobs_waiting_on_data", "Running jobs whose GPUs wait on data (low compute while reading from storage), by queue.", []string{"queue"}, nil)
	descStaging       = prometheus.NewDesc("spillway_jobs_staging", "Jobs holding GPUs while their data is staged, by queue.", []string{"queue"}, nil)
)

func (c *dataCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descCacheHitRatio, descCacheBytes, descCacheCap, descCacheEvicted} {
		ch <- d
	}
}

func (c *dataCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.s
	s.lock()
	defer s.mu.Unlock()
	for n := range s.view.Nodes() {
		// A node whose agent has staged nothing yet reports an empty cache.
		c := broker.NodeCache{}
		if n.Cache != nil {
			c = *n.Cache
		}
		ch <- prometheus.MustNewConstMetric(descCacheHitRatio, prometheus.GaugeValue, c.HitRatio, n.Name)
		ch <- prometheus.MustNewConstMetric(descCacheBytes, prometheus.GaugeValue, float64(c.Bytes), n.Name)
		ch <- prometheus.MustNewConstMetric(descCacheCap, prometheus.GaugeValue, float64(c.CapBytes), n.Name)
		ch <- prometheus.MustNewConstMetric(descCacheEvicted, prometheus.GaugeValue, float64(c.Evictions), n.Name)
	}
}
