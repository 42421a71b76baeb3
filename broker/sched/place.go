package sched

import (
	"math/bits"
	"slices"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/onprem/gpu"
)

// miss says why a job found no place on free cards.
type miss uint8

const (
	missCards    miss = iota // not enough free cards
	missBackfill             // only on reserved nodes, past the reservation
	missReserve              // only by taking cards reserved for other queues
)

// accepts reports whether node i may take g of the job's cards until end:
// CPU and memory fit (where the node declares them), and the head's
// reservation is not delayed (EASY backfill).
func (c *cycle) accepts(i int32, p *pjob, g int, end int64) bool {
	nd := &c.nodes[i]
	if nd.cpuCap > 0 && nd.cpuFree < p.cpu {
		return false
	}
	if nd.memCap > 0 && nd.memFree < p.mem {
		return false
	}
	if nd.reserved && end > c.resv.at && nd.extra < g {
		c.sawBackfill = true
		return false
	}
	return true
}

// capacityOK reports whether the node could ever hold the job's CPU and
// memory.
func capacityOK(nd *node, p *pjob) bool {
	return (nd.cpuCap == 0 || nd.cpuCap >= p.cpu) && (nd.memCap == 0 || nd.memCap >= p.mem)
}

// findSingle returns the ready node with at least g free cards for a
// single-node job, -1 when none. A preemptible job goes to the best fit:
// the fewest free cards first, so whole nodes stay free for large jobs;
// then the lowest index (name order). A job that cannot be preempted goes
// by the end of protected work (findHorizon).
func (c *cycle) findSingle(p *pjob, g int, end int64) int32 {
	if !p.preemptible {
		return c.findHorizon(p, g, end)
	}
	cons := &c.cons[p.cons]
	for k := g; k <= c.K; k++ {
		best := int32(-1)
		for _, sg := range cons.sgs {
			if c.sgroups[sg].cnt[k] == 0 {
				continue
			}
			b := c.sgroups[sg].bucket[k]
			for i := b.next(0); i >= 0 && (best < 0 || i < best); i = b.next(i + 1) {
				if c.accepts(i, p, g, end) {
					best = i
					break
				}
			}
		}
		if best >= 0 {
			return best
		}
	}
	return -1
}

// findHorizon places a job that cannot be preempted on the node whose end
// of protected work (hardEnd: the latest declared end of the work there
// that cannot be preempted) it pushes back least, then the fewest free
// cards, then the lowest index. Nodes holding no such work come last: that
// way protected work gathers on nodes that empty of it together, and a
// large job finds a whole node it can have by preemption or by waiting
// out one end rather than several. -1 when no node fits.
func (c *cycle) findHorizon(p *pjob, g int, end int64) int32 {
	const never = int64(1<<63 - 1)
	cons := &c.cons[p.cons]
	best, bestGrow := int32(-1), never
	for k := g; k <= c.K; k++ {
		bestK := int32(-1)
		for _, sg := range cons.sgs {
			if c.sgroups[sg].cnt[k] == 0 {
				continue
			}
			b := c.sgroups[sg].bucket[k]
			for i := b.next(0); i >= 0; i = b.next(i + 1) {
				nd := &c.nodes[i]
				grow := never
				if nd.hardEnd > 0 {
					grow = max(0, end-nd.hardEnd)
				}
				// A node seen at a lower k wins ties: it has fewer
				// free cards. Within k the lowest index wins.
				if grow > bestGrow || (grow == bestGrow && (best >= 0 && (bestK < 0 || i > bestK))) {
					continue
				}
				if !c.accepts(i, p, g, end) {
					continue
				}
				if grow < bestGrow || bestK < 0 || i < bestK {
					best, bestGrow, bestK = i, grow, i
				}
			}
		}
		if bestGrow == 0 {
			break
		}
	}
	return best
}

