// Package burstctl carries out burst decisions: the one executor of
// burst.Decide that the broker and the simulator share. burst decides
// (pure); burstctl turns a decision into records, job bindings, budget
// reservations and stops, and keeps the rules around them — launch with a
// reservation, fallback to the next offer, bind and unbind, drain and
// scale-down, idle marks, failed launches, ended machines, projected cost
// and the budget months. It does its work through a Fleet: the broker's
// (store transactions, workers, providers) or the simulator's (memory,
// virtual time). Neither carries out a decision any other way.
package burstctl

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/spillway-dev/spillway/billing"
	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/burst"
	"github.com/spillway-dev/spillway/broker/sched"
	"github.com/spillway-dev/spillway/providers"
)

// Fleet is where the controller's decisions take effect. Records and jobs
// it hands out are never changed in place: the controller changes copies
// and hands them back in a Step. The broker calls the controller, and the
// controller its Fleet, with the broker's state lock held; Commit is the
// only method that writes.
type Fleet interface {
	// Job is a non-terminal job by id, or nil.
	Job(id string) *broker.Job
	// Record is a machine record by id, or nil.
	Record(id string) *broker.InstanceRecord
	// Records are the records not ended, in id order.
	Records() []*broker.InstanceRecord
	// Waiting are the jobs pending or bound to a machine, in id order,
	// with what the scheduler last said of them.
	Waiting() []Waiting
	// OnPrem is the healthy on-prem GPUs and those held on them.
	OnPrem() (gpus, held int)
	// MachineJobs are the ids (sorted) of the jobs bound to machine id or
	// holding its cards, and their GPUs.
	MachineJobs(id string) ([]string, int)
	// OnMachine are the jobs bound to machine id and waiting for it, and
	// the jobs holding its cards, each in id order.
	OnMachine(id string) (waiting, holding []*broker.Job)
	// ReadyGPUs is how many of machine id's GPUs its agent registered.
	ReadyGPUs(id string) int
	// Offers are the providers' offers, provider by provider.
	Offers() []providers.Offer
	// NewRecordID names a new machine record.
	NewRecordID(now time.Time) string
	// Commit writes one step in one transaction: jobs, records and the
	// budget change. When it fails nothing changed.
	Commit(ctx context.Context, st *Step) error
	// Launch starts carrying a requested record to ready: a worker that
	// creates and bootstraps the machine, or a simulated provider. It
	// reports what happens through Launched, NextOffer, Ready and Fail.
	Launch(ctx context.Context, id string)
	// Delete starts deleting a terminating record's machine; once it is
	// gone the fleet calls Close.
	Delete(ctx context.Context, id string)
}

// Waiting is a job the burst decision may send out, with the scheduler's
// last word on it.
type Waiting struct {
	Job            *broker.Job
	EstimatedStart *time.Time
	Why            string
	// MinWait, when positive, is the job's own minimum wait (the
	// simulator's per-job policies).
	MinWait time.Duration
}

// Step is one atomic change: jobs and records to write, and what it does
// to the budgets, in the same transaction.
type Step struct {
	Jobs    []*broker.Job
	Records []*broker.InstanceRecord
	// Budget, when set, reserves, re-reserves or releases in the step's
	// transaction; an error (broker.ErrBudgetExceeded) undoes the step.
	Budget func(tx broker.Tx) error
}

// Controller carries out decisions on a Fleet.
type Controller struct {
	Fleet  Fleet
	Policy burst.Policy
	// Zone is the billing time zone: budget months begin at its midnight.
	Zone     *time.Location
	Currency string
	// OfferCoolDown is how long an offer stays out of decisions after
	// one of its spot machines is reclaimed (burst.offerCoolDown).
	OfferCoolDown time.Duration
}

func (c *Controller) zone() *time.Location {
	if c.Zone == nil {
		return time.UTC
	}
	return c.Zone
}

func (c *Controller) currency() string {
	if c.Currency == "" {
		return "USD"
	}
	return c.Currency
}

// Month is the budget month of t ("2026-12" in the billing zone).
func (c *Controller) Month(t time.Time) string { return broker.BudgetMonthKey(t, c.zone()) }

