package sched

import (
	"slices"
)

// reservation is the head job's EASY reservation during a cycle. Nodes in
// it carry reserved and extra; a later job may use a reserved node only if
// it ends by at or uses no more than the node's extra cards.
type reservation struct {
	active bool
	job    int32 // pending index
	at     int64
	nodes  []int32
}

type release struct {
	at   int64
	node int32
}

// reserve computes the earliest time the job fits on whole cards by
// declared timeouts: every held card is released at its holder's end
// (start + timeout, or the stop deadline), cards claimed for waiting jobs
// when those would end. The sweep walks releases in time order until a
// node (or a gang group's n nodes) has g free cards and, for a
// non-preemptible job, the other queues' reservations are still covered.
func (c *cycle) reserve(pi int32) bool {
	p := &c.pending[pi]
	if p.g <= 0 {
		return false
	}
	cons := &c.cons[p.cons]
	ev := c.scratch.releases[:0]
	var until [maxCards]int64
	for i := range c.nodes {
		nd := &c.nodes[i]
		if !nd.ready {
			continue
		}
		c.cardUntil(int32(i), &until)
		for k := range nd.cards {
			if cd := &nd.cards[k]; cd.healthy && !cd.free() {
				ev = append(ev, release{at: max(until[k], c.nowNs), node: int32(i)})
			}
		}
	}
	// The sweep takes releases in (at, node) order and usually stops after
	// a few of them, so they go in a min-heap (built in linear time)
	// rather than being sorted.
	c.scratch.releases = ev
	heapifyReleases(ev)

	freeAt := c.scratch.freeAt[:0]
	for i := range c.nodes {
		freeAt = append(freeAt, int32(c.nodes[i].free))
	}
	c.scratch.freeAt = freeAt
	total := c.freeTotal
	others := 0
	if !p.preemptible {
		others = c.unmetTotal - c.queues[p.queue].unmet()
	}
	w := p.g * p.n
	fits := func(i int32) bool {
		nd := &c.nodes[i]
		return nd.ready && cons.in[nd.sg] && int(freeAt[i]) >= p.g && capacityOK(nd, p)
	}
	// pick returns the chosen nodes at the current point of the sweep, or
	// nil.
	pick := func() []int32 {
		if total-w < others {
			return nil
		}
		if p.n == 1 {
			best := int32(-1)
			for i := range c.nodes {
				if fits(int32(i)) && (best < 0 || freeAt[i] < freeAt[best]) {
					best = int32(i)
				}
			}
			if best < 0 {
				return nil
			}
			return []int32{best}
		}
		var bestNodes []int32
		bestLeft := 0
		for gi := range c.ggroups {
			gg := &c.ggroups[gi]
			if !cons.in[gg.key.sg] || len(gg.nodes) < p.n {
				continue
			}
			cand := c.scratch.cand[:0]
			for _, i := range gg.nodes {
				if fits(i) {
					cand = append(cand, nodeCap{i: i, capa: int(freeAt[i])})
				}
			}
			c.scratch.cand = cand
			if len(cand) < p.n {
				continue
			}
			slices.SortFunc(cand, func(a, b nodeCap) int {
				if a.capa != b.capa {
					return a.capa - b.capa
				}
				return int(a.i - b.i)
			})
			left := 0
			for _, nc := range cand[:p.n] {
				left += nc.capa - p.g
			}
			if bestNodes == nil || left < bestLeft {
				bestLeft = left
				bestNodes = bestNodes[:0]
				for _, nc := range cand[:p.n] {
					bestNodes = append(bestNodes, nc.i)
				}
			}
		}
		return bestNodes
	}

	at := c.nowNs
	nodes := pick()
	for nodes == nil && len(ev) > 0 {
		at = ev[0].at
		changed := false
		for len(ev) > 0 && ev[0].at == at {
			i := ev[0].node
			ev = popRelease(ev)
			freeAt[i]++
			total++
			changed = changed || fits(i)
		}
		// Only a node that just reached g cards, or the reserve condition
		// just met, can change the answer; for gangs check every time a
		// node fits.
		if changed || total-w == others {
			nodes = pick()
		}
	}
	if nodes == nil {
		return false
	}
	slices.Sort(nodes)
	c.resv.active, c.resv.job, c.resv.at = true, pi, at
	c.resv.nodes = append(c.resv.nodes[:0], nodes...)
	for _, i := range nodes {
		nd := &c.nodes[i]
		nd.reserved = true
		nd.extra = int(freeAt[i]) - p.g
	}
	return true
}

func (a release) less(b release) bool {
	return a.at < b.at || (a.at == b.at && a.node < b.node)
}

// heapifyReleases makes h a binary min-heap by (at, node).
func heapifyReleases(h []release) {
	for i := len(h)/2 - 1; i >= 0; i-- {
		siftDownRelease(h, i)
	}
}

// popRelease removes the least release, h[0], and returns the shorter heap.
func popRelease(h []release) []release {
	n := len(h) - 1
	h[0] = h[n]
	h = h[:n]
	siftDownRelease(h, 0)
	return h
}

func siftDownRelease(h []release, i int) {
	for {
		l := 2*i + 1
		if l >= len(h) {
			return
		}
		m := l
		if r := l + 1; r < len(h) && h[r].less(h[l]) {
			m = r
		}
		if !h[m].less(h[i]) {
			return
		}
		h[i], h[m] = h[m], h[i]
		i = m
	}
}
