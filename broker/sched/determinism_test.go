package sched

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/spillway-dev/spillway/broker"
)

// busySnapshot is a mixed cluster mid-day: jobs running (some of them
// shared, some stopping), more pending than fits, quotas, reservations.
func busySnapshot(seed uint64, nNodes, nJobs int) *Snapshot {
	rng := rand.New(rand.NewPCG(seed, 7))
	s := &Snapshot{Now: t0, Nodes: genNodes(nNodes), Policy: genPolicy(), Usage: map[string]float64{}}
	for i := 0; i < nJobs; i++ {
		s.Jobs = append(s.Jobs, genJob(rng, fmt.Sprintf("a%05d", i), t0))
	}
	applyPlan(s, Schedule(s))
	kept := s.Jobs[:0]
	for i, j := range s.Jobs {
		if j.State == broker.StateRunning && i%5 == 0 {
			continue // ended: its cards are free
		}
		kept = append(kept, j)
	}
	s.Jobs = kept
	for i, j := range s.Jobs {
		if j.State == broker.StateRunning {
			st := t0.Add(-time.Duration(rng.Int64N(int64(j.Spec.Timeout))))
			j.StartedAt = &st
			if i%13 == 0 {
				j.Stop = &broker.StopRequest{Reason: "cancelled", Signal: "SIGTERM", Grace: time.Minute, RequestedAt: t0.Add(-10 * time.Second)}
			}
		}
	}
	for i := 0; i < nJobs; i++ {
		s.Jobs = append(s.Jobs, genJob(rng, fmt.Sprintf("b%05d", i), t0))
	}
	for t := 0; t < genTeams; t++ {
		s.Usage[fmt.Sprintf("team-%d", t)] = float64(rng.IntN(1_000_000))
	}
	s.Nodes[3].State = broker.NodeLost
	s.Nodes[5].Unhealthy = map[int]string{2: "xid 79"}
	return s
}

// TestDeterministic: the same snapshot in any input order gives the same
// plan, and a Scheduler reused across different snapshots gives the same
// plan as a fresh one.
func TestDeterministic(t *testing.T) {
	s := busySnapshot(1, 40, 400)
	plan := Schedule(s)
	want := viewPlan(plan)
	if len(want.Starts) == 0 || len(want.Pending) == 0 || len(want.Stops) == 0 {
		t.Fatalf("the snapshot should exercise starts, stops and pending reasons: %d/%d/%d",
			len(want.Starts), len(want.Stops), len(want.Pending))
	}
	rng := rand.New(rand.NewPCG(42, 42))
	reused := New()
	for round := 0; round < 20; round++ {
		sh := *s
		sh.Nodes = append([]*broker.Node(nil), s.Nodes...)
		sh.Jobs = append([]*broker.Job(nil), s.Jobs...)
		rng.Shuffle(len(sh.Nodes), func(i, j int) { sh.Nodes[i], sh.Nodes[j] = sh.Nodes[j], sh.Nodes[i] })
		rng.Shuffle(len(sh.Jobs), func(i, j int) { sh.Jobs[i], sh.Jobs[j] = sh.Jobs[j], sh.Jobs[i] })
		if round%2 == 1 {
			reused.Schedule(busySnapshot(uint64(round), 25, 300)) // dirty the buffers
		}
		got := viewPlan(reused.Schedule(&sh))
		if diff := cmp.Diff(want, got); diff != "" {
			t.Fatalf("round %d: plan depends on input order or on reused buffers (-want +got):\n%s", round, diff)
		}
	}
}

// TestInvariants: over a busy cluster, no card is given twice, whole cards
// are never shared, shared cards stay within memory and the sharer cap,
// every pending job has exactly one reason, and preemption victims were
// preemptible.
func TestInvariants(t *testing.T) {
	for seed := uint64(1); seed <= 5; seed++ {
		s := busySnapshot(seed, 30, 300)
		plan := Schedule(s)
		type cardKey struct {
			node string
			gpu  int
		}
		whole := map[cardKey]string{}
		shared := map[cardKey][]int64{}
		add := func(job string, pls []broker.Placement) {
			for _, pl := range pls {
				for _, g := range pl.GPUs {
					k := cardKey{pl.Node, g}
					if pl.MemoryShare > 0 {
						shared[k] = append(shared[k], pl.MemoryShare)
						if w := whole[k]; w != "" {
							t.Fatalf("seed %d: %s shares %v held whole by %s", seed, job, k, w)
						}
						continue
					}
					if w := whole[k]; w != "" || len(shared[k]) > 0 {
						t.Fatalf("seed %d: %s and %q hold %v", seed, job, w, k)
					}
					whole[k] = job
				}
			}
		}
		byID := map[string]*broker.Job{}
		for _, j := range s.Jobs {
			byID[j.ID] = j
			if j.State.Holding() {
				add(j.ID, j.Placements)
			}
		}
		for _, st := range plan.Starts {
			if byID[st.Job].State != broker.StatePending {
				t.Fatalf("seed %d: started %s in state %s", seed, st.Job, byID[st.Job].State)
			}
			add(st.Job, st.Placements)
		}
		for k, shares := range shared {
			sum := int64(0)
			for _, m := range shares {
				sum += m
			}
			if len(shares) > 4 || sum > 80*gi {
				t.Fatalf("seed %d: card %v has %d sharers with %d bytes", seed, k, len(shares), sum)
			}
		}
		seen := map[string]bool{}
		for _, pe := range plan.Pending {
			if seen[pe.Job] || byID[pe.Job].State != broker.StatePending || pe.Reason.Code() == "" || pe.Reason.Message() == "" || pe.Reason.Position() < 1 {
				t.Fatalf("seed %d: bad pending entry %+v", seed, pe)
			}
			seen[pe.Job] = true
		}
		for _, st := range plan.Starts {
			seen[st.Job] = true
		}
		for _, j := range s.Jobs {
			if j.State == broker.StatePending && !seen[j.ID] {
				t.Fatalf("seed %d: pending job %s neither started nor has a reason", seed, j.ID)
			}
		}
		for _, p := range plan.Preemptions {
			if !byID[p.Victim].Spec.Preemptible || byID[p.Victim].Stop != nil {
				t.Fatalf("seed %d: victim %s was not preemptible or already stopping", seed, p.Victim)
			}
		}
	}
}