// MonthEnd is when the budget month of t ends.
func (c *Controller) MonthEnd(t time.Time) time.Time { return billing.MonthOf(t, c.zone()).To }

// Budgets reads every budget with what the month of now has committed
// (spent and reserved). It does store I/O: the broker calls it without
// its state lock.
func (c *Controller) Budgets(ctx context.Context, st broker.Store, now time.Time) (map[string]burst.Budget, error) {
	month := c.Month(now)
	out := map[string]burst.Budget{}
	err := st.View(ctx, func(tx broker.Tx) error {
		budgets, err := broker.ListBudgets(tx)
		if err != nil {
			return err
		}
		for _, b := range budgets {
			m, err := broker.GetBudgetMonth(tx, month, b.Scope)
			if err != nil {
				return err
			}
			out[b.Scope] = burst.Budget{Limit: b.Limit, Committed: m.Committed()}
		}
		return nil
	})
	return out, err
}

// Input is the decision's input: the fleet's jobs, machines and offers
// with the budgets read before (Budgets).
func (c *Controller) Input(now time.Time, active bool, budgets map[string]burst.Budget) *burst.Input {
	f := c.Fleet
	in := &burst.Input{Now: now, Policy: c.Policy, Active: active, Currency: c.currency(), Budgets: budgets}
	in.OnPremGPUs, in.OnPremAllocated = f.OnPrem()
	waiting := f.Waiting()
	in.Pending = make([]burst.Job, 0, len(waiting))
	for _, w := range waiting {
		if bj, ok := PendingJob(w, now); ok {
			in.Pending = append(in.Pending, bj)
		}
	}
	records := f.Records()
	in.Machines = make([]burst.Machine, 0, len(records))
	for _, r := range records {
		if r.State.Ended() || r.SlurmNode != "" { // Slurm ends its nodes
			continue
		}
		m := burst.Machine{ID: r.ID, Provider: r.Provider, Offer: r.Offer, State: r.State, Team: r.Team, Group: r.Group}
		m.Jobs, m.GPUsUsed = f.MachineJobs(r.ID)
		m.ReadyGPUs = f.ReadyGPUs(r.ID)
		if r.LaunchedAt != nil {
			m.LaunchedAt = *r.LaunchedAt
		}
		if r.IdleSince != nil {
			m.IdleSince = *r.IdleSince
		}
		in.Machines = append(in.Machines, m)
	}
	// Sized up front (a decision per ~30 s of a replay grew them append by
	// append); nil when empty, as before.
	if len(in.Pending) == 0 {
		in.Pending = nil
	}
	if len(in.Machines) == 0 {
		in.Machines = nil
	}
	in.Offers = f.Offers()
	return in
}

// PendingJob is a waiting job as the burst decision sees it; false when
// it may not go out now: held, waiting for its array's limit, or pending
// with a retry time not reached.
func PendingJob(w Waiting, now time.Time) (burst.Job, bool) {
	j := w.Job
	switch {
	case j.Hold != nil, w.Why == sched.ReasonArrayLimit:
		// Held, or its array runs the most elements it may at once: a
		// rented machine would not start it either.
		return burst.Job{}, false
	case j.State == broker.StatePending && (j.NotBefore == nil || !now.Before(*j.NotBefore)):
	case j.State == broker.StateProvisioning:
	default:
		return burst.Job{}, false
	}
	return burst.Job{ID: j.ID, Team: j.Spec.Team, Queue: j.Spec.Queue, Priority: j.Spec.Priority, Burst: j.Spec.Burst,
		Preemptible: j.Spec.Preemptible, GPUs: j.Spec.Resources.GPUs, Nodes: max(1, j.Spec.Resources.Nodes),
		GPUModel: j.Spec.Resources.GPUModel, GPUMemory: int64(j.Spec.Resources.GPUMemory), Timeout: j.Spec.Timeout.D(),
		WaitingSince: j.WaitingSince(), Machine: j.Machine, EstimatedStart: w.EstimatedStart, Why: w.Why, MinWait: w.MinWait}, true
}

