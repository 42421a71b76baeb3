package server

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/report"
	"github.com/spillway-dev/spillway/onprem/agentapi"
)

// metrics are the broker's Prometheus series; docs/metrics.md lists them.
type metrics struct {
	requests     *prometheus.CounterVec
	latency      *prometheus.HistogramVec
	submitted    *prometheus.CounterVec
	transitions  *prometheus.CounterVec
	cycleSeconds prometheus.Histogram
	// storeCommit is each store write (storeslow.go).
	storeCommit  *prometheus.HistogramVec
	idle         *prometheus.CounterVec
	exports      *prometheus.CounterVec
	burstLead    *prometheus.HistogramVec
	budgetUsed   *prometheus.GaugeVec
	budgetAlerts *prometheus.CounterVec
	// limited counts requests refused by a team limit (limits.go).
	limited *prometheus.CounterVec
	// delivery are the delivery series and gauges (delivery.go).
	delivery *deliveryMetrics
}

func newMetrics(reg *prometheus.Registry, s *Server) *metrics {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "spillway_http_requests_total", Help: "API requests by method, route and status code.",
		}, []string{"method", "route", "code"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "spillway_http_request_duration_seconds", Help: "API request latency.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 5},
		}, []string{"method", "route"}),
		submitted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "spillway_jobs_submitted_total", Help: "Jobs accepted, by queue.",
		}, []string{"queue"}),
		transitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "spillway_job_transitions_total", Help: "Job state transitions, by the state entered.",
		}, []string{"state"}),
		cycleSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "spillway_scheduler_cycle_duration_seconds", Help: "Time the scheduler core took per cycle.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16),
		}),
	}
	m.idle = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "spillway_jobs_idle_total", Help: "Jobs found holding GPUs under the idle threshold for the idle window, by queue.",
	}, []string{"queue"})
	m.exports = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "spillway_billing_export_runs_total", Help: "Scheduled billing export runs, by export and outcome (ok, failed, waiting).",
	}, []string{"export", "state"})
	m.burstLead = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "spillway_burst_lead_time_seconds", Help: "Time from a burst decision to the machine's agent registered, by provider.",
		Buckets: []float64{10, 30, 60, 120, 180, 300, 600, 900, 1500, 3600},
	}, []string{"provider"})
	m.budgetUsed = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "spillway_burst_budget_used_ratio", Help: "Committed (spent + reserved) burst money over the month's budget, by scope.",
	}, []string{"scope"})
	m.budgetAlerts = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "spillway_burst_budget_alerts_total", Help: "Budget alerts raised, by scope and level (80, 100).",
	}, []string{"scope", "level"})
	m.storeCommit = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "spillway_store_commit_duration_seconds", Help: "Store writes, by kind: state (job and node changes, under the broker's lock), submit, or other.",
		Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
	}, []string{"kind"})
	m.limited = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "spillway_requests_limited_total", Help: "Requests refused with 429 by a team limit, by limit (submit_rate, pending_cap).",
	}, []string{"limit"})
	reg.MustRegister(m.limited, m.storeCommit)
	if gc, ok := s.backend.(broker.GroupCommitter); ok {
		registerGroupCommits(reg, gc)
	}
	reg.MustRegister(m.budgetUsed, m.budgetAlerts, m.burstLead, m.exports, m.idle, m.requests, m.latency, m.submitted, m.transitions, m.cycleSeconds,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		&stateCollector{s: s})
	m.delivery = newDeliveryMetrics(reg, s)
	return m
}

// registerGroupCommits exports the store's group commits: calls over
// commits is how many submits (and state changes) share each fsync, and
// a busy rate near 1 means the store's one writer never rests, so writes
// wait on the disk or on Redis rather than on the broker.
func registerGroupCommits(reg *prometheus.Registry, gc broker.GroupCommitter) {
	reg.MustRegister(
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "spillway_store_group_commits_total", Help: "Transactions the store committed for grouped writes (submits and state changes).",
		}, func() float64 { return float64(gc.GroupCommits().Commits) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "spillway_store_group_commit_calls_total", Help: "Grouped writes those transactions carried; over spillway_store_group_commits_total, the writes per commit.",
		}, func() float64 { return float64(gc.GroupCommits().Calls) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "spillway_store_writer_busy_seconds_total", Help: "Time the store's writer spent committing grouped writes; a rate near 1 means it never rests (the disk or Redis is the limit).",
		}, func() float64 { return gc.GroupCommits().Busy.Seconds() }),
	)
}

// observeTransition counts the states a change entered.
func (m *metrics) observeTransition(old, j *broker.Job) {
	from := 0
	if old != nil {
		from = len(old.History)
	}
	for _, t := range j.History[min(from, len(j.History)):] {
		m.transitions.WithLabelValues(string(t.To)).Inc()
	}
	m.delivery.observe(old, j)
}

