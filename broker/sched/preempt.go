package sched

import (
	"fmt"
	"math/bits"
	"slices"
	"time"

	"github.com/spillway-dev/spillway/broker"
)

// rights are the ways a pending job may take cards from running jobs.
type rights struct {
	class int32
	// latency: a latency-queue job may take batch jobs' cards.
	latency bool
	// reclaim: the team is under its guarantee and may take cards from
	// teams that borrow; projReclaim: the same between projects of a team.
	reclaim     bool
	projReclaim bool
	// queueReclaim: the queue is under its reservation and may take
	// cards from other queues' jobs.
	queueReclaim bool
	// quotaOnly: the job is at its team's (or project's) limit and may
	// only take cards of its own team's (or project's) lower classes,
	// freeing at least needFree GPUs of that quota.
	quotaOnly  bool
	ownProject bool
	needFree   int
}

// possible reports whether any running job could be a victim under r:
// a lower class than the job's exists among preemptible jobs (for the
// priority and quota rules), a batch one (latency), or r reclaims.
func (c *cycle) possible(r *rights) bool {
	if c.preemptible == 0 {
		return false
	}
	return r.class > c.pMinClass || (r.latency && c.pBatch) || r.reclaim || r.projReclaim || r.queueReclaim
}

// failKey identifies jobs that would meet the same preemption result in
// this cycle: cards only get scarcer as the cycle goes on, so a search
// that failed for one job fails for the next with the same key. It packs
// the rights and the job's shape into three words: the shape's part is
// shapeKeyOf, the rights' part the flags (word 0, bits 24–29) and
// needFree (word 2, low 16 bits).
type failKey [3]uint64

func failKeyOf(r *rights, p *pjob) failKey {
	k := shapeKeyOf(p)
	k[0] |= r.flags() << 24
	k[2] |= uint64(uint16(min(r.needFree, 0xffff)))
	return k
}

// shapeKeyOf is the part of a job's failKey that comes from the job: its
// class, constraint, team, project, queue, nodes and cards.
func shapeKeyOf(p *pjob) failKey {
	return failKey{
		uint64(uint32(p.class))<<32 | uint64(uint32(p.cons))&0xffffff,
		uint64(uint32(p.team))<<32 | uint64(uint32(p.project)),
		uint64(uint32(p.queue))<<48 | uint64(uint16(min(p.n, 0xffff)))<<32 | uint64(uint32(p.g))&0xffff<<16,
	}
}

// flags packs the rights' booleans into six bits.
func (r *rights) flags() uint64 {
	var f uint64
	if r.latency {
		f |= 1
	}
	if r.reclaim {
		f |= 2
	}
	if r.projReclaim {
		f |= 4
	}
	if r.queueReclaim {
		f |= 8
	}
	if r.quotaOnly {
		f |= 16
	}
	if r.ownProject {
		f |= 32
	}
	return f
}

// rightsOf is what the job may preempt; over > 0 when it is at its quota
// by that many GPUs (project says whether the project's quota binds).
func (c *cycle) rightsOf(p *pjob, over int, project bool) rights {
	if over > 0 {
		return rights{class: p.class, quotaOnly: true, ownProject: project, needFree: over}
	}
	total := p.g * p.n
	t := &c.teams[p.team]
	q := &c.queues[p.queue]
	r := rights{class: p.class, latency: p.latency}
	r.reclaim = t.hasQuota && t.effective()+total <= t.guar
	if p.project >= 0 {
		pr := &c.projects[p.project]
		r.projReclaim = pr.hasQuota && pr.effective()+total <= pr.guar
	}
	r.queueReclaim = q.reserved > 0 && q.held-q.stopping+total <= q.reserved
	return r
}

