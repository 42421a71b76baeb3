package sim

import (
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/spillway-dev/spillway/billing"
	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/burst"
	"github.com/spillway-dev/spillway/broker/sched"
	"github.com/spillway-dev/spillway/providers"
)

// machine is a simulated burst machine: the broker's instance record and
// the provider's machine in one.
type machine struct {
	id       string
	offer    providers.Offer
	team     string
	queue    string
	state    burst.MachineState
	launched time.Time
	readyAt  time.Time
	ended    time.Time
	node     *broker.Node
	// bound are the jobs waiting for the machine (provisioning); running
	// the jobs holding its cards; jobIDs the ids of both, as the burst
	// decision's Machine.Jobs (kept sorted).
	bound   []*sjob
	running []*sjob
	jobIDs  []string
	// used is the GPUs of bound and running jobs.
	used      int
	idleSince time.Time
	allocs    []billing.Allocation
	// reserved is the budget reservation (projected cost) made in resMonth.
	reserved billing.Amount
	resMonth time.Time
}

func (m *machine) addJob(sj *sjob) {
	i, _ := slices.BinarySearch(m.jobIDs, sj.t.ID)
	m.jobIDs = slices.Insert(m.jobIDs, i, sj.t.ID)
	m.used += sj.j.Spec.Resources.GPUs
}

func (m *machine) dropJob(sj *sjob) {
	if i, ok := slices.BinarySearch(m.jobIDs, sj.t.ID); ok {
		m.jobIDs = slices.Delete(m.jobIDs, i, i+1)
	}
	m.used -= sj.j.Spec.Resources.GPUs
}

// burstInput is the burst decision's input, its buffers reused from
// decision to decision (Decide keeps none of them).
type burstInput struct {
	in       burst.Input
	offers   []providers.Offer
	machines []burst.Machine
}

// burst is one burst decision, built and carried out as broker/server's
// BurstCycle does (burstInputLocked, applyBurstLocked).
func (e *engine) burst() {
	e.res.BurstDecisions++
	bi := &e.bin
	in := &bi.in
	*in = burst.Input{Now: e.now, Policy: e.pol.Burst, OnPremGPUs: e.onPremGPUs, OnPremAllocated: e.onPremHeld,
		Currency: e.c.Currency, Active: e.active, Pending: in.Pending[:0], Machines: bi.machines[:0], Budgets: in.Budgets}
	// Waiting jobs and jobs bound to a machine, in id order (e.live is).
	for _, sj := range e.live {
		j := sj.j
		if j.State != broker.StatePending && j.State != broker.StateProvisioning {
			continue
		}
		in.Pending = append(in.Pending, sj.burstJob())
	}
	for _, m := range e.alive {
		bm := burst.Machine{ID: m.id, Provider: m.offer.Provider, Offer: m.offer, State: m.state, Team: m.team,
			Jobs: m.jobIDs, GPUsUsed: m.used, LaunchedAt: m.launched, IdleSince: m.idleSince}
		if m.state == burst.Ready || m.state == burst.Draining {
			bm.ReadyGPUs = m.offer.GPUs
		}
		in.Machines = append(in.Machines, bm)
	}
	bi.machines = in.Machines
	if bi.offers == nil {
		bi.offers = slices.Clone(e.c.Offers)
	}
	in.Offers = bi.offers
	if in.Budgets == nil {
		in.Budgets = map[string]burst.Budget{}
	}
	month := billing.MonthOf(e.now, time.UTC).From
	for scope, limit := range e.c.Budgets {
		in.Budgets[scope] = burst.Budget{Limit: limit, Committed: e.committed[month][scope]}
	}
	e.spillInput(in)
	d := burst.Decide(in)
	e.active = d.Active
	for _, l := range d.Launches {
		e.launch(l)
	}
	for _, b := range d.Binds {
		sj, m := e.byID[b.Job], e.machineByID(b.Machine)
		if sj == nil || m == nil || sj.j.State != broker.StatePending {
			continue
		}
		e.bind(sj, m)
		m.idleSince = time.Time{}
		if m.state == burst.Ready {
			// The scheduler's next cycle starts it there (placeBound).
			e.wantWake(e.now.Add(e.c.Config.Scheduler.Interval.D()))
		}
	}
	for _, s := range d.Stops {
		if m := e.machineByID(s.Machine); m != nil {
			e.scaleDown(m, s)
		}
	}
	// Idle marks: set when a ready machine's last job goes, cleared when
	// one comes.
	for _, m := range e.alive {
		switch {
		case m.state != burst.Ready:
		case len(m.jobIDs) == 0 && m.idleSince.IsZero():
			m.idleSince = e.now
		case len(m.jobIDs) > 0:
			m.idleSince = time.Time{}
		}
	}
	for id, r := range d.Reasons {
		switch r.Code {
		case burst.CodeBudget:
			if sj := e.byID[id]; sj != nil && !sj.budgetBlocked {
				sj.budgetBlocked = true
				e.res.BudgetBlockedJobs++
			}
		case burst.CodeMinWait:
			e.wakeMinWait(e.byID[id])
		}
	}
}

