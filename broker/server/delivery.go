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
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/spillway-dev/spillway/broker/api"

	"github.com/labstack/echo/v4"
	"github.com/oklog/ulid/v2"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/spillway-dev/spillway/billing"
	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/config"
)

// Delivery is how well the cluster serves its users: how long jobs wait,
// how long they take, how many succeed, how often they are preempted and
// resume, who starves, and what a unit of output costs (how fast bursts
// arrive is spillway_burst_lead_time_seconds, metrics.go). This file holds its Prometheus series, the job-scoped units API
// and the delivery report.

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
			if entered, ok := enteredQueue(j.History[:i]); ok {
				d.wait.WithLabelValues(j.Spec.Queue, j.Spec.Priority).Observe(t.At.Sub(entered).Seconds())
			}
			if resumed(j.History[:i]) {
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

// enteredQueue is when the job last entered pending before the end of h.
func enteredQueue(h []broker.Transition) (time.Time, bool) {
	for i := len(h) - 1; i >= 0; i-- {
		if h[i].To == broker.StatePending {
			return h[i].At, true
		}
	}
	return time.Time{}, false
}

// resumed reports whether the attempt starting after h follows a
// preemption: the last attempt before it was preempted.
func resumed(h []broker.Transition) bool {
	for i := len(h) - 1; i >= 0; i-- {
		switch h[i].To {
		case broker.StatePreempted:
			return true
		case broker.StateStarting:
			return false
		}
	}
	return false
}

// observeCollector reports delivery and card gauges read from memory at
// scrape time.
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
	for _, d := range []*prometheus.Desc{descStarving, descOldest, descPending, descGPUUtil, descGPUMemUsed, descGPUMemCap} {
		ch <- d
	}
}