// eligible says whether running job v may be preempted for p, under which
// rule, and whether v's team is within its guarantee (protected victims
// are taken only when no borrowed capacity will do).
func (c *cycle) eligible(p *pjob, r *rights, v *rjob) (rule string, protected bool) {
	if !v.preemptible || v.stopping || v.fresh {
		return "", false
	}
	vt := &c.teams[v.team]
	same := v.team == p.team
	if r.quotaOnly {
		if !same || v.class >= r.class || (r.ownProject && v.project != p.project) {
			return "", false
		}
		return RuleQuota, false
	}
	protected = !vt.borrowing()
	open := same || !protected // other teams' jobs only while their team borrows
	switch {
	case v.class < r.class && open:
		return RulePriority, protected
	case r.latency && !v.latency && open:
		return RuleLatency, protected
	case r.reclaim && !same && !protected:
		return RuleReclaim, protected
	case r.projReclaim && same && v.project != p.project && (v.project < 0 || c.projects[v.project].borrowing()):
		return RuleReclaim, protected
	case r.queueReclaim && v.queue != p.queue:
		return RuleQueue, protected
	}
	return "", false
}

// victim is one preemption candidate on a node.
type victim struct {
	job       int32
	mask      uint64
	rule      string
	protected bool
	lost      int64 // GPU-seconds of work lost
	total     int
}

// vcost orders victim sets: fewest protected victims (borrowed capacity
// goes first), least work lost, fewest victims, fewest GPUs freed.
type vcost struct {
	protected int
	lost      int64
	count     int
	freed     int
}

func (a vcost) less(b vcost) bool {
	if a.protected != b.protected {
		return a.protected < b.protected
	}
	if a.lost != b.lost {
		return a.lost < b.lost
	}
	if a.count != b.count {
		return a.count < b.count
	}
	return a.freed < b.freed
}

func (a vcost) add(b vcost) vcost {
	return vcost{a.protected + b.protected, a.lost + b.lost, a.count + b.count, a.freed + b.freed}
}

// maxExact is the most candidates on one node for which every subset is
// tried; above it victims are chosen greedily.
const maxExact = 12