// findShared looks for g shared cards with room for the job's memory on one
// node (packing sharers together), else a node where shared cards plus
// free cards make g. It returns the node and the shared cards to use.
func (c *cycle) findShared(p *pjob, g int, end int64) (int32, uint64) {
	cons := &c.cons[p.cons]
	bestNode, bestMask, bestWhole := int32(-1), uint64(0), g+1
	for i := c.sharedSet.next(0); i >= 0; i = c.sharedSet.next(i + 1) {
		nd := &c.nodes[i]
		if !cons.in[nd.sg] || !c.accepts(i, p, g, end) {
			continue
		}
		mask, n := c.sharedCards(nd, p.share, g)
		whole := g - n
		if whole > nd.free || whole >= bestWhole {
			continue
		}
		bestNode, bestMask, bestWhole = i, mask, whole
		if whole == 0 {
			break
		}
	}
	return bestNode, bestMask
}

// sharedCards picks up to g shared cards of nd that can take share more
// bytes, tightest fit first.
func (c *cycle) sharedCards(nd *node, share int64, g int) (uint64, int) {
	cand := c.scratch.cards[:0]
	for p := range nd.cards {
		cd := &nd.cards[p]
		if cd.healthy && cd.sharers > 0 && !cd.whole && !cd.claimed && cd.live == cd.sharers &&
			int(cd.sharers) < c.maxSharers && cd.mem > share && cd.mem-cd.memUsed >= share {
			cand = append(cand, int32(p))
		}
	}
	slices.SortFunc(cand, func(a, b int32) int {
		ra, rb := nd.cards[a].mem-nd.cards[a].memUsed, nd.cards[b].mem-nd.cards[b].memUsed
		if ra != rb {
			if ra < rb {
				return -1
			}
			return 1
		}
		return int(a - b)
	})
	c.scratch.cards = cand
	var mask uint64
	n := 0
	for _, p := range cand {
		if n == g {
			break
		}
		mask |= 1 << uint(p)
		n++
	}
	return mask, n
}

// findGang picks n nodes of one gang group with at least g cards each
// (free ones, plus draining ones when withDrain): in the group that leaves
// the fewest cards over, best-fit nodes first.
func (c *cycle) findGang(p *pjob, g, n int, end int64, withDrain bool) []int32 {
	cons := &c.cons[p.cons]
	bestGroup, bestLeft := -1, 0
	chosen := c.scratch.gang[:0]
	for gi := range c.ggroups {
		gg := &c.ggroups[gi]
		if !cons.in[gg.key.sg] || len(gg.nodes) < n {
			continue
		}
		if !withDrain {
			have := 0
			for k := g; k <= c.K; k++ {
				have += gg.cnt[k]
			}
			if have < n {
				continue
			}
		}
		cand := c.scratch.cand[:0]
		for _, i := range gg.nodes {
			nd := &c.nodes[i]
			capa := nd.free
			if withDrain {
				capa += nd.drain
			}
			if capa >= g && c.accepts(i, p, g, end) {
				cand = append(cand, nodeCap{i: i, capa: capa})
			}
		}
		c.scratch.cand = cand
		if len(cand) < n {
			continue
		}
		slices.SortFunc(cand, func(a, b nodeCap) int {
			if a.capa != b.capa {
				return a.capa - b.capa
			}
			return int(a.i - b.i)
		})
		pick := cand[:n]
		if len(c.job(p).AvoidPairs) > 0 {
			if pick = c.avoidPairs(p, cand, n); pick == nil {
				continue
			}
		}
		left := 0
		for _, nc := range pick {
			left += nc.capa - g
		}
		if bestGroup < 0 || left < bestLeft {
			bestGroup, bestLeft = gi, left
			chosen = chosen[:0]
			for _, nc := range pick {
				chosen = append(chosen, nc.i)
			}
		}
	}
	c.scratch.gang = chosen
	if bestGroup < 0 {
		return nil
	}
	slices.Sort(chosen)
	return chosen
}

type nodeCap struct {
	i    int32
	capa int
}

