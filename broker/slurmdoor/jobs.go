package slurmdoor

import (
	"cmp"
	"context"
	"slices"
	"sort"
	"time"

	"github.com/spillway-dev/spillway/billing"
	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/slurm"
)

// Loop is the door's part of a leader term: it opens the door to resume
// and suspend for the term, picks up suspends a previous leader left half
// done, and reads the jobs on the burst nodes every slurm.pollEvery for
// the ledger, until ctx ends. Without a slurm: section it returns at once.
func (d *Door) Loop(ctx context.Context) {
	if d.cfg().Slurm == nil {
		return
	}
	d.st.Lock()
	d.ctx = ctx
	for _, r := range d.fleet.RecordsLocked() {
		id := r.ID
		if r.SlurmNode != "" && r.State == broker.MachineDraining {
			d.fleet.StartWorkerLocked(ctx, id, d.suspendWorker)
		}
	}
	d.st.Unlock()
	defer func() {
		d.st.Lock()
		d.ctx = nil
		d.st.Unlock()
	}()
	for ctx.Err() == nil {
		d.pollJobs(ctx)
		select {
		case <-ctx.Done():
			return
		case <-d.clock.After(d.cfg().Slurm.PollEvery.D()):
		}
	}
}

// pollJobs asks squeue for the jobs on every live Slurm node.
func (d *Door) pollJobs(ctx context.Context) {
	d.st.Lock()
	var nodes []string
	for _, r := range d.fleet.RecordsLocked() {
		if r.SlurmNode != "" && r.LaunchedAt != nil && !r.State.Ended() {
			nodes = append(nodes, r.SlurmNode)
		}
	}
	d.st.Unlock()
	if len(nodes) == 0 {
		return
	}
	slices.Sort(nodes)
	nodes = slices.Compact(nodes)
	jobs, err := d.commands().Jobs(ctx, nodes)
	if err != nil {
		d.log.Warn("slurm: list jobs on burst nodes", "err", err)
		return
	}
	d.mergeJobs(ctx, nodes, jobs)
}

// mergeJobs records jobs squeue listed for the queried nodes on the live
// records of their nodes: a job that started while the record's machine
// lived belongs to it. A job recorded as running on a queried node that
// squeue no longer lists ended by now.
func (d *Door) mergeJobs(ctx context.Context, queried []string, jobs []slurm.Job) {
	now := d.clock.Now()
	d.st.Lock()
	defer d.st.Unlock()
	byNode := map[string][]slurm.Job{}
	listed := map[string]bool{}
	for _, j := range jobs {
		listed[j.ID] = true
		if j.Start.IsZero() {
			continue
		}
		for _, n := range j.Nodes {
			byNode[n] = append(byNode[n], j)
		}
	}
	for _, r := range d.fleet.RecordsLocked() {
		if r.SlurmNode == "" || r.LaunchedAt == nil || r.State.Ended() || !slices.Contains(queried, r.SlurmNode) {
			continue
		}
		merged := slices.Clone(r.SlurmJobs)
		changed := false
		for _, j := range byNode[r.SlurmNode] {
			if j.Start.Before(r.LaunchedAt.Add(-time.Minute)) {
				continue // ran on an earlier machine of this node
			}
			j.Nodes = nil
			i := slices.IndexFunc(merged, func(o slurm.Job) bool { return o.ID == j.ID })
			switch {
			case i < 0:
				merged = append(merged, j)
				changed = true
			case !equalJob(merged[i], j):
				merged[i] = j
				changed = true
			}
		}
		for i, j := range merged {
			if j.End.IsZero() && !listed[j.ID] {
				merged[i].End = now.UTC()
				merged[i].State = "GONE"
				changed = true
			}
		}
		if !changed {
			continue
		}
		rr := r.Clone()
		rr.SlurmJobs = merged
		if err := d.fleet.PutRecordLocked(ctx, rr, nil, nil); err != nil {
			d.log.Warn("slurm: record jobs", "record", r.ID, "err", err)
		}
	}
}

func equalJob(a, b slurm.Job) bool {
	return a.ID == b.ID && a.Account == b.Account && a.User == b.User && a.Partition == b.Partition && a.GPUs == b.GPUs &&
		a.State == b.State && a.Start.Equal(b.Start) && a.End.Equal(b.End) && slices.Equal(a.Nodes, b.Nodes)
}

// AllocsLocked turns the Slurm jobs recorded on burst machines into the
// meter's allocations: usage lines with the Slurm job id ("slurm:42"),
// the account as project, the user and the partition, on the machine's
// pool. The machine's other GPU-time stays overhead (under the lock).
func (d *Door) AllocsLocked(cursor time.Time) []billing.Allocation {
	var out []billing.Allocation
	for _, r := range d.fleet.RecordsLocked() {
		if r.SlurmNode == "" || r.LaunchedAt == nil || len(r.SlurmJobs) == 0 {
			continue
		}
		if r.TerminatedAt != nil && !cursor.IsZero() && r.TerminatedAt.Before(cursor.Add(-time.Hour)) {
			continue
		}
		pool := billing.Pool{Kind: d.fleet.PoolKind(r), Name: r.Provider, Node: r.SlurmNode, Provider: r.Provider, Region: r.Offer.Region,
			InstanceType: r.Offer.InstanceType, InstanceID: r.ID}
		for _, j := range r.SlurmJobs {
			gpus := min(j.GPUs, max(r.Offer.GPUs, 0))
			if gpus <= 0 || j.Start.IsZero() {
				continue
			}
			start, end := ms(maxT(j.Start, *r.LaunchedAt)), time.Time{}
			if !j.End.IsZero() {
				end = ms(j.End)
			}
			if r.TerminatedAt != nil && (end.IsZero() || end.After(*r.TerminatedAt)) {
				end = ms(*r.TerminatedAt)
			}
			if !end.IsZero() && !end.After(start) {
				continue
			}
			out = append(out, billing.Allocation{Job: "slurm:" + j.ID, Attempt: 1, Team: r.Team, Project: j.Account, User: j.User,
				Queue: j.Partition, Pool: pool, GPUModel: cmp.Or(r.Offer.GPUModel, "GPU"), Spot: r.Offer.Spot,
				GPUMilli: int64(gpus) * 1000, Start: start, End: end})
		}
	}
	sort.Slice(out, func(a, b int) bool { return out[a].Job < out[b].Job })
	return out
}

// ms is the meter's resolution, as the server's allocations have it.
func ms(t time.Time) time.Time { return t.UTC().Truncate(time.Millisecond) }

func maxT(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
