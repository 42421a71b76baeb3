package sched

import (
	"cmp"
	"encoding/binary"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/spillway-dev/spillway/broker"
)

// cycle is the working state of one Schedule call. Its slices and maps
// are kept between calls only to reuse their memory, but for jc, which
// keeps what pending jobs' records take from the jobs alone.
type cycle struct {
	s          *Snapshot
	pol        Policy
	now        time.Time
	nowNs      int64
	maxSharers int

	nodeOrder  []int32
	nodes      []node
	nodeIdx    map[string]int32
	sgroups    []sgroup
	sgIndex    map[sgKey]int32
	ggroups    []ggroup
	ggIndex    map[ggKey]int32
	K          int // most healthy cards on one node
	freeTotal  int // free cards on ready nodes, kept equal to the sum of their free counts
	drainSet   bitset
	sharedSet  bitset
	preemptSet bitset
	// lostSets[b] holds the nodes of preemptSet whose cheapest victim
	// loses work in lostBucket b.
	lostSets [65]bitset
	// lostCount[b] is the number of nodes in lostSets[b].
	lostCount [65]int32

	teams    []team
	teamIdx  map[string]int32
	projects []project
	projIdx  map[projKey]int32
	// arrays are the job arrays with a limit on elements running at once
	// (--array 0-999%10) that this cycle met, by id in arrIdx.
	arrays     []arrayUse
	arrIdx     map[string]int32
	queues     []queue
	queueIdx   map[string]int32
	tqps       []tqp
	tqpIdx     map[tqpKey]int32
	unmetTotal int // sum over queues of their unmet reservation
	cons       []constraint
	consIdx    map[consKey]int32

	running []rjob
	rplaces []placeRef
	pending []pjob
	// pendRef[k] is pending[k]'s record and id once ordered.
	pendRef []jobRef
	keys    []sortKey
	sizeRef int
	// preemptible counts running jobs that could be preempted; pMinClass
	// is the lowest class among those loaded with the snapshot and pBatch
	// whether one of them is in a batch queue (bounds: victims only
	// leave during a cycle).
	preemptible int
	pMinClass   int32
	pBatch      bool

	plan      Plan
	pendBuf   []Pending
	rctx      *reasonCtx // this cycle's reason table, new every cycle
	fitFailed map[fitKey]bool
	fitBits   []uint64 // fitBits[cons*64+g] has bit n when that shape found no place
	// everKnown[cons*64+g] has bit n when canEverFit was computed for
	// that shape (without CPU and memory), everFits when it was true.
	everKnown, everFits []uint64
	drainNodes          int // nodes in drainSet
	stops               []Stop
	starts              []Start
	preemptions         []Preemption
	resv                reservation
	failed              map[failKey]bool
	// lastVictims and lastNodes are the last successful preemption's.
	lastVictims []int32
	lastNodes   []int32
	// miss and sawBackfill tell why the last tryStart found no place.
	miss        miss
	sawBackfill bool

	scratch scratch

	jc jobCache
	// tqpMap, projMap, consMap and shapeMap take jc's interned names to
	// this cycle's entries (-1: not looked up yet).
	tqpMap, projMap, consMap, shapeMap, arrMap []int32
	// shapeIdx numbers this cycle's job shapes (shapeKeyOf);
	// shapeFailed[s] has bit f when a preemption search with flags f
	// (and needFree 0) failed for shape s.
	shapeIdx    map[failKey]int32
	shapeFailed []uint64
}

// placeRef is one node's share of a running job.
type placeRef struct {
	node int32
	mask uint64
}

// rjob is a job holding cards: running, starting, or started this cycle.
type rjob struct {
	j                    *broker.Job
	team, project, queue int32
	class                int32
	latency              bool
	preemptible          bool
	// stopping jobs have a stop request (earlier or this cycle).
	stopping bool
	// fresh jobs were started by this cycle.
	fresh bool
	total int
	end   int64 // expected end (unix ns): timeout, or stop deadline
	lost  int64 // ns of work lost if stopped now
	grace int64
	// p0:p1 is the job's range in cycle.rplaces.
	p0, p1 int32
}