// Apply carries out a decision: launches (record, job bindings and budget
// reservation in one step, then Fleet.Launch), binds, scale-downs and
// idle marks. A launch the budgets refuse puts its reason on its jobs in
// d.Reasons.
func (c *Controller) Apply(ctx context.Context, now time.Time, d *burst.Decision) error {
	if d.Reasons == nil {
		d.Reasons = map[string]broker.PendingReason{}
	}
	for _, l := range d.Launches {
		if err := c.launch(ctx, now, l, d); err != nil {
			return err
		}
	}
	for _, b := range d.Binds {
		if err := c.bind(ctx, now, b); err != nil {
			return err
		}
	}
	for _, st := range d.Stops {
		if err := c.ScaleDown(ctx, now, st); err != nil {
			return err
		}
	}
	for _, sb := range d.SpillBacks {
		if !sb.Whole {
			if err := c.moveHome(ctx, now, sb); err != nil {
				return err
			}
		}
	}
	return c.MarkIdle(ctx, now)
}

func (c *Controller) launch(ctx context.Context, now time.Time, l burst.Launch, d *burst.Decision) error {
	if l.Nodes > 1 {
		return c.launchGroup(ctx, now, l, d)
	}
	f := c.Fleet
	id := f.NewRecordID(now)
	rec := &broker.InstanceRecord{ID: id, Provider: l.Offer.Provider, Offer: l.Offer, Fallbacks: l.Fallbacks,
		State: broker.MachineRequested, Team: l.Team, Queue: l.Queue, ProjectedCost: l.ProjectedCost, CreatedAt: now}
	rec.History = []broker.Transition{{At: now, To: broker.State(broker.MachineRequested), Reason: "burst",
		Detail: fmt.Sprintf("%s %s for %d waiting job(s), projected %s %s", l.Offer.Provider, l.Offer.InstanceType, len(l.Jobs), burst.Money(l.ProjectedCost), c.currency())}}
	st := &Step{Records: []*broker.InstanceRecord{rec}}
	detail := fmt.Sprintf("burst: %s %s requested (%s)", l.Offer.Provider, l.Offer.InstanceType, id)
	for _, jid := range l.Jobs {
		if j := f.Job(jid); j != nil {
			jj := j.Clone()
			if jj.Bind(id, now, detail) {
				st.Jobs = append(st.Jobs, jj)
				rec.Jobs = append(rec.Jobs, jid)
			}
		}
	}
	if len(st.Jobs) == 0 {
		return nil
	}
	if !l.Offer.Prepaid {
		st.Budget = func(tx broker.Tx) error {
			_, err := broker.Reserve(tx, id, l.Team, l.ProjectedCost, now, c.zone())
			return err
		}
	}
	err := f.Commit(ctx, st)
	if errors.Is(err, broker.ErrBudgetExceeded) {
		for _, jid := range rec.Jobs {
			d.Reasons[jid] = broker.PendingReason{Code: burst.CodeBudget, Message: "burst blocked: " + strings.TrimPrefix(err.Error(), broker.ErrBudgetExceeded.Error()+": ")}
		}
		return nil
	}
	if err != nil {
		return err
	}
	f.Launch(ctx, id)
	return nil
}

func (c *Controller) bind(ctx context.Context, now time.Time, b burst.Bind) error {
	f := c.Fleet
	r, j := f.Record(b.Machine), f.Job(b.Job)
	if r == nil || j == nil {
		return nil
	}
	jj := j.Clone()
	if !jj.Bind(r.ID, now, fmt.Sprintf("burst: bound to %s %s (%s)", r.Provider, r.Offer.InstanceType, r.ID)) {
		return nil
	}
	rr := r.Clone()
	rr.Jobs = append(rr.Jobs, b.Job)
	rr.IdleSince = nil
	return f.Commit(ctx, &Step{Jobs: []*broker.Job{jj}, Records: []*broker.InstanceRecord{rr}})
}

// unbind returns the jobs waiting for machine id to the queue.
func (c *Controller) unbind(id string, now time.Time, why string) []*broker.Job {
	waiting, _ := c.Fleet.OnMachine(id)
	out := make([]*broker.Job, 0, len(waiting))
	for _, j := range waiting {
		jj := j.Clone()
		jj.Unbind(now, why)
		out = append(out, jj)
	}
	return out
}

