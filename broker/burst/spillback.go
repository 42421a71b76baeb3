package burst

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/spillway-dev/spillway/billing"
	"github.com/spillway-dev/spillway/broker"
)

// StopSpillBack is the Stop reason (and the reason of the job's
// preempted transition) of a machine whose jobs move home.
const StopSpillBack = broker.ReasonSpillBack

// SpillBackPolicy configures moving checkpointable jobs from burst
// machines back to owned GPUs once those stand idle (docs/bursting.md).
type SpillBackPolicy struct {
	// Enabled turns spill-back on.
	Enabled bool `json:"enabled,omitempty"`
	// Margin: a machine's jobs move only when the expected saving exceeds
	// the move's cost × (1 + Margin).
	Margin float64 `json:"margin,omitempty"`
	// MinInterval: a job moved home is not moved again within this long.
	MinInterval time.Duration `json:"minInterval,omitempty"`
	// Staging is the expected time to restore a checkpoint at home
	// (download and unpack), counted in the move's cost.
	Staging time.Duration `json:"staging,omitempty"`
}

// Running is a job holding GPUs on a burst machine, as spill-back sees
// it.
type Running struct {
	ID      string `json:"id"`
	Machine string `json:"machine"`
	GPUs    int    `json:"gpus"`
	// GPUModel and GPUMemory are the job's constraints, matched against
	// the owned nodes.
	GPUModel  string `json:"gpuModel,omitempty"`
	GPUMemory int64  `json:"gpuMemory,omitempty"`
	// Checkpointable: the job's checkpoint travels through object storage
	// (checkpoint.to), so another machine can resume it.
	Checkpointable bool `json:"checkpointable"`
	// Stopping: a stop was already asked of it.
	Stopping bool `json:"stopping,omitempty"`
	// StartedAt is when the current attempt started; Timeout its declared
	// run time; Grace its checkpoint grace.
	StartedAt time.Time     `json:"startedAt"`
	Timeout   time.Duration `json:"timeout"`
	Grace     time.Duration `json:"grace"`
	// CheckpointEvery is the job's declared checkpoint interval (0: none).
	CheckpointEvery time.Duration `json:"checkpointEvery,omitempty"`
	// LastCheckpoint is the last checkpoint the job reported (zero: none).
	LastCheckpoint time.Time `json:"lastCheckpoint,omitzero"`
	// LastMoved is when spill-back last moved the job (zero: never).
	LastMoved time.Time `json:"lastMoved,omitzero"`
}

// Spill-back's rules: why a ready burst machine's jobs stay on it
// (Decision.StayRules; Decision.Stays has the detail for people).
const (
	StayJobsWait      = "jobs_wait"        // a job waiting on-prem could use the idle owned GPUs
	StayStarting      = "starting"         // a job bound to the machine has not started
	StayNoCheckpoint  = "no_checkpoint"    // a job has no checkpoint in object storage
	StayStopping      = "stopping"         // a job is already stopping
	StayMovedRecently = "moved_recently"   // a job moved home within minInterval
	StayPastTime      = "past_time"        // a job is past its declared time
	StaySaving        = "saving_too_small" // the saving does not beat the move's cost × (1 + margin)
	StayNoFit         = "no_fit"           // the jobs do not fit on the idle owned GPUs
)

// HomeNode is an owned node's free GPUs.
type HomeNode struct {
	Name      string `json:"name"`
	Free      int    `json:"free"`
	GPUModel  string `json:"gpuModel,omitempty"`
	GPUMemory int64  `json:"gpuMemory,omitempty"`
}