// pjob is a pending job. It copies what the cycle needs from the job, so
// that the walk and the plan never go back to the (cold) job record. It
// holds no pointers (the job and its id are in the cache's refs), so
// that laying 100,000 of them out in order is a plain copy that the
// garbage collector neither watches nor scans.
type pjob struct {
	// rec is the job's derived record in cycle.jc.
	rec                  int32
	team, project, queue int32
	class                int32
	latency              bool
	preemptible          bool
	// starved jobs have waited in the queue past the starvation age.
	starved   bool
	g, n      int   // cards per node, nodes
	share     int64 // memory per card when it may share a card, else 0
	cons      int32
	shape     int32 // this cycle's number for shapeKeyOf(p)
	cpu       float64
	mem       int64
	timeout   int64
	sub       int64
	notBefore int64 // retry backoff (unix ns), 0 when none
}

type team struct {
	name     string
	used     int // GPUs held by the team's jobs, including stopping ones
	stopping int // GPUs of those jobs that were told to stop
	hasQuota bool
	guar     int
	limit    int // guar + borrow limit; -1 when unlimited
	share    float64
	fair     float64
}

// effective is what the team holds once its stopping jobs are gone.
func (t *team) effective() int { return t.used - t.stopping }

// borrowing reports whether the team uses more than its guarantee.
func (t *team) borrowing() bool { return t.effective() > t.guar }

type projKey struct {
	team int32
	name string
}

type project struct {
	name     string
	used     int
	stopping int
	hasQuota bool
	guar     int
	limit    int
}

func (p *project) effective() int  { return p.used - p.stopping }
func (p *project) borrowing() bool { return p.effective() > p.guar }

// arrayUse is one array with a limit on its elements running at once:
// the limit, and its elements holding cards (running, starting, stopping,
// or started by this cycle).
type arrayUse struct {
	id             string
	limit, running int
}

// arrayFull reports whether the pending job's array runs the most
// elements it may at once, and then says so in r.
func (c *cycle) arrayFull(p *pjob, r *Reason) bool {
	i := c.arrayOfPending(p)
	if i < 0 || c.arrays[i].running < c.arrays[i].limit {
		return false
	}
	a := &c.arrays[i]
	r.kind, r.arr, r.used, r.limit = kindArrayLimit, i, int32(a.running), int32(a.limit)
	return true
}

// arrayOf is the cycle's index of the array id with that limit.
func (c *cycle) arrayOf(id string, limit int) int32 {
	if i, ok := c.arrIdx[id]; ok {
		return i
	}
	i := int32(len(c.arrays))
	c.arrIdx[id] = i
	c.arrays = append(c.arrays, arrayUse{id: id, limit: limit})
	return i
}

type queue struct {
	name     string
	kind     QueueKind
	reserved int
	sharing  bool
	held     int
	stopping int
}

// unmet is the part of the queue's reservation its jobs do not use.
func (q *queue) unmet() int { return max(0, q.reserved-(q.held-q.stopping)) }

type consKey struct {
	model  string
	minMem int64
	onprem bool
}

// constraint is the set of single-node groups a job may use.
type constraint struct {
	key consKey
	sgs []int32
	// in[g] reports whether sgroup g is in sgs.
	in []bool
}

// sortKey orders pending jobs: key ascending (it is the complement of
// starved, latency tier, class and score, or of starved and submit time),
// then submit time, then id (both read through idx, the job's index in
// cycle.pending: equal keys are rare, and 16 bytes move faster than 24).
type sortKey struct {
	key uint64
	idx int32
}