// bestOnNode finds the cheapest set of victims on node i that leaves g
// cards for p (counting free and draining ones), or ok=false. Sets not
// cheaper than bound are not reported.
func (c *cycle) bestOnNode(i int32, p *pjob, r *rights, g int, bound *vcost) (vcost, []victim, bool) {
	nd := &c.nodes[i]
	base := bits.OnesCount64(freeCards(nd) | drainingCards(nd))
	need := max(0, g-base)
	if need == 0 && r.needFree == 0 {
		return vcost{}, nil, true
	}
	cands := c.scratch.victims[:0]
	lb := vcost{protected: 1, lost: -1, count: 1, freed: max(1, need)}
	for _, h := range nd.holders {
		v := &c.running[h.job]
		rule, prot := c.eligible(p, r, v)
		if rule == "" {
			continue
		}
		lost := int64(v.total) * (v.lost / int64(time.Second))
		cands = append(cands, victim{job: h.job, mask: h.mask, rule: rule, protected: prot, lost: lost, total: v.total})
		if !prot {
			lb.protected = 0
		}
		if lb.lost < 0 || lost < lb.lost {
			lb.lost = lost
		}
	}
	c.scratch.victims = cands
	if len(cands) == 0 || (bound != nil && !lb.less(*bound)) {
		return vcost{}, nil, false
	}
	// freeable[k] lists, per card that victims could free, the candidates
	// holding it; the card frees when all of them (its live holders) go.
	type fc struct{ holders uint64 }
	var freeable [maxCards]fc
	nf := 0
	if len(cands) <= 64 {
		for p := range nd.cards {
			cd := &nd.cards[p]
			if !cd.healthy || cd.claimed || cd.live == 0 {
				continue
			}
			var hs uint64
			for k := range cands {
				if cands[k].mask&(1<<uint(p)) != 0 {
					hs |= 1 << uint(k)
				}
			}
			if hs != 0 && bits.OnesCount64(hs) == int(cd.live) {
				freeable[nf] = fc{hs}
				nf++
			}
		}
	}
	if nf < need {
		return vcost{}, nil, false
	}
	freedBy := func(set uint64) int {
		n := 0
		for k := 0; k < nf; k++ {
			if freeable[k].holders&^set == 0 {
				n++
			}
		}
		return n
	}
	costOf := func(set uint64) (vcost, int) {
		var cost vcost
		quota := 0
		for s := set; s != 0; s &= s - 1 {
			v := &cands[bits.TrailingZeros64(s)]
			cost.count++
			cost.lost += v.lost
			quota += v.total
			if v.protected {
				cost.protected++
			}
		}
		return cost, quota
	}
	var best vcost
	bestSet := uint64(0)
	if len(cands) <= maxExact {
		for set := uint64(1); set < 1<<uint(len(cands)); set++ {
			freed := freedBy(set)
			if freed < need {
				continue
			}
			cost, quota := costOf(set)
			if quota < r.needFree {
				continue
			}
			cost.freed = freed
			if bestSet == 0 || cost.less(best) {
				best, bestSet = cost, set
			}
		}
	} else {
		order := make([]int, len(cands))
		for k := range order {
			order[k] = k
		}
		slices.SortFunc(order, func(a, b int) int {
			va, vb := &cands[a], &cands[b]
			if va.protected != vb.protected {
				if !va.protected {
					return -1
				}
				return 1
			}
			if va.lost != vb.lost {
				if va.lost < vb.lost {
					return -1
				}
				return 1
			}
			return a - b
		})
		var set uint64
		for _, k := range order {
			set |= 1 << uint(k)
			if _, quota := costOf(set); freedBy(set) >= need && quota >= r.needFree {
				break
			}
		}
		// Drop victims that turned out not to be needed, dearest first.
		for idx := len(order) - 1; idx >= 0; idx-- {
			k := order[idx]
			if set&(1<<uint(k)) == 0 {
				continue
			}
			trial := set &^ (1 << uint(k))
			if _, quota := costOf(trial); trial != 0 && freedBy(trial) >= need && quota >= r.needFree {
				set = trial
			}
		}
		if _, quota := costOf(set); freedBy(set) >= need && quota >= r.needFree {
			best, _ = costOf(set)
			best.freed = freedBy(set)
			bestSet = set
		}
	}
	if bestSet == 0 || (bound != nil && !best.less(*bound)) {
		return vcost{}, nil, false
	}
	out := make([]victim, 0, bits.OnesCount64(bestSet))
	for s := bestSet; s != 0; s &= s - 1 {
		out = append(out, cands[bits.TrailingZeros64(s)])
	}
	return best, out, true
}

// nodePick is one node of a preemption plan with its victims.
type nodePick struct {
	node    int32
	cost    vcost
	victims []victim
}

// tryPreempt looks for victims that make the job fit and, if it finds
// them, stops them and keeps their cards for the job. It returns when the
// job is expected to start, or 0. It never preempts for a job that would
// not then fit.
func (c *cycle) tryPreempt(pi int32, r rights) int64 {
	p := &c.pending[pi]
	if p.g <= 0 || !c.possible(&r) {
		return 0
	}
	// Most searches are for jobs within their quota (needFree 0): their
	// failures are bits by the job's shape (pjob.shape: jobs with equal
	// shapeKeyOf share it) and flags; the rest go to a map.
	flags, byShape := r.flags(), r.needFree == 0
	var key failKey
	if byShape {
		if c.shapeFailed[p.shape]&(1<<flags) != 0 {
			return 0
		}
	} else if key = failKeyOf(&r, p); c.failed[key] {
		return 0
	}
	var picks []nodePick
	if p.n == 1 {
		picks = c.preemptSingle(p, &r)
	} else {
		picks = c.preemptGang(p, &r)
	}
	if picks == nil {
		if byShape {
			c.shapeFailed[p.shape] |= 1 << flags
		} else {
			c.failed[key] = true
		}
		return 0
	}
	at := c.nowNs
	stopped := map[int32]bool{}
	c.lastVictims, c.lastNodes = c.lastVictims[:0], c.lastNodes[:0]
	for _, pk := range picks {
		c.lastNodes = append(c.lastNodes, pk.node)
		for _, v := range pk.victims {
			if stopped[v.job] {
				continue
			}
			stopped[v.job] = true
			c.lastVictims = append(c.lastVictims, v.job)
			c.preempt(v, p)
		}
	}
	prefer := make([]uint64, len(picks))
	for k, pk := range picks {
		for _, v := range pk.victims {
			prefer[k] |= v.mask
		}
		at = max(at, c.drainDeadline(pk.node))
	}
	for k, pk := range picks {
		c.claim(pk.node, p.g, prefer[k], at+p.timeout)
	}
	return at
}

