// Package burst decides when Spillway rents capacity, and what: a pure
// function from a snapshot (on-prem allocation, waiting work, machines in
// flight, offers, budgets, the clock) to a Decision — launches, jobs bound
// to machines, machines to scale down, and a reason for every waiting job
// that does not go out. It does no I/O; the broker carries the decision
// out, and `spillway burst plan` and the simulator print or replay it.
package burst

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/spillway-dev/spillway/billing"
	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/providers"
)

// Policy is the burst configuration.
type Policy struct {
	// Threshold is the on-prem GPU allocation (0..1) at or above which
	// waiting work may burst.
	Threshold float64 `json:"threshold"`
	// Hysteresis: once bursting, keep going until allocation falls below
	// Threshold-Hysteresis, so decisions do not flap around the line.
	Hysteresis float64 `json:"hysteresis"`
	// MinWait is how long burst-eligible work waits before it bursts.
	MinWait time.Duration `json:"minWait"`
	// WaitPerGPUHour, when positive, replaces MinWait with a minimum wait
	// per job in proportion to what the job would cost in the cloud: this
	// much for every GPU-hour it declares (GPUs × nodes × timeout). Small,
	// short jobs go out almost at once; large, long ones wait for owned
	// capacity (Starburst's linear_cost, on declared timeouts). A queue's
	// own minWait still overrides it.
	WaitPerGPUHour time.Duration `json:"waitPerGPUHour,omitempty"`
	// MaxWait, when positive, caps the wait WaitPerGPUHour gives one job:
	// large, long work still waits for owned GPUs first, but not past a
	// bound (a gang of 2 × 8 GPUs for 3 days would otherwise wait 1,152
	// times WaitPerGPUHour).
	MaxWait time.Duration `json:"maxWait,omitempty"`
	// MaxWaitMultiNode, when positive, is MaxWait for multi-node jobs. A
	// gang needs several whole owned nodes free at once, which a busy
	// site seldom has, so waiting in proportion to its cost buys it far
	// less owned capacity than it buys a single-node job (on the
	// simulator's standard scenario, days of waiting).
	MaxWaitMultiNode time.Duration `json:"maxWaitMultiNode,omitempty"`
	// MaxInFlight caps machines being requested, provisioned or
	// bootstrapped at once; MaxInFlightPerProvider caps them per provider.
	MaxInFlight            int `json:"maxInFlight"`
	MaxInFlightPerProvider int `json:"maxInFlightPerProvider"`
	// IdleTTL ends a machine that has had no job this long.
	IdleTTL time.Duration `json:"idleTTL"`
	// MaxLifetime ends every machine this long after launch, and caps the
	// projected cost of a launch.
	MaxLifetime time.Duration `json:"maxLifetime"`
	// LeaseMargin drains leased hosts this long before their lease ends.
	LeaseMargin time.Duration `json:"leaseMargin"`
	// Queues override the trigger per queue.
	Queues map[string]QueuePolicy `json:"queues,omitempty"`
	// Priorities maps class names to values (higher first).
	Priorities map[string]int `json:"priorities,omitempty"`
	// SpillBack moves jobs home when owned GPUs stand idle.
	SpillBack SpillBackPolicy `json:"spillBack,omitzero"`
}

// QueuePolicy overrides the trigger for one queue. Zero values inherit.
type QueuePolicy struct {
	Threshold float64       `json:"threshold,omitempty"`
	MinWait   time.Duration `json:"minWait,omitempty"`
	// WaitTarget: a job whose estimated start (by the scheduler's
	// reservation) is further than this from when it began waiting bursts
	// without waiting MinWait.
	WaitTarget time.Duration `json:"waitTarget,omitempty"`
	// Never keeps the queue's work on-prem whatever its jobs say.
	Never bool `json:"never,omitempty"`
}