func (c *cycle) reset(s *Snapshot) {
	c.s = s
	c.pol = s.Policy
	c.now = s.Now
	c.nowNs = s.Now.UnixNano()
	c.maxSharers = s.Policy.MaxSharersPerGPU
	if c.maxSharers <= 0 {
		c.maxSharers = 4
	}
	if c.nodeIdx == nil {
		c.nodeIdx = map[string]int32{}
		c.sgIndex = map[sgKey]int32{}
		c.ggIndex = map[ggKey]int32{}
		c.teamIdx = map[string]int32{}
		c.projIdx = map[projKey]int32{}
		c.arrIdx = map[string]int32{}
		c.queueIdx = map[string]int32{}
		c.tqpIdx = map[tqpKey]int32{}
		c.consIdx = map[consKey]int32{}
		c.failed = map[failKey]bool{}
		c.fitFailed = map[fitKey]bool{}
		c.shapeIdx = map[failKey]int32{}
	}
	clear(c.shapeIdx)
	c.shapeFailed = c.shapeFailed[:0]
	clear(c.fitFailed)
	c.fitBits = c.fitBits[:0]
	c.everKnown, c.everFits = c.everKnown[:0], c.everFits[:0]
	clear(c.teamIdx)
	clear(c.projIdx)
	clear(c.arrIdx)
	c.arrays = c.arrays[:0]
	clear(c.queueIdx)
	clear(c.tqpIdx)
	c.tqps = c.tqps[:0]
	clear(c.consIdx)
	clear(c.failed)
	c.teams, c.projects, c.queues, c.cons = c.teams[:0], c.projects[:0], c.queues[:0], c.cons[:0]
	c.running, c.rplaces, c.pending, c.keys = c.running[:0], c.rplaces[:0], c.pending[:0], c.keys[:0]
	c.stops, c.starts, c.preemptions = nil, nil, nil
	c.drainNodes = 0
	c.resv = reservation{nodes: c.resv.nodes[:0]}
	c.unmetTotal, c.preemptible, c.pMinClass, c.pBatch = 0, 0, 0, false
}

func (c *cycle) teamOf(name string) int32 {
	if i, ok := c.teamIdx[name]; ok {
		return i
	}
	i := int32(len(c.teams))
	c.teamIdx[name] = i
	t := team{name: name, limit: -1, share: 1}
	if tp, ok := c.pol.Teams[name]; ok {
		if tp.Share > 0 {
			t.share = tp.Share
		}
		if q := tp.Quota; q != nil {
			t.hasQuota, t.guar = true, q.GPUs
			if q.BorrowLimit != nil {
				t.limit = q.GPUs + *q.BorrowLimit
			}
		}
	}
	c.teams = append(c.teams, t)
	return i
}

func (c *cycle) projectOf(t int32, name string) int32 {
	if name == "" {
		return -1
	}
	k := projKey{team: t, name: name}
	if i, ok := c.projIdx[k]; ok {
		return i
	}
	i := int32(len(c.projects))
	c.projIdx[k] = i
	p := project{name: name, limit: -1}
	if q, ok := c.pol.Teams[c.teams[t].name].Projects[name]; ok {
		p.hasQuota, p.guar = true, q.GPUs
		if q.BorrowLimit != nil {
			p.limit = q.GPUs + *q.BorrowLimit
		}
	}
	c.projects = append(c.projects, p)
	return i
}

func (c *cycle) queueOf(name string) int32 {
	if i, ok := c.queueIdx[name]; ok {
		return i
	}
	i := int32(len(c.queues))
	c.queueIdx[name] = i
	qp := c.pol.Queues[name]
	c.queues = append(c.queues, queue{name: name, kind: qp.Kind, reserved: qp.Reserved, sharing: qp.Sharing})
	return i
}

func (c *cycle) consOf(model string, minMem int64, onprem bool) int32 {
	k := consKey{model: model, minMem: minMem, onprem: onprem}
	if i, ok := c.consIdx[k]; ok {
		return i
	}
	i := int32(len(c.cons))
	c.consIdx[k] = i
	var sgs []int32
	var in []bool
	if int(i) < cap(c.cons) {
		old := c.cons[:i+1][i]
		sgs, in = old.sgs[:0], old.in[:0]
	}
	for g := range c.sgroups {
		key := c.sgroups[g].key
		ok := key.mem >= minMem && modelMatches(key.model, model) && (!onprem || key.pool == "onprem")
		if ok {
			sgs = append(sgs, int32(g))
		}
		in = append(in, ok)
	}
	c.cons = append(c.cons[:i], constraint{key: k, sgs: sgs, in: in})
	return i
}

