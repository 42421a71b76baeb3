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
const StopSpillBack = "spill_back"

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

// HomeNode is an owned node's free GPUs.
type HomeNode struct {
	Name      string `json:"name"`
	Free      int    `json:"free"`
	GPUModel  string `json:"gpuModel,omitempty"`
	GPUMemory int64  `json:"gpuMemory,omitempty"`
}

// SpillBack moves a burst machine's jobs home and ends the machine.
type SpillBack struct {
	Machine string     `json:"machine"`
	Jobs    []SpillJob `json:"jobs"`
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
// nothing waits on-prem, every job on the machine is checkpointable, not
// moved within MinInterval and fits on idle owned GPUs, and the expected
// saving beats the cost by the margin. Machines go in order of net saving
// (then id), each taking its owned GPUs before the next. It returns the
// moves and, per ready machine considered and kept, why it stays.
func spillBack(in *Input, stopping map[string]bool) ([]SpillBack, map[string]string) {
	sp := in.Policy.SpillBack
	if !sp.Enabled || len(in.Running) == 0 {
		return nil, nil
	}
	stays := map[string]string{}
	for _, j := range in.Pending {
		if j.Machine == "" {
			for _, m := range in.Machines {
				if m.State == broker.MachineReady && len(m.Jobs) > 0 {
					stays[m.ID] = "jobs wait on-prem"
				}
			}
			return nil, stays
		}
	}
	byMachine := map[string][]Running{}
	for _, r := range in.Running {
		byMachine[r.Machine] = append(byMachine[r.Machine], r)
	}
	type cand struct {
		m            *Machine
		jobs         []Running
		saving, cost billing.Amount
		remaining    []time.Duration
		lost         []time.Duration
	}
	var cands []cand
	for i := range in.Machines {
		m := &in.Machines[i]
		jobs := byMachine[m.ID]
		if m.State != broker.MachineReady || stopping[m.ID] || len(jobs) == 0 || m.Offer.Prepaid {
			continue
		}
		if m.Group != "" {
			stays[m.ID] = "it runs a gang across its group " + m.Group + ", which moves home only by ending"
			continue
		}
		if len(jobs) != len(m.Jobs) {
			stays[m.ID] = "jobs are still starting on it"
			continue
		}
		c := cand{m: m, jobs: jobs}
		why := ""
		var longest time.Duration
		gpuMs := int64(0) // Σ GPUs × remaining, ms
		costMs := int64(0)
		for _, r := range jobs {
			rem := r.StartedAt.Add(r.Timeout).Sub(in.Now)
			lost := in.Now.Sub(maxTime(r.StartedAt, r.LastCheckpoint))
			if r.CheckpointEvery > 0 {
				lost = min(lost, r.CheckpointEvery)
			}
			lost = max(lost, 0)
			switch {
			case !r.Checkpointable:
				why = fmt.Sprintf("job %s has no checkpoint in object storage (checkpoint.to)", r.ID)
			case r.Stopping:
				why = fmt.Sprintf("job %s is stopping", r.ID)
			case !r.LastMoved.IsZero() && in.Now.Sub(r.LastMoved) < sp.MinInterval:
				why = fmt.Sprintf("job %s moved home %s ago (spillBack.minInterval %s)", r.ID,
					broker.FormatDuration(in.Now.Sub(r.LastMoved).Truncate(time.Second)), broker.FormatDuration(sp.MinInterval))
			case rem <= 0:
				why = fmt.Sprintf("job %s is past its declared time", r.ID)
			}
			if why != "" {
				break
			}
			longest = max(longest, rem)
			gpuMs += int64(r.GPUs) * rem.Milliseconds()
			costMs += int64(r.GPUs) * (r.Grace + sp.Staging + lost).Milliseconds()
			c.remaining = append(c.remaining, rem)
			c.lost = append(c.lost, lost)
		}
		if why != "" {
			stays[m.ID] = why
			continue
		}
		perGPU := m.Offer.PricePerGPUHour()
		c.saving = m.Offer.PricePerHour.MulDiv(longest.Milliseconds(), billing.MillisPerHour) -
			in.HomeRate.MulDiv(gpuMs, billing.MillisPerHour)
		c.cost = perGPU.MulDiv(costMs, billing.MillisPerHour)
		need := c.cost + billing.Amount(float64(c.cost)*sp.Margin)
		if c.saving <= need {
			stays[m.ID] = fmt.Sprintf("expected saving %s %s does not beat the move's cost %s × (1 + margin %g)",
				Money(c.saving), in.Currency, Money(c.cost), sp.Margin)
			continue
		}
		cands = append(cands, c)
	}
	slices.SortFunc(cands, func(a, b cand) int {
		if c := cmp.Compare(b.saving-b.cost, a.saving-a.cost); c != 0 {
			return c
		}
		return strings.Compare(a.m.ID, b.m.ID)
	})
	free := slices.Clone(in.Home)
	var out []SpillBack
	for _, c := range cands {
		placed, ok := placeHome(free, c.jobs)
		if !ok {
			stays[c.m.ID] = "its jobs do not fit on the idle owned GPUs"
			continue
		}
		sb := SpillBack{Machine: c.m.ID, Saving: c.saving, Cost: c.cost}
		for i, r := range c.jobs {
			n := &free[placed[i]]
			n.Free -= r.GPUs
			sb.Jobs = append(sb.Jobs, SpillJob{Job: r.ID, Node: n.Name, GPUs: r.GPUs, Remaining: c.remaining[i], LostWork: c.lost[i]})
		}
		sb.Detail = fmt.Sprintf("moving home: expected saving %s %s, move cost %s %s", Money(c.saving), in.Currency, Money(c.cost), in.Currency)
		out = append(out, sb)
		delete(stays, c.m.ID)
	}
	return out, stays
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
