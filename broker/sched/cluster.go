package sched

import (
	"math/bits"
	"slices"
	"strings"
	"time"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/onprem/gpu"
)

// maxCards is the most cards of one node the scheduler uses: a node's
// cards are a bit mask in one word.
const maxCards = 64

// bitset is a set of small non-negative integers (node indexes).
type bitset []uint64

func newBitset(buf bitset, n int) bitset {
	words := (n + 63) / 64
	if cap(buf) >= words {
		buf = buf[:words]
		clear(buf)
		return buf
	}
	return make(bitset, words)
}

func (b bitset) set(i int32)      { b[i>>6] |= 1 << (uint(i) & 63) }
func (b bitset) unset(i int32)    { b[i>>6] &^= 1 << (uint(i) & 63) }
func (b bitset) has(i int32) bool { return b[i>>6]&(1<<(uint(i)&63)) != 0 }

// next returns the smallest member >= i, or -1.
func (b bitset) next(i int32) int32 {
	w := int(i >> 6)
	if w >= len(b) {
		return -1
	}
	word := b[w] &^ (1<<(uint(i)&63) - 1)
	for {
		if word != 0 {
			return int32(w*64 + bits.TrailingZeros64(word))
		}
		w++
		if w >= len(b) {
			return -1
		}
		word = b[w]
	}
}

// card is one GPU during a cycle. A card is free (no holder, not claimed),
// draining (every holder was told to stop, not claimed), or busy.
type card struct {
	index   int
	uuid    string
	mem     int64
	healthy bool
	// whole is set when a job holds the whole card; sharers and memUsed
	// count the jobs sharing it and the memory they were given.
	whole   bool
	sharers int32
	memUsed int64
	// live counts holders without a stop request.
	live int32
	// claimed cards are kept this cycle for a pending job that waits for
	// them (released by stopping jobs); claimUntil is when that job would
	// end.
	claimed    bool
	claimUntil int64
}

func (cd *card) free() bool {
	return cd.healthy && !cd.whole && cd.sharers == 0 && !cd.claimed
}

func (cd *card) draining() bool {
	return cd.healthy && (cd.whole || cd.sharers > 0) && cd.live == 0 && !cd.claimed
}

// holder is one job's cards on one node.
type holder struct {
	job  int32 // index into cycle.running
	mask uint64
}

// node is one node during a cycle.
type node struct {
	n     *broker.Node
	ready bool
	sg    int32 // single-node group: model, card memory, pool
	gg    int32 // gang group: sg, driver, gang label
	cards []card
	total int // healthy cards
	free  int // free cards
	drain int // draining cards
	// cpuCap and memCap are the node's CPU and memory (0: not declared;
	// copied here so that the searches do not follow n); cpuFree and
	// memFree are tracked only when the node declares them.
	cpuCap  float64
	memCap  int64
	cpuFree float64
	memFree int64
	holders []holder
	// uniform reports that every pair of cards is equally close, so the
	// lowest free indexes are as good as any.
	uniform bool
	// What preemption could get here, kept by refreshPreempt: cards whose
	// every live holder is preemptible, and the lowest class, the least
	// work lost and whether a batch job is among those holders.
	pCards  int
	pMin    int32
	pLost   int64
	pBatch  bool
	pBucket int8 // lostBucket(pLost), the node's place in cycle.lostSets; -1 when none
	// hardEnd is the latest expected end (unix ns) of the live work here
	// that cannot be preempted, 0 when none (findHorizon).
	hardEnd int64
	// reserved nodes hold the head's reservation; extra is the number of
	// cards they have beyond it at the reservation time.
	reserved bool
	extra    int
}

// pos returns the position of card index idx, or -1.
func (nd *node) pos(idx int) int {
	if idx >= 0 && idx < len(nd.cards) && nd.cards[idx].index == idx {
		return idx
	}
	for p := range nd.cards {
		if nd.cards[p].index == idx {
			return p
		}
	}
	return -1
}