// SpillBack moves a burst machine's jobs home: all of them (Whole: the
// machine drains and ends), or those with the most time left, when the
// machine would otherwise run on for them (the others keep it until they
// end; its freed cards may take other jobs).
type SpillBack struct {
	Machine string     `json:"machine"`
	Jobs    []SpillJob `json:"jobs"`
	Whole   bool       `json:"whole,omitempty"`
	// Saving is the expected saving: what the machine would still cost
	// for its jobs' remaining declared time, less what the same GPU-time
	// costs at home. Cost is the move's: grace, staging and the work since
	// the last checkpoint, priced at the machine's rate per GPU-hour.
	Saving billing.Amount `json:"saving"`
	Cost   billing.Amount `json:"cost"`
	Detail string         `json:"detail"`
}

// SpillJob is one job of a spill-back and the owned node it fits on.
type SpillJob struct {
	Job       string        `json:"job"`
	Node      string        `json:"node"`
	GPUs      int           `json:"gpus"`
	Remaining time.Duration `json:"remaining"`
	LostWork  time.Duration `json:"lostWork"`
}

// spillBack picks the burst machines whose jobs move home now: only when
// no waiting job could use the idle owned GPUs; of a machine, the jobs
// with the most time left that are checkpointable, not moved within
// MinInterval and fit on idle owned GPUs, when the expected saving beats
// the cost by the margin (all of them: the machine ends); a gang's group
// moves whole (gangOption). Machines go in order of net saving (then id),
// each taking its owned GPUs before the next. It returns the
// moves and, per ready machine considered and kept, why it stays and the
// rule (Stay*).
func spillBack(in *Input, stopping map[string]bool) ([]SpillBack, map[string]string, map[string]string) {
	sp := in.Policy.SpillBack
	if !sp.Enabled || len(in.Running) == 0 {
		return nil, nil, nil
	}
	stays, rules := map[string]string{}, map[string]string{}
	stay := func(id, rule, why string) { stays[id], rules[id] = why, rule }
	// A waiting job that could use the idle owned GPUs gets them: nothing
	// moves. Jobs too big for them (or for another model) do not hold the
	// moves back: the cards would stand idle for them anyway.
	for _, j := range in.Pending {
		if j.Machine == "" && fitsHome(in.Home, j) {
			for _, m := range in.Machines {
				if m.State == broker.MachineReady && len(m.Jobs) > 0 && !stopping[m.ID] {
					stay(m.ID, StayJobsWait, fmt.Sprintf("jobs wait on-prem (%s fits the idle owned GPUs)", j.ID))
				}
			}
			return nil, stays, rules
		}
	}
	byMachine := map[string][]Running{}
	for _, r := range in.Running {
		byMachine[r.Machine] = append(byMachine[r.Machine], r)
	}
	// An option moves the k jobs with the most time left (movable ones,
	// largest remaining first) and leaves the rest: the machine then runs
	// until the longest remaining job it keeps ends (all moved: it ends
	// now), so the saving is its price over the time cut, less the moved
	// GPU-time at the owned rate; the cost is the moved jobs' grace,
	// staging and lost work at the machine's rate per GPU-hour.
	type cand struct {
		m    *Machine
		opts []option // each beats the margin, best net saving first
	}
	var cands []cand
	groupSeen := map[string]bool{}
	for i := range in.Machines {
		m := &in.Machines[i]
		jobs := byMachine[m.ID]
		if m.State != broker.MachineReady || stopping[m.ID] || len(jobs) == 0 || m.Offer.Prepaid {
			continue
		}
		if m.Group != "" {
			if o, id, rule, why, ok := gangOption(in, m, byMachine, stopping, groupSeen); ok {
				if o.saving <= o.cost+billing.Amount(float64(o.cost)*sp.Margin) {
					stay(id, StaySaving, fmt.Sprintf("expected saving %s %s does not beat the move's cost %s × (1 + margin %g)",
						Money(o.saving), in.Currency, Money(o.cost), sp.Margin))
					continue
				}
				cands = append(cands, cand{m: m, opts: []option{o}})
			} else if rule != "" {
				stay(id, rule, why)
			}
			continue
		}
		if len(jobs) != len(m.Jobs) {
			stay(m.ID, StayStarting, "jobs are still starting on it")
			continue
		}
		type mv struct {
			r         Running
			rem, lost time.Duration
		}
		var movable []mv
		var kept time.Duration // the longest time left of a job that cannot move
		why, rule := "", ""
		for _, r := range jobs {
			rem, lost, jrule, jwhy := jobMove(in, r)
			if jwhy != "" {
				if why == "" {
					why, rule = jwhy, jrule
				}
				kept = max(kept, rem)
				continue
			}
			movable = append(movable, mv{r, rem, lost})
		}
		if len(movable) == 0 {
			stay(m.ID, rule, why)
			continue
		}
		slices.SortStableFunc(movable, func(a, b mv) int {
			if c := cmp.Compare(b.rem, a.rem); c != 0 {
				return c
			}
			return strings.Compare(a.r.ID, b.r.ID)
		})
		longest := max(kept, movable[0].rem)
		perGPU := m.Offer.PricePerGPUHour()
		var opts []option
		best := option{}
		gpuMs, costMs := int64(0), int64(0) // Σ GPUs × remaining, Σ GPUs × move time, ms
		for k := 1; k <= len(movable); k++ {
			x := movable[k-1]
			gpuMs += int64(x.r.GPUs) * x.rem.Milliseconds()
			costMs += int64(x.r.GPUs) * (x.r.Grace + sp.Staging + x.lost).Milliseconds()
			life := kept
			if k < len(movable) {
				life = max(life, movable[k].rem)
			}
			o := option{whole: k == len(movable) && kept == 0 && why == ""}
			o.saving = m.Offer.PricePerHour.MulDiv((longest-life).Milliseconds(), billing.MillisPerHour) -
				in.HomeRate.MulDiv(gpuMs, billing.MillisPerHour)
			o.cost = perGPU.MulDiv(costMs, billing.MillisPerHour)
			if k == 1 || o.saving-o.cost > best.saving-best.cost {
				best = o
			}
			if o.saving <= o.cost+billing.Amount(float64(o.cost)*sp.Margin) {
				continue
			}
			for _, y := range movable[:k] {
				o.jobs = append(o.jobs, y.r)
				o.remaining = append(o.remaining, y.rem)
				o.lost = append(o.lost, y.lost)
			}
			opts = append(opts, o)
		}
		if len(opts) == 0 {
			if why != "" {
				stay(m.ID, rule, why)
			} else {
				stay(m.ID, StaySaving, fmt.Sprintf("expected saving %s %s does not beat the move's cost %s × (1 + margin %g)",
					Money(best.saving), in.Currency, Money(best.cost), sp.Margin))
			}
			continue
		}
		slices.SortStableFunc(opts, func(a, b option) int { return cmp.Compare(b.saving-b.cost, a.saving-a.cost) })
		cands = append(cands, cand{m: m, opts: opts})
	}
	slices.SortFunc(cands, func(a, b cand) int {
		if c := cmp.Compare(b.opts[0].saving-b.opts[0].cost, a.opts[0].saving-a.opts[0].cost); c != 0 {
			return c
		}
		return strings.Compare(a.m.ID, b.m.ID)
	})
	free := slices.Clone(in.Home)
	var out []SpillBack
	for _, c := range cands {
		moved := false
		for _, o := range c.opts {
			var placed []int
			ok := false
			if o.nodes > 1 {
				placed, ok = placeGang(free, o.jobs[0], o.nodes)
			} else {
				placed, ok = placeHome(free, o.jobs)
			}
			if !ok {
				continue
			}
			sb := SpillBack{Machine: c.m.ID, Saving: o.saving, Cost: o.cost, Whole: o.whole}
			for i, at := range placed {
				r, k := o.jobs[0], 0
				if o.nodes <= 1 {
					r, k = o.jobs[i], i
				}
				g := r.GPUs / max(1, o.nodes)
				n := &free[at]
				n.Free -= g
				sb.Jobs = append(sb.Jobs, SpillJob{Job: r.ID, Node: n.Name, GPUs: g, Remaining: o.remaining[k], LostWork: o.lost[k]})
			}
			sb.Detail = fmt.Sprintf("moving home: expected saving %s %s, move cost %s %s", Money(o.saving), in.Currency, Money(o.cost), in.Currency)
			switch {
			case o.nodes > 1:
				sb.Detail += fmt.Sprintf(" (gang across group %s, %d nodes)", c.m.Group, o.nodes)
			case !o.whole:
				sb.Detail += fmt.Sprintf(" (%d of the machine's %d jobs)", len(o.jobs), len(c.m.Jobs))
			}
			out = append(out, sb)
			moved = true
			break
		}
		if !moved {
			stay(c.m.ID, StayNoFit, "its jobs do not fit on the idle owned GPUs")
			continue
		}
		delete(stays, c.m.ID)
		delete(rules, c.m.ID)
	}
	return out, stays, rules
}

