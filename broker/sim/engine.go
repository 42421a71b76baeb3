// Package sim is `spillway sim`: it replays a job trace through the real
// scheduler core (broker/sched) and the real burst decision
// (broker/burst) on a virtual clock, with simulated on-prem nodes,
// agents and providers, and reports what each burst policy would have
// cost and how long jobs would have waited.
//
// The replay is a discrete-event loop on one goroutine. Events are job
// arrivals, job ends (start + remaining work), checkpointed exits of
// stopped jobs, burst machines becoming ready (launch + a drawn lead
// time), burst ticks and timers. After the events of one instant, one
// scheduling cycle runs, as the broker runs one after a submit or a
// freed GPU: fair-share usage advanced, a snapshot, sched.Schedule, the
// plan applied through the job lifecycle rules of package broker (Start,
// RequestStop, Preempted). The burst controller decides on its own grid
// (burst.interval): broker/burstctl — the executor the broker runs —
// builds the input, burst.Decide decides, and burstctl carries it out on
// the simulated fleet (simFleet): launches with budget reservations in a
// broker.MemStore, fallbacks, binds, drains and scale-downs, idle marks,
// budget months in the billing zone, spend settled slice by slice by the
// broker's meter and Settle. Randomness (lead times, capacity failures)
// comes from generators seeded by Options.Seed, so a seed gives the same
// report to the bit. docs/sim.md has the model and what it leaves out.
package sim

import (
	"context"
	"fmt"
	"github.com/spillway-dev/spillway/broker/burst"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/spillway-dev/spillway/billing"
	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/burstctl"
	"github.com/spillway-dev/spillway/broker/sched"
	"github.com/spillway-dev/spillway/onprem/gpu"
	"github.com/spillway-dev/spillway/providers"
)

// Options are a run's settings besides the trace, cluster and policy.
type Options struct {
	// Seed seeds lead times and capacity failures.
	Seed uint64
	// RecordStarts keeps every start in Result.Starts, in order.
	RecordStarts bool
	// RecordMachines keeps every burst machine's final record in
	// Result.MachineRecords.
	RecordMachines bool
	// MeterOwned prices the on-prem attempts too (Result.OwnedCost).
	MeterOwned bool
	// Prices is a live-price series (LoadPrices), in time order: the
	// offers' prices change as virtual time passes.
	Prices []PriceChange
}

// Start is one start of a job, as the simulator decided it.
type Start struct {
	Job     string    `json:"job"`
	At      time.Time `json:"at"`
	Attempt int       `json:"attempt"`
	// Nodes the job was placed on.
	Nodes []string `json:"nodes"`
	// Burst is true on a burst machine.
	Burst bool `json:"burst,omitempty"`
}

// sjob is one trace job during the replay.
type sjob struct {
	t *Job
	j *broker.Job
	// live is the job's index in engine.live (-1 before arrival and after
	// its end).
	live int
	// remaining is the work left; it shrinks when a preempted attempt
	// checkpoints.
	remaining time.Duration
	// runFrom is when the current attempt took its cards.
	runFrom    time.Time
	firstStart time.Time
	onPrem     int // GPUs of the current attempt on on-prem nodes
	// on are the burst machines of the current attempt (a gang's group, or
	// one machine).
	on []*machine
	// bound are the burst machines the job waits for (state
	// provisioning): one, or a gang's group.
	bound         []*machine
	minWait       time.Duration
	burstStarts   int
	budgetBlocked bool
	// why and est are the scheduler's last pending reason for the job,
	// which the burst input carries (EstimatedStart, Why).
	why string
	est *time.Time
}

type evKind uint8

const (
	evFinish  evKind = iota // a job's work is done
	evStopped               // a stopped job has checkpointed and exited
	evReady                 // a burst machine's agent registered
	evWake                  // a scheduling timer
	evTimeout               // a running job reaches its timeout
	evBurst                 // a burst decision is due
	evNotice                // a spot machine's reclaim notice
	evReclaim               // the provider takes a spot machine back
)

type event struct {
	at      time.Time
	seq     uint64
	kind    evKind
	job     *sjob
	attempt int
	m       *machine
}