// modelMatches reports whether a card model satisfies a gpuModel
// constraint: "H100" matches "NVIDIA H100 80GB HBM3".
func modelMatches(have, want string) bool {
	if want == "" {
		return true
	}
	if len(want) > len(have) {
		return false
	}
	for i := 0; i+len(want) <= len(have); i++ {
		if strings.EqualFold(have[i:i+len(want)], want) {
			return true
		}
	}
	return false
}

// shapeOf numbers p's shapeKeyOf in this cycle.
func (c *cycle) shapeOf(p *pjob) int32 {
	k := shapeKeyOf(p)
	if i, ok := c.shapeIdx[k]; ok {
		return i
	}
	i := int32(len(c.shapeFailed))
	c.shapeIdx[k] = i
	c.shapeFailed = append(c.shapeFailed, 0)
	return i
}

func (c *cycle) classOf(name string) int32 { return int32(c.pol.Priorities[name]) }

// burstCode is a job's burst policy in one byte.
type burstCode uint8

const (
	burstAllowed burstCode = iota
	burstNever
	burstPrefer
)

func burstCodeOf(b broker.BurstPolicy) burstCode {
	switch b {
	case broker.BurstNever:
		return burstNever
	case broker.BurstPrefer:
		return burstPrefer
	}
	return burstAllowed
}

func (b burstCode) policy() broker.BurstPolicy {
	return [...]broker.BurstPolicy{broker.BurstAllowed, broker.BurstNever, broker.BurstPrefer}[b]
}

// tqpKey is a job's team, queue and priority class names: one map lookup
// finds all three.
type tqpKey struct{ team, queue, priority string }

type tqp struct {
	team, queue int32
	class       int32
}

func (c *cycle) tqpOf(team, queue, priority string) int32 {
	k := tqpKey{team, queue, priority}
	if i, ok := c.tqpIdx[k]; ok {
		return i
	}
	i := int32(len(c.tqps))
	c.tqpIdx[k] = i
	c.tqps = append(c.tqps, tqp{team: c.teamOf(team), queue: c.queueOf(queue), class: c.classOf(priority)})
	return i
}

// heldSince is when a holding job took its cards: its start, or the last
// time it was scheduled.
func heldSince(j *broker.Job, now time.Time) time.Time {
	if j.StartedAt != nil {
		return *j.StartedAt
	}
	for i := len(j.History) - 1; i >= 0; i-- {
		if j.History[i].To == broker.StateStarting {
			return j.History[i].At
		}
	}
	return now
}