// DefaultPolicy is the shipped configuration.
func DefaultPolicy() Policy {
	return Policy{Threshold: 0.8, Hysteresis: 0.1, MinWait: 2 * time.Minute, MaxInFlight: 8, MaxInFlightPerProvider: 4,
		IdleTTL: 10 * time.Minute, MaxLifetime: 24 * time.Hour, LeaseMargin: time.Hour}
}

// Job is a pending job as the burst controller sees it.
type Job struct {
	ID          string             `json:"id"`
	Team        string             `json:"team"`
	Queue       string             `json:"queue"`
	Priority    string             `json:"priority"`
	Burst       broker.BurstPolicy `json:"burst"`
	Preemptible bool               `json:"preemptible"`
	GPUs        int                `json:"gpus"`
	Nodes       int                `json:"nodes"`
	GPUModel    string             `json:"gpuModel,omitempty"`
	GPUMemory   int64              `json:"gpuMemory,omitempty"`
	Timeout     time.Duration      `json:"timeout"`
	// WaitingSince is when the job last entered the queue.
	WaitingSince time.Time `json:"waitingSince"`
	// EstimatedStart is the scheduler's reservation for it, if any.
	EstimatedStart *time.Time `json:"estimatedStart,omitempty"`
	// Machine is the burst machine the job is bound to, if any.
	Machine string `json:"machine,omitempty"`
	// Why is the scheduler's pending reason code.
	Why string `json:"why,omitempty"`
	// MinWait, when positive, replaces the queue's and the policy's
	// minimum wait for this job alone: per-job waiting policies (the
	// simulator's Starburst policies) set it.
	MinWait time.Duration `json:"minWait,omitempty"`
}

// MinWaitFor is how long job j waits before it may burst: its own
// MinWait when set, else its queue's minWait, else WaitPerGPUHour × its
// declared GPU-hours (at most MaxWait, or MaxWaitMultiNode for a
// multi-node job, when set) when that is set, else the policy's MinWait.
func (p Policy) MinWaitFor(j Job) time.Duration {
	switch q := p.Queues[j.Queue]; {
	case j.MinWait > 0:
		return j.MinWait
	case q.MinWait > 0:
		return q.MinWait
	case p.WaitPerGPUHour > 0:
		gpuHours := float64(j.GPUs*max(1, j.Nodes)) * j.Timeout.Hours()
		w := time.Duration(float64(p.WaitPerGPUHour) * gpuHours)
		limit := p.MaxWait
		if j.Nodes > 1 && p.MaxWaitMultiNode > 0 {
			limit = p.MaxWaitMultiNode
		}
		if limit > 0 {
			w = min(w, limit)
		}
		return w
	}
	return p.MinWait
}

// Machine is a burst machine the broker has a record of.
type Machine struct {
	ID       string              `json:"id"`
	Provider string              `json:"provider"`
	Offer    providers.Offer     `json:"offer"`
	State    broker.MachineState `json:"state"`
	Team     string              `json:"team"`
	// Group is the gang launch the machine belongs to (empty when it was
	// launched alone): such a machine takes no other job, and its group
	// scales down together.
	Group string `json:"group,omitempty"`
	// Jobs bound to the machine (waiting for it or running on it), and
	// the GPUs they take.
	Jobs     []string `json:"jobs,omitempty"`
	GPUsUsed int      `json:"gpusUsed"`
	// ReadyGPUs is how many of its GPUs the agent has registered.
	ReadyGPUs  int       `json:"readyGpus"`
	LaunchedAt time.Time `json:"launchedAt"`
	// IdleSince is when the machine last became jobless (zero when busy).
	IdleSince time.Time `json:"idleSince"`
}

// Budget is one scope's money this month.
type Budget struct {
	Limit     billing.Amount `json:"limit"`
	Committed billing.Amount `json:"committed"` // spent + reserved
}