// engine is one replay.
type engine struct {
	c      *Cluster
	pol    Policy
	policy sched.Policy
	core   *sched.Scheduler
	opt    Options
	lead   *rand.Rand
	capRNG *rand.Rand
	// reclaimRNG draws the spot machines' times to a reclaim notice.
	reclaimRNG *rand.Rand

	start  time.Time
	now    time.Time
	events []event
	seq    uint64
	// wakeAt and burstAt are the armed scheduling timer and burst tick;
	// nextWake and nextBurst collect the earliest wanted during an
	// instant.
	wakeAt, nextWake   time.Time
	burstAt, nextBurst time.Time
	// every is the burst controller's interval.
	every time.Duration

	jobs         []*sjob
	byID         map[string]*sjob
	next         int // next job to arrive
	live         []*sjob
	pending      int
	provisioning int
	// timeoutDue is set by a timer at a running job's timeout.
	timeoutDue bool
	// heldLimits: some team or project has a quota or some queue a
	// reservation, so GPUs held anywhere count in scheduling decisions.
	heldLimits bool
	// fullSnapshot gives the scheduler every node and job even when
	// heldLimits is false (for the test that the two agree).
	fullSnapshot bool

	// nodes are the on-prem nodes (the first onPremNodes), then the
	// nodes of ready burst machines.
	nodes       []*broker.Node
	onPremNodes int
	onPremGPUs  int
	onPremHeld  int
	largest     int
	// homeIdx indexes the on-prem nodes by name; homeUsed is the GPUs
	// held on each (spillback.go).
	homeIdx  map[string]int
	homeUsed []int

	// alive are the machines not yet ended, in id order; nMachines counts
	// launches.
	alive     []*machine
	aliveByID map[string]*machine // alive by id (machineByID)
	nMachines int
	byNode    map[string]*machine
	active    bool
	// closing are ended machines not yet metered through their end.
	closing []*machine
	// ctl carries out burst decisions on the simulated fleet; budgets
	// holds the budgets, their months and the reservations, kept by the
	// broker's own functions.
	ctl     *burstctl.Controller
	budgets *broker.MemStore
	offers  []providers.Offer
	// coolDowns keep offers out of decisions after a reclaim (the
	// broker's offer cool-downs; burst.OfferSkip reads them).
	coolDowns map[string]burst.CoolDown
	// nextPrice is the first change of Options.Prices not yet applied.
	nextPrice int
	meterCfg  billing.MeterConfig
	// unsettled are the entries of the meter pass under way
	// (meterMachines settles them at its end).
	unsettled []billing.Entry
	waiting   []burstctl.Waiting
	// err is the first error of the in-memory fleet.
	err error
	// usage is the fair-share ledger; usageHeld the GPUs each team's
	// holding attempts hold (attempts start only right after an Advance,
	// so counting them from the ledger's time counts them from their
	// start).
	usage     *sched.Ledger
	usageHeld map[string]int

	snap sched.Snapshot
	rec  recorder
	res  *Result
}

// Run replays tr on cluster c under policy p.
func Run(tr *Trace, c *Cluster, p Policy, opt Options) (*Result, error) {
	e, err := newEngine(tr, c, p, opt)
	if err != nil {
		return nil, err
	}
	e.loop()
	// Meter the last machines through their end.
	e.meterMachines(e.now.Add(e.meterCfg.Slice + time.Hour))
	if e.err != nil {
		return nil, e.err
	}
	return e.finish(), nil
}