// ScaleDown drains a machine: jobs waiting for it go back to the queue,
// jobs on it are stopped with their checkpoint signal (and requeued when
// they exit); a machine with no job left is ended (Fleet.Delete).
func (c *Controller) ScaleDown(ctx context.Context, now time.Time, s burst.Stop) error {
	f := c.Fleet
	r := f.Record(s.Machine)
	if r == nil || r.State.Ended() || r.State == broker.MachineTerminating {
		return nil
	}
	rr := r.Clone()
	changed := c.unbind(r.ID, now, "burst machine "+r.ID+" is going away: "+s.Detail)
	_, holding := f.OnMachine(r.ID)
	reason := "preempted"
	if s.Reason == burst.StopSpillBack { // moved home: the job's history keeps why
		reason = burst.StopSpillBack
	}
	for _, j := range holding {
		jj := j.Clone()
		if jj.RequestStop(reason, "burst machine "+r.ID+": "+s.Detail, "burst controller", now) {
			changed = append(changed, jj)
		}
	}
	if len(holding) > 0 {
		if rr.State != broker.MachineDraining {
			rr.Transit(now, broker.MachineDraining, s.Reason, s.Detail)
		}
		return f.Commit(ctx, &Step{Jobs: changed, Records: []*broker.InstanceRecord{rr}})
	}
	rr.Transit(now, broker.MachineTerminating, s.Reason, s.Detail)
	if err := f.Commit(ctx, &Step{Jobs: changed, Records: []*broker.InstanceRecord{rr}}); err != nil {
		return err
	}
	f.Delete(ctx, r.ID)
	return nil
}

// moveHome stops the jobs of a partial spill-back with their checkpoint
// signal (reason StopSpillBack: requeued when they exit, to resume at
// home); the machine stays for its other jobs.
func (c *Controller) moveHome(ctx context.Context, now time.Time, sb burst.SpillBack) error {
	var changed []*broker.Job
	for _, sj := range sb.Jobs {
		j := c.Fleet.Job(sj.Job)
		if j == nil || j.Machine != "" && j.Machine != sb.Machine {
			continue
		}
		jj := j.Clone()
		if jj.RequestStop(burst.StopSpillBack, "burst machine "+sb.Machine+": "+sb.Detail, "burst controller", now) {
			changed = append(changed, jj)
		}
	}
	if len(changed) == 0 {
		return nil
	}
	return c.Fleet.Commit(ctx, &Step{Jobs: changed})
}

// MarkIdle keeps each ready machine's IdleSince: set when its last job
// goes, cleared when one comes.
func (c *Controller) MarkIdle(ctx context.Context, now time.Time) error {
	f := c.Fleet
	for _, r := range f.Records() {
		if r.State != broker.MachineReady || r.SlurmNode != "" {
			continue
		}
		jobs, _ := f.MachineJobs(r.ID)
		var rr *broker.InstanceRecord
		switch {
		case len(jobs) == 0 && r.IdleSince == nil:
			rr = r.Clone()
			t := now
			rr.IdleSince = &t
		case len(jobs) > 0 && r.IdleSince != nil:
			rr = r.Clone()
			rr.IdleSince = nil
		default:
			continue
		}
		if err := f.Commit(ctx, &Step{Records: []*broker.InstanceRecord{rr}}); err != nil {
			return err
		}
	}
	return nil
}

// NextOffer moves a requested record to its next fallback offer when the
// provider had no capacity (or quota) for its offer, re-reserving the
// budget for the new projected cost in the same step. It reports false
// when no offer is left or the budget refuses the next one.
func (c *Controller) NextOffer(ctx context.Context, id string, now time.Time, cause error) (providers.Offer, bool, error) {
	f := c.Fleet
	r := f.Record(id)
	if r == nil || len(r.Fallbacks) == 0 {
		return providers.Offer{}, false, nil
	}
	rr := r.Clone()
	next := rr.Fallbacks[0]
	rr.Fallbacks = rr.Fallbacks[1:]
	rr.Offer, rr.Provider = next, next.Provider
	rr.ProjectedCost = burst.ProjectedCost(next, c.longestTimeout(rr.Jobs), c.Policy.MaxLifetime)
	rr.Transit(now, broker.MachineRequested, "next_offer", fmt.Sprintf("%v; trying %s %s", cause, next.Provider, next.InstanceType))
	amount := rr.ProjectedCost
	if next.Prepaid {
		amount = 0
	}
	err := f.Commit(ctx, &Step{Records: []*broker.InstanceRecord{rr}, Budget: func(tx broker.Tx) error {
		return broker.Rereserve(tx, id, rr.Team, amount, now, c.zone())
	}})
	if errors.Is(err, broker.ErrBudgetExceeded) {
		return providers.Offer{}, false, nil
	}
	if err != nil {
		return providers.Offer{}, false, err
	}
	return next, true, nil
}