// waitingSince is when a job last entered the queue, as the broker's
// burst input has it: a job requeued after a preemption keeps its submit
// time, so it may resume on burst capacity at once.
func waitingSince(j *broker.Job) time.Time {
	for i := len(j.History) - 1; i >= 0; i-- {
		if j.History[i].To == broker.StatePending {
			if j.History[i].From == broker.StatePreempted {
				return j.SubmittedAt
			}
			return j.History[i].At
		}
	}
	return j.SubmittedAt
}

// machineByID finds a live machine (alive is in id order).
func (e *engine) machineByID(id string) *machine {
	i, ok := slices.BinarySearchFunc(e.alive, id, func(m *machine, id string) int {
		switch {
		case m.id < id:
			return -1
		case m.id > id:
			return 1
		}
		return 0
	})
	if !ok {
		return nil
	}
	return e.alive[i]
}

// wakeMinWait asks for a burst decision when a job's minimum wait runs
// out.
func (e *engine) wakeMinWait(sj *sjob) {
	if sj == nil {
		return
	}
	e.wantBurst(waitingSince(sj.j).Add(e.pol.Burst.MinWaitFor(sj.burstJob())))
}

// burstJob is the waiting job as the burst decision sees it.
func (sj *sjob) burstJob() burst.Job {
	j := sj.j
	return burst.Job{ID: j.ID, Team: j.Spec.Team, Queue: j.Spec.Queue, Priority: j.Spec.Priority, Burst: j.Spec.Burst,
		Preemptible: j.Spec.Preemptible, GPUs: j.Spec.Resources.GPUs, Nodes: max(1, j.Spec.Resources.Nodes),
		GPUModel: j.Spec.Resources.GPUModel, GPUMemory: int64(j.Spec.Resources.GPUMemory), Timeout: j.Spec.Timeout.D(),
		WaitingSince: waitingSince(j), Machine: j.Machine, EstimatedStart: sj.est, Why: sj.why, MinWait: sj.minWait}
}

// bind moves a waiting job to provisioning on machine m.
func (e *engine) bind(sj *sjob, m *machine) {
	sj.j.Machine = m.id
	sj.j.Transit(e.now, broker.StateProvisioning, "burst", "bound to "+m.id)
	sj.bound = m
	sj.why, sj.est = "", nil
	m.bound = append(m.bound, sj)
	m.addJob(sj)
	e.pending--
	e.provisioning++
}

// unbind returns a job bound to a machine to the queue.
func (e *engine) unbind(sj *sjob, why string) {
	m := sj.bound
	m.bound = removeJob(m.bound, sj)
	m.dropJob(sj)
	sj.bound = nil
	sj.j.Machine = ""
	sj.j.Transit(e.now, broker.StatePending, "burst_failed", why)
	e.provisioning--
	e.pending++
}

