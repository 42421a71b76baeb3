package sched

import (
	"slices"
	"strconv"
	"time"

	"github.com/spillway-dev/spillway/broker"
)

// walk decides for each pending job in order. Jobs left pending get their
// Plan entry at once, in order: a compact Reason whose sentence is
// formatted only when asked.
func (c *cycle) walk() {
	pos := c.scratch.pos[:0]
	for range c.queues {
		pos = append(pos, 0)
	}
	c.scratch.pos = pos
	c.rctx = &reasonCtx{now: c.nowNs}
	// Each job's entry is written in place, in the slot after the last
	// entry; it becomes part of the plan unless the job starts.
	pend := slices.Grow(c.pendBuf[:0], len(c.pending))
	for k := range c.pending {
		pi := int32(k)
		p := &c.pending[pi]
		ref := &c.pendRef[pi]
		e := &pend[:len(pend)+1][len(pend)]
		*e = Pending{Job: ref.id, j: ref.j, at1: c.jc.pos[p.rec] + 1,
			Reason: Reason{ctx: c.rctx, g: int32(p.g), n: int32(p.n), share: p.share, model: p.cons, queue: p.queue}}
		r := &e.Reason
		switch over, project := c.quotaOver(p); {
		case p.notBefore > c.nowNs:
			r.kind, r.at = kindBackoff, p.notBefore
		case c.arrayFull(p, r):
		case over > 0:
			if at := c.tryPreempt(pi, c.rightsOf(p, over, project)); at > 0 {
				r.kind, r.est, r.victims = kindPreempting, at, c.victimText()
				c.addUse(p)
			} else {
				c.quotaReason(r, p, project)
			}
		case c.tryStart(pi):
			continue
		default:
			// A job that waits for cards kept for it counts against its
			// quota and queue for the rest of the cycle, as if started.
			if at := c.tryClaim(pi); at > 0 {
				r.kind, r.est = kindReleasing, at
				c.addUse(p)
				break
			}
			miss := c.miss
			if at := c.tryPreempt(pi, c.rightsOf(p, 0, false)); at > 0 {
				r.kind, r.est, r.victims = kindPreempting, at, c.victimText()
				c.addUse(p)
				break
			}
			// sawBackfill now says whether placing, claiming or preempting
			// was refused for the head's reservation.
			c.blocked(pi, r, miss, c.sawBackfill)
		}
		pos[p.queue]++
		r.pos = pos[p.queue]
		pend = pend[:len(pend)+1]
	}
	c.plan = Plan{Pending: pend}
}

// BurstDemand lists the pending jobs that may run on rented capacity
// (burst: allowed or prefer), with what they need, built from the plan
// when asked. Entries come in scheduling order (the order jobs would
// start on-prem), so earlier entries matter more. Jobs in retry backoff
// are not listed; Pending has every job's full reason and position. It
// reads the snapshot's jobs: call it before they change.
func (pl *Plan) BurstDemand() []BurstDemand {
	var out []BurstDemand
	for k := range pl.Pending {
		pe := &pl.Pending[k]
		j := pe.j
		if j == nil || pe.Reason.kind == kindBackoff || pe.Reason.kind == kindArrayLimit || j.Spec.Burst == broker.BurstNever {
			continue
		}
		res := j.Spec.Resources
		out = append(out, BurstDemand{
			Job: j.ID, Team: j.Spec.Team, Queue: j.Spec.Queue, Priority: j.Spec.Priority, Burst: burstCodeOf(j.Spec.Burst).policy(),
			GPUs: res.GPUs, Nodes: max(1, res.Nodes), GPUModel: res.GPUModel, GPUMemory: int64(res.GPUMemory), CPU: res.CPU,
			Memory: int64(res.Memory), Timeout: j.Spec.Timeout.D(), Preemptible: j.Spec.Preemptible,
			Waited: time.Duration(pe.Reason.ctx.now - pendingSince(j).UnixNano()),
			Reason: pe.Reason.Code(), EstimatedStart: pe.Reason.EstimatedStart(),
		})
	}
	return out
}

// quotaOver returns by how many GPUs starting the job would pass its
// team's limit (or, with project true, its project's), or 0.
func (c *cycle) quotaOver(p *pjob) (int, bool) {
	total := p.g * p.n
	t := &c.teams[p.team]
	over := 0
	if t.limit >= 0 {
		over = t.effective() + total - t.limit
	}
	if p.project >= 0 {
		pr := &c.projects[p.project]
		if pr.limit >= 0 {
			if po := pr.effective() + total - pr.limit; po > 0 && po >= over {
				return po, true
			}
		}
	}
	return max(0, over), false
}

// quotaReason records that the job is held by its team's (or, with
// project, its project's) limit: the numbers as they are now.
func (c *cycle) quotaReason(r *Reason, p *pjob, project bool) {
	r.kind, r.team = kindQuota, p.team
	used, limit := c.teams[p.team].effective(), c.teams[p.team].limit
	if project {
		pr := &c.projects[p.project]
		used, limit = pr.effective(), pr.limit
		r.proj, r.projectQuota = p.project, true
	}
	r.used, r.limit = int32(used), int32(limit)
}