// longestTimeout is the longest timeout among the jobs still known.
func (c *Controller) longestTimeout(ids []string) time.Duration {
	var d time.Duration
	for _, id := range ids {
		if j := c.Fleet.Job(id); j != nil {
			d = max(d, j.Spec.Timeout.D())
		}
	}
	return d
}

// Launched records that the provider created the machine.
func (c *Controller) Launched(ctx context.Context, id string, now time.Time, inst providers.Instance) error {
	r := c.Fleet.Record(id)
	if r == nil {
		return broker.ErrNotFound
	}
	if r.State != broker.MachineRequested {
		// Its gang group was given up while it was created: the record
		// keeps what was made, and the caller deletes it.
		if r.ProviderID == "" {
			rr := r.Clone()
			rr.ProviderID = inst.ID
			if err := c.Fleet.Commit(ctx, &Step{Records: []*broker.InstanceRecord{rr}}); err != nil {
				return err
			}
		}
		return ErrAbandoned
	}
	rr := r.Clone()
	rr.ProviderID = inst.ID
	rr.SSHHost, rr.SSHUser = inst.SSHHost, inst.SSHUser
	t := now
	rr.LaunchedAt = &t
	where := inst.Zone
	if where == "" {
		where = inst.Region
	}
	rr.Transit(now, broker.MachineProvisioning, "created", fmt.Sprintf("%s %s in %s", rr.Provider, inst.ID, where))
	return c.Fleet.Commit(ctx, &Step{Records: []*broker.InstanceRecord{rr}})
}

// Ready records that the machine's agent registered: the scheduler may
// start the jobs bound to it.
func (c *Controller) Ready(ctx context.Context, id string, now time.Time) error {
	r := c.Fleet.Record(id)
	if r == nil {
		return broker.ErrNotFound
	}
	if r.State == broker.MachineTerminating || r.State.Ended() {
		return ErrAbandoned
	}
	rr := r.Clone()
	t := now
	rr.ReadyAt = &t
	if rr.Reclaim != nil { // reclaimed while bootstrapping: it stays draining
		return c.Fleet.Commit(ctx, &Step{Records: []*broker.InstanceRecord{rr}})
	}
	rr.Transit(now, broker.MachineReady, "registered", fmt.Sprintf("agent registered after %s", broker.FormatDuration(now.Sub(r.CreatedAt).Truncate(time.Second))))
	return c.Fleet.Commit(ctx, &Step{Records: []*broker.InstanceRecord{rr}})
}

// Fail ends a launch that cannot go on: the waiting jobs go back to the
// queue with the reason and the reservation is released; a machine that
// exists moves to terminating (the caller deletes it), one that does not
// is failed. It returns the record as written.
func (c *Controller) Fail(ctx context.Context, id string, now time.Time, cause error) (*broker.InstanceRecord, error) {
	r := c.Fleet.Record(id)
	if r == nil {
		return nil, broker.ErrNotFound
	}
	if r.Group != "" {
		return c.failGroup(ctx, r, now, cause)
	}
	rr := r.Clone()
	jobs := c.unbind(id, now, "burst failed: "+cause.Error())
	rr.Reason = cause.Error()
	if rr.ProviderID != "" {
		rr.Transit(now, broker.MachineTerminating, "failed", cause.Error())
	} else {
		t := now
		rr.TerminatedAt = &t
		rr.Transit(now, broker.MachineFailed, "failed", cause.Error())
	}
	err := c.Fleet.Commit(ctx, &Step{Jobs: jobs, Records: []*broker.InstanceRecord{rr},
		Budget: func(tx broker.Tx) error { return broker.Release(tx, id) }})
	return rr, err
}