// launch carries out one launch as the broker does: the jobs still
// waiting are bound to a new machine record and its projected cost is
// reserved against the budgets in one step (nothing happens when the
// budget cannot take it); then the provider is asked for the offer, and
// on a capacity error for each fallback in turn, re-reserving for its
// price; when none can be had the jobs go back to the queue.
func (e *engine) launch(l burst.Launch) {
	var jobs []*sjob
	for _, id := range l.Jobs {
		if sj := e.byID[id]; sj != nil && sj.j.State == broker.StatePending {
			jobs = append(jobs, sj)
		}
	}
	if len(jobs) == 0 {
		return
	}
	month := billing.MonthOf(e.now, time.UTC).From
	if !l.Offer.Prepaid && !e.mayReserve(month, l.Team, l.ProjectedCost) {
		for _, sj := range jobs {
			if !sj.budgetBlocked {
				sj.budgetBlocked = true
				e.res.BudgetBlockedJobs++
			}
		}
		return
	}
	e.res.LaunchAttempts++
	e.nMachines++
	m := &machine{id: fmt.Sprintf("m%06d", e.nMachines), offer: l.Offer, team: l.Team, queue: l.Queue, state: burst.Requested}
	e.alive = append(e.alive, m) // ids grow: alive stays in id order
	if !l.Offer.Prepaid {
		m.reserved, m.resMonth = l.ProjectedCost, month
		e.commit(month, l.Team, l.ProjectedCost)
	}
	for _, sj := range jobs {
		e.bind(sj, m)
	}
	offers := append([]providers.Offer{l.Offer}, l.Fallbacks...)
	for i, o := range offers {
		if i > 0 {
			// The next offer: release, then reserve for its price.
			e.commit(m.resMonth, m.team, -m.reserved)
			m.offer, m.reserved = o, 0
			cost := projectFor(o, e.pol.Burst, jobs)
			if !o.Prepaid {
				if !e.mayReserve(month, l.Team, cost) {
					break
				}
				m.reserved = cost
				e.commit(month, l.Team, cost)
			}
		}
		if e.capRNG.Float64() < e.c.CapacityFailureRate {
			e.res.CapacityErrors++
			continue
		}
		m.state, m.launched = burst.Provisioning, e.now
		e.push(event{at: e.now.Add(e.leadTime(o)), kind: evReady, m: m})
		return
	}
	// No offer could be had: the jobs go back, the reservation is
	// released, the record fails.
	e.res.LaunchFailures++
	for _, sj := range slices.Clone(m.bound) {
		e.unbind(sj, "burst failed: no offer could be had")
	}
	e.commit(m.resMonth, m.team, -m.reserved)
	m.reserved, m.state, m.ended = 0, burst.Failed, e.now
	e.alive = slices.DeleteFunc(e.alive, func(x *machine) bool { return x == m })
	e.wantWake(e.now.Add(e.c.Config.Scheduler.Interval.D()))
}

// projectFor is a machine's projected cost on offer o: its price for the
// longest timeout of its jobs, capped by the lifetime (broker/server's
// projectFor).
func projectFor(o providers.Offer, p burst.Policy, jobs []*sjob) billing.Amount {
	var d time.Duration
	for _, sj := range jobs {
		d = max(d, sj.j.Spec.Timeout.D())
	}
	if d <= 0 || d > p.MaxLifetime {
		d = p.MaxLifetime
	}
	return o.PricePerHour.MulDiv(d.Milliseconds(), billing.MillisPerHour)
}

// mayReserve reports whether amount fits the team's budget (when it has
// one) and the global budget (which must exist) this month.
func (e *engine) mayReserve(month time.Time, team string, amount billing.Amount) bool {
	for _, scope := range []string{team, broker.GlobalScope} {
		limit, ok := e.c.Budgets[scope]
		if !ok {
			if scope == broker.GlobalScope {
				return false
			}
			continue
		}
		if e.committed[month][scope]+amount > limit {
			return false
		}
	}
	return true
}

// commit adds an amount to what counts against a team's and the global
// budget in a month.
func (e *engine) commit(month time.Time, team string, a billing.Amount) {
	c := e.committed[month]
	if c == nil {
		c = map[string]billing.Amount{}
		e.committed[month] = c
	}
	c[team] += a
	c[broker.GlobalScope] += a
}

// zOf99 is the standard normal's 99th percentile.
const zOf99 = 2.3263478740408408

// leadTime draws a launch-to-ready time for offer o: log-normal with the
// configured median and 99th percentile, cut at the maximum.
func (e *engine) leadTime(o providers.Offer) time.Duration {
	lt, ok := e.c.OfferLead[o.Key()]
	if !ok {
		lt = e.c.LeadTime
	}
	mu := math.Log(float64(lt.P50.D()))
	sigma := 0.0
	if lt.P99 > lt.P50 {
		sigma = math.Log(float64(lt.P99)/float64(lt.P50)) / zOf99
	}
	d := time.Duration(math.Exp(mu + sigma*e.lead.NormFloat64()))
	return min(max(d, time.Second), lt.Max.D()).Round(time.Second)
}