type sgKey struct {
	model string
	mem   int64
	pool  string
}

// sgroup is the nodes of one GPU model, card memory and pool: what a
// single-node job's constraints select. bucket[k] holds the ready nodes
// with exactly k free cards.
type sgroup struct {
	key      sgKey
	bucket   []bitset
	cnt      []int // cnt[k] is the size of bucket[k]
	maxTotal int
}

type ggKey struct {
	sg     int32
	driver string
	label  string
}

// ggroup is the nodes a gang may span: one sgroup, one driver version and
// one gang label value. cnt[k] counts its ready nodes with k free cards.
type ggroup struct {
	key   ggKey
	nodes []int32
	cnt   []int
}

// buildCluster indexes the ready nodes by name order and groups them.
func (c *cycle) buildCluster() {
	s := c.s
	order := c.nodeOrder[:0]
	for i := range s.Nodes {
		order = append(order, int32(i))
	}
	slices.SortFunc(order, func(a, b int32) int { return strings.Compare(s.Nodes[a].Name, s.Nodes[b].Name) })
	c.nodeOrder = order

	c.nodes = c.nodes[:0]
	clear(c.nodeIdx)
	clear(c.sgIndex)
	clear(c.ggIndex)
	c.sgroups = c.sgroups[:0]
	c.ggroups = c.ggroups[:0]
	c.K = 0
	for _, oi := range order {
		n := s.Nodes[oi]
		if _, dup := c.nodeIdx[n.Name]; dup {
			continue
		}
		c.nodeIdx[n.Name] = int32(len(c.nodes))
		if len(c.nodes) < cap(c.nodes) {
			c.nodes = c.nodes[:len(c.nodes)+1] // keep the element's buffers
		} else {
			c.nodes = append(c.nodes, node{})
		}
		nd := &c.nodes[len(c.nodes)-1]
		c.initNode(nd, n)
	}
	nn := len(c.nodes)
	for g := range c.sgroups {
		sg := &c.sgroups[g]
		for k := range sg.bucket {
			sg.bucket[k] = newBitset(sg.bucket[k], nn)
		}
		for len(sg.bucket) <= c.K {
			sg.bucket = append(sg.bucket, newBitset(nil, nn))
		}
		sg.bucket = sg.bucket[:c.K+1]
		sg.cnt = slices.Grow(sg.cnt[:0], c.K+1)[:c.K+1]
		clear(sg.cnt)
	}
	for g := range c.ggroups {
		gg := &c.ggroups[g]
		gg.cnt = slices.Grow(gg.cnt[:0], c.K+1)[:c.K+1]
		clear(gg.cnt)
	}
	c.drainSet = newBitset(c.drainSet, nn)
	c.sharedSet = newBitset(c.sharedSet, nn)
	c.preemptSet = newBitset(c.preemptSet, nn)
	c.lostCount = [len(c.lostSets)]int32{}
	for b := range c.lostSets {
		c.lostSets[b] = newBitset(c.lostSets[b], nn)
	}
}