func (c *observeCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.s
	s.lock()
	defer s.mu.Unlock()
	now := s.clock.Now()
	bound := s.cfg().Reports.StarvationAfter.D()
	starving := map[string]int{}
	oldest := map[string]time.Duration{}
	type qr struct{ q, r string }
	pending := map[qr]int{}
	for _, q := range s.cfg().Queues {
		starving[q.Name] = 0
		oldest[q.Name] = 0
	}
	for id, j := range s.jobs {
		if j.State != broker.StatePending {
			continue
		}
		entered, ok := enteredQueue(j.History)
		if !ok {
			entered = j.SubmittedAt
		}
		w := now.Sub(entered)
		if w > bound {
			starving[j.Spec.Queue]++
		}
		oldest[j.Spec.Queue] = max(oldest[j.Spec.Queue], w)
		code := "unscheduled"
		if r, ok := s.reasons[id]; ok && r.Code() != "" {
			code = r.Code()
		}
		if r, ok := s.burst.reasons[id]; ok && r.Code != "" {
			code = r.Code // the burst controller's word comes first, as in the API
		}
		pending[qr{j.Spec.Queue, code}]++
	}
	for q, n := range starving {
		ch <- prometheus.MustNewConstMetric(descStarving, prometheus.GaugeValue, float64(n), q)
		ch <- prometheus.MustNewConstMetric(descOldest, prometheus.GaugeValue, oldest[q].Seconds(), q)
	}
	for k, n := range pending {
		ch <- prometheus.MustNewConstMetric(descPending, prometheus.GaugeValue, float64(n), k.q, k.r)
	}
	for _, n := range s.nodes {
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

// BucketUnits holds the units of output jobs reported: "t/<ulid>" → one
// UnitsReport (ULIDs sort by time, so a period is one range scan), and
// "id/<job>/<id>" → the key of a report sent with an idempotency id.
const BucketUnits broker.Bucket = "units"

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
			if prev, err := tx.Get(BucketUnits, idKey); err == nil {
				ans.Duplicate = true
				var old api.UnitsReport
				raw, err := tx.Get(BucketUnits, string(prev))
				if err != nil {
					return err
				}
				if err := json.Unmarshal(raw, &old); err != nil {
					return fmt.Errorf("decode units report: %w", err)
				}
				ans.UnitsReport = old
			} else if !errors.Is(err, broker.ErrNotFound) {
				return err
			} else if err := tx.Put(BucketUnits, idKey, []byte(key)); err != nil {
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
			if err := tx.Put(BucketUnits, key, raw); err != nil {
				return err
			}
			total += rep.Units
			if err := tx.Put(BucketUnits, unitsSumKey(j.ID, rep.Kind), []byte(fmt.Sprint(total))); err != nil {
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
	raw, err := tx.Get(BucketUnits, unitsSumKey(job, kind))
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

// ulidBound is the smallest ULID of an instant: a key bound for ranges of
// job ids and units reports.
func ulidBound(t time.Time) string {
	if t.Before(time.UnixMilli(0)) {
		return ""
	}
	var id ulid.ULID
	_ = id.SetTime(ulid.Timestamp(t))
	return id.String()
}

// --- the delivery report ----------------------------------------------------

func summarise(ds []time.Duration) api.Durations {
	if len(ds) == 0 {
		return api.Durations{}
	}
	slices.Sort(ds)
	var sum time.Duration
	for _, d := range ds {
		sum += d
	}
	rank := func(p float64) float64 {
		i := int(p*float64(len(ds))+0.999999) - 1 // nearest rank
		return ds[min(max(i, 0), len(ds)-1)].Seconds()
	}
	return api.Durations{Count: len(ds), Mean: (sum / time.Duration(len(ds))).Seconds(), P50: rank(0.5), P90: rank(0.9), P99: rank(0.99), Max: ds[len(ds)-1].Seconds()}
}

// deliveryReport serves GET /v1/reports/delivery.
func (s *Server) deliveryReport(c echo.Context) error {
	team, err := billingTeam(c)
	if err != nil {
		return err
	}
	period, err := s.billingPeriod(c)
	if err != nil {
		return err
	}
	rep, err := s.buildDelivery(c.Request().Context(), period, team)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, rep)
}

// buildDelivery reads the job records submitted from reports.lookback
// before the period to its end, and the units and ledger of the period.
func (s *Server) buildDelivery(ctx context.Context, p billing.Period, team string) (*api.DeliveryReport, error) {
	now := s.clock.Now()
	bound := s.cfg().Reports.StarvationAfter.D()
	rep := &api.DeliveryReport{Period: p, Team: team, StarvationAfter: broker.FormatDuration(bound), Rows: []api.DeliveryRow{}, Starving: []api.StarvingJob{}, Units: []api.UnitCost{}}
	rows := map[[2]string]*deliveryRow{}
	row := func(j *broker.Job) *deliveryRow {
		k := [2]string{j.Spec.Queue, j.Spec.Priority}
		r := rows[k]
		if r == nil {
			r = &deliveryRow{DeliveryRow: api.DeliveryRow{Queue: k[0], Priority: k[1]}}
			rows[k] = r
		}
		return r
	}
	in := p.Contains
	err := s.store.View(ctx, func(tx broker.Tx) error {
		return tx.Scan(broker.BucketJobs, ulidBound(p.From.Add(-s.cfg().Reports.Lookback.D())), ulidBound(p.To), func(_ string, raw []byte) error {
			var j broker.Job
			if err := json.Unmarshal(raw, &j); err != nil {
				return fmt.Errorf("decode job: %w", err)
			}
			if team != "" && j.Spec.Team != team {
				return nil
			}
			r := row(&j)
			var waitFrom time.Time
			waiting := false
			for i, t := range j.History {
				if waiting && t.To != broker.StatePending {
					// A wait ended (started, cancelled, …): did it starve in the period?
					if cross := waitFrom.Add(bound); t.At.After(cross) && in(cross) {
						r.Starved++
					}
					waiting = false
				}
				switch {
				case t.To == broker.StatePending:
					if !waiting {
						waitFrom, waiting = t.At, true
					}
				case t.To == broker.StateStarting && in(t.At):
					if w, ok := enteredQueue(j.History[:i]); ok {
						r.waits = append(r.waits, t.At.Sub(w))
					}
					if resumed(j.History[:i]) {
						r.Resumes++
					}
				case t.To == broker.StatePreempted && in(t.At):
					r.Preemptions++
				case t.To.Terminal() && in(t.At):
					r.completions = append(r.completions, t.At.Sub(j.SubmittedAt))
					switch t.To {
					case broker.StateSucceeded:
						r.Succeeded++
					case broker.StateFailed:
						r.Failed++
					case broker.StateTimedOut:
						r.TimedOut++
					case broker.StateCancelled:
						r.Cancelled++
					}
				}
			}
			if waiting {
				end := minT(now, p.To)
				if cross := waitFrom.Add(bound); end.After(cross) && in(cross) {
					r.Starved++
				}
			}
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("read jobs: %w", err)
	}
	var all, allDone []time.Duration
	for _, k := range sortedRowKeys(rows) {
		r := rows[k]
		if len(r.waits)+len(r.completions)+r.Preemptions+r.Starved == 0 {
			continue
		}
		finish(r)
		all = append(all, r.waits...)
		allDone = append(allDone, r.completions...)
		t := &rep.Total
		t.Succeeded += r.Succeeded
		t.Failed += r.Failed
		t.TimedOut += r.TimedOut
		t.Cancelled += r.Cancelled
		t.Preemptions += r.Preemptions
		t.Resumes += r.Resumes
		t.Starved += r.Starved
		rep.Rows = append(rep.Rows, r.DeliveryRow)
	}
	total := deliveryRow{DeliveryRow: rep.Total, waits: all, completions: allDone}
	finish(&total)
	rep.Total = total.DeliveryRow

	s.lock()
	for id, j := range s.jobs {
		if j.State != broker.StatePending || (team != "" && j.Spec.Team != team) {
			continue
		}
		since, ok := enteredQueue(j.History)
		if !ok || now.Sub(since) <= bound {
			continue
		}
		rep.Starving = append(rep.Starving, api.StarvingJob{ID: id, Team: j.Spec.Team, Queue: j.Spec.Queue, Priority: j.Spec.Priority,
			Since: since, Reason: s.reasons[id].Message()})
	}
	s.mu.Unlock()
	slices.SortFunc(rep.Starving, func(a, b api.StarvingJob) int { return a.Since.Compare(b.Since) })

	units, cur, err := s.unitCosts(ctx, p, team)
	if err != nil {
		return nil, err
	}
	rep.Units, rep.Currency = units, cur
	return rep, nil
}

// deliveryRow is a row of the delivery report while it is summed: the
// waits and completion times its summaries come from.
type deliveryRow struct {
	api.DeliveryRow
	waits, completions []time.Duration
}

func finish(r *deliveryRow) {
	r.Wait = summarise(r.waits)
	r.Completion = summarise(r.completions)
	if n := r.Succeeded + r.Failed + r.TimedOut; n > 0 {
		r.SuccessRate = float64(r.Succeeded) / float64(n)
	}
}

func sortedRowKeys(m map[[2]string]*deliveryRow) [][2]string {
	keys := make([][2]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, k int) bool {
		if keys[i][0] != keys[k][0] {
			return keys[i][0] < keys[k][0]
		}
		return keys[i][1] < keys[k][1]
	})
	return keys
}

// unitCosts sums the period's units by team and kind, and the ledger's
// GPU-time and cost of the jobs that reported them.
func (s *Server) unitCosts(ctx context.Context, p billing.Period, team string) ([]api.UnitCost, string, error) {
	type key struct{ team, kind string }
	sums := map[key]*api.UnitCost{}
	jobsOf := map[key]map[string]bool{}
	want := map[string]bool{}
	err := s.store.View(ctx, func(tx broker.Tx) error {
		return tx.Scan(BucketUnits, "t/"+ulidBound(p.From), "t/"+ulidBound(p.To), func(_ string, raw []byte) error {
			var u api.UnitsReport
			if err := json.Unmarshal(raw, &u); err != nil {
				return fmt.Errorf("decode units report: %w", err)
			}
			if (team != "" && u.Team != team) || !p.Contains(u.At) {
				return nil
			}
			k := key{u.Team, u.Kind}
			if sums[k] == nil {
				sums[k] = &api.UnitCost{Team: u.Team, Kind: u.Kind}
				jobsOf[k] = map[string]bool{}
			}
			sums[k].Units += u.Units
			jobsOf[k][u.Job] = true
			want[u.Job] = true
			return nil
		})
	})
	if err != nil || len(sums) == 0 {
		return []api.UnitCost{}, "", err
	}
	type spend struct {
		ms   int64
		cost billing.Amount
	}
	byJob := map[string]*spend{}
	cur := ""
	err = broker.Ledger{Store: s.store}.Scan(ctx, p.From, p.To, func(e billing.Entry) error {
		if !want[e.Job] {
			return nil
		}
		cur = e.Currency
		sp := byJob[e.Job]
		if sp == nil {
			sp = &spend{}
			byJob[e.Job] = sp
		}
		sp.ms += e.GPUMillis
		sp.cost += e.Cost
		return nil
	})
	if err != nil {
		return nil, "", fmt.Errorf("read ledger: %w", err)
	}
	out := make([]api.UnitCost, 0, len(sums))
	for k, uc := range sums {
		for job := range jobsOf[k] {
			uc.Jobs++
			if sp := byJob[job]; sp != nil {
				uc.GPUMillis += sp.ms
				uc.Cost += sp.cost
			}
		}
		uc.CostPer1000 = uc.Cost.MulDiv(1000, uc.Units)
		uc.GPUSecondsPer1000 = float64(uc.GPUMillis) / float64(uc.Units)
		out = append(out, *uc)
	}
	slices.SortFunc(out, func(a, b api.UnitCost) int {
		if c := strings.Compare(a.Team, b.Team); c != 0 {
			return c
		}
		return strings.Compare(a.Kind, b.Kind)
	})
	return out, cur, nil
}
