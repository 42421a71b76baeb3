package server

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"sync"

	"github.com/spillway-dev/spillway/broker/api"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/config"
	"github.com/spillway-dev/spillway/broker/report"
)

// Delivery is how well the cluster serves its users: how long jobs wait,
// how long they take, how many succeed, how often they are preempted and
// resume, who starves, and what a unit of output costs (how fast bursts
// arrive is spillway_burst_lead_time_seconds, metrics.go). This file holds its Prometheus series and the job-scoped units API;
// the delivery report is broker/report's.

// waitBuckets span a second to a week.
var waitBuckets = []float64{1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 14400, 28800, 86400, 259200, 604800}

// deliveryMetrics are the delivery series (docs/metrics.md).
type deliveryMetrics struct {
	wait        *prometheus.HistogramVec
	duration    *prometheus.HistogramVec
	completed   *prometheus.CounterVec
	preemptions *prometheus.CounterVec
	resumes     *prometheus.CounterVec
	units       *prometheus.CounterVec
}

func newDeliveryMetrics(reg prometheus.Registerer, s *Server) *deliveryMetrics {
	d := &deliveryMetrics{
		wait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "spillway_job_wait_seconds", Help: "Time a job waited in the queue before it was scheduled (from submit, or from its return to the queue), by queue and priority.",
			Buckets: waitBuckets,
		}, []string{"queue", "priority"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "spillway_job_completion_seconds", Help: "Time from submit to a terminal state, by queue and the state reached.",
			Buckets: waitBuckets,
		}, []string{"queue", "state"}),
		completed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "spillway_jobs_completed_total", Help: "Jobs that reached a terminal state, by queue and state (succeeded, failed, cancelled, timed_out).",
		}, []string{"queue", "state"}),
		preemptions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "spillway_job_preemptions_total", Help: "Attempts stopped by preemption, by queue.",
		}, []string{"queue"}),
		resumes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "spillway_job_resumes_total", Help: "Attempts started after a preemption (resuming from a checkpoint), by queue.",
		}, []string{"queue"}),
		units: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "spillway_job_units_total", Help: "Units of output jobs reported (requests, tokens, samples …), by team and kind.",
		}, []string{"team", "kind"}),
	}
	reg.MustRegister(d.wait, d.duration, d.completed, d.preemptions, d.resumes, d.units, &observeCollector{s: s}, &dataCollector{s: s})
	return d
}

// observe counts the delivery events among the transitions a change added.
func (d *deliveryMetrics) observe(old, j *broker.Job) {
	from := 0
	if old != nil {
		from = len(old.History)
	}
	for i := min(from, len(j.History)); i < len(j.History); i++ {
		t := j.History[i]
		switch {
		case t.To == broker.StateStarting:
			if entered, ok := report.EnteredQueue(j.History[:i]); ok {
				d.wait.WithLabelValues(j.Spec.Queue, j.Spec.Priority).Observe(t.At.Sub(entered).Seconds())
			}
			if report.Resumed(j.History[:i]) {
				d.resumes.WithLabelValues(j.Spec.Queue).Inc()
			}
		case t.To == broker.StatePreempted:
			d.preemptions.WithLabelValues(j.Spec.Queue).Inc()
		case t.To.Terminal():
			d.completed.WithLabelValues(j.Spec.Queue, string(t.To)).Inc()
			d.duration.WithLabelValues(j.Spec.Queue, string(t.To)).Observe(t.At.Sub(j.SubmittedAt).Seconds())
		}
	}
}

// observeCollector reports card gauges read from memory at scrape time
// (the queues' delivery gauges are stateCollector's, counted in its pass
// over the jobs).
type observeCollector struct{ s *Server }

var (
	descStarving   = prometheus.NewDesc("spillway_jobs_starving", "Pending jobs that have waited longer than reports.starvationAfter, by queue.", []string{"queue"}, nil)
	descOldest     = prometheus.NewDesc("spillway_queue_oldest_wait_seconds", "How long the longest-waiting pending job of a queue has waited.", []string{"queue"}, nil)
	descPending    = prometheus.NewDesc("spillway_pending_jobs", "Pending jobs by queue and pending reason code.", []string{"queue", "reason"}, nil)
	descGPUUtil    = prometheus.NewDesc("spillway_gpu_utilization_ratio", "Latest compute (SM) utilisation of each card, 0 to 1.", []string{"node", "gpu", "model"}, nil)
	descGPUMemUsed = prometheus.NewDesc("spillway_gpu_memory_used_bytes", "Latest GPU memory in use on each card.", []string{"node", "gpu"}, nil)
	descGPUMemCap  = prometheus.NewDesc("spillway_gpu_memory_capacity_bytes", "GPU memory of each card.", []string{"node", "gpu"}, nil)
)