// option is one way to move a machine's jobs home: the jobs, their time
// left and work lost, the expected saving and the move's cost; whole when
// the machine (or, for a gang, Nodes > 1, its whole group) ends.
type option struct {
	jobs         []Running
	remaining    []time.Duration
	lost         []time.Duration
	saving, cost billing.Amount
	whole        bool
	nodes        int // a gang's members, one per owned node (0: single jobs)
}

// gangOption weighs moving the gang that runs on machine m's group home,
// once per group (seen): every machine of the group must be ready and run
// only the gang, which must be movable by the rules of a single job. The
// group ends, so the saving is every machine's price for the gang's time
// left, less that GPU-time at the owned rate; the cost is the whole
// gang's grace, staging and lost work. It returns the option, or the
// machine, rule and reason that keep the group (rule empty: the group was
// weighed already).
func gangOption(in *Input, m *Machine, byMachine map[string][]Running, stopping map[string]bool, seen map[string]bool) (option, string, string, string, bool) {
	sp := in.Policy.SpillBack
	if seen[m.Group] {
		return option{}, "", "", "", false
	}
	seen[m.Group] = true
	var group []*Machine
	for i := range in.Machines {
		if g := &in.Machines[i]; g.Group == m.Group && !g.State.Ended() {
			group = append(group, g)
		}
	}
	var r Running
	for _, g := range group {
		jobs := byMachine[g.ID]
		if g.State != broker.MachineReady || stopping[g.ID] || len(jobs) != 1 || len(g.Jobs) != 1 || (r.ID != "" && jobs[0].ID != r.ID) {
			return option{}, m.ID, StayStarting, "the gang of group " + m.Group + " is not running on all its machines", false
		}
		r = jobs[0]
	}
	rem, lost, rule, why := jobMove(in, r)
	if rule != "" {
		return option{}, m.ID, rule, why, false
	}
	n := len(group)
	gpuMs := int64(r.GPUs) * rem.Milliseconds()
	o := option{jobs: []Running{r}, remaining: []time.Duration{rem}, lost: []time.Duration{lost}, whole: true, nodes: n}
	o.saving = m.Offer.PricePerHour.MulDiv(int64(n)*rem.Milliseconds(), billing.MillisPerHour) -
		in.HomeRate.MulDiv(gpuMs, billing.MillisPerHour)
	o.cost = m.Offer.PricePerGPUHour().MulDiv(int64(r.GPUs)*(r.Grace+sp.Staging+lost).Milliseconds(), billing.MillisPerHour)
	return o, m.ID, "", "", true
}