// reserveOK reports whether taking w free cards leaves what other queues
// have reserved. Preemptible jobs may use reserved cards.
func (c *cycle) reserveOK(p *pjob, w int) bool {
	if p.preemptible || w == 0 {
		return true
	}
	others := c.unmetTotal - c.queues[p.queue].unmet()
	return c.freeTotal-w >= others
}

// tryStart places the job on free cards now, or records in c.miss why not.
func (c *cycle) tryStart(pi int32) bool {
	p := &c.pending[pi]
	end := c.nowNs + p.timeout
	c.sawBackfill = false
	c.miss = missCards
	if p.g <= 0 {
		return false
	}
	// Free cards only get fewer during a cycle, so a shape that found no
	// place will not find one later in the same cycle.
	// Most jobs differ only in cards and nodes: their failures are bits
	// in fitBits; the rest go to a map.
	plain := p.share == 0 && p.cpu == 0 && p.mem == 0 && p.g < 64 && p.n < 64
	word, bit := int(p.cons)*64+p.g, uint64(1)<<uint(p.n&63)
	var fk fitKey
	if plain {
		if word < len(c.fitBits) && c.fitBits[word]&bit != 0 {
			return false
		}
	} else {
		fk = fitKey{g: p.g, n: p.n, cons: p.cons, share: p.share, cpu: p.cpu, mem: p.mem}
		if c.fitFailed[fk] {
			return false
		}
	}
	ok := c.startNow(pi, end)
	if !ok && c.miss == missCards && !c.sawBackfill {
		if plain {
			for len(c.fitBits) <= word {
				c.fitBits = append(c.fitBits, 0)
			}
			c.fitBits[word] |= bit
		} else {
			c.fitFailed[fk] = true
		}
	}
	return ok
}

// fitKey is the shape of a job as far as finding free cards goes.
type fitKey struct {
	g, n  int
	cons  int32
	share int64
	cpu   float64
	mem   int64
}

func (c *cycle) startNow(pi int32, end int64) bool {
	p := &c.pending[pi]
	if p.share > 0 {
		if i, shared := c.findShared(p, p.g, end); i >= 0 {
			nd := &c.nodes[i]
			need := p.g - bits.OnesCount64(shared)
			whole := uint64(0)
			if need > 0 {
				if !c.reserveOK(p, need) {
					c.miss = missReserve
					return false
				}
				whole = c.pickCards(nd, need, freeCards(nd))
			}
			c.commitStart(pi, []int32{i}, []uint64{shared | whole}, end)
			return true
		}
	}
	if p.n == 1 {
		i := c.findSingle(p, p.g, end)
		if i < 0 {
			if c.sawBackfill {
				c.miss = missBackfill
			}
			return false
		}
		if !c.reserveOK(p, p.g) {
			c.miss = missReserve
			return false
		}
		nd := &c.nodes[i]
		c.commitStart(pi, []int32{i}, []uint64{c.pickCards(nd, p.g, freeCards(nd))}, end)
		return true
	}
	nodes := c.findGang(p, p.g, p.n, end, false)
	if nodes == nil {
		if c.sawBackfill {
			c.miss = missBackfill
		}
		return false
	}
	if !c.reserveOK(p, p.g*p.n) {
		c.miss = missReserve
		return false
	}
	masks := make([]uint64, len(nodes))
	for k, i := range nodes {
		nd := &c.nodes[i]
		masks[k] = c.pickCards(nd, p.g, freeCards(nd))
	}
	c.commitStart(pi, slices.Clone(nodes), masks, end)
	return true
}

// freeCards is the mask of nd's free cards.
func freeCards(nd *node) uint64 {
	var m uint64
	for p := range nd.cards {
		if nd.cards[p].free() {
			m |= 1 << uint(p)
		}
	}
	return m
}

// drainingCards is the mask of nd's draining cards.
func drainingCards(nd *node) uint64 {
	var m uint64
	for p := range nd.cards {
		if nd.cards[p].draining() {
			m |= 1 << uint(p)
		}
	}
	return m
}