func (c *cycle) initNode(nd *node, n *broker.Node) {
	cards := nd.cards[:0]
	holders := nd.holders[:0]
	*nd = node{n: n, ready: n.State == broker.NodeReady, cards: cards, holders: holders, pBucket: -1}
	devs := n.Inventory.Devices
	sorted := slices.IsSortedFunc(devs, func(a, b gpu.Device) int { return a.Index - b.Index })
	if !sorted {
		devs = slices.Clone(devs)
		slices.SortFunc(devs, func(a, b gpu.Device) int { return a.Index - b.Index })
	}
	model, mem := "", int64(0)
	for _, d := range devs {
		if len(nd.cards) == maxCards {
			break
		}
		_, bad := n.Unhealthy[d.Index]
		nd.cards = append(nd.cards, card{index: d.Index, uuid: d.UUID, mem: d.MemoryBytes, healthy: !bad})
		if !bad {
			nd.total++
			if model == "" {
				model, mem = d.Model, d.MemoryBytes
			}
		}
	}
	nd.cpuCap, nd.memCap = n.CPU, n.Memory
	nd.cpuFree, nd.memFree = n.CPU, n.Memory
	nd.uniform = uniformTopology(n.Inventory.Topology, nd.cards)
	if nd.total > c.K {
		c.K = nd.total
	}
	key := sgKey{model: model, mem: mem, pool: n.Pool}
	sg, ok := c.sgIndex[key]
	if !ok {
		sg = int32(len(c.sgroups))
		c.sgIndex[key] = sg
		if len(c.sgroups) < cap(c.sgroups) {
			c.sgroups = c.sgroups[:len(c.sgroups)+1]
			c.sgroups[sg].key, c.sgroups[sg].maxTotal = key, 0
		} else {
			c.sgroups = append(c.sgroups, sgroup{key: key})
		}
	}
	nd.sg = sg
	if nd.ready {
		c.sgroups[sg].maxTotal = max(c.sgroups[sg].maxTotal, nd.total)
	}
	gk := ggKey{sg: sg, driver: n.Inventory.DriverVersion, label: n.Labels[c.pol.GangLabel]}
	gg, ok := c.ggIndex[gk]
	if !ok {
		gg = int32(len(c.ggroups))
		c.ggIndex[gk] = gg
		if len(c.ggroups) < cap(c.ggroups) {
			c.ggroups = c.ggroups[:len(c.ggroups)+1]
			c.ggroups[gg].key = gk
			c.ggroups[gg].nodes = c.ggroups[gg].nodes[:0]
		} else {
			c.ggroups = append(c.ggroups, ggroup{key: gk})
		}
	}
	nd.gg = gg
	if nd.ready {
		c.ggroups[gg].nodes = append(c.ggroups[gg].nodes, int32(len(c.nodes)-1))
	}
}

// uniformTopology reports whether all pairs of healthy cards have the same
// link (or the topology is unknown).
func uniformTopology(topo [][]gpu.Link, cards []card) bool {
	if len(topo) == 0 {
		return true
	}
	first, seen := gpu.Link(0), false
	for a := range cards {
		for b := a + 1; b < len(cards); b++ {
			l, ok := link(topo, cards[a].index, cards[b].index)
			if !ok {
				return true
			}
			if !seen {
				first, seen = l, true
			} else if l != first {
				return false
			}
		}
	}
	return true
}

func link(topo [][]gpu.Link, a, b int) (gpu.Link, bool) {
	if a < 0 || b < 0 || a >= len(topo) || b >= len(topo[a]) {
		return 0, false
	}
	return topo[a][b], true
}

// indexNodes computes the free and draining counts of every node once the
// running jobs are applied, and fills the indexes.
func (c *cycle) indexNodes() {
	c.freeTotal = 0
	for i := range c.nodes {
		nd := &c.nodes[i]
		free, drain := 0, 0
		for p := range nd.cards {
			switch cd := &nd.cards[p]; {
			case cd.free():
				free++
			case cd.draining():
				drain++
			}
		}
		nd.free, nd.drain = free, drain
		if !nd.ready {
			continue
		}
		c.sgroups[nd.sg].bucket[free].set(int32(i))
		c.sgroups[nd.sg].cnt[free]++
		c.ggroups[nd.gg].cnt[free]++
		c.freeTotal += free
		if drain > 0 {
			c.drainSet.set(int32(i))
			c.drainNodes++
		}
		c.refreshShared(int32(i))
		c.refreshPreempt(int32(i))
	}
}

// setFree moves a node to another free-card bucket.
func (c *cycle) setFree(i int32, v int) {
	nd := &c.nodes[i]
	old := nd.free
	nd.free = v
	if !nd.ready || old == v {
		return
	}
	sg := &c.sgroups[nd.sg]
	sg.bucket[old].unset(i)
	sg.bucket[v].set(i)
	sg.cnt[old]--
	sg.cnt[v]++
	gg := &c.ggroups[nd.gg]
	gg.cnt[old]--
	gg.cnt[v]++
	c.freeTotal += v - old
}