// Input is everything a decision may look at.
type Input struct {
	Now    time.Time `json:"now"`
	Policy Policy    `json:"policy"`
	// OnPremGPUs is the healthy on-prem GPUs, OnPremAllocated those held.
	OnPremGPUs      int       `json:"onPremGPUs"`
	OnPremAllocated int       `json:"onPremAllocated"`
	Pending         []Job     `json:"pending"`
	Machines        []Machine `json:"machines"`
	// Offers from every provider; unavailable ones are skipped, and so
	// are those cooling down (CoolDowns, by Offer.Key; offers.go).
	Offers    []providers.Offer   `json:"offers"`
	CoolDowns map[string]CoolDown `json:"coolDowns,omitempty"`
	// Budgets by scope (broker.GlobalScope and team names); a team with
	// no entry has no limit; without a global entry nothing bursts.
	Budgets  map[string]Budget `json:"budgets"`
	Currency string            `json:"currency"`
	// Active is the hysteresis state the last decision left.
	Active bool `json:"active"`
	// Running are the jobs holding GPUs on burst machines, Home the owned
	// nodes with free GPUs, HomeRate the owned GPUs' rate per GPU-hour:
	// what spill-back weighs (spillback.go).
	Running  []Running      `json:"running,omitempty"`
	Home     []HomeNode     `json:"home,omitempty"`
	HomeRate billing.Amount `json:"homeRate,omitempty"`
}

// Launch is one machine to start, for these jobs, or, for a gang, Nodes
// identical machines of one offer (one zone, one placement group), one
// per member, started all or none.
type Launch struct {
	Offer providers.Offer `json:"offer"`
	// Fallbacks are the next offers that fit the same jobs, tried in order
	// when the provider has no capacity or quota for Offer.
	Fallbacks []providers.Offer `json:"fallbacks,omitempty"`
	Jobs      []string          `json:"jobs"`
	Team      string            `json:"team"`
	Queue     string            `json:"queue"`
	// GPUs are the GPUs the jobs take on each machine.
	GPUs int `json:"gpus"`
	// Nodes is how many machines to start: the gang's members (0 or 1 for
	// a machine of its own).
	Nodes int `json:"nodes,omitempty"`
	// ProjectedCost is what the launch reserves: every machine's.
	ProjectedCost billing.Amount `json:"projectedCost"`
	// Hours is the time the projection charges for.
	Hours float64 `json:"hours"`
}

// Bind puts a waiting job on a machine already launched.
type Bind struct {
	Job     string `json:"job"`
	Machine string `json:"machine"`
}

// Stop ends a machine.
type Stop struct {
	Machine string `json:"machine"`
	Reason  string `json:"reason"` // idle | max_lifetime | lease_ending | drained | spill_back
	Detail  string `json:"detail"`
}

// Decision is what the controller would do now.
type Decision struct {
	Active     bool     `json:"active"`
	Allocation float64  `json:"allocation"`
	Launches   []Launch `json:"launches,omitempty"`
	Binds      []Bind   `json:"binds,omitempty"`
	Stops      []Stop   `json:"stops,omitempty"`
	// Reasons says, for every waiting burst-eligible job that is neither
	// launched for nor bound, why not.
	Reasons map[string]broker.PendingReason `json:"reasons,omitempty"`
	// SpillBacks are the machines whose jobs move home (a whole machine
	// also a Stop with reason StopSpillBack; a partial move stops only
	// its jobs, burstctl.Apply); Stays says, per ready machine spill-back
	// weighed and kept, why.
	SpillBacks []SpillBack       `json:"spillBacks,omitempty"`
	Stays      map[string]string `json:"stays,omitempty"`
	// StayRules is, per machine in Stays, the rule that keeps it (Stay*).
	StayRules map[string]string `json:"stayRules,omitempty"`
}

