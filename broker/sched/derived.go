package sched

import (
	"math"
	"slices"

	"github.com/spillway-dev/spillway/broker"
)

// jobCache keeps, from cycle to cycle, what each pending job's record
// takes from the job alone, so that a job that did not change is not read
// again: reading ~100,000 pointer-rich job records, and looking their
// team, queue, class, project and GPU model up by name, was a third of a
// cycle.
//
// An entry is keyed on the job record's address and its revision, the
// length of its history. The broker changes a job on a Clone and swaps it
// in (a new address); the simulator changes jobs in place only through
// their lifecycle methods (broker/lifecycle.go), and every change a
// pending job can go through — requeue, retry, burst unbind, a priority
// change — records a transition. What depends on the cycle (the policy,
// the nodes) is looked up anew each cycle through interned names, so a
// Scheduler that keeps the cache plans exactly as a fresh one.
type jobCache struct {
	slot map[*broker.Job]int32
	recs []derived
	// refs[i] is the job and id of recs[i]: apart, so that the records
	// hold no pointers and laying the refs out in order copies 24 bytes.
	refs []jobRef
	// seen[i] is the cycle that last used recs[i]; 0 marks a free slot.
	// pos[i] is the index in that cycle's snapshot of the job of recs[i]
	// (apart, so that the records are only written when a job changes).
	seen  []uint32
	pos   []int32
	free  []int32
	cycle uint32
	// lastSlot[k] is the slot of the snapshot's k-th job in the previous
	// cycle (-1: not a pending job), curSlot the same for this cycle; off
	// is how far the jobs last found moved in the snapshot. Snapshots that
	// keep their order between cycles find most jobs there, without a
	// map lookup.
	lastSlot, curSlot []int32
	off               int

	tqps   names[tqpKey]
	projs  names[projName]
	conss  names[consName]
	shapes names[shapeName]

	// Job arrays that limit their elements running at once are rare, so
	// they live beside the records, which keep their size: arr[i] is the
	// interned array of recs[i] (-1: none), arrLimit[a] array a's limit,
	// and limited counts the records with one (0: the cycle skips it all).
	arrs     names[string]
	arr      []int32
	arrLimit []int32
	limited  int
}

// names interns keys as dense int32 ids, kept across cycles.
type names[K comparable] struct {
	ids  map[K]int32
	keys []K
}

// id is k's id; a new key also gets a -1 ("not looked up this cycle")
// in the cycle's lookup table m.
func (n *names[K]) id(m *[]int32, k K) int32 {
	if i, ok := n.ids[k]; ok {
		return i
	}
	if n.ids == nil {
		n.ids = map[K]int32{}
	}
	i := int32(len(n.keys))
	n.ids[k], n.keys, *m = i, append(n.keys, k), append(*m, -1)
	return i
}

// maxInterns bounds the interned names, and maxShapes the interned
// shapes: past them (names churn, policy changes) the cache starts over.
const (
	maxInterns = 1 << 12
	maxShapes  = 1 << 16
)

type projName struct{ team, project string }

type consName struct {
	model  string
	minMem int64
}

// shapeName is a job's interned (team, queue, priority), (team, project)
// and (GPU model, card memory) with its cards and nodes: jobs of one
// shapeName have one shapeKeyOf in every cycle.
type shapeName struct {
	tqp, proj, cons int32
	g, n            int
}

// jobRef is a pending job's record and id.
type jobRef struct {
	j  *broker.Job
	id string
}

// derived is what a pending job's record takes from the job alone (its
// record and id are in the jobRef of the same slot).
type derived struct {
	rev int32
	// Interned (team, queue, priority), (team, project) — -1 for none —
	// and (GPU model, card memory), and all of them with g and n.
	tqp, proj, cons int32
	shape           int32
	preemptible     bool
	requeues        uint16 // requeues(j), capped; fits beside preemptible
	g, n            int
	gpuMem          int64
	cpu             float64
	mem             int64
	timeout         int64
	sub             int64
	notBefore       int64
	since           int64
}

