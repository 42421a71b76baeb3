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

// machine is a simulated burst machine.
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
	// bound are pending jobs waiting for the machine while it boots;
	// running the jobs holding its cards; jobIDs the ids of both, as the
	// burst decision's Machine.Jobs.
	bound   []*sjob
	running []*sjob
	jobIDs  []string
	// used is the GPUs of bound and running jobs.
	used      int
	idleSince time.Time
	allocs    []billing.Allocation
	reserved  billing.Amount
	resMonth  time.Time
}

func (m *machine) addJob(sj *sjob) {
	m.jobIDs = append(m.jobIDs, sj.t.ID)
	m.used += sj.j.TotalGPUs()
}

func (m *machine) dropJob(sj *sjob) {
	if i := slices.Index(m.jobIDs, sj.t.ID); i >= 0 {
		m.jobIDs = slices.Delete(m.jobIDs, i, i+1)
	}
	m.used -= sj.j.TotalGPUs()
}

// burstInput is the burst decision's input, its buffers reused from
// cycle to cycle (Decide keeps none of them).
type burstInput struct {
	in       burst.Input
	offers   []providers.Offer
	keys     []string
	machines []burst.Machine
}

// burst runs the burst decision on the plan's demand, as the broker's
// burst controller does after a cycle, and carries the decision out.
func (e *engine) burst(plan *sched.Plan) {
	bi := &e.bin
	in := &bi.in
	*in = burst.Input{Now: e.now, Policy: e.pol.Burst, OnPremGPUs: e.onPremGPUs, OnPremAllocated: e.onPremHeld,
		Currency: e.c.Currency, Active: e.active, Pending: in.Pending[:0], Machines: bi.machines[:0], Budgets: in.Budgets}
	for _, d := range plan.BurstDemand {
		sj := e.byID[d.Job]
		bj := burst.Job{ID: d.Job, Team: d.Team, Queue: d.Queue, Priority: d.Priority, Burst: d.Burst,
			Preemptible: d.Preemptible, GPUs: d.GPUs, Nodes: d.Nodes, GPUModel: d.GPUModel, GPUMemory: d.GPUMemory,
			Timeout: d.Timeout, WaitingSince: e.now.Add(-d.Waited), EstimatedStart: d.EstimatedStart, Why: d.Reason,
			MinWait: sj.minWait}
		if sj.bound != nil {
			bj.Machine = sj.bound.id
		}
		in.Pending = append(in.Pending, bj)
	}
	// Without waiting work the decision can only stop machines; when none
	// is due to stop (see stopDue) it gets no machines, which changes
	// nothing but its cost.
	if len(in.Pending) > 0 || e.stopDue() {
		for _, m := range e.alive {
			bm := burst.Machine{ID: m.id, Provider: m.offer.Provider, Offer: m.offer, State: m.state, Team: m.team,
				Jobs: m.jobIDs, GPUsUsed: m.used, LaunchedAt: m.launched, IdleSince: m.idleSince}
			if m.state == burst.Ready {
				bm.ReadyGPUs = m.offer.GPUs
			}
			in.Machines = append(in.Machines, bm)
		}
	}
	bi.machines = in.Machines
	if !e.pol.NoOffers {
		if bi.offers == nil {
			bi.offers = slices.Clone(e.c.Offers)
			for _, o := range e.c.Offers {
				bi.keys = append(bi.keys, o.Key())
			}
		}
		for i := range bi.offers {
			until, down := e.offerDown[bi.keys[i]]
			bi.offers[i].Available = !down || !e.now.Before(until)
		}
		in.Offers = bi.offers
	}
	if in.Budgets == nil {
		in.Budgets = map[string]burst.Budget{}
	}
	month := billing.MonthOf(e.now, time.UTC).From
	for scope, limit := range e.c.Budgets {
		in.Budgets[scope] = burst.Budget{Limit: limit, Committed: e.committed[month][scope]}
	}
	if len(in.Offers) == 0 && len(e.alive) == 0 {
		// No offer and no machine: the decision can launch, bind and stop
		// nothing, only explain, which the report does not use.
		return
	}
	d := burst.Decide(in)
	e.active = d.Active
	for _, s := range d.Stops {
		if m := e.machineByID(s.Machine); m != nil {
			if len(m.running) > 0 {
				// Its jobs go back to the queue after this cycle's
				// scheduling: the broker's next cycle places them.
				e.wantWake(e.now.Add(e.c.Config.Scheduler.Interval.D()))
			}
			e.terminate(m)
		}
	}
	for _, l := range d.Launches {
		e.launch(l)
	}
	for _, b := range d.Binds {
		sj, m := e.byID[b.Job], e.machineByID(b.Machine)
		if sj == nil || m == nil || sj.bound != nil || sj.j.State != broker.StatePending {
			continue
		}
		// On a ready machine the scheduler places the job when it can;
		// a machine on its way up keeps the job bound until it is ready.
		if m.state.InFlight() {
			sj.bound = m
			m.bound = append(m.bound, sj)
			m.addJob(sj)
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

// stopDue reports whether the burst decision's scale-down could stop a
// machine now: a ready one idle for the idle TTL or at its lifetime.
// (Simulated offers have no lease end and machines never drain.)
func (e *engine) stopDue() bool {
	p := e.pol.Burst
	for _, m := range e.alive {
		if m.state != burst.Ready {
			continue
		}
		if p.MaxLifetime > 0 && !e.now.Before(m.launched.Add(p.MaxLifetime)) {
			return true
		}
		if len(m.jobIDs) == 0 && !m.idleSince.IsZero() && !e.now.Before(m.idleSince.Add(p.IdleTTL)) {
			return true
		}
	}
	return false
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

// wakeMinWait asks for a cycle when a job's minimum wait runs out.
func (e *engine) wakeMinWait(sj *sjob) {
	if sj == nil {
		return
	}
	w := e.pol.Burst.MinWait
	if q := e.pol.Burst.Queues[sj.t.Queue]; q.MinWait > 0 {
		w = q.MinWait
	}
	if sj.minWait > 0 {
		w = sj.minWait
	}
	e.wantWake(pendingSince(sj.j).Add(w))
}

// pendingSince is when a pending job last entered the queue (the burst
// demand's Waited counts from it).
func pendingSince(j *broker.Job) time.Time {
	if n := len(j.History); n > 0 && j.History[n-1].To == broker.StatePending {
		return j.History[n-1].At
	}
	return j.SubmittedAt
}

// launch creates a burst machine: the offer, then its fallbacks on
// capacity errors; a failed launch leaves its jobs unbound for the next
// decision.
func (e *engine) launch(l burst.Launch) {
	e.res.LaunchAttempts++
	for i, o := range append([]providers.Offer{l.Offer}, l.Fallbacks...) {
		if e.capRNG.Float64() < e.c.CapacityFailureRate {
			e.res.CapacityErrors++
			e.offerDown[o.Key()] = e.now.Add(e.c.CapacityBackoff)
			continue
		}
		e.nMachines++
		m := &machine{id: fmt.Sprintf("m%06d", e.nMachines), offer: o, team: l.Team, queue: l.Queue,
			state: burst.Provisioning, launched: e.now}
		cost := l.ProjectedCost
		if i > 0 {
			cost = o.PricePerHour.MulDiv(int64(l.Hours*float64(time.Hour/time.Millisecond)), billing.MillisPerHour)
		}
		if !o.Prepaid {
			m.reserved, m.resMonth = cost, billing.MonthOf(e.now, time.UTC).From
			e.commit(m.resMonth, l.Team, cost)
		}
		for _, id := range l.Jobs {
			if sj := e.byID[id]; sj != nil && sj.bound == nil && sj.j.State == broker.StatePending {
				sj.bound = m
				m.bound = append(m.bound, sj)
				m.addJob(sj)
			}
		}
		e.alive = append(e.alive, m) // ids grow: alive stays in id order
		e.push(event{at: e.now.Add(e.leadTime(o)), kind: evReady, m: m})
		return
	}
	e.res.LaunchFailures++
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

// ready registers a machine's agent: its node joins the cluster and the
// jobs bound to it go back to the scheduler, which places them.
func (e *engine) ready(m *machine) {
	if m.state != burst.Provisioning {
		return
	}
	m.state, m.readyAt = burst.Ready, e.now
	m.node = simNode(m.id, m.offer.Provider, m.id, m.offer.GPUs, m.offer.GPUModel, m.offer.GPUMemoryBytes, "", nil, e.now)
	e.nodes = append(e.nodes, m.node)
	e.byNode[m.node.Name] = m
	for _, sj := range m.bound {
		sj.bound = nil
		m.dropJob(sj)
	}
	m.bound = nil
	m.idleSince = e.now
}

// unbind frees a pending job from the in-flight machine it waited for
// (it started elsewhere).
func (e *engine) unbind(sj *sjob) {
	m := sj.bound
	m.bound = removeJob(m.bound, sj)
	m.dropJob(sj)
	sj.bound = nil
}

// terminate ends a machine: jobs still on it are lost and return to the
// queue (their attempt's work is gone), its node leaves the cluster, and
// its GPU-time is metered and settles its reservation.
func (e *engine) terminate(m *machine) {
	for _, sj := range slices.Clone(m.running) {
		e.release(sj)
		sj.j.Transit(e.now, broker.StateLost, "machine_terminated", "burst machine "+m.id+" ended")
		sj.j.Placements, sj.j.Stop = nil, nil
		sj.j.Transit(e.now, broker.StatePending, "requeued", "back in the queue after machine_terminated")
		e.pending++
		e.res.LostJobs++
	}
	for _, sj := range m.bound {
		sj.bound = nil
	}
	m.bound, m.jobIDs, m.used = nil, nil, 0
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
	return billing.Pool{Kind: kind, Node: m.id, Provider: m.offer.Provider, Region: m.offer.Region,
		InstanceType: m.offer.InstanceType, InstanceID: m.id}
}

// meter prices an ended machine with the billing meter, as the broker's
// ledger would: usage entries for its jobs, overhead for the rest of its
// GPU-time from launch to end (one-hour slices). The cost settles the
// machine's budget reservation, month by month.
func (e *engine) meter(m *machine) {
	rate, err := billing.InstancePrice(m.offer.PricePerHour, m.offer.GPUs)
	if err != nil {
		e.res.meterProblems++
	}
	bm := billing.Machine{Pool: machinePool(m), GPUModel: m.offer.GPUModel, GPUs: m.offer.GPUs, Spot: m.offer.Spot,
		Prices: billing.FlatPrice(rate), Start: m.launched, End: m.ended, DemandTeam: m.team, DemandQueue: m.queue}
	cfg := billing.MeterConfig{Slice: time.Hour, Currency: e.c.Currency, Overhead: e.c.Overhead}
	out := billing.Meter(cfg, billing.MeterInput{Now: m.ended, Allocations: m.allocs, Machines: []billing.Machine{bm}})
	m.allocs = nil
	if m.reserved != 0 {
		e.commit(m.resMonth, m.team, -m.reserved)
	}
	boot := m.ended
	if !m.readyAt.IsZero() {
		boot = m.readyAt
	}
	r := e.res
	r.Machines++
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