// pickCards chooses g cards among those in from: the lowest indexes when
// all cards are equally linked, else the set with the smallest sum of
// pairwise links (nvidia-smi topo: NVLink < one PCIe switch < … < across
// NUMA nodes), grown greedily from each seed.
func (c *cycle) pickCards(nd *node, g int, from uint64) uint64 {
	if bits.OnesCount64(from) <= g {
		return from
	}
	if nd.uniform {
		var m uint64
		for k := 0; k < g; k++ {
			low := from & -from
			m |= low
			from &^= low
		}
		return m
	}
	topo := nd.n.Inventory.Topology
	dist := func(a, b int) int {
		l, ok := link(topo, nd.cards[a].index, nd.cards[b].index)
		if !ok {
			return int(gpu.LinkSys)
		}
		return int(l)
	}
	best, bestCost := uint64(0), -1
	for seeds := from; seeds != 0; seeds &= seeds - 1 {
		seed := bits.TrailingZeros64(seeds)
		m := uint64(1) << uint(seed)
		cost := 0
		for k := 1; k < g; k++ {
			pick, pickCost := -1, 0
			for rest := from &^ m; rest != 0; rest &= rest - 1 {
				q := bits.TrailingZeros64(rest)
				d := 0
				for in := m; in != 0; in &= in - 1 {
					d += dist(q, bits.TrailingZeros64(in))
				}
				if pick < 0 || d < pickCost {
					pick, pickCost = q, d
				}
			}
			m |= 1 << uint(pick)
			cost += pickCost
		}
		if bestCost < 0 || cost < bestCost {
			best, bestCost = m, cost
		}
	}
	return best
}

// commitStart records a start: the cards become held, the job becomes a
// fresh running job, usage and queue counts grow.
func (c *cycle) commitStart(pi int32, nodes []int32, masks []uint64, end int64) {
	p := &c.pending[pi]
	ri := int32(len(c.running))
	j := c.job(p)
	r := rjob{j: j, team: p.team, project: p.project, queue: p.queue, class: p.class, latency: p.latency,
		preemptible: p.preemptible, fresh: true, total: p.g * p.n, end: end,
		grace: int64(j.Spec.Checkpoint.Grace.D()), p0: int32(len(c.rplaces))}
	c.running = append(c.running, r)
	st := Start{Job: j.ID, Placements: make([]broker.Placement, len(nodes))}
	for k, i := range nodes {
		nd := &c.nodes[i]
		mask := masks[k]
		pl := broker.Placement{Node: nd.n.Name, GPUs: make([]int, 0, p.g), UUIDs: make([]string, 0, p.g)}
		for m := mask; m != 0; m &= m - 1 {
			cd := &nd.cards[bits.TrailingZeros64(m)]
			if p.share > 0 {
				cd.sharers++
				cd.memUsed += p.share
			} else {
				cd.whole = true
			}
			cd.live++
			pl.GPUs = append(pl.GPUs, cd.index)
			pl.UUIDs = append(pl.UUIDs, cd.uuid)
		}
		pl.MemoryShare = p.share
		st.Placements[k] = pl
		if nd.cpuCap > 0 {
			nd.cpuFree -= p.cpu
		}
		if nd.memCap > 0 {
			nd.memFree -= p.mem
		}
		if nd.reserved && end > c.resv.at {
			nd.extra -= bits.OnesCount64(mask)
		}
		nd.holders = append(nd.holders, holder{job: ri, mask: mask})
		c.rplaces = append(c.rplaces, placeRef{node: i, mask: mask})
		c.recount(i)
	}
	c.running[ri].p1 = int32(len(c.rplaces))
	c.addUse(p)
	c.starts = append(c.starts, st)
}