// beginCycle readies the cache for one cycle's lookups.
func (c *cycle) beginCycle(jobs int) {
	jc := &c.jc
	if jc.slot == nil || len(jc.tqps.keys)+len(jc.projs.keys)+len(jc.conss.keys)+len(jc.arrs.keys) > maxInterns || len(jc.shapes.keys) > maxShapes {
		*jc = jobCache{slot: make(map[*broker.Job]int32, jobs), recs: jc.recs[:0], refs: jc.refs[:0], seen: jc.seen[:0], pos: jc.pos[:0], free: jc.free[:0],
			arr: jc.arr[:0]}
		clear(jc.refs[:cap(jc.refs)])
	}
	if more := jobs - len(jc.recs) + len(jc.free); more > 0 {
		jc.recs = slices.Grow(jc.recs, more)
		jc.refs = slices.Grow(jc.refs, more)
		jc.seen = slices.Grow(jc.seen, more)
		jc.pos = slices.Grow(jc.pos, more)
		jc.arr = slices.Grow(jc.arr, more)
	}
	jc.curSlot = fillInt32(jc.curSlot, jobs, -1)
	jc.cycle++
	if jc.cycle == 0 {
		jc.cycle = 1
	}
	c.tqpMap = fillInt32(c.tqpMap, len(jc.tqps.keys), -1)
	c.projMap = fillInt32(c.projMap, len(jc.projs.keys), -1)
	c.arrMap = fillInt32(c.arrMap, len(jc.arrs.keys), -1)
	c.consMap = fillInt32(c.consMap, len(jc.conss.keys), -1)
	c.shapeMap = fillInt32(c.shapeMap, len(jc.shapes.keys), -1)
}

func fillInt32(s []int32, n int, v int32) []int32 {
	s = s[:0]
	for range n {
		s = append(s, v)
	}
	return s
}

// endCycle drops the entries of jobs this cycle did not see pending.
func (c *cycle) endCycle() {
	jc := &c.jc
	jc.lastSlot, jc.curSlot = jc.curSlot, jc.lastSlot
	for i, s := range jc.seen {
		if s != 0 && s != jc.cycle {
			delete(jc.slot, jc.refs[i].j)
			jc.recs[i], jc.refs[i], jc.seen[i] = derived{}, jobRef{}, 0
			c.setArray(int32(i), nil)
			jc.free = append(jc.free, int32(i))
		}
	}
}

// derivedOf returns the slot of the derived record of j, the snapshot's
// pos-th job at revision rev (len(j.History)), kept from an earlier cycle
// when the job is the one seen then.
func (c *cycle) derivedOf(j *broker.Job, pos, rev int) int32 {
	jc := &c.jc
	i, ok := int32(-1), false
	if q := pos - jc.off; q >= 0 && q < len(jc.lastSlot) {
		if k := jc.lastSlot[q]; k >= 0 && jc.refs[k].j == j {
			i, ok = k, true
		}
	}
	if !ok {
		if i, ok = jc.slot[j]; ok {
			jc.off = pos - int(jc.pos[i])
		}
	}
	switch {
	case !ok:
		if n := len(jc.free); n > 0 {
			i, jc.free = jc.free[n-1], jc.free[:n-1]
		} else {
			i = int32(len(jc.recs))
			jc.recs = append(jc.recs, derived{})
			jc.refs = append(jc.refs, jobRef{})
			jc.seen = append(jc.seen, 0)
			jc.pos = append(jc.pos, 0)
			jc.arr = append(jc.arr, -1)
		}
		jc.slot[j] = i
		jc.refs[i] = jobRef{j: j, id: j.ID}
		c.derive(&jc.recs[i], j, rev)
		c.setArray(i, j)
	case jc.recs[i].rev != int32(rev):
		c.derive(&jc.recs[i], j, rev)
		c.setArray(i, j)
	}
	jc.seen[i], jc.pos[i], jc.curSlot[pos] = jc.cycle, int32(pos), i
	return i
}

// derive reads the job into d.
func (c *cycle) derive(d *derived, j *broker.Job, rev int) {
	res := j.Spec.Resources
	*d = derived{
		rev:         int32(rev),
		tqp:         c.jc.tqps.id(&c.tqpMap, tqpKey{j.Spec.Team, j.Spec.Queue, j.Spec.Priority}),
		proj:        -1,
		cons:        c.jc.conss.id(&c.consMap, consName{res.GPUModel, int64(res.GPUMemory)}),
		preemptible: j.Spec.Preemptible,
		requeues:    uint16(min(requeues(j), math.MaxUint16)),
		g:           res.GPUs,
		n:           max(1, res.Nodes),
		gpuMem:      int64(res.GPUMemory),
		cpu:         res.CPU,
		mem:         int64(res.Memory),
		timeout:     int64(j.Spec.Timeout.D()),
		sub:         j.SubmittedAt.UnixNano(),
		since:       pendingSince(j).UnixNano(),
	}
	if j.Spec.Project != "" {
		d.proj = c.jc.projs.id(&c.projMap, projName{j.Spec.Team, j.Spec.Project})
	}
	if j.NotBefore != nil {
		d.notBefore = j.NotBefore.UnixNano()
	}
	d.shape = c.jc.shapes.id(&c.shapeMap, shapeName{tqp: d.tqp, proj: d.proj, cons: d.cons, g: d.g, n: d.n})
}

