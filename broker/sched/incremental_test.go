package sched

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/spillway-dev/spillway/broker"
)

// TestIncrementalAgreesWithFresh: a Scheduler that keeps its jobs'
// derived records from cycle to cycle plans exactly as a fresh one, over
// randomized sequences of cycles in which jobs change the ways the broker
// and the simulator change them — in place through the lifecycle methods
// (start, stop, preemption, loss, burst bind and unbind), replaced by a
// changed copy (priority, project, retry backoff, avoided node pairs),
// submitted and ended — and the policy and the nodes change between
// cycles.
func TestIncrementalAgreesWithFresh(t *testing.T) {
	for seed := uint64(1); seed <= 4; seed++ {
		rng := rand.New(rand.NewPCG(seed, 99))
		s := busySnapshot(seed, 30, 300)
		for k, j := range s.Jobs {
			inArray(j, k)
		}
		inc := New()
		next := 0
		for round := 0; round < 25; round++ {
			got := viewPlan(inc.Schedule(s))
			plan := New().Schedule(s)
			want := viewPlan(plan)
			if diff := cmp.Diff(want, got); diff != "" {
				t.Fatalf("seed %d round %d: the incremental plan differs from a fresh one (-fresh +incremental):\n%s", seed, round, diff)
			}
			if round == 0 && (len(want.Starts) == 0 || len(want.Pending) == 0) {
				t.Fatalf("seed %d: the sequence should start jobs and leave jobs pending", seed)
			}
			mutate(rng, s, plan, &next)
		}
	}
}

// inArray makes every fifth job an element of one of three arrays that
// run at most 1, 2 and 3 elements at once, by the job's number k.
func inArray(j *broker.Job, k int) {
	if k%5 == 0 {
		a := k / 5 % 3
		j.ArrayID, j.ArrayLimit = fmt.Sprintf("array-%d", a), a+1
	}
}

// mutate carries out plan and changes the snapshot the ways jobs, the
// policy and the nodes change between cycles.
func mutate(rng *rand.Rand, s *Snapshot, plan Plan, next *int) {
	now := s.Now
	byID := map[string]int{}
	for i, j := range s.Jobs {
		byID[j.ID] = i
	}
	for _, st := range plan.Starts {
		j := s.Jobs[byID[st.Job]]
		j.Start(st.Placements, now)
		if rng.IntN(2) == 0 {
			j.Transit(now, broker.StateRunning, "started", "")
		}
	}
	for _, st := range plan.Stops {
		s.Jobs[byID[st.Job]].RequestStop(st.Reason, st.Detail, "scheduler", now)
	}
	s.Now = now.Add(time.Duration(1+rng.IntN(120)) * time.Second)
	later := s.Now
	kept := s.Jobs[:0]
	for _, j := range s.Jobs {
		r := rng.IntN(100)
		switch {
		case j.State.Holding() && j.Stop != nil && r < 50:
			if j.Spec.Preemptible {
				j.Preempted(later, "preempted", "") // in place, back to the queue
			} else {
				continue // ended
			}
		case j.State.Holding() && r < 5:
			continue // ended
		case j.State.Holding() && r < 7:
			j.Lose(later, later, "node_lost", "") // in place
		case j.State.Holding() && r < 9:
			// Failed, retried after a backoff: the broker's copy on write.
			c := j.Clone()
			nb := later.Add(time.Duration(rng.IntN(300)) * time.Second)
			c.Placements, c.Stop, c.NotBefore = nil, nil, &nb
			c.Transit(later, broker.StatePending, "retry", "")
			j = c
		case j.State == broker.StatePending && r < 3:
			c := j.Clone()
			c.Spec.Priority = []string{"low", "medium", "high"}[rng.IntN(3)]
			c.History = append(c.History, broker.Transition{At: later, From: c.State, To: c.State, Reason: "priority"})
			j = c
		case j.State == broker.StatePending && r < 5:
			c := j.Clone()
			c.Spec.Project = fmt.Sprintf("p%d", rng.IntN(3))
			j = c
		case j.State == broker.StatePending && r < 6 && j.Spec.Resources.Nodes > 1:
			c := j.Clone()
			c.AvoidPairs = append(c.AvoidPairs, broker.Pair(s.Nodes[0].Name, s.Nodes[1].Name))
			j = c
		case j.State == broker.StatePending && r < 8:
			j.Bind("m-"+j.ID, later, "") // in place
		case j.State == broker.StateProvisioning && r < 50:
			j.Unbind(later, "no capacity") // in place, back to the queue
		case j.State == broker.StatePending && r < 10:
			continue // cancelled
		}
		kept = append(kept, j)
	}
	s.Jobs = kept
	for k := rng.IntN(20); k > 0; k-- {
		j := genJob(rng, fmt.Sprintf("c%05d", *next), s.Now)
		inArray(j, *next)
		s.Jobs = append(s.Jobs, j)
		*next++
	}
	if rng.IntN(2) == 0 {
		// The broker's snapshot comes in map order; the simulator's and
		// the benchmarks' keep theirs.
		rng.Shuffle(len(s.Jobs), func(a, b int) { s.Jobs[a], s.Jobs[b] = s.Jobs[b], s.Jobs[a] })
	}
	switch rng.IntN(6) {
	case 0:
		// The policy changes: classes, sharing, a project quota.
		p := s.Policy
		p.Priorities = maps.Clone(p.Priorities)
		p.Priorities["medium"] = 150 + rng.IntN(200)
		p.Queues = maps.Clone(p.Queues)
		q := p.Queues["inference"]
		q.Sharing = !q.Sharing
		p.Queues["inference"] = q
		p.Teams = maps.Clone(p.Teams)
		p.Teams["team-1"] = TeamPolicy{Projects: map[string]Quota{"p1": {GPUs: 4, BorrowLimit: intp(rng.IntN(8))}}}
		s.Policy = p
	case 1:
		// A node is lost, or comes back.
		i := rng.IntN(len(s.Nodes))
		n := *s.Nodes[i]
		n.State = map[bool]broker.NodeState{true: broker.NodeReady, false: broker.NodeLost}[n.State == broker.NodeLost]
		s.Nodes = append([]*broker.Node(nil), s.Nodes...)
		s.Nodes[i] = &n
	}
	for name := range s.Usage {
		s.Usage[name] += float64(rng.IntN(100_000))
	}
}
