package sim

import (
	"math"
	"slices"
	"time"

	"github.com/spillway-dev/spillway/billing"
	"github.com/spillway-dev/spillway/broker"
)

// Stats summarises durations, in seconds.
type Stats struct {
	Count int     `json:"count"`
	Mean  float64 `json:"mean_s"`
	P50   float64 `json:"p50_s"`
	P95   float64 `json:"p95_s"`
	P99   float64 `json:"p99_s"`
	Max   float64 `json:"max_s"`
}

// statsOf summarises xs (seconds); percentiles are nearest-rank. xs is
// sorted in place.
func statsOf(xs []float64) Stats {
	s := Stats{Count: len(xs)}
	if len(xs) == 0 {
		return s
	}
	slices.Sort(xs)
	sum := 0.0
	for _, x := range xs {
		sum += x
	}
	rank := func(p float64) float64 {
		i := int(math.Ceil(p*float64(len(xs)))) - 1
		return xs[min(max(i, 0), len(xs)-1)]
	}
	s.Mean, s.P50, s.P95, s.P99, s.Max = sum/float64(len(xs)), rank(0.50), rank(0.95), rank(0.99), xs[len(xs)-1]
	return s
}

// BudgetMonth is one scope's burst spend in one month against its limit.
type BudgetMonth struct {
	Month  string         `json:"month"`
	Scope  string         `json:"scope"`
	Limit  billing.Amount `json:"limit"`
	Spent  billing.Amount `json:"spent"`
	Within bool           `json:"within"`
}