func newEngine(tr *Trace, c *Cluster, p Policy, opt Options) (*engine, error) {
	if len(tr.Jobs) == 0 {
		return nil, fmt.Errorf("the trace has no jobs (in the window)")
	}
	queues, prios := map[string]bool{}, map[string]bool{}
	for _, q := range c.Config.Queues {
		queues[q.Name] = true
	}
	for _, pr := range c.Config.Priorities {
		prios[pr.Name] = true
	}
	if err := tr.Validate(queues, prios); err != nil {
		return nil, err
	}
	if p.Wait.Kind == WaitDeclaredCost {
		// costWait=β is the broker's burst.waitPerGPUHour, calibrated on
		// the trace so that the waits sum to β × the declared run time.
		p.Burst.WaitPerGPUHour = DeclaredCostRate(p.Wait.Budget, tr.Jobs)
		p.Wait = WaitRule{}
	}
	e := &engine{
		c: c, pol: p, policy: c.Config.Policy(), core: sched.New(), opt: opt,
		lead:       rand.New(rand.NewPCG(opt.Seed, 0x6c656164)), // "lead"
		capRNG:     rand.New(rand.NewPCG(opt.Seed, 0x63617061)), // "capa"
		reclaimRNG: rand.New(rand.NewPCG(opt.Seed, 0x7265636c)), // "recl"
		coolDowns:  map[string]burst.CoolDown{},
		byID:       make(map[string]*sjob, len(tr.Jobs)), byNode: map[string]*machine{},
		aliveByID: map[string]*machine{},
		every:     c.Config.Burst.Interval.D(), budgets: broker.NewMemStore(), offers: slices.Clone(c.Offers),
		largest: c.LargestNode(), res: &Result{Policy: p.Name, WaitPerGPUHour: p.Burst.WaitPerGPUHour},
	}
	zone := c.Config.BillingCompiled().TimeZone
	if zone == nil {
		zone = time.UTC
	}
	e.ctl = &burstctl.Controller{Fleet: simFleet{e}, Policy: p.Burst, Zone: zone, Currency: c.Currency,
		OfferCoolDown: c.Config.Burst.OfferCoolDown.D()}
	e.meterCfg = c.Config.BillingCompiled().Meter
	e.meterCfg.Currency, e.meterCfg.Overhead = c.Currency, c.Overhead
	if e.meterCfg.Slice == 0 {
		e.meterCfg.Slice = billing.DefaultSlice
	}
	if err := CheckPrices(opt.Prices, c.Offers); err != nil {
		return nil, fmt.Errorf("prices: %w", err)
	}
	start := tr.Jobs[0].Submit
	err := e.budgets.Update(context.Background(), func(tx broker.Tx) error {
		for _, scope := range sortedKeys(c.Budgets) {
			if _, err := broker.SetBudget(tx, scope, c.Budgets[scope], c.Currency, "sim", start); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	e.start, e.now = start, start
	e.nodes = c.nodes(start)
	e.onPremNodes = len(e.nodes)
	e.onPremGPUs = c.OnPremGPUs()
	e.homeIndex()
	e.usage, e.usageHeld = sched.NewLedger(e.policy.FairShareHalfLife, nil, start), map[string]int{}
	for _, t := range e.policy.Teams {
		e.heldLimits = e.heldLimits || t.Quota != nil || len(t.Projects) > 0
	}
	for _, q := range e.policy.Queues {
		e.heldLimits = e.heldLimits || q.Reserved > 0
	}
	nodeCount := 0
	for _, g := range c.Groups {
		nodeCount += g.Count
	}
	waits := jobWaits(p.Wait, tr.Jobs)
	for i := range tr.Jobs {
		t := &tr.Jobs[i]
		if _, dup := e.byID[t.ID]; dup {
			return nil, fmt.Errorf("job id %s appears twice in the trace", t.ID)
		}
		per, n := Shape(t.GPUs, e.largest)
		if n > nodeCount {
			return nil, fmt.Errorf("job %s needs %d nodes of %d GPUs; the cluster has %d nodes", t.ID, n, per, nodeCount)
		}
		sj := &sjob{t: t, live: -1, remaining: t.Duration, minWait: waits[t.ID]}
		e.jobs = append(e.jobs, sj)
		e.byID[t.ID] = sj
	}
	e.rec.init(start, tr.Jobs[len(tr.Jobs)-1].Submit)
	return e, nil
}

// push schedules an event.
func (e *engine) push(ev event) {
	e.seq++
	ev.seq = e.seq
	e.events = append(e.events, ev)
	// sift up
	i := len(e.events) - 1
	for i > 0 {
		p := (i - 1) / 2
		if !e.before(i, p) {
			break
		}
		e.events[i], e.events[p] = e.events[p], e.events[i]
		i = p
	}
}

func (e *engine) before(i, k int) bool {
	a, b := &e.events[i], &e.events[k]
	if c := a.at.Compare(b.at); c != 0 {
		return c < 0
	}
	return a.seq < b.seq
}

func (e *engine) pop() event {
	top := e.events[0]
	last := len(e.events) - 1
	e.events[0] = e.events[last]
	e.events = e.events[:last]
	i := 0
	for {
		l, r := 2*i+1, 2*i+2
		m := i
		if l < last && e.before(l, m) {
			m = l
		}
		if r < last && e.before(r, m) {
			m = r
		}
		if m == i {
			break
		}
		e.events[i], e.events[m] = e.events[m], e.events[i]
		i = m
	}
	return top
}

// nextTime is the time of the next arrival or event; false when nothing
// is left.
func (e *engine) nextTime() (time.Time, bool) {
	var t time.Time
	ok := false
	if e.next < len(e.jobs) {
		t, ok = e.jobs[e.next].t.Submit, true
	}
	if len(e.events) > 0 && (!ok || e.events[0].at.Before(t)) {
		t, ok = e.events[0].at, true
	}
	return t, ok
}

// loop runs the replay: the events of each instant, then a scheduling
// cycle if anything changed, then a burst decision if one is due.
func (e *engine) loop() {
	for {
		t, ok := e.nextTime()
		if !ok {
			return
		}
		e.now = t
		effective, decide := false, false
		for e.next < len(e.jobs) && e.jobs[e.next].t.Submit.Equal(t) {
			e.arrive(e.jobs[e.next])
			e.next++
			effective = true
		}
		for len(e.events) > 0 && e.events[0].at.Equal(t) {
			ev := e.pop()
			if ev.kind == evBurst {
				decide = decide || ev.at.Equal(e.burstAt)
				continue
			}
			if e.handle(ev) {
				effective = true
			}
		}
		if effective {
			e.cycle()
		}
		if decide {
			e.burstAt = time.Time{}
			e.burst()
		}
		if effective || decide || !e.nextBurst.IsZero() {
			e.rec.sample(e)
			e.arm()
		}
		if e.next == len(e.jobs) && len(e.live) == 0 && len(e.alive) == 0 {
			return
		}
	}
}

// arrive submits a job, as the API does after Normalize.
func (e *engine) arrive(sj *sjob) {
	t := sj.t
	per, n := Shape(t.GPUs, e.largest)
	q, _ := e.c.Config.Queue(t.Queue)
	timeout := min(DeclaredTimeout(t.Duration), q.MaxTimeout.D())
	sj.j = &broker.Job{
		ID: t.ID, User: "sim", State: broker.StatePending, SubmittedAt: e.now,
		Spec: broker.Spec{
			Name: t.ID, Team: t.Team, Queue: t.Queue, Priority: t.Priority,
			Resources: broker.Resources{GPUs: per, Nodes: n},
			Timeout:   broker.Duration(timeout), RestartPolicy: broker.RestartNever,
			Preemptible: e.c.Preemptible[t.Priority],
			Checkpoint: broker.Checkpoint{Signal: "SIGTERM", Grace: broker.Duration(e.c.CheckpointGrace),
				To: "s3://sim/checkpoints/" + t.ID, Interval: broker.Duration(e.c.CheckpointInterval)},
			Burst: broker.BurstAllowed, Command: []string{"sim"},
		},
		History: []broker.Transition{{At: e.now, To: broker.StatePending, Reason: "submitted", Detail: "by sim"}},
	}
	sj.live = len(e.live)
	e.live = append(e.live, sj)
	e.pending++
}

// handle applies one event; it reports whether a cycle should follow.
func (e *engine) handle(ev event) bool {
	switch ev.kind {
	case evFinish:
		sj := ev.job
		if sj.j.Attempt != ev.attempt || !sj.j.State.Holding() {
			return false
		}
		on := sj.on
		e.release(sj)
		sj.j.Transit(e.now, broker.StateSucceeded, "exited", "exit code 0")
		e.retire(sj)
		if len(on) > 0 && noneBound(on) && !e.heldLimits {
			// Cards freed on a burst machine no job waits for change no
			// decision of the scheduler's (it places nothing else there,
			// and no quota or queue reservation counts them): only the
			// burst controller's, at its next tick.
			e.wantBurst(e.now)
			return false
		}
		return true
	case evStopped:
		sj := ev.job
		if sj.j.Attempt != ev.attempt || !sj.j.State.Holding() || sj.j.Stop == nil {
			return false
		}
		stop := sj.j.Stop
		e.release(sj)
		if stop.Reason == sched.StopTimedOut {
			sj.j.Transit(e.now, broker.StateTimedOut, "timed_out", fmt.Sprintf("ran past its timeout of %s", sj.j.Spec.Timeout))
			e.retire(sj)
			return true
		}
		if stop.Reason == broker.ReasonSpotReclaim {
			e.endReclaimed(sj)
			return true
		}
		// Preempted (or moved home): the work up to the signal is saved.
		sj.remaining -= stop.RequestedAt.Sub(sj.runFrom)
		sj.j.Preempted(e.now, stop.Reason, stop.Detail)
		e.pending++
		return true
	case evReady:
		e.ready(ev.m)
		return true
	case evNotice:
		return e.notice(ev.m)
	case evReclaim:
		return e.reclaimed(ev.m)
	case evTimeout:
		if ev.job.j.Attempt == ev.attempt && ev.job.j.State.Holding() {
			e.timeoutDue = true
			return true
		}
		return false
	case evWake:
		return ev.at.Equal(e.wakeAt)
	}
	return false
}

// release frees the cards of a job's current attempt.
func (e *engine) release(sj *sjob) {
	e.onPremHeld -= sj.onPrem
	if sj.onPrem > 0 {
		e.holdHome(sj, -1)
		if e.opt.MeterOwned {
			e.meterOwned(sj)
		}
	}
	sj.onPrem = 0
	gpus := sj.j.TotalGPUs()
	for _, m := range sj.on {
		m.running = removeJob(m.running, sj)
		m.dropJob(sj)
		m.allocs = append(m.allocs, e.allocation(sj, m, e.now))
	}
	sj.on = nil
	e.usageHeld[sj.t.Team] -= gpus
	e.usage.Release(sj.t.Team, gpus, sj.runFrom, e.now)
}

// meterOwned prices an ended attempt's on-prem GPU-time: one allocation
// per owned node, as the broker records them, metered through its end.
func (e *engine) meterOwned(sj *sjob) {
	var allocs []billing.Allocation
	for _, p := range sj.j.Placements {
		i, ok := e.homeIdx[p.Node]
		if !ok {
			continue
		}
		n := e.nodes[i]
		model := ""
		if d := n.Inventory.Devices; len(d) > 0 {
			model = gpu.ShortModel(d[0].Model)
		}
		allocs = append(allocs, billing.Allocation{Job: sj.t.ID, Attempt: sj.j.Attempt, Team: sj.t.Team, Queue: sj.t.Queue,
			User: sj.j.User, Pool: billing.Pool{Kind: billing.PoolOnPrem, Name: n.Pool, Node: n.Name}, GPUModel: model,
			GPUMilli: int64(len(p.GPUs)) * 1000, Start: sj.runFrom, End: e.now})
	}
	out := billing.Meter(e.meterCfg, billing.MeterInput{Now: e.now, Allocations: allocs})
	for _, en := range out.Entries {
		e.res.OwnedCost += en.Cost
	}
	e.res.meterProblems += len(out.Problems)
}

// retire takes an ended job out of the live set. The set stays in
// arrival order, which is id order: the scheduler sorts holding jobs by
// id, and sorted input sorts fastest.
func (e *engine) retire(sj *sjob) {
	i := sj.live
	copy(e.live[i:], e.live[i+1:])
	e.live = e.live[:len(e.live)-1]
	for k := i; k < len(e.live); k++ {
		e.live[k].live = k
	}
	sj.live = -1
}

// noneBound reports whether no job waits for any of the machines.
func noneBound(ms []*machine) bool {
	for _, m := range ms {
		if len(m.bound) > 0 {
			return false
		}
	}
	return true
}

// unboundFrom takes a job off the machines it waited for.
func (e *engine) unboundFrom(sj *sjob) {
	for _, m := range sj.bound {
		m.bound = removeJob(m.bound, sj)
		m.dropJob(sj)
	}
	sj.bound = nil
}

func removeJob(js []*sjob, sj *sjob) []*sjob {
	for i, x := range js {
		if x == sj {
			return append(js[:i], js[i+1:]...)
		}
	}
	return js
}

// cycle is one scheduling cycle at e.now: the scheduler core and its
// plan applied. The burst controller decides at its next tick.
func (e *engine) cycle() {
	e.res.Cycles++
	e.usage.Advance(e.now, func(add func(team string, gpus int, from time.Time)) {
		for team, g := range e.usageHeld {
			add(team, g, e.usage.At)
		}
	})
	// A cycle with nothing waiting and no timeout due has an empty plan:
	// the core is skipped, not its decision.
	if e.pending > 0 || e.timeoutDue || e.boundToReady() {
		e.timeoutDue = false
		e.res.SchedulerCycles++
		e.snap.Now = e.now
		e.snap.Policy = e.policy
		e.snapshot()
		e.snap.Usage = e.usage.Values(e.snap.Usage)
		plan := e.core.Schedule(&e.snap)
		e.apply(&plan)
	}
	e.wantBurst(e.now)
}

// snapshot fills the scheduler's input: every node and non-terminal job,
// as the broker's snapshot has them — except, unless some limit counts
// GPUs held anywhere (heldLimits), the burst machines no bound job waits
// for and the jobs running on them. The scheduler places nothing on a
// burst node but the jobs bound to it, finds preemption victims only where
// the preemptor can run (on-prem), and without quotas or queue
// reservations counts held GPUs nowhere else, so its plan is the same;
// TestSnapshotWithoutIdleBurstNodes checks that it is.
func (e *engine) snapshot() {
	e.snap.Jobs = e.snap.Jobs[:0]
	if e.heldLimits || e.fullSnapshot {
		e.snap.Nodes = e.nodes
		for _, sj := range e.live {
			e.snap.Jobs = append(e.snap.Jobs, sj.j)
		}
		return
	}
	e.snap.Nodes = append(e.snap.Nodes[:0], e.nodes[:e.onPremNodes]...)
	for _, m := range e.alive {
		if m.node != nil && len(m.bound) > 0 {
			e.snap.Nodes = append(e.snap.Nodes, m.node)
		}
	}
	for _, sj := range e.live {
		if len(sj.on) > 0 && noneBound(sj.on) {
			continue
		}
		e.snap.Jobs = append(e.snap.Jobs, sj.j)
	}
}

// boundToReady reports whether a job waits for a machine that is ready:
// the only work of a cycle with nothing pending (sched's placeBound).
func (e *engine) boundToReady() bool {
	if e.provisioning == 0 {
		return false
	}
	for _, m := range e.alive {
		if m.rec.State == broker.MachineReady && len(m.bound) > 0 {
			return true
		}
	}
	return false
}

// apply carries a plan out through the job lifecycle rules, with
// simulated agents that start jobs at once and report their ends. Jobs
// the burst controller bound to a machine (provisioning) start on it
// through the same plan (sched's placeBound).
func (e *engine) apply(plan *sched.Plan) {
	for _, st := range plan.Starts {
		sj := e.byID[st.Job]
		if sj == nil || (sj.j.State != broker.StatePending && sj.j.State != broker.StateProvisioning) {
			continue
		}
		j := sj.j
		if j.State == broker.StateProvisioning {
			e.provisioning--
			e.unboundFrom(sj)
		} else {
			e.pending--
		}
		j.Start(st.Placements, e.now)
		t := e.now
		j.StartedAt = &t
		j.Transit(e.now, broker.StateRunning, "started", "")
		sj.why, sj.est = "", nil
		sj.runFrom = e.now
		if sj.firstStart.IsZero() {
			sj.firstStart = e.now
		} else {
			e.res.Resumptions++
		}
		for _, p := range st.Placements {
			if m := e.byNode[p.Node]; m != nil {
				if !slices.Contains(sj.on, m) {
					sj.on = append(sj.on, m)
					m.running = append(m.running, sj)
					m.addJob(sj)
				}
			} else {
				sj.onPrem += len(p.GPUs)
			}
		}
		e.onPremHeld += sj.onPrem
		if sj.onPrem > 0 {
			e.holdHome(sj, 1)
		}
		e.usageHeld[sj.t.Team] += j.TotalGPUs()
		if len(sj.on) > 0 {
			sj.burstStarts++
		}
		if e.opt.RecordStarts {
			e.res.Starts = append(e.res.Starts, Start{Job: j.ID, At: e.now, Attempt: j.Attempt, Nodes: j.Nodes(), Burst: len(sj.on) > 0})
		}
		e.push(event{at: e.now.Add(sj.remaining), kind: evFinish, job: sj, attempt: j.Attempt})
		if to := j.Spec.Timeout.D(); to > 0 && sj.remaining > to {
			e.push(event{at: e.now.Add(to), kind: evTimeout, job: sj, attempt: j.Attempt})
		}
	}
	for _, st := range plan.Stops {
		if sj := e.byID[st.Job]; sj != nil {
			e.stop(sj, st.Reason, st.Detail, "scheduler")
		}
	}
	for _, pe := range plan.Pending {
		if sj := e.byID[pe.Job]; sj != nil {
			sj.why, sj.est = pe.Reason.Code(), pe.Reason.EstimatedStart()
		}
	}
}

// stop asks a holding job to stop: the simulated job saves its work at
// the signal and exits CheckpointTime later.
func (e *engine) stop(sj *sjob, reason, detail, by string) {
	if sj.j.RequestStop(reason, detail, by, e.now) {
		e.stopRequested(sj)
	}
}

// stopRequested starts the simulated job's exit after a stop request.
func (e *engine) stopRequested(sj *sjob) {
	switch sj.j.Stop.Reason {
	case sched.StopPreempted:
		e.res.Preemptions++
	case burst.StopSpillBack:
		e.res.SpillBacks++
	case broker.ReasonSpotReclaim:
		// The job saves its work unless its checkpoint takes longer than
		// the grace the notice leaves: then it runs until the machine goes.
		if at, ok := reclaimedAt(sj.on); ok && e.c.CheckpointTime > sj.j.Stop.Grace {
			e.push(event{at: at, kind: evStopped, job: sj, attempt: sj.j.Attempt})
			return
		}
	}
	e.push(event{at: e.now.Add(e.c.CheckpointTime), kind: evStopped, job: sj, attempt: sj.j.Attempt})
}

// reclaimedAt is the earliest time a provider takes back one of a job's
// machines (a gang runs on several), if it takes any.
func reclaimedAt(on []*machine) (time.Time, bool) {
	var at time.Time
	for _, m := range on {
		if r := m.rec.Reclaim; r != nil && (at.IsZero() || r.At.Before(at)) {
			at = r.At
		}
	}
	return at, !at.IsZero()
}

// wantWake asks for a scheduling cycle at t.
func (e *engine) wantWake(t time.Time) {
	if t.After(e.now) && (e.nextWake.IsZero() || t.Before(e.nextWake)) {
		e.nextWake = t
	}
}

// wantBurst asks for a burst decision at the controller's first tick at
// or after t (ticks fall every burst.interval from the replay's start).
func (e *engine) wantBurst(t time.Time) {
	if e.pol.NoOffers {
		return // no provider: the broker's burst loop does not run
	}
	if t.Before(e.now) {
		t = e.now
	}
	if !e.nextBurst.IsZero() && !t.Before(e.nextBurst) {
		return
	}
	if k := t.Sub(e.start) % e.every; k != 0 {
		t = t.Add(e.every - k)
	}
	if e.nextBurst.IsZero() || t.Before(e.nextBurst) {
		e.nextBurst = t
	}
}

// arm sets the timers after an instant: a scheduling cycle when a pending
// job reaches the starvation age in the queue (or one was asked for), and a burst tick
// for what the controller waits on — minimum waits (noted by burst), an
// idle machine's TTL, a machine's lifetime, a new budget month for jobs a
// budget holds back.
func (e *engine) arm() {
	if age := e.policy.StarvationAge; age > 0 && e.pending > 0 {
		for _, sj := range e.live {
			if sj.j.State == broker.StatePending {
				e.wantWake(sj.j.LastQueued().Add(age))
			}
		}
	}
	if w := e.nextWake; !w.IsZero() && (e.wakeAt.IsZero() || !e.wakeAt.After(e.now) || w.Before(e.wakeAt)) {
		e.wakeAt = w
		e.push(event{at: w, kind: evWake})
	}
	e.nextWake = time.Time{}

	p := e.pol.Burst
	lifetime := p.MaxLifetime > 0
	for _, m := range e.alive {
		if m.rec.State != broker.MachineReady {
			continue
		}
		// Machines are in launch order: the first ready one reaches its
		// lifetime first.
		if lifetime {
			e.wantBurst(m.rec.LaunchedAt.Add(p.MaxLifetime))
			lifetime = false
		}
		if m.rec.IdleSince != nil {
			e.wantBurst(m.rec.IdleSince.Add(p.IdleTTL))
		}
	}
	if e.res.BudgetBlockedJobs > 0 && e.pending > 0 {
		e.wantBurst(e.ctl.MonthEnd(e.now))
	}
	if b := e.nextBurst; !b.IsZero() && (e.burstAt.IsZero() || !e.burstAt.After(e.now) || b.Before(e.burstAt)) {
		e.burstAt = b
		e.push(event{at: b, kind: evBurst})
	}
	e.nextBurst = time.Time{}
}