// jobMove weighs running job r by the rules that concern the job alone:
// its declared time left, the work a move would lose (since its last
// checkpoint, at most its checkpoint interval), and, when it may not move
// now, the rule (Stay*) and why.
func jobMove(in *Input, r Running) (rem, lost time.Duration, rule, why string) {
	sp := in.Policy.SpillBack
	rem = r.StartedAt.Add(r.Timeout).Sub(in.Now)
	lost = in.Now.Sub(maxTime(r.StartedAt, r.LastCheckpoint))
	if r.CheckpointEvery > 0 {
		lost = min(lost, r.CheckpointEvery)
	}
	lost = max(lost, 0)
	switch {
	case !r.Checkpointable:
		rule, why = StayNoCheckpoint, fmt.Sprintf("job %s has no checkpoint in object storage (checkpoint.to)", r.ID)
	case r.Stopping:
		rule, why = StayStopping, fmt.Sprintf("job %s is stopping", r.ID)
	case !r.LastMoved.IsZero() && in.Now.Sub(r.LastMoved) < sp.MinInterval:
		rule, why = StayMovedRecently, fmt.Sprintf("job %s moved home %s ago (spillBack.minInterval %s)", r.ID,
			broker.FormatDuration(in.Now.Sub(r.LastMoved).Truncate(time.Second)), broker.FormatDuration(sp.MinInterval))
	case rem <= 0:
		rule, why = StayPastTime, fmt.Sprintf("job %s is past its declared time", r.ID)
	}
	return rem, lost, rule, why
}

