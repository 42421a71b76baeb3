package sched

import (
	"slices"
	"strconv"
	"time"

	"github.com/spillway-dev/spillway/broker"
)

// walk decides for each pending job in order. Jobs left pending get their
// Plan entry (and burst demand) at once, in order; their messages go to
// c.msg and are attached by finish.
func (c *cycle) walk() {
	pos := c.scratch.pos[:0]
	for range c.queues {
		pos = append(pos, 0)
	}
	c.scratch.pos = pos
	c.plan = Plan{Pending: slices.Grow(c.pendBuf[:0], len(c.pending)), BurstDemand: slices.Grow(c.burstBuf[:0], len(c.pending))}
	c.offs = slices.Grow(c.offs[:0], 2*len(c.pending))
	c.msg = slices.Grow(c.msg, 72*len(c.pending))
	for k := range c.pending {
		pi := int32(k)
		p := &c.pending[pi]
		m0 := int32(len(c.msg))
		var code string
		var est int64
		estByReservation := false
		switch over, project := c.quotaOver(p); {
		case p.notBefore > c.nowNs:
			code = ReasonBackoff
			c.msg = append(c.msg, "retry backoff until "...)
			c.msg = appendClock(c.msg, p.notBefore, c.nowNs)
		case over > 0:
			if at := c.tryPreempt(pi, c.rightsOf(p, over, project)); at > 0 {
				code, est = ReasonPreempting, at
				c.preemptingText(p)
				c.addUse(p.team, p.project, p.queue, p.g*p.n)
			} else {
				code = ReasonQuota
				c.quotaText(p, project)
			}
		case c.tryStart(pi):
			continue
		default:
			// A job that waits for cards kept for it counts against its
			// quota and queue for the rest of the cycle, as if started.
			if at := c.tryClaim(pi); at > 0 {
				code, est = ReasonReleasing, at
				c.addUse(p.team, p.project, p.queue, p.g*p.n)
				c.msg = append(c.msg, "waiting for "...)
				c.msg = c.appendNeed(c.msg, p)
				c.msg = append(c.msg, " being released by stopping jobs"...)
				break
			}
			miss := c.miss
			if at := c.tryPreempt(pi, c.rightsOf(p, 0, false)); at > 0 {
				code, est = ReasonPreempting, at
				c.preemptingText(p)
				c.addUse(p.team, p.project, p.queue, p.g*p.n)
				break
			}
			// sawBackfill now says whether placing, claiming or preempting
			// was refused for the head's reservation.
			code, est, estByReservation = c.blocked(pi, miss, c.sawBackfill)
		}
		pos[p.queue]++
		qname := c.queues[p.queue].name
		c.msg = append(c.msg, "; "...)
		c.msg = appendOrdinal(c.msg, int(pos[p.queue]))
		c.msg = append(c.msg, " in queue "...)
		c.msg = append(c.msg, qname...)
		var estT *time.Time
		if est > 0 {
			c.msg = append(c.msg, "; est. start "...)
			c.msg = appendClock(c.msg, est, c.nowNs)
			if estByReservation {
				c.msg = append(c.msg, " by reservation"...)
			}
			t := time.Unix(0, est).UTC()
			estT = &t
		}
		c.offs = append(c.offs, m0, int32(len(c.msg)))
		c.plan.Pending = append(c.plan.Pending, Pending{Job: p.id, Queue: qname,
			Reason: broker.PendingReason{Code: code, Position: int(pos[p.queue]), EstimatedStart: estT}})
		if code != ReasonBackoff && p.burst != burstNever {
			c.plan.BurstDemand = append(c.plan.BurstDemand, c.burstDemand(p, code, estT))
		}
	}
}

