package sched

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/broker"
)

// The figures of docs/benchmarks.md: 1,250 nodes × 8 GPUs, 100,000 pending
// jobs of 10 teams in 3 queues (the mixed workload of genJob).
const (
	benchNodes = 1250
	benchJobs  = 100_000
)

func benchSnapshot() *Snapshot {
	rng := rand.New(rand.NewPCG(2026, 11))
	s := &Snapshot{Now: t0, Nodes: genNodes(benchNodes), Policy: genPolicy(), Usage: map[string]float64{}}
	s.Jobs = make([]*broker.Job, benchJobs)
	for i := range s.Jobs {
		s.Jobs[i] = genJob(rng, fmt.Sprintf("j%07d", i), t0)
	}
	for t := 0; t < genTeams; t++ {
		s.Usage[fmt.Sprintf("team-%d", t)] = float64(rng.IntN(10_000_000))
	}
	return s
}

func reportHeap(b *testing.B, keep any) {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	b.ReportMetric(float64(ms.HeapAlloc)/(1<<20), "heap-MiB")
	runtime.KeepAlive(keep)
}

// BenchmarkFullCycle is one cycle over an empty cluster and 100,000
// pending jobs: it fills the 10,000 GPUs and gives every other job its
// reason. placements/s counts starts per second of scheduling.
func BenchmarkFullCycle(b *testing.B) {
	s := benchSnapshot()
	sc := New()
	starts := 0
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		starts = len(sc.Schedule(s).Starts)
	}
	b.ReportMetric(float64(starts), "starts/op")
	b.ReportMetric(float64(starts)*float64(b.N)/b.Elapsed().Seconds(), "placements/s")
	reportHeap(b, s)
}

// BenchmarkFullCycleBusy is one cycle over a full cluster (the first
// cycle's starts running) with the remaining ~96,000 jobs pending.
func BenchmarkFullCycleBusy(b *testing.B) {
	s := benchSnapshot()
	applyPlan(s, Schedule(s))
	sc := New()
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		sc.Schedule(s)
	}
	reportHeap(b, s)
}

// BenchmarkSteadyState: between cycles 1% of the jobs change — half of the
// changes are running jobs that end, half new submissions — and each
// cycle's plan is carried out before the next.
func BenchmarkSteadyState(b *testing.B) {
	s := benchSnapshot()
	applyPlan(s, Schedule(s))
	rng := rand.New(rand.NewPCG(7, 7))
	sc := New()
	next := benchJobs
	starts := 0
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		b.StopTimer()
		s.Now = s.Now.Add(time.Second)
		churn := len(s.Jobs) / 100
		ended := 0
		kept := s.Jobs[:0]
		for _, j := range s.Jobs {
			if ended < churn/2 && j.State == broker.StateRunning && rng.IntN(10) == 0 {
				ended++
				continue
			}
			kept = append(kept, j)
		}
		s.Jobs = kept
		for k := 0; k < churn-ended; k++ {
			s.Jobs = append(s.Jobs, genJob(rng, fmt.Sprintf("j%07d", next), s.Now))
			next++
		}
		b.StartTimer()
		plan := sc.Schedule(s)
		b.StopTimer()
		starts += len(plan.Starts)
		applyPlan(s, plan)
		b.StartTimer()
	}
	b.ReportMetric(float64(starts)/float64(b.N), "starts/op")
	reportHeap(b, s)
}