// addUse counts a pending job as holding its cards (started, or waiting
// for cards kept for it): in its team, project, queue (keeping
// unmetTotal) and limited array.
func (c *cycle) addUse(p *pjob) {
	gpus := p.g * p.n
	c.teams[p.team].used += gpus
	if p.project >= 0 {
		c.projects[p.project].used += gpus
	}
	if a := c.arrayOfPending(p); a >= 0 {
		c.arrays[a].running++
	}
	qu := &c.queues[p.queue]
	c.unmetTotal -= qu.unmet()
	qu.held += gpus
	c.unmetTotal += qu.unmet()
}

// cardUntil fills until[p] with when each card of node i is expected to be
// free: the latest end among its holders, or its claim's end.
func (c *cycle) cardUntil(i int32, until *[maxCards]int64) {
	nd := &c.nodes[i]
	for p := range nd.cards {
		until[p] = 0
		if nd.cards[p].claimed {
			until[p] = nd.cards[p].claimUntil
		}
	}
	for _, h := range nd.holders {
		end := c.running[h.job].end
		for m := h.mask; m != 0; m &= m - 1 {
			p := bits.TrailingZeros64(m)
			if !nd.cards[p].claimed && end > until[p] {
				until[p] = end
			}
		}
	}
}

// tryClaim holds cards that stopping jobs are releasing (with free cards
// of the same node or gang) for the job, so that nothing else takes them
// and no further victims are needed. It returns when the job is expected
// to start, or 0.
func (c *cycle) tryClaim(pi int32) int64 {
	p := &c.pending[pi]
	if p.g <= 0 || c.drainNodes == 0 {
		return 0
	}
	var nodes []int32
	if p.n == 1 {
		cons := &c.cons[p.cons]
		best, bestLeft := int32(-1), 0
		for i := c.drainSet.next(0); i >= 0; i = c.drainSet.next(i + 1) {
			nd := &c.nodes[i]
			capa := nd.free + nd.drain
			if !cons.in[nd.sg] || capa < p.g || nd.free >= p.g {
				continue // a node with enough free cards was refused for another reason
			}
			at := c.drainDeadline(i)
			if !c.accepts(i, p, p.g, at+p.timeout) {
				continue
			}
			if best < 0 || capa-p.g < bestLeft {
				best, bestLeft = i, capa-p.g
			}
		}
		if best < 0 {
			return 0
		}
		nodes = []int32{best}
	} else {
		nodes = c.findGang(p, p.g, p.n, c.nowNs+p.timeout, true)
		if nodes == nil {
			return 0
		}
		waits := false
		for _, i := range nodes {
			waits = waits || c.nodes[i].free < p.g
		}
		if !waits {
			return 0 // the gang fits on free cards and was refused for another reason
		}
		nodes = slices.Clone(nodes)
	}
	at := c.nowNs
	for _, i := range nodes {
		at = max(at, c.drainDeadline(i))
	}
	for _, i := range nodes {
		c.claim(i, p.g, 0, at+p.timeout)
	}
	return at
}

// drainDeadline is the latest end among the stopping holders of node i.
func (c *cycle) drainDeadline(i int32) int64 {
	at := c.nowNs
	for _, h := range c.nodes[i].holders {
		if r := &c.running[h.job]; r.stopping {
			at = max(at, r.end)
		}
	}
	return at
}

// claim marks g cards of node i as kept for a waiting job until end:
// first those in prefer, then other draining cards, then free ones.
func (c *cycle) claim(i int32, g int, prefer uint64, end int64) {
	nd := &c.nodes[i]
	drain := drainingCards(nd)
	free := freeCards(nd)
	take := func(from uint64) {
		for m := from; m != 0 && g > 0; m &= m - 1 {
			cd := &nd.cards[bits.TrailingZeros64(m)]
			if cd.claimed || !(cd.free() || cd.draining()) {
				continue
			}
			cd.claimed, cd.claimUntil = true, end
			g--
		}
	}
	take(prefer & drain)
	take(drain)
	take(free)
	c.recount(i)
}