// victimsEnd is when victims told to stop now are gone: their longest
// grace.
func (c *cycle) victimsEnd(vs []victim) int64 {
	at := c.nowNs
	for _, v := range vs {
		at = max(at, c.nowNs+c.running[v.job].grace)
	}
	return at
}

func (c *cycle) preemptSingle(p *pjob, r *rights) []nodePick {
	var bestPick nodePick
	var best *nodePick // &bestPick once one is found
	byClassOnly := !r.latency && !r.reclaim && !r.projReclaim && !r.queueReclaim
	// Nodes are visited by the work their cheapest victim would lose, in
	// power-of-two buckets; once the best set loses less than a bucket's
	// floor, no later node can do better.
	for b := range c.lostSets {
		if best != nil && best.cost.protected == 0 && lostFloor(b) > best.cost.lost {
			break
		}
		if c.lostCount[b] == 0 {
			continue
		}
		set := c.lostSets[b]
		for i := set.next(0); i >= 0; i = set.next(i + 1) {
			if pk, ok := c.preemptOnNode(i, p, r, byClassOnly, best); ok {
				bestPick, best = pk, &bestPick
			}
		}
	}
	if best == nil {
		return nil
	}
	return []nodePick{*best}
}

// preemptOnNode is the cheapest victim set on node i for p, if it beats
// best.
func (c *cycle) preemptOnNode(i int32, p *pjob, r *rights, byClassOnly bool, best *nodePick) (nodePick, bool) {
	cons := &c.cons[p.cons]
	nd := &c.nodes[i]
	if nd.free+nd.drain+nd.pCards < p.g || !cons.in[nd.sg] || !capacityOK(nd, p) {
		return nodePick{}, false
	}
	// Cheap refusals from the node's summary: no victim of a lower class
	// (or batch job, for a latency job), or no set that could lose less
	// work than the best found.
	if nd.pMin >= r.class && (byClassOnly || (r.latency && !r.reclaim && !r.projReclaim && !r.queueReclaim && !nd.pBatch)) {
		return nodePick{}, false
	}
	if best != nil {
		// The best this node could offer: one unprotected victim losing
		// its cheapest holder's work and freeing just what is missing.
		ideal := vcost{lost: nd.pLost, count: 1, freed: max(1, p.g-nd.free-nd.drain)}
		if !ideal.less(best.cost) {
			return nodePick{}, false
		}
	}
	{
		var bound *vcost
		if best != nil {
			bound = &best.cost
		}
		cost, vs, ok := c.bestOnNode(i, p, r, p.g, bound)
		if !ok || len(vs) == 0 {
			return nodePick{}, false
		}
		if end := c.victimsEnd(vs) + p.timeout; nd.reserved && end > c.resv.at && nd.extra < p.g {
			c.sawBackfill = true
			return nodePick{}, false
		}
		return nodePick{node: i, cost: cost, victims: vs}, true
	}
}