func (c *observeCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descGPUUtil, descGPUMemUsed, descGPUMemCap} {
		ch <- d
	}
}

func (c *observeCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.s
	s.lock()
	defer s.mu.Unlock()
	for n := range s.view.Nodes() {
		sample := s.telemetry[n.Name]
		for _, d := range n.Inventory.Devices {
			idx := fmt.Sprint(d.Index)
			ch <- prometheus.MustNewConstMetric(descGPUMemCap, prometheus.GaugeValue, float64(d.MemoryBytes), n.Name, idx)
			if sample == nil {
				continue
			}
			for _, ds := range sample.Devices {
				if ds.Index == d.Index {
					ch <- prometheus.MustNewConstMetric(descGPUUtil, prometheus.GaugeValue, float64(ds.SMUtil)/100, n.Name, idx, shortModel(d.Model))
					ch <- prometheus.MustNewConstMetric(descGPUMemUsed, prometheus.GaugeValue, float64(ds.MemoryUsedBytes), n.Name, idx)
				}
			}
		}
	}
}

func shortModel(m string) string { return strings.TrimPrefix(m, "NVIDIA ") }

// --- units of output -------------------------------------------------------

var (
	unitKindRe = regexp.MustCompile(`^[a-z][a-z0-9_-]{0,31}$`)
	unitIDRe   = regexp.MustCompile(`^[A-Za-z0-9._:-]{1,64}$`)
)

// maxUnits bounds one report.
const maxUnits = 1_000_000_000_000_000

// Job tokens: every attempt gets SPILLWAY_JOB_TOKEN in its environment,
// which may do one thing: report units for its own job. It is
// "spwj.<job>.<mac>", the MAC an HMAC-SHA256 of the job id under a key
// kept in the store (so every broker of an HA group knows it).
const (
	jobTokenPrefix = "spwj."
	metaJobKey     = "observe/job-token-key"
	roleJob        = "job"
)

// observeState is the server's observability bookkeeping.
type observeState struct {
	mu     sync.Mutex
	jobKey []byte
	// unitLabels caps the (team, kind) series of the units counter.
	unitLabels *labelCap
}

// jobKey returns the job-token key, creating it on first use.
func (s *Server) jobTokenKey(ctx context.Context) ([]byte, error) {
	s.observability.mu.Lock()
	defer s.observability.mu.Unlock()
	if s.observability.jobKey != nil {
		return s.observability.jobKey, nil
	}
	var key []byte
	err := s.store.Update(ctx, func(tx broker.Tx) error {
		raw, err := tx.Get(broker.BucketMeta, metaJobKey)
		if err == nil {
			key = slices.Clone(raw)
			return nil
		}
		if !errors.Is(err, broker.ErrNotFound) {
			return err
		}
		key = make([]byte, 32)
		if _, err := rand.Read(key); err != nil {
			return err
		}
		return tx.Put(broker.BucketMeta, metaJobKey, key)
	})
	if err != nil {
		return nil, fmt.Errorf("load job token key: %w", err)
	}
	s.observability.jobKey = key
	return key, nil
}

func jobTokenFor(key []byte, job string) string {
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte("units:" + job))
	return jobTokenPrefix + job + "." + base64.RawURLEncoding.EncodeToString(mac.Sum(nil)[:24])
}

// addJobEnv gives an attempt what it needs to report units: the broker's
// URL and its job token. It runs under s.mu, so it never reads the store:
// the key is the one loadJobTokenKey read before the lock. Without a key
// (the store was unreachable) the job simply gets none.
func (s *Server) addJobEnv(j *broker.Job, env map[string]string) {
	s.observability.mu.Lock()
	key := s.observability.jobKey
	s.observability.mu.Unlock()
	if key == nil {
		s.log.Warn("job gets no job token: the job-token key could not be read from the store", "job", j.ID)
		return
	}
	env["SPILLWAY_JOB_TOKEN"] = jobTokenFor(key, j.ID)
	env["SPILLWAY_SERVER"] = s.cfg().AdvertiseURL
}

// unitsAuth admits a job token for its own job, or else a person's token
// (user of the job's team, or operator).
func (s *Server) unitsAuth(next echo.HandlerFunc) echo.HandlerFunc {
	people := s.authenticate(allow(config.RoleUser, config.RoleOperator)(next))
	return func(c echo.Context) error {
		secret, _ := strings.CutPrefix(c.Request().Header.Get("Authorization"), "Bearer ")
		if !strings.HasPrefix(secret, jobTokenPrefix) {
			return people(c)
		}
		key, err := s.jobTokenKey(c.Request().Context())
		if err != nil {
			return err
		}
		if !hmac.Equal([]byte(secret), []byte(jobTokenFor(key, c.Param("id")))) {
			return errUnauthorized
		}
		c.Set(principalKey, api.Principal{Name: "job:" + c.Param("id"), Role: roleJob})
		return next(c)
	}
}