// loadJobs applies the holding jobs to the cluster and collects the
// pending ones. Holding jobs are applied in id order, so the holder lists
// (and through them victim choice) do not depend on input order.
func (c *cycle) loadJobs() {
	s := c.s
	c.consOf("", 0, false) // constraint 0: any node
	c.pending = slices.Grow(c.pending, len(s.Jobs))
	// Queues with a reservation count even when none of their jobs exist.
	names := c.scratch.names[:0]
	for name, q := range c.pol.Queues {
		if q.Reserved > 0 {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	for _, name := range names {
		c.queueOf(name)
	}
	c.scratch.names = names
	hold, bound := c.scratch.hold[:0], c.scratch.bound[:0]
	c.beginCycle(len(s.Jobs))
	look := c.lookAtJobs()
	for k, j := range s.Jobs {
		switch look[k].kind {
		case lookHolding:
			hold = append(hold, j)
		case lookPending:
			c.addPending(j, k, int(look[k].rev))
		case lookProvisioning:
			if j.Machine != "" {
				bound = append(bound, j)
			}
		}
	}
	c.scratch.bound = bound
	c.endCycle()
	slices.SortFunc(hold, func(a, b *broker.Job) int { return strings.Compare(a.ID, b.ID) })
	c.scratch.hold = hold
	for _, j := range hold {
		c.addRunning(j)
	}
	c.indexNodes()
	for i := range c.queues {
		c.unmetTotal += c.queues[i].unmet()
	}
	c.fairShare()
}

// jobLook is what the cycle reads of every job first: which of its
// lists the job goes to, and its revision (the length of its history,
// see jobCache).
type jobLook struct {
	kind uint8
	rev  int32
}

const (
	lookOther uint8 = iota
	lookPending
	lookHolding
	lookProvisioning
)

// lookAtJobs reads each job's state and revision in a loop that does
// nothing else. The job records lie at scattered addresses and each read
// is a cache miss; in this loop the processor has several of them in
// flight at once, where the loop that adds the jobs would wait for each
// in turn (a fifth of a steady-state cycle went to these two reads).
func (c *cycle) lookAtJobs() []jobLook {
	look := c.scratch.look[:0]
	for _, j := range c.s.Jobs {
		l := jobLook{kind: lookOther, rev: int32(len(j.History))}
		switch {
		case j.State == broker.StatePending:
			l.kind = lookPending
		case j.State.Holding():
			l.kind = lookHolding
		case j.State == broker.StateProvisioning:
			l.kind = lookProvisioning
		}
		look = append(look, l)
	}
	c.scratch.look = look
	return look
}

// requeues is how many of the job's attempts ended other than by a
// failure retry (preempted, or its node lost); a job holding cards is in
// an attempt that has not ended.
func requeues(j *broker.Job) int {
	n := j.Attempt - j.Retries
	if j.State.Holding() {
		n--
	}
	return max(0, n)
}

// pastLimit reports whether a job requeued this many times has reached a
// Policy.PreemptionLimit of limit: its attempts are protected from then on.
func pastLimit(limit, requeues int) bool { return limit > 0 && requeues >= limit }

// Requeues is how many times a job was requeued (preempted, or its node
// lost; failure retries are not counted), and whether that protects it
// from further preemption under a Policy.PreemptionLimit of limit (0: no
// limit). A job that is not preemptible is never past the limit.
func Requeues(j *broker.Job, limit int) (n int, protected bool) {
	n = requeues(j)
	return n, j.Spec.Preemptible && pastLimit(limit, n)
}

func (c *cycle) addRunning(j *broker.Job) {
	t := c.teamOf(j.Spec.Team)
	q := c.queueOf(j.Spec.Queue)
	r := rjob{
		j:           j,
		team:        t,
		project:     c.projectOf(t, j.Spec.Project),
		queue:       q,
		class:       c.classOf(j.Spec.Priority),
		latency:     c.queues[q].kind == Latency,
		preemptible: j.Spec.Preemptible && !pastLimit(c.pol.PreemptionLimit, requeues(j)),
		stopping:    j.Stop != nil,
		total:       j.TotalGPUs(),
		grace:       int64(j.Spec.Checkpoint.Grace.D()),
	}
	start := heldSince(j, c.now)
	r.end = start.Add(j.Spec.Timeout.D()).UnixNano()
	if j.Stop != nil {
		r.end = min(r.end, j.Stop.RequestedAt.Add(j.Stop.Grace).UnixNano())
	}
	r.end = max(r.end, c.nowNs)
	saved := start
	if j.LastCheckpointAt != nil && j.LastCheckpointAt.After(saved) {
		saved = *j.LastCheckpointAt
	}
	r.lost = max(0, c.nowNs-saved.UnixNano())
	ri := int32(len(c.running))
	r.p0 = int32(len(c.rplaces))
	for _, pl := range j.Placements {
		ni, ok := c.nodeIdx[pl.Node]
		if !ok {
			continue
		}
		nd := &c.nodes[ni]
		var mask uint64
		for _, g := range pl.GPUs {
			p := nd.pos(g)
			if p < 0 {
				continue
			}
			mask |= 1 << uint(p)
			cd := &nd.cards[p]
			if pl.MemoryShare > 0 {
				cd.sharers++
				cd.memUsed += pl.MemoryShare
			} else {
				cd.whole = true
			}
			if !r.stopping {
				cd.live++
			}
		}
		if mask == 0 {
			continue
		}
		if nd.cpuCap > 0 {
			nd.cpuFree -= j.Spec.Resources.CPU
		}
		if nd.memCap > 0 {
			nd.memFree -= int64(j.Spec.Resources.Memory)
		}
		nd.holders = append(nd.holders, holder{job: ri, mask: mask})
		c.rplaces = append(c.rplaces, placeRef{node: ni, mask: mask})
	}
	r.p1 = int32(len(c.rplaces))
	c.running = append(c.running, r)
	c.teams[t].used += r.total
	if r.project >= 0 {
		c.projects[r.project].used += r.total
	}
	c.queues[q].held += r.total
	if j.ArrayLimit > 0 && j.ArrayID != "" {
		c.arrays[c.arrayOf(j.ArrayID, j.ArrayLimit)].running++
	}
	if r.stopping {
		c.teams[t].stopping += r.total
		if r.project >= 0 {
			c.projects[r.project].stopping += r.total
		}
		c.queues[q].stopping += r.total
	} else if r.preemptible {
		if c.preemptible == 0 || r.class < c.pMinClass {
			c.pMinClass = r.class
		}
		c.pBatch = c.pBatch || !r.latency
		c.preemptible++
	}
}

// fairShare computes each team's factor 2^(-U/S): U is the team's share
// of all decayed usage, S its share of all shares (Slurm's classic
// formula). Sums run over sorted names so the result is exact to the bit
// whatever the map order.
func (c *cycle) fairShare() {
	names := c.scratch.names[:0]
	for name := range c.s.Usage {
		names = append(names, name)
	}
	slices.Sort(names)
	totalUsage := 0.0
	for _, n := range names {
		if u := c.s.Usage[n]; u > 0 {
			totalUsage += u
		}
	}
	names = names[:0]
	for name := range c.pol.Teams {
		if _, ok := c.teamIdx[name]; !ok {
			names = append(names, name)
		}
	}
	for i := range c.teams {
		names = append(names, c.teams[i].name)
	}
	slices.Sort(names)
	totalShares := 0.0
	for _, n := range names {
		share := 1.0
		if tp, ok := c.pol.Teams[n]; ok && tp.Share > 0 {
			share = tp.Share
		}
		totalShares += share
	}
	c.scratch.names = names
	for i := range c.teams {
		t := &c.teams[i]
		u := 0.0
		if totalUsage > 0 {
			u = max(0, c.s.Usage[t.name]) / totalUsage
		}
		t.fair = math.Exp2(-u / (t.share / totalShares))
	}
}

// order sorts the pending jobs: starved jobs first by submit time, then
// latency queues, then class, then score, then submit time, then id. The
// first four pack into one word (1 bit starved, 1 bit latency, 20 bits
// class, 42 bits score), so most comparisons are one integer compare.
func (c *cycle) order() {
	pol := c.pol
	maxAge := float64(pol.MaxAge)
	c.sizeRef = max(1, c.K)
	keys := c.keys[:0]
	const maxClass, maxScore, maxSub = 1<<20 - 1, 1<<42 - 1, 1<<62 - 1
	for i := range c.pending {
		p := &c.pending[i]
		wait := c.nowNs - p.sub
		var k uint64
		if p.starved {
			// Starved jobs go first, oldest first.
			k = 1<<63 | uint64(maxSub-min(maxSub, max(0, p.sub)))
		} else {
			if p.latency {
				k |= 1 << 62
			}
			k |= uint64(min(maxClass, max(0, p.class))) << 42
			age := 0.0
			if maxAge > 0 {
				age = min(1, max(0, float64(wait)/maxAge))
			}
			size := min(1, float64(p.g*p.n)/float64(c.sizeRef))
			score := int64(pol.Weights.Age)*quantize(age) +
				int64(pol.Weights.FairShare)*quantize(c.teams[p.team].fair) +
				int64(pol.Weights.Size)*quantize(size)
			k |= uint64(min(maxScore, max(0, score)))
		}
		keys = append(keys, sortKey{key: ^k, idx: int32(i)})
	}
	keys, c.scratch.keys = radixSort(keys, c.scratch.keys)
	// Equal keys fall back to submit time, then id. They are not rare: an
	// array's elements share their class, score and submit time, and
	// 10,000 of them are one group.
	for lo := 0; lo < len(keys); {
		hi := lo + 1
		for hi < len(keys) && keys[hi].key == keys[lo].key {
			hi++
		}
		if hi-lo > 1 {
			c.sortTies(keys[lo:hi])
		}
		lo = hi
	}
	c.keys = keys
	// Lay the pending jobs out in that order, so the walk reads memory
	// front to back.
	// Reads go front to back and writes land at each job's rank: stores
	// overlap their cache misses, loads would wait on them.
	rank := slices.Grow(c.scratch.rank[:0], len(keys))[:len(keys)]
	for r, k := range keys {
		rank[k.idx] = int32(r)
	}
	c.scratch.rank = rank
	n := len(c.pending)
	ordered := slices.Grow(c.scratch.ordered[:0], n)[:n]
	for i := range c.pending {
		ordered[rank[i]] = c.pending[i]
	}
	c.pending, c.scratch.ordered = ordered, c.pending
	// The records and ids the plan names are gathered in a loop of their
	// own: they hold pointers, and while the garbage collector marks,
	// each pointer store also reads the word it overwrites — in order
	// here, where a scatter would wait for each at a random place.
	refs := slices.Grow(c.pendRef[:0], n)[:n]
	for r := range ordered {
		refs[r] = c.jc.refs[ordered[r].rec]
	}
	c.pendRef = refs
}

// radixSort sorts a by key (LSD, 11 bits a pass, stable), skipping passes
// where every key has the same digit. One read of the keys counts the
// digits of every pass. It returns the sorted slice and the other buffer.
func radixSort(a, tmp []sortKey) ([]sortKey, []sortKey) {
	const width, passes = 11, 6 // the counting loop below has one line per pass
	const _ = uint(passes*width-64) + uint(63-(passes-1)*width)
	const buckets = 1 << width
	if len(a) < 2 {
		return a, tmp
	}
	tmp = slices.Grow(tmp[:0], len(a))[:len(a)]
	var count [passes][buckets]int32
	for _, k := range a {
		x := k.key
		count[0][x&(buckets-1)]++
		count[1][(x>>width)&(buckets-1)]++
		count[2][(x>>(2*width))&(buckets-1)]++
		count[3][(x>>(3*width))&(buckets-1)]++
		count[4][(x>>(4*width))&(buckets-1)]++
		count[5][(x>>(5*width))&(buckets-1)]++
	}
	for pass := range passes {
		shift := uint(pass * width)
		cnt := &count[pass]
		if int(cnt[(a[0].key>>shift)&(buckets-1)]) == len(a) {
			continue
		}
		sum := int32(0)
		for d := range cnt {
			sum, cnt[d] = sum+cnt[d], sum
		}
		for _, k := range a {
			d := (k.key >> shift) & (buckets - 1)
			tmp[cnt[d]] = k
			cnt[d]++
		}
		a, tmp = tmp, a
	}
	return a, tmp
}

// tieKey orders jobs of equal sort key: submit time, then id. The id's
// bytes are packed big-endian into words, so that comparing the words
// (then the lengths) orders ids as strings.Compare does, without a read of
// each string's bytes at every comparison (which, across 100,000 jobs
// strewn over the heap, is a cache miss each).
type tieKey struct {
	sub int64
	id  [4]uint64
	n   int32 // the id's length
	idx int32
}

// packID packs an id of at most 32 bytes into a tieKey's words,
// zero-padded; ok is false for a longer one.
func packID(id string) (w [4]uint64, ok bool) {
	if len(id) > len(w)*8 {
		return w, false
	}
	var b [32]byte
	copy(b[:], id)
	for i := range w {
		w[i] = binary.BigEndian.Uint64(b[i*8:])
	}
	return w, true
}

func cmpTie(a, b tieKey) int {
	if a.sub != b.sub {
		return cmp.Compare(a.sub, b.sub)
	}
	for i := range a.id {
		if a.id[i] != b.id[i] {
			return cmp.Compare(a.id[i], b.id[i])
		}
	}
	return cmp.Compare(a.n, b.n)
}

// sortTies orders keys (all of one sort key) by submit time, then id.
func (c *cycle) sortTies(keys []sortKey) {
	ties := c.scratch.ties[:0]
	for _, k := range keys {
		p := &c.pending[k.idx]
		id := c.idOf(p)
		w, ok := packID(id)
		if !ok { // an id past 32 bytes: compare the strings themselves
			slices.SortFunc(keys, func(a, b sortKey) int {
				pa, pb := &c.pending[a.idx], &c.pending[b.idx]
				if pa.sub != pb.sub {
					return cmp.Compare(pa.sub, pb.sub)
				}
				return strings.Compare(c.idOf(pa), c.idOf(pb))
			})
			return
		}
		ties = append(ties, tieKey{sub: p.sub, id: w, n: int32(len(id)), idx: k.idx})
	}
	if len(ties) >= radixTiesMin {
		ties, c.scratch.tiesTmp = radixTies(ties, c.scratch.tiesTmp)
	} else {
		slices.SortFunc(ties, cmpTie)
	}
	for i := range ties {
		keys[i].idx = ties[i].idx
	}
	c.scratch.ties = ties
}

// radixTiesMin is the smallest group radixTies sorts; a comparison sort
// is quicker below it.
const radixTiesMin = 256

// tieField is a tieKey's f-th field as an unsigned number, least
// significant first: the id's length, its four words from the last, then
// the submit time (sign bit flipped, so that it orders as unsigned).
func tieField(t *tieKey, f int) uint64 {
	switch f {
	case 0:
		return uint64(t.n)
	case 1, 2, 3, 4:
		return t.id[4-f]
	default:
		return uint64(t.sub) ^ 1<<63
	}
}

// radixTies sorts a in cmpTie's order with a least-significant-digit radix
// sort that visits only the digits differing within a: an array's
// elements differ in a few bytes of their ids, so 10,000 of them take two
// or three passes where a comparison sort takes 130,000 comparisons. tmp
// is scratch; it returns the sorted slice and the other buffer.
func radixTies(a, tmp []tieKey) ([]tieKey, []tieKey) {
	const width = 11
	const mask = 1<<width - 1
	tmp = slices.Grow(tmp[:0], len(a))[:len(a)]
	var cnt [1 << width]int32
	for f := range 6 {
		or, and := uint64(0), ^uint64(0)
		for i := range a {
			v := tieField(&a[i], f)
			or, and = or|v, and&v
		}
		diff := or ^ and
		for shift := uint(0); shift < 64; shift += width {
			if (diff>>shift)&mask == 0 {
				continue // every key has the same digit here
			}
			clear(cnt[:])
			for i := range a {
				cnt[(tieField(&a[i], f)>>shift)&mask]++
			}
			sum := int32(0)
			for d := range cnt {
				sum, cnt[d] = sum+cnt[d], sum
			}
			for i := range a {
				d := (tieField(&a[i], f) >> shift) & mask
				tmp[cnt[d]] = a[i]
				cnt[d]++
			}
			a, tmp = tmp, a
		}
	}
	return a, tmp
}

// quantize turns a factor in [0, 1] into millionths, so scores compare as
// integers.
func quantize(f float64) int64 { return int64(f * 1e6) }