// Reason codes the decision puts on waiting jobs.
const (
	CodeBelowThreshold = "below_threshold"
	CodeMinWait        = "burst_min_wait"
	CodeBudget         = "budget"
	CodeNoOffer        = "no_offer"
	CodeCapped         = "burst_capped"
	CodeInProgress     = "burst_in_progress"
	CodeNotEligible    = "burst_not_eligible"
)

// Decide computes the decision for one moment.
func Decide(in *Input) Decision {
	p := in.Policy
	d := Decision{Reasons: map[string]broker.PendingReason{}}
	d.Allocation = 1
	if in.OnPremGPUs > 0 {
		d.Allocation = float64(in.OnPremAllocated) / float64(in.OnPremGPUs)
	}
	d.Active = in.Active
	switch {
	case d.Allocation >= p.Threshold:
		d.Active = true
	case d.Allocation < p.Threshold-p.Hysteresis:
		d.Active = false
	}

	machines := make(map[string]*Machine, len(in.Machines))
	inFlight, perProvider := 0, map[string]int{}
	for i := range in.Machines {
		m := &in.Machines[i]
		machines[m.ID] = m
		if m.State.InFlight() {
			inFlight++
			perProvider[m.Provider]++
		}
	}
	d.Stops = scaleDown(in)
	stopping := map[string]bool{}
	for _, s := range d.Stops {
		stopping[s.Machine] = true
	}
	d.SpillBacks, d.Stays, d.StayRules = spillBack(in, stopping)
	var moved []Stop
	for _, sb := range d.SpillBacks {
		if sb.Whole { // the machine drains and ends; otherwise its jobs move one by one (burstctl)
			moved = append(moved, Stop{Machine: sb.Machine, Reason: StopSpillBack, Detail: sb.Detail})
		}
	}
	for _, s := range withGroups(in.Machines, moved) { // a gang's group ends together
		stopping[s.Machine] = true
		d.Stops = append(d.Stops, s)
	}

	offers := usableOffers(in)
	budgets := map[string]Budget{}
	for k, v := range in.Budgets {
		budgets[k] = v
	}

	jobs := slices.Clone(in.Pending)
	slices.SortFunc(jobs, func(a, b Job) int {
		if c := cmp.Compare(p.Priorities[b.Priority], p.Priorities[a.Priority]); c != 0 {
			return c
		}
		if c := a.WaitingSince.Compare(b.WaitingSince); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	// Spare room on machines launched but not full: jobs of the same team
	// may be bound to them (warm machines before new ones).
	// spare[i] is the room on in.Machines[i]; -1 when it takes no job.
	spare := make([]int, len(in.Machines))
	for i, m := range in.Machines {
		spare[i] = -1
		if (m.State.InFlight() || m.State == broker.MachineReady) && !stopping[m.ID] && m.Group == "" {
			spare[i] = m.Offer.GPUs - m.GPUsUsed
		}
	}
	var planned []*Launch
	var demand map[likeKey]int // built when a job first needs a new machine

	for _, j := range jobs {
		if j.Machine != "" {
			if m, ok := machines[j.Machine]; ok {
				d.Reasons[j.ID] = inProgress(m)
			}
			continue
		}
		q := p.Queues[j.Queue]
		if j.Burst == broker.BurstNever || q.Never {
			continue
		}
		prefer := j.Burst == broker.BurstPrefer
		thr := p.Threshold
		if q.Threshold > 0 {
			thr = q.Threshold
		}
		if d.Active && q.Threshold == 0 {
			thr = p.Threshold - p.Hysteresis
		}
		if !prefer && d.Allocation < thr {
			d.Reasons[j.ID] = broker.PendingReason{Code: CodeBelowThreshold,
				Message: fmt.Sprintf("below threshold: on-prem %.0f%% < %.0f%%", 100*d.Allocation, 100*thr)}
			continue
		}
		minWait := p.MinWaitFor(j)
		waited := in.Now.Sub(j.WaitingSince)
		missesTarget := q.WaitTarget > 0 && j.EstimatedStart != nil && j.EstimatedStart.Sub(j.WaitingSince) > q.WaitTarget
		if !prefer && waited < minWait && !missesTarget {
			d.Reasons[j.ID] = broker.PendingReason{Code: CodeMinWait,
				Message: fmt.Sprintf("waiting %s of the %s minimum before bursting", broker.FormatDuration(waited.Truncate(time.Second)), broker.FormatDuration(minWait))}
			continue
		}
		if j.Nodes > 1 {
			if l, reason, ok := planGang(in, j, offers, budgets, &inFlight, perProvider); ok {
				planned = append(planned, l)
			} else {
				d.Reasons[j.ID] = reason
			}
			continue
		}
		// A machine already on its way or idle with room, same team.
		if i := bindable(in.Machines, spare, j); i >= 0 {
			spare[i] -= j.GPUs
			d.Binds = append(d.Binds, Bind{Job: j.ID, Machine: in.Machines[i].ID})
			continue
		}
		// Room in a launch planned this round.
		if l := packInto(planned, j); l != nil {
			l.Jobs = append(l.Jobs, j.ID)
			l.GPUs += j.GPUs
			continue
		}
		fit := fitting(offers, j)
		if len(fit) == 0 {
			d.Reasons[j.ID] = broker.PendingReason{Code: CodeNoOffer, Message: noOfferMessage(j)}
			continue
		}
		if inFlight >= p.MaxInFlight {
			d.Reasons[j.ID] = broker.PendingReason{Code: CodeCapped,
				Message: fmt.Sprintf("burst capped: %d machines already starting (maxInFlight %d)", inFlight, p.MaxInFlight)}
			continue
		}
		if demand == nil {
			demand = demandByKind(jobs)
		}
		remaining := max(demand[likeKey{j.Team, j.GPUModel, j.Preemptible}], j.GPUs)
		offer, fallbacks, ok := chooseOffer(fit, j, remaining, perProvider, p.MaxInFlightPerProvider)
		if !ok {
			d.Reasons[j.ID] = broker.PendingReason{Code: CodeCapped,
				Message: fmt.Sprintf("burst capped: every provider with a fitting offer has %d machines starting", p.MaxInFlightPerProvider)}
			continue
		}
		hours := projectedDuration(j.Timeout, p.MaxLifetime).Hours()
		cost := ProjectedCost(offer, j.Timeout, p.MaxLifetime)
		if why, blocked := overBudget(budgets, j.Team, cost, in.Currency); blocked && !offer.Prepaid {
			d.Reasons[j.ID] = broker.PendingReason{Code: CodeBudget, Message: why}
			continue
		}
		if !offer.Prepaid {
			charge(budgets, j.Team, cost)
		}
		inFlight++
		perProvider[offer.Provider]++
		planned = append(planned, &Launch{Offer: offer, Fallbacks: fallbacks, Jobs: []string{j.ID}, Team: j.Team,
			Queue: j.Queue, GPUs: j.GPUs, ProjectedCost: cost, Hours: hours})
	}
	for _, l := range planned {
		d.Launches = append(d.Launches, *l)
	}
	return d
}

func inProgress(m *Machine) broker.PendingReason {
	msg := fmt.Sprintf("burst in progress: %s %s %s", m.Provider, m.ID, m.State)
	if m.State == broker.MachineBootstrapping || m.State == broker.MachineReady {
		msg += fmt.Sprintf(" (%d/%d GPUs ready)", m.ReadyGPUs, m.Offer.GPUs)
	}
	return broker.PendingReason{Code: CodeInProgress, Message: msg}
}

// planGang plans the machines for gang j: Nodes machines of one offer,
// each fitting one member, all or none. The in-flight caps count every
// machine of the group (a group larger than a cap starts only when
// nothing else is starting), and the budgets must take every machine's
// projected cost.
func planGang(in *Input, j Job, offers []providers.Offer, budgets map[string]Budget, inFlight *int, perProvider map[string]int) (*Launch, broker.PendingReason, bool) {
	p := in.Policy
	n := j.Nodes
	fit := fitting(offers, j)
	if len(fit) == 0 {
		return nil, broker.PendingReason{Code: CodeNoOffer, Message: noOfferMessage(j) + " per node"}, false
	}
	if *inFlight >= p.MaxInFlight || (*inFlight > 0 && *inFlight+n > p.MaxInFlight) {
		return nil, broker.PendingReason{Code: CodeCapped,
			Message: fmt.Sprintf("burst capped: %d machines already starting, the gang needs %d (maxInFlight %d)", *inFlight, n, p.MaxInFlight)}, false
	}
	capOpen := map[string]int{}
	for prov, k := range perProvider {
		if p.MaxInFlightPerProvider > 0 && k > 0 && k+n > p.MaxInFlightPerProvider {
			capOpen[prov] = p.MaxInFlightPerProvider // full for this gang
		} else {
			capOpen[prov] = 0
		}
	}
	offer, fallbacks, ok := chooseOffer(fit, j, j.GPUs, capOpen, p.MaxInFlightPerProvider)
	if !ok {
		return nil, broker.PendingReason{Code: CodeCapped,
			Message: fmt.Sprintf("burst capped: every provider with a fitting offer has machines starting and room for fewer than %d (maxInFlightPerProvider %d)", n, p.MaxInFlightPerProvider)}, false
	}
	hours := projectedDuration(j.Timeout, p.MaxLifetime).Hours()
	cost := ProjectedCost(offer, j.Timeout, p.MaxLifetime) * billing.Amount(n)
	if why, blocked := overBudget(budgets, j.Team, cost, in.Currency); blocked && !offer.Prepaid {
		return nil, broker.PendingReason{Code: CodeBudget, Message: why}, false
	}
	if !offer.Prepaid {
		charge(budgets, j.Team, cost)
	}
	*inFlight += n
	perProvider[offer.Provider] += n
	return &Launch{Offer: offer, Fallbacks: fallbacks, Jobs: []string{j.ID}, Team: j.Team, Queue: j.Queue,
		GPUs: j.GPUs, Nodes: n, ProjectedCost: cost, Hours: hours}, broker.PendingReason{}, true
}

// offerFits reports whether one machine of o can run j.
func offerFits(o providers.Offer, j Job) bool {
	if o.GPUs < j.GPUs {
		return false
	}
	if o.Spot && !j.Preemptible {
		return false
	}
	if j.GPUModel != "" && !strings.Contains(strings.ToLower(o.GPUModel), strings.ToLower(j.GPUModel)) {
		return false
	}
	if j.GPUMemory > 0 && o.GPUMemoryBytes > 0 && o.GPUMemoryBytes < j.GPUMemory {
		return false
	}
	return true
}

func fitting(offers []providers.Offer, j Job) []providers.Offer {
	var out []providers.Offer
	for _, o := range offers {
		if offerFits(o, j) {
			out = append(out, o)
		}
	}
	return out
}

func noOfferMessage(j Job) string {
	switch {
	case j.GPUModel != "":
		return fmt.Sprintf("no offer fits gpuModel=%s with %d GPUs", j.GPUModel, j.GPUs)
	default:
		return fmt.Sprintf("no offer has %d GPUs", j.GPUs)
	}
}

// likeKey groups the waiting jobs that could share a machine: same team,
// same constraints.
type likeKey struct {
	team, model string
	preemptible bool
}

// demandByKind sums the GPUs of the waiting jobs not yet on a machine that
// could share one, by likeKey: what a bigger machine could be filled
// with.
func demandByKind(jobs []Job) map[likeKey]int {
	out := map[likeKey]int{}
	for _, o := range jobs {
		if o.Machine == "" && o.Nodes <= 1 && o.Burst != broker.BurstNever {
			out[likeKey{o.Team, o.GPUModel, o.Preemptible}] += o.GPUs
		}
	}
	return out
}

// chooseOffer picks the offer for a new machine: prepaid capacity first;
// otherwise the lowest price per GPU-hour among the machines that the
// waiting demand can fill, then the smaller machine. The other fitting
// offers, in SortOffers order, are the fallbacks.
func chooseOffer(fit []providers.Offer, j Job, demand int, perProvider map[string]int, capPer int) (providers.Offer, []providers.Offer, bool) {
	var open []providers.Offer
	for _, o := range fit {
		if capPer <= 0 || perProvider[o.Provider] < capPer {
			open = append(open, o)
		}
	}
	if len(open) == 0 {
		return providers.Offer{}, nil, false
	}
	best := -1
	for i, o := range open {
		if o.GPUs > demand && o.GPUs > j.GPUs && !o.Prepaid {
			continue // more GPUs than anything waiting could use
		}
		if best < 0 || better(o, open[best]) {
			best = i
		}
	}
	if best < 0 {
		best = 0 // only oversized machines: the cheapest per hour
		for i, o := range open {
			if o.PricePerHour < open[best].PricePerHour {
				best = i
			}
		}
	}
	chosen := open[best]
	key := chosen.Key()
	var rest []providers.Offer
	for _, o := range fit {
		if o.Key() != key {
			rest = append(rest, o)
		}
	}
	return chosen, rest, true
}

func better(a, b providers.Offer) bool {
	if a.Prepaid != b.Prepaid {
		return a.Prepaid
	}
	pa, pb := a.PricePerGPUHour(), b.PricePerGPUHour()
	if pa != pb {
		return pa < pb
	}
	if a.GPUs != b.GPUs {
		return a.GPUs < b.GPUs
	}
	return a.Key() < b.Key()
}

func packInto(planned []*Launch, j Job) *Launch {
	for _, l := range planned {
		if l.Nodes > 1 {
			continue // a gang's machines are its own
		}
		if l.Team == j.Team && l.GPUs+j.GPUs <= l.Offer.GPUs && offerFits(l.Offer, j) {
			return l
		}
	}
	return nil
}

// bindable is the index in ms of the first machine of j's team with room
// for it (spare, from Decide), or -1.
func bindable(ms []Machine, spare []int, j Job) int {
	for i := range ms {
		m := &ms[i]
		if spare[i] < j.GPUs || m.Team != j.Team {
			continue
		}
		if offerFits(m.Offer, j) {
			return i
		}
	}
	return -1
}

// projectedDuration is the job's timeout capped by the machine's
// lifetime: the time a launch's projection charges for.
func projectedDuration(timeout, maxLifetime time.Duration) time.Duration {
	d := timeout
	if d <= 0 || (maxLifetime > 0 && d > maxLifetime) {
		d = maxLifetime
	}
	return d
}

// ProjectedCost is what a machine of offer o is projected to cost: its
// price for the longest timeout of its jobs, capped by the machine
// lifetime, to the micro. It is what a launch reserves against the
// budgets.
func ProjectedCost(o providers.Offer, timeout, maxLifetime time.Duration) billing.Amount {
	return o.PricePerHour.MulDiv(projectedDuration(timeout, maxLifetime).Milliseconds(), billing.MillisPerHour)
}

func overBudget(b map[string]Budget, team string, cost billing.Amount, currency string) (string, bool) {
	g, ok := b[broker.GlobalScope]
	if !ok {
		return "burst blocked: no global burst budget is set (spillway budget set --global AMOUNT)", true
	}
	if t, ok := b[team]; ok && t.Committed+cost > t.Limit {
		return fmt.Sprintf("burst blocked: budget %s %s/%s %s this month (needs %s more)", team,
			Money(t.Committed), Money(t.Limit), currency, Money(cost)), true
	}
	if g.Committed+cost > g.Limit {
		return fmt.Sprintf("burst blocked: global budget %s/%s %s this month (needs %s more)",
			Money(g.Committed), Money(g.Limit), currency, Money(cost)), true
	}
	return "", false
}

func charge(b map[string]Budget, team string, cost billing.Amount) {
	for _, scope := range []string{team, broker.GlobalScope} {
		if v, ok := b[scope]; ok {
			v.Committed += cost
			b[scope] = v
		}
	}
}

// Money prints an amount with thousands separators: "4,980.00".
func Money(a billing.Amount) string {
	s := a.Cents()
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	whole, frac, _ := strings.Cut(s, ".")
	var b strings.Builder
	for i, r := range whole {
		if i > 0 && (len(whole)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(r)
	}
	out := b.String() + "." + frac
	if neg {
		out = "-" + out
	}
	return out
}

// scaleDown ends machines idle past the TTL, past their lifetime, or near
// the end of their lease, in machine id order.
func scaleDown(in *Input) []Stop {
	p := in.Policy
	var out []Stop
	for i := range in.Machines {
		m := &in.Machines[i]
		if m.State != broker.MachineReady && m.State != broker.MachineDraining {
			continue
		}
		id := m.ID
		switch {
		case p.MaxLifetime > 0 && !m.LaunchedAt.IsZero() && in.Now.Sub(m.LaunchedAt) >= p.MaxLifetime:
			out = append(out, Stop{Machine: id, Reason: "max_lifetime",
				Detail: fmt.Sprintf("reached the %s maximum lifetime", broker.FormatDuration(p.MaxLifetime))})
		case m.Offer.LeaseEnds != nil && m.Offer.LeaseEnds.Sub(in.Now) <= p.LeaseMargin:
			out = append(out, Stop{Machine: id, Reason: "lease_ending",
				Detail: fmt.Sprintf("its lease ends at %s", m.Offer.LeaseEnds.UTC().Format(time.RFC3339))})
		case len(m.Jobs) == 0 && !m.IdleSince.IsZero() && in.Now.Sub(m.IdleSince) >= p.IdleTTL:
			out = append(out, Stop{Machine: id, Reason: "idle",
				Detail: fmt.Sprintf("no job for %s (idle TTL %s)", broker.FormatDuration(in.Now.Sub(m.IdleSince).Truncate(time.Second)), broker.FormatDuration(p.IdleTTL))})
		case m.State == broker.MachineDraining && len(m.Jobs) == 0:
			out = append(out, Stop{Machine: id, Reason: "drained", Detail: "drained"})
		}
	}
	out = withGroups(in.Machines, out)
	slices.SortFunc(out, func(a, b Stop) int { return strings.Compare(a.Machine, b.Machine) })
	return out
}

// withGroups adds to stops the other ready or draining machines of every
// gang group one of whose machines stops: a group ends together.
func withGroups(ms []Machine, stops []Stop) []Stop {
	var groups map[string]Stop
	stopped := map[string]bool{}
	for _, s := range stops {
		stopped[s.Machine] = true
	}
	for _, s := range stops {
		for i := range ms {
			if ms[i].ID == s.Machine && ms[i].Group != "" {
				if groups == nil {
					groups = map[string]Stop{}
				}
				if _, ok := groups[ms[i].Group]; !ok {
					groups[ms[i].Group] = s
				}
			}
		}
	}
	if groups == nil {
		return stops
	}
	for i := range ms {
		m := &ms[i]
		s, ok := groups[m.Group]
		if !ok || m.Group == "" || stopped[m.ID] || (m.State != broker.MachineReady && m.State != broker.MachineDraining) {
			continue
		}
		stopped[m.ID] = true
		stops = append(stops, Stop{Machine: m.ID, Reason: s.Reason, Detail: s.Detail + " (gang group " + m.Group + ")"})
	}
	return stops
}