// placeGang finds n distinct owned nodes with room for one member of
// gang r each (r.GPUs / n cards), the fullest first: indexes into free,
// without changing free; false when fewer than n have room.
func placeGang(free []HomeNode, r Running, n int) ([]int, bool) {
	g := r.GPUs / n
	var at []int
	for i, h := range free {
		if h.Free >= g && homeFits(h, r) {
			at = append(at, i)
		}
	}
	if len(at) < n {
		return nil, false
	}
	slices.SortStableFunc(at, func(a, b int) int { return cmp.Compare(free[a].Free, free[b].Free) })
	return at[:n], true
}

// placeHome finds an owned node for each job (largest first, each on the
// fullest node it fits): indexes into free per job, without changing
// free; false when some job does not fit.
func placeHome(free []HomeNode, jobs []Running) ([]int, bool) {
	left := make([]int, len(free))
	for i, n := range free {
		left[i] = n.Free
	}
	order := make([]int, len(jobs))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(jobs[b].GPUs, jobs[a].GPUs) })
	at := make([]int, len(jobs))
	for _, k := range order {
		r := jobs[k]
		best := -1
		for i, n := range free {
			if left[i] < r.GPUs || !homeFits(n, r) {
				continue
			}
			if best < 0 || left[i] < left[best] {
				best = i
			}
		}
		if best < 0 {
			return nil, false
		}
		left[best] -= r.GPUs
		at[k] = best
	}
	return at, true
}

// fitsHome reports whether waiting job j fits on the idle owned GPUs:
// j.Nodes nodes each with j.GPUs free of its model and memory.
func fitsHome(home []HomeNode, j Job) bool {
	r := Running{GPUModel: j.GPUModel, GPUMemory: j.GPUMemory}
	n := 0
	for _, h := range home {
		if h.Free >= j.GPUs && homeFits(h, r) {
			n++
		}
	}
	return n >= max(1, j.Nodes)
}

func homeFits(n HomeNode, r Running) bool {
	if r.GPUModel != "" && !strings.Contains(strings.ToLower(n.GPUModel), strings.ToLower(r.GPUModel)) {
		return false
	}
	return r.GPUMemory == 0 || n.GPUMemory == 0 || n.GPUMemory >= r.GPUMemory
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// LastSpillBack is when a job was last moved home: its last preempted
// transition with reason StopSpillBack (zero when never).
func LastSpillBack(j *broker.Job) time.Time {
	for i := len(j.History) - 1; i >= 0; i-- {
		if t := j.History[i]; t.To == broker.StatePreempted && t.Reason == StopSpillBack {
			return t.At
		}
	}
	return time.Time{}
}