// Result is what one policy did with one trace.
type Result struct {
	Policy string `json:"policy"`
	// WaitPerGPUHour is the burst policy's burst.waitPerGPUHour, when set
	// (costWait=β policies calibrate it on the trace).
	WaitPerGPUHour time.Duration `json:"waitPerGPUHour,omitempty"`
	// Jobs in the trace; Succeeded ran to the end, TimedOut were stopped
	// at their timeout, NeverStarted were still waiting when no event was
	// left (no node and no offer could ever hold them).
	Jobs         int `json:"jobs"`
	Succeeded    int `json:"succeeded"`
	TimedOut     int `json:"timedOut"`
	NeverStarted int `json:"neverStarted"`
	// Wait is from submit to the first start; JCT from submit to the end.
	Wait           Stats            `json:"wait"`
	WaitByPriority map[string]Stats `json:"waitByPriority"`
	WaitByQueue    map[string]Stats `json:"waitByQueue"`
	// WaitMultiNode is Wait over the MultiNodeJobs larger than one node
	// (gangs), reported apart: their waits differ in kind.
	WaitMultiNode Stats `json:"waitMultiNode"`
	MultiNodeJobs int   `json:"multiNodeJobs"`
	JCT           Stats `json:"jct"`
	// OnPremAllocation is the mean share of on-prem GPUs held by jobs
	// between the first and the last arrival.
	OnPremAllocation float64 `json:"onPremAllocation"`
	// BurstGPUHours is the GPU-time of burst machines from launch to end:
	// UsageGPUHours held by jobs plus OverheadGPUHours (BootGPUHours from
	// launch to ready, IdleGPUHours the rest).
	BurstGPUHours    float64 `json:"burstGPUHours"`
	UsageGPUHours    float64 `json:"usageGPUHours"`
	OverheadGPUHours float64 `json:"overheadGPUHours"`
	BootGPUHours     float64 `json:"bootGPUHours"`
	IdleGPUHours     float64 `json:"idleGPUHours"`
	// FluidBoundGPUHours is ∫ max(0, demand − on-prem GPUs) dt with
	// demand taken without queueing (see FluidBound); BurstOverFluid is
	// BurstGPUHours over it.
	FluidBoundGPUHours float64 `json:"fluidBoundGPUHours"`
	BurstOverFluid     float64 `json:"burstOverFluid"`
	// OwnedIdleWhileRenting is the GPU-hours of owned GPUs left idle at
	// moments when burst machines ran jobs those GPUs could hold (the
	// jobs, largest first, each on the fullest owned node it fits);
	// OwnedIdleShare is it over BurstGPUHours.
	OwnedIdleWhileRenting float64 `json:"ownedIdleWhileRentingGPUHours"`
	OwnedIdleShare        float64 `json:"ownedIdleShare"`
	// SpillBacks are the jobs moved from burst machines home.
	SpillBacks int `json:"spillBacks"`
	// SpillBackRefusals counts, by spill-back's rule (burst.Stay*), the
	// machines a decision kept while owned GPUs stood idle that could
	// hold jobs running on burst machines: one per machine per decision.
	SpillBackRefusals map[string]int `json:"spillBackRefusals,omitempty"`
	// Reclaims are the spot machines the providers took back (drawn from
	// the offers' reclaimsPerHour); ReclaimedAttempts the attempts they
	// ended, each requeued to resume from its last checkpoint; and
	// ReclaimLostGPUHours the work those attempts lost (from their last
	// committed checkpoint to their end).
	Reclaims            int     `json:"reclaims,omitempty"`
	ReclaimedAttempts   int     `json:"reclaimedAttempts,omitempty"`
	ReclaimLostGPUHours float64 `json:"reclaimLostGPUHours,omitempty"`
	// BurstCost is UsageCost + OverheadCost, priced by billing.Meter.
	BurstCost    billing.Amount `json:"burstCost"`
	UsageCost    billing.Amount `json:"usageCost"`
	OverheadCost billing.Amount `json:"overheadCost"`
	Currency     string         `json:"currency"`
	// Machines launched and ended; LaunchAttempts are launch decisions,
	// LaunchFailures those for which every offer failed, CapacityErrors
	// the create calls that failed for capacity.
	Machines       int `json:"machines"`
	LaunchAttempts int `json:"launchAttempts"`
	LaunchFailures int `json:"launchFailures"`
	CapacityErrors int `json:"capacityErrors"`
	// JobsOnBurst ran at least one attempt on a burst machine.
	JobsOnBurst int `json:"jobsOnBurst"`
	// Preemptions are stops for preemption (by the scheduler, or by the
	// burst controller draining a machine); Resumptions are starts after
	// one.
	Preemptions int `json:"preemptions"`
	Resumptions int `json:"resumptions"`
	// Budgets is each month's spend per budget scope; BudgetBlockedJobs
	// were held back by a budget at least once.
	Budgets           []BudgetMonth `json:"budgets,omitempty"`
	BudgetBlockedJobs int           `json:"budgetBlockedJobs"`
	// Cycles run, how many of them called the scheduler core (the others
	// had nothing waiting), and burst decisions.
	Cycles          int `json:"cycles"`
	SchedulerCycles int `json:"schedulerCycles"`
	BurstDecisions  int `json:"burstDecisions"`
	// Starts in order, when Options.RecordStarts is set.
	Starts []Start `json:"starts,omitempty"`
	// MachineRecords are the burst machines' records as the controller
	// left them (ended), in launch order, when Options.RecordMachines is
	// set (in the order they ended): offer, jobs bound, each transition
	// with its time.
	MachineRecords []*broker.InstanceRecord `json:"machineRecords,omitempty"`
	// OwnedCost is the on-prem GPU-time priced at the broker section's
	// on-prem rates (billing.onprem.rates) by billing.Meter, as the
	// broker's ledger prices it, when Options.MeterOwned is set.
	OwnedCost billing.Amount `json:"ownedCost,omitempty"`
	// Series are hourly means for the chart.
	Series Series `json:"-"`

	usageMillis, overheadMillis, bootMillis int64
	meterProblems                           int
	spent                                   map[time.Time]map[string]billing.Amount
}

