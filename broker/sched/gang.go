package sched

// avoidPairs picks n of the sorted candidates, best fit first, so that
// no two of them are a pairing the job's failed preflights ruled out
// (broker.Job.AvoidPairs, part of the snapshot); nil when no such n
// exist. The pick is greedy: a pairing rules out few nodes, and a job
// that runs out of pairings waits with the gang reason.
func (c *cycle) avoidPairs(p *pjob, cand []nodeCap, n int) []nodeCap {
	pick := c.scratch.pick[:0]
	for _, nc := range cand {
		name := c.nodes[nc.i].n.Name
		ok := true
		for _, q := range pick {
			if c.job(p).Avoids(name, c.nodes[q.i].n.Name) {
				ok = false
				break
			}
		}
		if ok {
			pick = append(pick, nc)
			if len(pick) == n {
				break
			}
		}
	}
	c.scratch.pick = pick
	if len(pick) < n {
		return nil
	}
	return pick
}