func (c *cycle) preemptGang(p *pjob, r *rights) []nodePick {
	cons := &c.cons[p.cons]
	var best []nodePick
	var bestCost vcost
	for gi := range c.ggroups {
		gg := &c.ggroups[gi]
		if !cons.in[gg.key.sg] || len(gg.nodes) < p.n {
			continue
		}
		var picks []nodePick
		for _, i := range gg.nodes {
			nd := &c.nodes[i]
			if nd.free+nd.drain+nd.pCards < p.g || nd.total < p.g || !capacityOK(nd, p) {
				continue
			}
			cost, vs, ok := c.bestOnNode(i, p, r, p.g, nil)
			if !ok {
				continue
			}
			if end := c.victimsEnd(vs) + p.timeout; nd.reserved && end > c.resv.at && nd.extra < p.g {
				c.sawBackfill = true
				continue
			}
			picks = append(picks, nodePick{node: i, cost: cost, victims: vs})
		}
		if len(picks) < p.n {
			continue
		}
		slices.SortStableFunc(picks, func(a, b nodePick) int {
			switch {
			case a.cost.less(b.cost):
				return -1
			case b.cost.less(a.cost):
				return 1
			}
			return int(a.node - b.node)
		})
		picks = picks[:p.n]
		var total vcost
		victims := 0
		for _, pk := range picks {
			total = total.add(pk.cost)
			victims += len(pk.victims)
		}
		if victims == 0 {
			continue // fits without victims: refused for another reason
		}
		if best == nil || total.less(bestCost) {
			best, bestCost = picks, total
		}
	}
	return best
}

// preempt stops victim v to make room for p.
func (c *cycle) preempt(v victim, p *pjob) {
	r := &c.running[v.job]
	detail := fmt.Sprintf("preempted by job %s (%s)", c.idOf(p), c.ruleText(v.rule, p, r))
	c.stopJob(v.job, StopPreempted, detail)
	c.preemptions = append(c.preemptions, Preemption{Victim: r.j.ID, For: c.idOf(p), Rule: v.rule, GPUs: r.total,
		LostWork: time.Duration(r.lost)})
}

func (c *cycle) ruleText(rule string, pj *pjob, v *rjob) string {
	p := c.job(pj)
	switch rule {
	case RulePriority:
		return fmt.Sprintf("priority %s over %s", p.Spec.Priority, v.j.Spec.Priority)
	case RuleLatency:
		return fmt.Sprintf("latency queue %s over batch queue %s", p.Spec.Queue, v.j.Spec.Queue)
	case RuleReclaim:
		if v.team == pj.team {
			return fmt.Sprintf("project %s takes back its guaranteed GPUs", p.Spec.Project)
		}
		return fmt.Sprintf("team %s takes back its guaranteed GPUs from team %s", p.Spec.Team, v.j.Spec.Team)
	case RuleQueue:
		return fmt.Sprintf("queue %s takes back its reserved GPUs", p.Spec.Queue)
	case RuleQuota:
		return fmt.Sprintf("team %s at its quota: priority %s over its own %s", p.Spec.Team, p.Spec.Priority, v.j.Spec.Priority)
	}
	return rule
}

// stopJob marks a holding job as stopping: its cards drain, its usage
// stops counting towards borrowing, and the plan gets its Stop.
func (c *cycle) stopJob(ri int32, reason, detail string) {
	r := &c.running[ri]
	if r.stopping {
		return
	}
	r.stopping = true
	r.end = min(r.end, c.nowNs+r.grace)
	if r.preemptible && !r.fresh {
		c.preemptible--
	}
	for _, pl := range c.rplaces[r.p0:r.p1] {
		nd := &c.nodes[pl.node]
		for m := pl.mask; m != 0; m &= m - 1 {
			nd.cards[bits.TrailingZeros64(m)].live--
		}
		c.recount(pl.node)
	}
	c.teams[r.team].stopping += r.total
	if r.project >= 0 {
		c.projects[r.project].stopping += r.total
	}
	q := &c.queues[r.queue]
	c.unmetTotal -= q.unmet()
	q.stopping += r.total
	c.unmetTotal += q.unmet()
	c.stops = append(c.stops, Stop{Job: r.j.ID, Reason: reason, Detail: detail})
}

// stopTimedOut stops running jobs past their timeout, in id order.
func (c *cycle) stopTimedOut() {
	for ri := range c.running {
		r := &c.running[ri]
		j := r.j
		if j.State != broker.StateRunning || r.stopping || j.StartedAt == nil || j.Spec.Timeout <= 0 {
			continue
		}
		if deadline := j.StartedAt.Add(j.Spec.Timeout.D()); !c.now.Before(deadline) {
			c.stopJob(int32(ri), StopTimedOut, "ran past its timeout of "+j.Spec.Timeout.String())
		}
	}
}