func (r *Result) spend(month time.Time, team string, a billing.Amount) {
	if r.spent == nil {
		r.spent = map[time.Time]map[string]billing.Amount{}
	}
	m := r.spent[month]
	if m == nil {
		m = map[string]billing.Amount{}
		r.spent[month] = m
	}
	m[team] += a
	m[broker.GlobalScope] += a
}

// Series are hourly means from the trace's first arrival.
type Series struct {
	Start time.Time `json:"start"`
	// OnPremBusy is GPUs held on-prem, BurstGPUs the GPUs of burst
	// machines alive (booting, busy or idle), Queue the pending jobs.
	OnPremBusy []float64 `json:"onPremBusy"`
	BurstGPUs  []float64 `json:"burstGPUs"`
	Queue      []float64 `json:"queue"`
}

// recorder integrates the cluster's state over time.
type recorder struct {
	start, last      time.Time
	windowEnd        time.Time
	onPrem, burstGPU float64
	queue            float64
	ownedIdle        float64 // e.ownedIdleForBurst() at the last sample
	heldArea         float64 // ∫ on-prem held dt within the window, GPU-seconds
	ownedIdleArea    float64 // ∫ ownedIdle dt, GPU-seconds
	series           Series
}

func (r *recorder) init(start, windowEnd time.Time) {
	r.start, r.last, r.windowEnd = start, start, windowEnd
	r.series.Start = start
}

// sample closes the interval since the last sample with the values it
// held, then takes the engine's current values.
func (r *recorder) sample(e *engine) {
	r.advance(e.now)
	r.onPrem = float64(e.onPremHeld)
	g := 0
	for _, m := range e.alive {
		if m.rec.State != broker.MachineRequested {
			g += m.rec.Offer.GPUs
		}
	}
	r.burstGPU = float64(g)
	r.queue = float64(e.pending)
	r.ownedIdle = float64(e.ownedIdleForBurst())
}