// victimText keeps what the last preemption's sentence names and returns
// its index in the cycle's reason table.
func (c *cycle) victimText() int32 {
	v := victimText{n: len(c.lastVictims)}
	for k, i := range c.lastVictims {
		if k == 3 {
			break
		}
		v.ids = append(v.ids, c.running[i].j.ID)
	}
	for _, i := range c.lastNodes {
		v.nodes = append(v.nodes, c.nodes[i].n.Name)
	}
	c.rctx.victims = append(c.rctx.victims, v)
	return int32(len(c.rctx.victims) - 1)
}

// blocked finds the reason of a job that neither starts, claims, nor
// preempts: it can never fit, it becomes the head with a reservation, it
// would delay the head, or it waits for cards.
func (c *cycle) blocked(pi int32, r *Reason, miss miss, sawBackfill bool) {
	p := &c.pending[pi]
	if !c.canEverFit(p) {
		r.kind = kindNoFit
		return
	}
	r.kind = kindResources
	if p.n > 1 {
		r.kind = kindGang
	}
	switch {
	case miss == missReserve:
		r.kind = kindQueueReserved
	case c.resv.active && (miss == missBackfill || sawBackfill):
		r.kind, r.at = kindBackfill, c.resv.at
		return
	}
	if !c.resv.active && c.reserve(pi) {
		r.est, r.byResv = c.resv.at, true
	}
}

// canEverFit reports whether some ready node (or gang group) has enough
// healthy cards for the job, whoever holds them now. Nodes do not change
// during a cycle: the answer for a shape without CPU or memory is kept.
func (c *cycle) canEverFit(p *pjob) bool {
	if p.cpu != 0 || p.mem != 0 || p.g <= 0 || p.g >= 64 || p.n >= 64 {
		return c.everFit(p)
	}
	word, bit := int(p.cons)*64+p.g, uint64(1)<<uint(p.n)
	if word < len(c.everKnown) && c.everKnown[word]&bit != 0 {
		return c.everFits[word]&bit != 0
	}
	for len(c.everKnown) <= word {
		c.everKnown, c.everFits = append(c.everKnown, 0), append(c.everFits, 0)
	}
	ok := c.everFit(p)
	c.everKnown[word] |= bit
	if ok {
		c.everFits[word] |= bit
	}
	return ok
}

// everFit is canEverFit computed.
func (c *cycle) everFit(p *pjob) bool {
	if p.g <= 0 {
		return false
	}
	cons := &c.cons[p.cons]
	if p.n == 1 {
		for _, sg := range cons.sgs {
			if c.sgroups[sg].maxTotal >= p.g {
				return true
			}
		}
		return false
	}
	for gi := range c.ggroups {
		gg := &c.ggroups[gi]
		if !cons.in[gg.key.sg] || len(gg.nodes) < p.n {
			continue
		}
		n := 0
		for _, i := range gg.nodes {
			if nd := &c.nodes[i]; nd.total >= p.g && capacityOK(nd, p) {
				n++
			}
		}
		if n >= p.n {
			return true
		}
	}
	return false
}

// appendClock writes t as "14:20 UTC", or "Jan 2 14:20 UTC" when it is
// not within a day of now.
func appendClock(b []byte, t, now int64) []byte {
	tm := time.Unix(0, t).UTC()
	if d := t - now; d >= 0 && d < int64(24*time.Hour) {
		return tm.AppendFormat(b, "15:04 UTC")
	}
	return tm.AppendFormat(b, "Jan 2 15:04 UTC")
}

func appendOrdinal(b []byte, n int) []byte {
	b = strconv.AppendInt(b, int64(n), 10)
	switch {
	case n%100 >= 11 && n%100 <= 13:
		return append(b, "th"...)
	case n%10 == 1:
		return append(b, "st"...)
	case n%10 == 2:
		return append(b, "nd"...)
	case n%10 == 3:
		return append(b, "rd"...)
	}
	return append(b, "th"...)
}

// finish completes the Plan and the names its reasons refer to.
func (c *cycle) finish() Plan {
	plan := c.plan
	c.plan = Plan{}
	c.pendBuf = plan.Pending[:0]
	plan.Starts, plan.Stops, plan.Preemptions = c.starts, c.stops, c.preemptions
	x := c.rctx
	for i := range c.queues {
		x.queues = append(x.queues, c.queues[i].name)
	}
	for i := range c.cons {
		x.models = append(x.models, c.cons[i].key.model)
	}
	for i := range c.teams {
		x.teams = append(x.teams, c.teams[i].name)
	}
	for i := range c.projects {
		x.projects = append(x.projects, c.projects[i].name)
	}
	for i := range c.arrays {
		x.arrays = append(x.arrays, c.arrays[i].id)
	}
	if len(plan.Pending) == 0 {
		plan.Pending = nil
	}
	if c.resv.active {
		x.head = c.idOf(&c.pending[c.resv.job])
		rv := &Reservation{Job: x.head, At: time.Unix(0, c.resv.at).UTC()}
		for _, i := range c.resv.nodes {
			rv.Nodes = append(rv.Nodes, c.nodes[i].n.Name)
		}
		plan.Reservation = rv
	}
	return plan
}

// pendingSince is when the job last entered the queue.
func pendingSince(j *broker.Job) time.Time {
	if n := len(j.History); n > 0 && j.History[n-1].To == broker.StatePending {
		return j.History[n-1].At
	}
	return j.SubmittedAt
}