// Close ends a record whose machine is gone: terminated (it was ready
// once) or failed, metered up to end (now when zero), its reservation
// released, and anything still bound to it or running on it requeued.
func (c *Controller) Close(ctx context.Context, id string, now, end time.Time, reason, detail string) error {
	f := c.Fleet
	r := f.Record(id)
	if r == nil {
		return broker.ErrNotFound
	}
	if end.IsZero() {
		end = now
	}
	if r.Reclaim != nil && r.Reclaim.At.Before(end) { // the provider took it back then
		end = r.Reclaim.At
	}
	rr := r.Clone()
	t := end
	rr.TerminatedAt = &t
	final := broker.MachineTerminated
	if rr.ReadyAt == nil {
		final = broker.MachineFailed
	}
	rr.Transit(now, final, reason, detail)
	jobs := c.unbind(id, now, "burst machine "+id+" ended")
	_, holding := f.OnMachine(id)
	for _, j := range holding {
		jj := j.Clone()
		jj.Lose(end, now, "node_lost", "burst machine "+id+" ended")
		jobs = append(jobs, jj)
	}
	return f.Commit(ctx, &Step{Jobs: jobs, Records: []*broker.InstanceRecord{rr},
		Budget: func(tx broker.Tx) error { return broker.Release(tx, id) }})
}

// Pool is a machine's billing pool: cloud unless prepaid (lease), or the
// provider's own kind when it has one.
func Pool(r *broker.InstanceRecord, kind billing.PoolKind) billing.Pool {
	if r.Offer.Prepaid {
		kind = billing.PoolLease
	}
	if kind == "" {
		kind = billing.PoolCloud
	}
	return billing.Pool{Kind: kind, Name: r.Provider, Node: r.ID, Provider: r.Provider, Region: r.Offer.Region,
		InstanceType: r.Offer.InstanceType, InstanceID: r.ID}
}

// MeterMachine describes a launched machine for the meter: it costs from
// launch to termination, whoever uses it. ok is false before launch.
func MeterMachine(r *broker.InstanceRecord, kind billing.PoolKind) (billing.Machine, bool) {
	if r.LaunchedAt == nil {
		return billing.Machine{}, false
	}
	m := billing.Machine{Pool: Pool(r, kind), GPUModel: r.Offer.GPUModel, GPUs: r.Offer.GPUs, Spot: r.Offer.Spot,
		Prices: billing.FlatPrice(r.Offer.PricePerGPUHour()), Start: millis(*r.LaunchedAt),
		DemandTeam: r.Team, DemandQueue: r.Queue}
	if r.TerminatedAt != nil {
		m.End = millis(*r.TerminatedAt)
		if m.End.Before(m.Start) {
			m.End = m.Start
		}
	}
	return m, true
}

func millis(t time.Time) time.Time { return t.UTC().Truncate(time.Millisecond) }

// SortRecords orders records by id.
func SortRecords(rs []*broker.InstanceRecord) {
	slices.SortFunc(rs, func(a, b *broker.InstanceRecord) int { return strings.Compare(a.ID, b.ID) })
}

// RunningJob is a job holding cards on burst machine machine as the
// spill-back decision sees it; startedAt is when its current attempt took
// the cards. The broker and the simulator both build Input.Running with it.
func RunningJob(j *broker.Job, machine string, startedAt time.Time) burst.Running {
	r := burst.Running{ID: j.ID, Machine: machine, GPUs: j.TotalGPUs(), GPUModel: j.Spec.Resources.GPUModel,
		GPUMemory: int64(j.Spec.Resources.GPUMemory), Checkpointable: j.Spec.Checkpoint.To != "", Stopping: j.Stop != nil,
		StartedAt: startedAt, Timeout: j.Spec.Timeout.D(), Grace: j.Spec.Checkpoint.Grace.D(),
		CheckpointEvery: j.Spec.Checkpoint.Interval.D(), LastMoved: burst.LastSpillBack(j)}
	if j.LastCheckpointAt != nil {
		r.LastCheckpoint = *j.LastCheckpointAt
	}
	return r
}