// ready registers a machine's agent: its node joins the cluster, and the
// scheduler's cycle that follows starts the jobs bound to it.
func (e *engine) ready(m *machine) {
	if m.state != burst.Provisioning {
		return
	}
	m.state, m.readyAt = burst.Ready, e.now
	m.node = simNode(m.id, m.offer.Provider, m.id, m.offer.GPUs, m.offer.GPUModel, m.offer.GPUMemoryBytes, "", nil, e.now)
	e.nodes = append(e.nodes, m.node)
	e.byNode[m.node.Name] = m
}

// scaleDown carries out a stop as the broker does: jobs bound to the
// machine go back to the queue, jobs on it are stopped with their
// checkpoint signal (preempted) and the machine drains; a machine with no
// job left ends.
func (e *engine) scaleDown(m *machine, s burst.Stop) {
	for _, sj := range slices.Clone(m.bound) {
		e.unbind(sj, "burst machine "+m.id+" is going away: "+s.Detail)
	}
	if len(m.running) > 0 {
		for _, sj := range m.running {
			reason := sched.StopPreempted
			if s.Reason == burst.StopSpillBack {
				reason = burst.StopSpillBack
			}
			e.stop(sj, reason, "burst machine "+m.id+": "+s.Detail, "burst controller")
		}
		m.state = burst.Draining
		return
	}
	e.terminate(m)
	e.wantWake(e.now.Add(e.c.Config.Scheduler.Interval.D()))
}

// terminate ends a machine: its node leaves the cluster, and its GPU-time
// is metered and settles its reservation.
func (e *engine) terminate(m *machine) {
	if m.node != nil {
		e.nodes = slices.DeleteFunc(e.nodes, func(n *broker.Node) bool { return n == m.node })
		delete(e.byNode, m.node.Name)
	}
	m.state, m.ended = burst.Terminated, e.now
	e.alive = slices.DeleteFunc(e.alive, func(x *machine) bool { return x == m })
	e.meter(m)
}

func machinePool(m *machine) billing.Pool {
	kind := billing.PoolCloud
	if m.offer.Prepaid {
		kind = billing.PoolLease
	}
	return billing.Pool{Kind: kind, Name: m.offer.Provider, Node: m.id, Provider: m.offer.Provider, Region: m.offer.Region,
		InstanceType: m.offer.InstanceType, InstanceID: m.id}
}

// meter prices an ended machine with the billing meter, as the broker's
// ledger would: usage entries for its jobs, overhead for the rest of its
// GPU-time from launch to end (one-hour slices). The cost becomes the
// month's spend and the reservation is released.
func (e *engine) meter(m *machine) {
	bm := billing.Machine{Pool: machinePool(m), GPUModel: m.offer.GPUModel, GPUs: m.offer.GPUs, Spot: m.offer.Spot,
		Prices: billing.FlatPrice(m.offer.PricePerGPUHour()), Start: m.launched, End: m.ended, DemandTeam: m.team, DemandQueue: m.queue}
	cfg := billing.MeterConfig{Slice: time.Hour, Currency: e.c.Currency, Overhead: e.c.Overhead}
	out := billing.Meter(cfg, billing.MeterInput{Now: m.ended, Allocations: m.allocs, Machines: []billing.Machine{bm}})
	m.allocs = nil
	if m.reserved != 0 {
		e.commit(m.resMonth, m.team, -m.reserved)
		m.reserved = 0
	}
	r := e.res
	r.Machines++
	boot := m.ended
	if !m.readyAt.IsZero() {
		boot = m.readyAt
	}
	r.bootMillis += int64(m.offer.GPUs) * boot.Sub(m.launched).Milliseconds()
	for _, en := range out.Entries {
		switch en.Kind {
		case billing.KindUsage:
			r.usageMillis += en.GPUMillis
			r.UsageCost += en.Cost
		case billing.KindOverhead:
			r.overheadMillis += en.GPUMillis
			r.OverheadCost += en.Cost
		}
		r.BurstCost += en.Cost
		if !m.offer.Prepaid {
			month := billing.MonthOf(en.Start, time.UTC).From
			c := e.committed[month]
			if c == nil {
				c = map[string]billing.Amount{}
				e.committed[month] = c
			}
			c[en.Team] += en.Cost
			c[broker.GlobalScope] += en.Cost
			r.spend(month, en.Team, en.Cost)
		}
	}
	r.meterProblems += len(out.Problems)
}