// stateCollector reports gauges read from the broker's memory at scrape
// time. Every gauge of jobs is counted here, in one pass over the view
// under the lock: at 100,000 jobs each pass reads every record.
type stateCollector struct{ s *Server }

var (
	descJobs  = prometheus.NewDesc("spillway_jobs", "Non-terminal jobs by state and queue.", []string{"state", "queue"}, nil)
	descGPUs  = prometheus.NewDesc("spillway_gpus", "GPUs by node pool and state (free, allocated, unhealthy, unavailable).", []string{"pool", "state"}, nil)
	descNodes = prometheus.NewDesc("spillway_nodes", "Nodes by state.", []string{"state"}, nil)
)

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descJobs, descGPUs, descNodes, descStarving, descOldest, descPending, descDataWait, descStaging} {
		ch <- d
	}
}

// queueGauges is what the scrape reports of one queue's jobs.
type queueGauges struct {
	starving          int
	oldest            time.Duration
	pending           map[string]int // by reason code
	dataWait, staging int
}

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.s
	s.lock()
	defer s.mu.Unlock()
	type key struct{ a, b string }
	jobs := map[key]int{}
	queues := map[string]*queueGauges{}
	for _, q := range s.cfg().Queues {
		queues[q.Name] = &queueGauges{pending: map[string]int{}}
	}
	now := s.clock.Now()
	bound := s.cfg().Reports.StarvationAfter.D()
	// Jobs come in runs that share a state and queue (an array's
	// elements), and their strings are interned: comparing with the
	// previous job's is cheaper than hashing each job's.
	var run key
	var runLen int
	var q *queueGauges
	for j, h := range s.view.JobHandles() {
		k := key{string(j.State), j.Spec.Queue}
		if k != run {
			if runLen > 0 {
				jobs[run] += runLen
			}
			run, runLen = k, 0
			if q = queues[k.b]; q == nil {
				q = &queueGauges{pending: map[string]int{}}
				queues[k.b] = q
			}
		}
		runLen++
		switch {
		case j.State == broker.StatePending:
			entered, ok := report.EnteredQueue(j.History)
			if !ok {
				entered = j.SubmittedAt
			}
			w := now.Sub(entered)
			if w > bound {
				q.starving++
			}
			q.oldest = max(q.oldest, w)
			r, ok := s.view.ReasonAt(h)
			code := s.waitingCodeOfLocked(j, r.Code(), ok) // as the API shows it
			if code == "" {
				code = "unscheduled"
			}
			q.pending[code]++
		case j.State.Holding():
			if j.DataWait != nil && j.DataWait.Active {
				q.dataWait++
			}
			if d := j.Data; d != nil && d.Attempt == j.Attempt && d.Phase != agentapi.PhaseRunning && d.Phase != agentapi.PhaseDone {
				q.staging++
			}
		}
	}
	if runLen > 0 {
		jobs[run] += runLen
	}
	for k, v := range jobs {
		ch <- prometheus.MustNewConstMetric(descJobs, prometheus.GaugeValue, float64(v), k.a, k.b)
	}
	for name, q := range queues {
		ch <- prometheus.MustNewConstMetric(descStarving, prometheus.GaugeValue, float64(q.starving), name)
		ch <- prometheus.MustNewConstMetric(descOldest, prometheus.GaugeValue, q.oldest.Seconds(), name)
		for code, n := range q.pending {
			ch <- prometheus.MustNewConstMetric(descPending, prometheus.GaugeValue, float64(n), name, code)
		}
		ch <- prometheus.MustNewConstMetric(descDataWait, prometheus.GaugeValue, float64(q.dataWait), name)
		ch <- prometheus.MustNewConstMetric(descStaging, prometheus.GaugeValue, float64(q.staging), name)
	}
	gpus := map[key]int{}
	nodes := map[string]int{}
	for _, v := range s.nodeViewsLocked() {
		nodes[string(v.State)]++
		for _, cv := range v.Cards {
			st := "free"
			switch {
			case cv.Unhealthy != "":
				st = "unhealthy"
			case len(cv.Jobs) > 0:
				st = "allocated"
			case v.State != broker.NodeReady:
				st = "unavailable"
			}
			gpus[key{v.Pool, st}]++
		}
	}
	for k, v := range gpus {
		ch <- prometheus.MustNewConstMetric(descGPUs, prometheus.GaugeValue, float64(v), k.a, k.b)
	}
	for k, v := range nodes {
		ch <- prometheus.MustNewConstMetric(descNodes, prometheus.GaugeValue, float64(v), k)
	}
}