// addPending adds a pending job at revision rev: its derived record, with what depends on
// this cycle's policy and nodes looked up through the interned names.
func (c *cycle) addPending(j *broker.Job, pos, rev int) {
	jc := &c.jc
	slot := c.derivedOf(j, pos, rev)
	d := &jc.recs[slot]
	tq := c.tqpMap[d.tqp]
	if tq < 0 {
		k := jc.tqps.keys[d.tqp]
		tq = c.tqpOf(k.team, k.queue, k.priority)
		c.tqpMap[d.tqp] = tq
	}
	t, q := c.tqps[tq].team, c.tqps[tq].queue
	proj := int32(-1)
	if d.proj >= 0 {
		if proj = c.projMap[d.proj]; proj < 0 {
			proj = c.projectOf(t, jc.projs.keys[d.proj].project)
			c.projMap[d.proj] = proj
		}
	}
	cons := c.consMap[d.cons]
	if cons < 0 {
		k := jc.conss.keys[d.cons]
		// Work placed by the scheduler stays on owned nodes: a burst
		// machine takes only the jobs the burst controller bound to it
		// (placeBound).
		cons = c.consOf(k.model, k.minMem, true)
		c.consMap[d.cons] = cons
	}
	p := pjob{
		rec:         slot,
		team:        t,
		project:     proj,
		queue:       q,
		class:       c.tqps[tq].class,
		latency:     c.queues[q].kind == Latency,
		preemptible: d.preemptible && !pastLimit(c.pol.PreemptionLimit, int(d.requeues)),
		g:           d.g,
		n:           d.n,
		cpu:         d.cpu,
		mem:         d.mem,
		timeout:     d.timeout,
		sub:         d.sub,
		notBefore:   d.notBefore,
		cons:        cons,
	}
	// Starvation is waiting in the queue, measured from when the job last
	// entered it: a job just preempted is old but not starving, and must
	// not take back the cards of the job that preempted it.
	if starve := int64(c.pol.StarvationAge); starve > 0 && c.nowNs-d.since >= starve {
		p.starved = true
	}
	if d.gpuMem > 0 && p.n == 1 && c.queues[q].sharing {
		p.share = d.gpuMem
	}
	if p.shape = c.shapeMap[d.shape]; p.shape < 0 {
		p.shape = c.shapeOf(&p)
		c.shapeMap[d.shape] = p.shape
	}
	c.pending = append(c.pending, p)
}

// setArray records the array of slot i's job j (nil: the slot is freed)
// when that array limits its elements running at once.
func (c *cycle) setArray(i int32, j *broker.Job) {
	jc := &c.jc
	a := int32(-1)
	if j != nil && j.ArrayLimit > 0 && j.ArrayID != "" {
		a = jc.arrs.id(&c.arrMap, j.ArrayID)
		if int(a) == len(jc.arrLimit) {
			jc.arrLimit = append(jc.arrLimit, 0)
		}
		jc.arrLimit[a] = int32(min(j.ArrayLimit, math.MaxInt32))
	}
	switch old := jc.arr[i]; {
	case old < 0 && a >= 0:
		jc.limited++
	case old >= 0 && a < 0:
		jc.limited--
	}
	jc.arr[i] = a
}

// arrayOfPending is the pending job's limited array in cycle.arrays, or
// -1 when its array has no limit or it is in none.
func (c *cycle) arrayOfPending(p *pjob) int32 {
	jc := &c.jc
	if jc.limited == 0 {
		return -1
	}
	a := jc.arr[p.rec]
	if a < 0 {
		return -1
	}
	i := c.arrMap[a]
	if i < 0 {
		i = c.arrayOf(jc.arrs.keys[a], int(jc.arrLimit[a]))
		c.arrMap[a] = i
	}
	return i
}

// job is the pending job's record.
func (c *cycle) job(p *pjob) *broker.Job { return c.jc.refs[p.rec].j }

// idOf is the pending job's id.
func (c *cycle) idOf(p *pjob) string { return c.jc.refs[p.rec].id }