func (c *cycle) setDrain(i int32, v int) {
	nd := &c.nodes[i]
	nd.drain = v
	if !nd.ready {
		return
	}
	if was := c.drainSet.has(i); v > 0 && !was {
		c.drainSet.set(i)
		c.drainNodes++
	} else if v == 0 && was {
		c.drainSet.unset(i)
		c.drainNodes--
	}
}

// recount recomputes a node's free and draining counts after its cards
// changed.
func (c *cycle) recount(i int32) {
	nd := &c.nodes[i]
	free, drain := 0, 0
	for p := range nd.cards {
		switch cd := &nd.cards[p]; {
		case cd.free():
			free++
		case cd.draining():
			drain++
		}
	}
	c.setFree(i, free)
	c.setDrain(i, drain)
	c.refreshShared(i)
	c.refreshPreempt(i)
}

// refreshShared keeps sharedSet equal to the ready nodes with a shared
// card that can take another sharer.
func (c *cycle) refreshShared(i int32) {
	nd := &c.nodes[i]
	ok := false
	if nd.ready {
		for p := range nd.cards {
			cd := &nd.cards[p]
			if cd.healthy && cd.sharers > 0 && !cd.whole && cd.live == cd.sharers && int(cd.sharers) < c.maxSharers && cd.memUsed < cd.mem {
				ok = true
				break
			}
		}
	}
	if ok {
		c.sharedSet.set(i)
	} else {
		c.sharedSet.unset(i)
	}
}

// refreshPreempt keeps preemptSet equal to the ready nodes holding a
// preemptible job that was not told to stop, the node's summary of what
// preemption could free there, and its end of protected work.
func (c *cycle) refreshPreempt(i int32) {
	nd := &c.nodes[i]
	nd.pCards, nd.pMin, nd.pLost, nd.pBatch, nd.hardEnd = 0, 0, -1, false, 0
	var blocked, any uint64
	if nd.ready {
		for _, h := range nd.holders {
			r := &c.running[h.job]
			if r.stopping {
				continue
			}
			if !r.preemptible {
				nd.hardEnd = max(nd.hardEnd, r.end)
			}
			if !r.preemptible || r.fresh {
				blocked |= h.mask
				continue
			}
			any |= h.mask
			if nd.pLost < 0 || r.class < nd.pMin {
				nd.pMin = r.class
			}
			if lost := int64(r.total) * (r.lost / int64(time.Second)); nd.pLost < 0 || lost < nd.pLost {
				nd.pLost = lost
			}
			nd.pBatch = nd.pBatch || !r.latency
		}
	}
	if nd.pBucket >= 0 {
		c.lostSets[nd.pBucket].unset(i)
		c.lostCount[nd.pBucket]--
		nd.pBucket = -1
	}
	if any != 0 {
		for p := range nd.cards {
			if cd := &nd.cards[p]; any&(1<<uint(p)) != 0 && blocked&(1<<uint(p)) == 0 && !cd.claimed && cd.healthy {
				nd.pCards++
			}
		}
		c.preemptSet.set(i)
		nd.pBucket = lostBucket(nd.pLost)
		c.lostSets[nd.pBucket].set(i)
		c.lostCount[nd.pBucket]++
	} else {
		c.preemptSet.unset(i)
	}
}

// lostBucket groups work lost by powers of two: bucket b holds values in
// [lostFloor(b), 2*lostFloor(b)).
func lostBucket(lost int64) int8 { return int8(bits.Len64(uint64(max(0, lost)))) }

// lostFloor is the smallest value in bucket b.
func lostFloor(b int) int64 {
	if b == 0 {
		return 0
	}
	return 1 << uint(b-1)
}
