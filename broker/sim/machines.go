package sim

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"time"

	"github.com/spillway-dev/spillway/billing"
	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/burst"
	"github.com/spillway-dev/spillway/broker/burstctl"
	"github.com/spillway-dev/spillway/providers"
)

// machine is a simulated burst machine: the broker's record of it (kept
// by burstctl, as in the broker), and the provider's machine and agent's
// node it stands for.
type machine struct {
	rec  *broker.InstanceRecord
	node *broker.Node
	// bound are the jobs waiting for the machine (provisioning); running
	// the jobs holding its cards; jobIDs the ids of both (kept sorted).
	bound   []*sjob
	running []*sjob
	jobIDs  []string
	// used is the GPUs of bound and running jobs.
	used int
	// allocs are the ended allocations on the machine not yet metered
	// through; metered is the meter's cursor for the machine.
	allocs  []billing.Allocation
	metered time.Time
	// counted are the entries at or after metered already counted, by id,
	// with their start.
	counted map[string]time.Time
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

// burst is one burst decision: the machines metered up to now (their
// cost settles the budgets slice by slice), the budgets read, then the
// decision taken and carried out by burstctl on the simulated fleet.
func (e *engine) burst() {
	e.res.BurstDecisions++
	ctx := context.Background()
	e.meterMachines(e.now)
	budgets, err := e.ctl.Budgets(ctx, e.budgets, e.now)
	if err != nil {
		e.fail(err)
		return
	}
	e.applyPrices()
	in := e.ctl.Input(e.now, e.active, budgets)
	in.CoolDowns = e.coolDowns
	e.ctl.SpillInput(in, e.meterCfg.OnPrem, e.homeNodes)
	d := burst.Decide(in)
	e.active = d.Active
	if len(d.StayRules) > 0 && e.ownedIdleForBurst() > 0 {
		if e.res.SpillBackRefusals == nil {
			e.res.SpillBackRefusals = map[string]int{}
		}
		for _, rule := range d.StayRules {
			e.res.SpillBackRefusals[rule]++
		}
	}
	if err := e.ctl.Apply(ctx, e.now, &d); err != nil {
		e.fail(err)
		return
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

// fail keeps the first error of the replay (the in-memory fleet has
// none to give unless a rule is broken).
func (e *engine) fail(err error) {
	if e.err == nil {
		e.err = err
	}
}

// machineByID finds a live machine.
func (e *engine) machineByID(id string) *machine { return e.aliveByID[id] }

// wakeMinWait asks for a burst decision when a job's minimum wait runs
// out.
func (e *engine) wakeMinWait(sj *sjob) {
	if sj == nil {
		return
	}
	w := burstctl.Waiting{Job: sj.j, MinWait: sj.minWait}
	if bj, ok := burstctl.PendingJob(w, e.now); ok {
		e.wantBurst(bj.WaitingSince.Add(e.pol.Burst.MinWaitFor(bj)))
	}
}

// simFleet is the simulator's burstctl.Fleet: machines in memory, budgets
// in a broker.MemStore, a provider that answers at once (with the
// configured capacity failures) and machines ready after a drawn lead
// time.
type simFleet struct{ e *engine }

var _ burstctl.Fleet = simFleet{}

func (f simFleet) Job(id string) *broker.Job {
	if sj := f.e.byID[id]; sj != nil && sj.live >= 0 {
		return sj.j
	}
	return nil
}

func (f simFleet) Record(id string) *broker.InstanceRecord {
	if m := f.e.machineByID(id); m != nil {
		return m.rec
	}
	return nil
}

func (f simFleet) Records() []*broker.InstanceRecord {
	out := make([]*broker.InstanceRecord, len(f.e.alive))
	for i, m := range f.e.alive {
		out[i] = m.rec
	}
	return out
}

func (f simFleet) Waiting() []burstctl.Waiting {
	e := f.e
	out := e.waiting[:0]
	for _, sj := range e.live { // in id order
		if st := sj.j.State; st == broker.StatePending || st == broker.StateProvisioning {
			out = append(out, burstctl.Waiting{Job: sj.j, EstimatedStart: sj.est, Why: sj.why, MinWait: sj.minWait})
		}
	}
	e.waiting = out
	return out
}

func (f simFleet) OnPrem() (int, int) { return f.e.onPremGPUs, f.e.onPremHeld }

func (f simFleet) MachineJobs(id string) ([]string, int) {
	if m := f.e.machineByID(id); m != nil {
		return m.jobIDs, m.used
	}
	return nil, 0
}

func (f simFleet) OnMachine(id string) (waiting, holding []*broker.Job) {
	m := f.e.machineByID(id)
	if m == nil {
		return nil, nil
	}
	for _, sj := range m.bound {
		waiting = append(waiting, sj.j)
	}
	for _, sj := range m.running {
		holding = append(holding, sj.j)
	}
	byID := func(a, b *broker.Job) int {
		switch {
		case a.ID < b.ID:
			return -1
		case a.ID > b.ID:
			return 1
		}
		return 0
	}
	slices.SortFunc(waiting, byID)
	slices.SortFunc(holding, byID)
	return waiting, holding
}

func (f simFleet) ReadyGPUs(id string) int {
	if m := f.e.machineByID(id); m != nil && (m.rec.State == broker.MachineReady || m.rec.State == broker.MachineDraining) {
		return m.rec.Offer.GPUs
	}
	return 0
}

func (f simFleet) Offers() []providers.Offer { return f.e.offers }

func (f simFleet) NewRecordID(time.Time) string {
	f.e.nMachines++
	return fmt.Sprintf("m%06d", f.e.nMachines)
}

// Commit applies a step: the budget change in the store, then the
// records, then the jobs, with what each change means for the
// simulation (queues, nodes, stop signals, metering).
func (f simFleet) Commit(ctx context.Context, st *burstctl.Step) error {
	e := f.e
	if st.Budget != nil {
		if err := e.budgets.Update(ctx, st.Budget); err != nil {
			return err
		}
	}
	for _, r := range st.Records {
		e.putRecord(r)
	}
	for _, j := range st.Jobs {
		e.putJob(j)
	}
	return nil
}

// putRecord takes a machine record the controller wrote.
func (e *engine) putRecord(r *broker.InstanceRecord) {
	m := e.machineByID(r.ID)
	if m == nil {
		if r.State.Ended() {
			return
		}
		e.res.LaunchAttempts++
		m = &machine{rec: r}
		e.alive = append(e.alive, m) // ids grow: alive stays in id order
		e.aliveByID[r.ID] = m
	}
	old := m.rec
	m.rec = r
	switch {
	case r.State == broker.MachineReady && old.State != broker.MachineReady && m.node == nil:
		m.node = simNode(r.ID, r.Offer.Provider, r.ID, r.Offer.GPUs, r.Offer.GPUModel, r.Offer.GPUMemoryBytes, "", nil, e.now)
		e.nodes = append(e.nodes, m.node)
		e.byNode[m.node.Name] = m
	case r.State.Ended():
		if m.node != nil {
			e.nodes = slices.DeleteFunc(e.nodes, func(n *broker.Node) bool { return n == m.node })
			delete(e.byNode, m.node.Name)
		}
		e.alive = slices.DeleteFunc(e.alive, func(x *machine) bool { return x == m })
		delete(e.aliveByID, r.ID)
		if e.opt.RecordMachines {
			e.res.MachineRecords = append(e.res.MachineRecords, r)
		}
		if r.LaunchedAt != nil {
			e.closing = append(e.closing, m)
		}
		e.wantWake(e.now.Add(e.c.Config.Scheduler.Interval.D()))
	}
}

// putJob takes a job the controller changed: bound to a machine, back in
// the queue, asked to stop, or lost with its machine.
func (e *engine) putJob(nj *broker.Job) {
	sj := e.byID[nj.ID]
	old := sj.j
	switch {
	case old.State == broker.StatePending && nj.State == broker.StateProvisioning:
		sj.why, sj.est = "", nil
		sj.j = nj
		e.bindTo(sj, nj)
		e.pending--
		e.provisioning++
		return
	case old.State == broker.StateProvisioning && nj.State == broker.StateProvisioning && !slices.Equal(old.BoundMachines(), nj.BoundMachines()):
		// A gang moved to a new group (burstctl.GroupNextOffer).
		e.unboundFrom(sj)
		sj.j = nj
		e.bindTo(sj, nj)
		return
	case old.State == broker.StateProvisioning && nj.State != broker.StateProvisioning:
		e.unboundFrom(sj)
		e.provisioning--
		e.pending++
	case old.State.Holding() && !nj.State.Holding():
		e.release(sj)
		if nj.State == broker.StatePending {
			e.pending++
		}
	}
	sj.j = nj
	switch {
	case nj.State.Terminal():
		e.retire(sj)
	case nj.State.Holding() && old.Stop == nil && nj.Stop != nil:
		e.stopRequested(sj)
	}
}

// bindTo puts a job on the machines it is bound to (one, or its gang's
// group).
func (e *engine) bindTo(sj *sjob, j *broker.Job) {
	ready := true
	for _, id := range j.BoundMachines() {
		m := e.machineByID(id)
		if m == nil {
			continue
		}
		sj.bound = append(sj.bound, m)
		m.bound = append(m.bound, sj)
		m.addJob(sj)
		ready = ready && m.rec.State == broker.MachineReady
	}
	if ready {
		// The scheduler's next cycle starts it there (placeBound).
		e.wantWake(e.now.Add(e.c.Config.Scheduler.Interval.D()))
	}
}

// errNoCapacity is the simulated provider's answer for a draw of
// CapacityFailureRate.
var errNoCapacity = errors.New("insufficient capacity (simulated)")

// Launch is the simulated provider: each offer in turn is had unless a
// draw says it has no capacity; a machine created is ready after a lead
// time drawn for its offer.
func (f simFleet) Launch(ctx context.Context, id string) {
	e := f.e
	for {
		m := e.machineByID(id)
		if m == nil || m.rec.State != broker.MachineRequested {
			return // its gang group was given up
		}
		if e.capRNG.Float64() < e.c.CapacityFailureRate {
			e.res.CapacityErrors++
			if m.rec.Group != "" {
				// A gang's machines are one offer: the group moves on.
				ok, err := e.ctl.GroupNextOffer(ctx, id, e.now, errNoCapacity)
				if err != nil {
					e.fail(err)
				} else if !ok {
					e.res.LaunchFailures++
				}
				return
			}
			_, ok, err := e.ctl.NextOffer(ctx, id, e.now, errNoCapacity)
			if err == nil && !ok {
				e.res.LaunchFailures++
				_, err = e.ctl.Fail(ctx, id, e.now, fmt.Errorf("no offer could be had: %w", errNoCapacity))
			}
			if err != nil {
				e.fail(err)
			}
			if !ok {
				return
			}
			continue
		}
		// The simulated machine is running and reachable at once; its
		// agent registers a lead time later.
		inst := providers.Instance{ID: id, SSHHost: id}
		if err := e.ctl.Launched(ctx, id, e.now, inst); err != nil {
			e.fail(err)
			return
		}
		if err := e.ctl.Running(ctx, id, e.now, inst); err != nil {
			e.fail(err)
			return
		}
		e.push(event{at: e.now.Add(e.leadTime(m.rec.Offer)), kind: evReady, m: m})
		e.drawReclaim(m)
		return
	}
}

// Delete is the simulated provider deleting a machine at once.
func (f simFleet) Delete(ctx context.Context, id string) {
	if err := f.e.ctl.Close(ctx, id, f.e.now, time.Time{}, "deleted", "the provider reports the machine gone"); err != nil {
		f.e.fail(err)
	}
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
	if m.rec.State != broker.MachineBootstrapping {
		return
	}
	if err := e.ctl.Ready(context.Background(), m.rec.ID, e.now); err != nil {
		e.fail(err)
	}
}

// meterMachines meters every launched machine up to now, slice by slice
// by billing.Meter on the broker's slices: the entries settle the budgets (spend in
// their month, the machine's reservation covered; one transaction for all
// the machines) and add to the result.
// Ended machines leave once metered through their end.
func (e *engine) meterMachines(now time.Time) {
	for _, m := range e.alive {
		if m.rec.LaunchedAt != nil {
			e.meter(m, now)
		}
	}
	e.closing = slices.DeleteFunc(e.closing, func(m *machine) bool {
		e.meter(m, now)
		if m.metered.Before(*m.rec.TerminatedAt) {
			return false
		}
		e.res.Machines++
		boot := *m.rec.TerminatedAt
		if m.rec.ReadyAt != nil {
			boot = *m.rec.ReadyAt
		}
		e.res.bootMillis += int64(m.rec.Offer.GPUs) * boot.Sub(*m.rec.LaunchedAt).Milliseconds()
		return true
	})
	if len(e.unsettled) == 0 {
		return
	}
	// One transaction for the pass: nothing reads the budgets between
	// the machines' meters, and SettleAll ends where settling each
	// entry would.
	err := e.budgets.Update(context.Background(), func(tx broker.Tx) error {
		return broker.SettleAll(tx, e.unsettled, e.ctl.Zone)
	})
	if err != nil {
		e.fail(err)
	}
	e.unsettled = e.unsettled[:0]
}

// meter meters one machine from its cursor up to now.
func (e *engine) meter(m *machine, now time.Time) {
	// The cursor moves only to a slice boundary (billing.Meter's Through,
	// now rounded down to the grid); until now passes the next one there
	// is nothing this pass would keep.
	if !now.Truncate(e.meterCfg.Slice).After(m.metered) {
		return
	}
	bm, _ := burstctl.MeterMachine(m.rec, "")
	allocs := m.allocs
	for _, sj := range m.running {
		allocs = append(allocs, e.allocation(sj, m, time.Time{}))
	}
	out := billing.Meter(e.meterCfg, billing.MeterInput{From: m.metered, Now: now, Allocations: allocs, Machines: []billing.Machine{bm}})
	if !out.Through.After(m.metered) {
		return
	}
	m.metered = out.Through
	m.allocs = slices.DeleteFunc(m.allocs, func(a billing.Allocation) bool { return !a.End.After(out.Through) })
	// An ended allocation's last part-slice is metered again until the
	// cursor passes it (so that the slice's overhead stays right); the
	// broker's ledger keeps one entry per id, and so does the replay.
	out.Entries = slices.DeleteFunc(out.Entries, func(en billing.Entry) bool {
		_, dup := m.counted[en.ID]
		return dup
	})
	maps.DeleteFunc(m.counted, func(_ string, start time.Time) bool { return start.Before(out.Through) })
	for _, en := range out.Entries {
		if !en.Start.Before(out.Through) {
			if m.counted == nil {
				m.counted = map[string]time.Time{}
			}
			m.counted[en.ID] = en.Start
		}
	}
	e.unsettled = append(e.unsettled, out.Entries...)
	r := e.res
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
		if en.Pool.Kind != billing.PoolOnPrem && en.Cost != 0 {
			r.spend(billing.MonthOf(en.Start, e.ctl.Zone).From, en.Team, en.Cost)
		}
	}
	r.meterProblems += len(out.Problems)
}

// allocation is a job's attempt on a burst machine for the meter, ended
// at end (zero while it runs).
func (e *engine) allocation(sj *sjob, m *machine, end time.Time) billing.Allocation {
	return billing.Allocation{Job: sj.t.ID, Attempt: sj.j.Attempt, Team: sj.t.Team, Queue: sj.t.Queue,
		Pool: burstctl.Pool(m.rec, ""), GPUModel: m.rec.Offer.GPUModel, Spot: m.rec.Offer.Spot,
		GPUMilli: int64(sj.j.Spec.Resources.GPUs) * 1000, Start: sj.runFrom, End: end}
}