func (c *cycle) burstDemand(p *pjob, code string, est *time.Time) BurstDemand {
	return BurstDemand{
		Job: p.id, Team: c.teams[p.team].name, Queue: c.queues[p.queue].name, Priority: c.tqps[p.tqp].priority, Burst: p.burst.policy(),
		GPUs: p.g, Nodes: p.n, GPUModel: c.cons[p.cons].key.model, GPUMemory: p.gpuMem, CPU: p.cpu, Memory: p.mem,
		Timeout: time.Duration(p.timeout), Preemptible: p.preemptible, Waited: time.Duration(c.nowNs - p.since),
		Reason: code, EstimatedStart: est,
	}
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

func (c *cycle) quotaText(p *pjob, project bool) {
	used, limit := c.teams[p.team].effective(), c.teams[p.team].limit
	if project {
		pr := &c.projects[p.project]
		used, limit = pr.effective(), pr.limit
		c.msg = append(c.msg, "project "...)
		c.msg = append(c.msg, pr.name...)
		c.msg = append(c.msg, " of team "...)
	} else {
		c.msg = append(c.msg, "team "...)
	}
	c.msg = append(c.msg, c.teams[p.team].name...)
	c.msg = append(c.msg, " at quota "...)
	c.msg = strconv.AppendInt(c.msg, int64(used), 10)
	c.msg = append(c.msg, '/')
	c.msg = strconv.AppendInt(c.msg, int64(limit), 10)
	c.msg = append(c.msg, " GPUs (borrow limit reached"...)
	if used+p.g*p.n > limit && used < limit {
		c.msg = append(c.msg, "; this job needs "...)
		c.msg = strconv.AppendInt(c.msg, int64(p.g*p.n), 10)
	}
	c.msg = append(c.msg, ')')
}

// preemptingText: "preempting 2 jobs (a, b) on n1 for 8 GPUs on one
// node; starts when they stop".
func (c *cycle) preemptingText(p *pjob) {
	n := len(c.lastVictims)
	c.msg = append(c.msg, "preempting "...)
	c.msg = strconv.AppendInt(c.msg, int64(n), 10)
	if n == 1 {
		c.msg = append(c.msg, " job ("...)
	} else {
		c.msg = append(c.msg, " jobs ("...)
	}
	for k, v := range c.lastVictims {
		if k == 3 {
			c.msg = append(c.msg, ", …"...)
			break
		}
		if k > 0 {
			c.msg = append(c.msg, ", "...)
		}
		c.msg = append(c.msg, c.running[v].j.ID...)
	}
	c.msg = append(c.msg, ") on "...)
	for k, i := range c.lastNodes {
		if k > 0 {
			c.msg = append(c.msg, ", "...)
		}
		c.msg = append(c.msg, c.nodes[i].n.Name...)
	}
	c.msg = append(c.msg, " for "...)
	c.msg = c.appendNeed(c.msg, p)
	if n == 1 {
		c.msg = append(c.msg, "; starts when it stops"...)
	} else {
		c.msg = append(c.msg, "; starts when they stop"...)
	}
}

// appendNeed describes what the job waits for: "8 GPUs on one node",
// "2 nodes with 8 GPUs each", "1 GPU with 20Gi free (shared)".
func (c *cycle) appendNeed(b []byte, p *pjob) []byte {
	if p.n > 1 {
		b = strconv.AppendInt(b, int64(p.n), 10)
		b = append(b, " nodes with "...)
		b = strconv.AppendInt(b, int64(p.g), 10)
		b = append(b, " GPUs each in one pool"...)
	} else {
		b = strconv.AppendInt(b, int64(p.g), 10)
		if p.g == 1 {
			b = append(b, " GPU"...)
		} else {
			b = append(b, " GPUs on one node"...)
		}
		if p.share > 0 {
			b = append(b, " with "...)
			b = append(b, broker.FormatQuantity(p.share)...)
			b = append(b, " free (shared)"...)
		}
	}
	if m := c.cons[p.cons].key.model; m != "" {
		b = append(b, " of model "...)
		b = append(b, m...)
	}
	return b
}

// blocked finds the reason of a job that neither starts, claims, nor
// preempts: it can never fit, it becomes the head with a reservation, it
// would delay the head, or it waits for cards.
func (c *cycle) blocked(pi int32, miss miss, sawBackfill bool) (code string, est int64, byReservation bool) {
	p := &c.pending[pi]
	if !c.canEverFit(p) {
		c.msg = append(c.msg, "no ready node set can hold "...)
		c.msg = c.appendNeed(c.msg, p)
		return ReasonNoFit, 0, false
	}
	code = ReasonResources
	if p.n > 1 {
		code = ReasonGang
	}
	switch {
	case miss == missReserve:
		code = ReasonQueueReserved
		c.msg = append(c.msg, "the free GPUs are reserved for other queues; waiting for "...)
		c.msg = c.appendNeed(c.msg, p)
	case c.resv.active && (miss == missBackfill || sawBackfill):
		code = ReasonBackfill
		c.msg = append(c.msg, "starting now would delay job "...)
		c.msg = append(c.msg, c.pending[c.resv.job].id...)
		c.msg = append(c.msg, ", reserved for "...)
		c.msg = appendClock(c.msg, c.resv.at, c.nowNs)
		c.msg = append(c.msg, "; waiting for "...)
		c.msg = c.appendNeed(c.msg, p)
		return code, 0, false
	default:
		c.msg = append(c.msg, "waiting for "...)
		c.msg = c.appendNeed(c.msg, p)
	}
	if !c.resv.active && c.reserve(pi) {
		return code, c.resv.at, true
	}
	return code, 0, false
}

// canEverFit reports whether some ready node (or gang group) has enough
// healthy cards for the job, whoever holds them now.
func (c *cycle) canEverFit(p *pjob) bool {
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

// finish completes the Plan: all messages live in one string, each
// reason's Message is a slice of it.
func (c *cycle) finish() Plan {
	plan := c.plan
	c.plan = Plan{}
	c.pendBuf, c.burstBuf = plan.Pending[:0], plan.BurstDemand[:0]
	plan.Starts, plan.Stops, plan.Preemptions = c.starts, c.stops, c.preemptions
	all := string(c.msg)
	for k := range plan.Pending {
		plan.Pending[k].Reason.Message = all[c.offs[2*k]:c.offs[2*k+1]]
	}
	if len(plan.Pending) == 0 {
		plan.Pending = nil
	}
	if c.resv.active {
		rv := &Reservation{Job: c.pending[c.resv.job].id, At: time.Unix(0, c.resv.at).UTC()}
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