func unitsSumKey(job, kind string) string { return "sum/" + job + "/" + kind }

// reportUnits serves POST /v1/jobs/{id}/units.
func (s *Server) reportUnits(c echo.Context) error {
	var req api.UnitsRequest
	if err := decodeBody(c, 4<<10, &req); err != nil {
		return err
	}
	if req.Kind == "" {
		req.Kind = "units"
	}
	switch {
	case req.Units < 1 || req.Units > maxUnits:
		return errBadRequest("units", broker.CodeOutOfRange, "must be between 1 and %d", int64(maxUnits))
	case !unitKindRe.MatchString(req.Kind):
		return errBadRequest("kind", broker.CodeInvalid, "must be 1-32 lower-case letters, digits, '_' or '-', starting with a letter (e.g. tokens)")
	case req.ID != "" && !unitIDRe.MatchString(req.ID):
		return errBadRequest("id", broker.CodeInvalid, "must be 1-64 letters, digits, '.', '_', ':' or '-'")
	}
	var j *broker.Job
	var err error
	if principal(c).Role == roleJob {
		err = s.store.View(c.Request().Context(), func(tx broker.Tx) error {
			j, err = broker.GetJob(tx, c.Param("id"))
			return err
		})
		if errors.Is(err, broker.ErrNotFound) {
			return newError(http.StatusNotFound, "not_found", "job %s not found", clip(c.Param("id")))
		}
		if err == nil && j.State.Terminal() {
			// A job token lives as long as its job.
			return newError(http.StatusUnauthorized, "unauthorized", "job %s has ended; its job token is no longer valid", j.ID)
		}
	} else {
		j, err = s.loadVisibleJob(c)
	}
	if err != nil {
		return err
	}
	now := s.clock.Now()
	rep := api.UnitsReport{Job: j.ID, Team: j.Spec.Team, Project: j.Spec.Project, Queue: j.Spec.Queue, Kind: req.Kind,
		Units: req.Units, At: now, By: principal(c).Name, ID: req.ID}
	key := "t/" + s.ids.next(now)
	ans := api.UnitsAnswer{UnitsReport: rep}
	err = s.store.Update(c.Request().Context(), func(tx broker.Tx) error {
		ans = api.UnitsAnswer{UnitsReport: rep}
		if req.ID != "" {
			idKey := "id/" + j.ID + "/" + req.ID
			if prev, err := tx.Get(report.BucketUnits, idKey); err == nil {
				ans.Duplicate = true
				var old api.UnitsReport
				raw, err := tx.Get(report.BucketUnits, string(prev))
				if err != nil {
					return err
				}
				if err := json.Unmarshal(raw, &old); err != nil {
					return fmt.Errorf("decode units report: %w", err)
				}
				ans.UnitsReport = old
			} else if !errors.Is(err, broker.ErrNotFound) {
				return err
			} else if err := tx.Put(report.BucketUnits, idKey, []byte(key)); err != nil {
				return err
			}
		}
		total, err := unitsTotal(tx, j.ID, ans.Kind)
		if err != nil {
			return err
		}
		if !ans.Duplicate && total > math.MaxInt64-rep.Units {
			return errBadRequest("units", broker.CodeOutOfRange, "the job's %s total %d cannot grow by %d (it would pass %d)",
				rep.Kind, total, rep.Units, int64(math.MaxInt64))
		}
		if !ans.Duplicate {
			raw, err := json.Marshal(rep)
			if err != nil {
				return err
			}
			if err := tx.Put(report.BucketUnits, key, raw); err != nil {
				return err
			}
			total += rep.Units
			if err := tx.Put(report.BucketUnits, unitsSumKey(j.ID, rep.Kind), []byte(fmt.Sprint(total))); err != nil {
				return err
			}
		}
		ans.Total = total
		return nil
	})
	var he *apiError
	if errors.As(err, &he) {
		return err
	}
	if err != nil {
		return fmt.Errorf("store units: %w", err)
	}
	if ans.Duplicate {
		return c.JSON(http.StatusOK, ans)
	}
	s.observability.mu.Lock()
	if s.observability.unitLabels == nil {
		s.observability.unitLabels = newLabelCap(maxLabelSets)
	}
	lc := s.observability.unitLabels
	s.observability.mu.Unlock()
	s.metrics.delivery.units.WithLabelValues(lc.admit(rep.Team, rep.Kind)...).Add(float64(rep.Units))
	return c.JSON(http.StatusCreated, ans)
}

func unitsTotal(tx broker.Tx, job, kind string) (int64, error) {
	raw, err := tx.Get(report.BucketUnits, unitsSumKey(job, kind))
	if errors.Is(err, broker.ErrNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	var n int64
	_, err = fmt.Sscan(string(raw), &n)
	return n, err
}