func (r *recorder) advance(now time.Time) {
	if !now.After(r.last) {
		return
	}
	r.ownedIdleArea += r.ownedIdle * now.Sub(r.last).Seconds()
	if end := minTime(now, r.windowEnd); end.After(r.last) {
		r.heldArea += r.onPrem * end.Sub(r.last).Seconds()
	}
	// Spread the interval over the hourly buckets it covers.
	for t := r.last; t.Before(now); {
		h := int(t.Sub(r.start) / time.Hour)
		next := minTime(r.start.Add(time.Duration(h+1)*time.Hour), now)
		w := next.Sub(t).Seconds() / 3600
		for len(r.series.OnPremBusy) <= h {
			r.series.OnPremBusy = append(r.series.OnPremBusy, 0)
			r.series.BurstGPUs = append(r.series.BurstGPUs, 0)
			r.series.Queue = append(r.series.Queue, 0)
		}
		r.series.OnPremBusy[h] += r.onPrem * w
		r.series.BurstGPUs[h] += r.burstGPU * w
		r.series.Queue[h] += r.queue * w
		t = next
	}
	r.last = now
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// finish computes the result from the replay's end state.
func (e *engine) finish() *Result {
	r := e.res
	last := e.jobs[len(e.jobs)-1].t.Submit
	e.rec.advance(e.now)
	r.Series = e.rec.series
	span := last.Sub(e.jobs[0].t.Submit).Seconds()
	if span > 0 && e.onPremGPUs > 0 {
		r.OnPremAllocation = e.rec.heldArea / (float64(e.onPremGPUs) * span)
	}
	r.Jobs = len(e.jobs)
	r.Currency = e.c.Currency
	var waits, jcts, multi []float64
	byPrio, byQueue := map[string][]float64{}, map[string][]float64{}
	for _, sj := range e.jobs {
		switch {
		case sj.j == nil || sj.firstStart.IsZero():
			r.NeverStarted++
			continue
		case sj.j.State == broker.StateSucceeded:
			r.Succeeded++
		case sj.j.State == broker.StateTimedOut:
			r.TimedOut++
		}
		w := sj.firstStart.Sub(sj.j.SubmittedAt).Seconds()
		waits = append(waits, w)
		byPrio[sj.t.Priority] = append(byPrio[sj.t.Priority], w)
		byQueue[sj.t.Queue] = append(byQueue[sj.t.Queue], w)
		if sj.j.Spec.Resources.Nodes > 1 {
			multi = append(multi, w)
		}
		if sj.j.EndedAt != nil {
			jcts = append(jcts, sj.j.EndedAt.Sub(sj.j.SubmittedAt).Seconds())
		}
		if sj.burstStarts > 0 {
			r.JobsOnBurst++
		}
	}
	r.Wait, r.JCT = statsOf(waits), statsOf(jcts)
	r.WaitMultiNode, r.MultiNodeJobs = statsOf(multi), len(multi)
	r.WaitByPriority, r.WaitByQueue = map[string]Stats{}, map[string]Stats{}
	for k, v := range byPrio {
		r.WaitByPriority[k] = statsOf(v)
	}
	for k, v := range byQueue {
		r.WaitByQueue[k] = statsOf(v)
	}
	const ms = float64(time.Hour / time.Millisecond)
	r.UsageGPUHours = float64(r.usageMillis) / ms
	r.OverheadGPUHours = float64(r.overheadMillis) / ms
	r.BurstGPUHours = r.UsageGPUHours + r.OverheadGPUHours
	r.BootGPUHours = float64(r.bootMillis) / ms
	r.IdleGPUHours = math.Max(0, r.OverheadGPUHours-r.BootGPUHours)
	traceJobs := make([]Job, len(e.jobs))
	for i, sj := range e.jobs {
		traceJobs[i] = *sj.t
	}
	r.FluidBoundGPUHours = FluidBound(traceJobs, e.onPremGPUs)
	if r.FluidBoundGPUHours > 0 {
		r.BurstOverFluid = r.BurstGPUHours / r.FluidBoundGPUHours
	}
	r.OwnedIdleWhileRenting = e.rec.ownedIdleArea / 3600
	if r.BurstGPUHours > 0 {
		r.OwnedIdleShare = r.OwnedIdleWhileRenting / r.BurstGPUHours
	}
	months := make([]time.Time, 0, len(r.spent))
	for m := range r.spent {
		months = append(months, m)
	}
	slices.SortFunc(months, func(a, b time.Time) int { return a.Compare(b) })
	for _, m := range months {
		for _, scope := range sortedKeys(e.c.Budgets) {
			limit := e.c.Budgets[scope]
			spent := r.spent[m][scope]
			r.Budgets = append(r.Budgets, BudgetMonth{Month: m.Format("2006-01"), Scope: scope, Limit: limit, Spent: spent, Within: spent <= limit})
		}
	}
	return r
}

// FluidBound is the burst GPU-hours no policy that starts every job on
// submit can go below: ∫ max(0, D(t) − capacity) dt, where D(t) is the
// GPUs of the jobs with submit ≤ t < submit + duration — every job
// running from its submit for its duration, with no queueing, whatever
// the fragmentation of nodes. The integral is exact: D is a step function
// that changes only at submits and ends.
func FluidBound(jobs []Job, capacity int) float64 {
	type step struct {
		at time.Time
		d  int
	}
	steps := make([]step, 0, 2*len(jobs))
	for _, j := range jobs {
		steps = append(steps, step{j.Submit, j.GPUs}, step{j.Submit.Add(j.Duration), -j.GPUs})
	}
	slices.SortFunc(steps, func(a, b step) int { return a.at.Compare(b.at) })
	var area float64 // GPU-seconds
	demand := 0
	for i, s := range steps {
		if i > 0 && demand > capacity {
			area += float64(demand-capacity) * s.at.Sub(steps[i-1].at).Seconds()
		}
		demand += s.d
	}
	return area / 3600
}
