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

// reportCPU reports the process CPU time per op since cpu0.
func reportCPU(b *testing.B, cpu0 time.Duration) {
	if cpu := processCPU(); cpu > 0 {
		b.ReportMetric(float64(cpu-cpu0)/float64(b.N)/1e6, "cpu-ms/op")
	}
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
// reason. The Scheduler has seen these jobs before (it keeps their derived
// records); BenchmarkFullCycleCold is the same cycle from scratch.
// placements/s counts starts per second of scheduling.
func BenchmarkFullCycle(b *testing.B) {
	s := benchSnapshot()
	sc := New()
	sc.Schedule(s)
	starts := 0
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := processCPU()
	for b.Loop() {
		starts = len(sc.Schedule(s).Starts)
	}
	reportCPU(b, cpu0)
	b.ReportMetric(float64(starts), "starts/op")
	b.ReportMetric(float64(starts)*float64(b.N)/b.Elapsed().Seconds(), "placements/s")
	reportHeap(b, s)
}

// BenchmarkFullCycleCold is BenchmarkFullCycle with a new Scheduler for
// every cycle, as after a broker restart: every job's record is read.
func BenchmarkFullCycleCold(b *testing.B) {
	s := benchSnapshot()
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := processCPU()
	for b.Loop() {
		New().Schedule(s)
	}
	reportCPU(b, cpu0)
	reportHeap(b, s)
}

// busyBenchSnapshot is benchSnapshot after its first cycle: the starts
// running, each since a random point within its timeout (as in a cluster
// that has been up for a while), the other ~96,000 jobs pending.
func busyBenchSnapshot() *Snapshot {
	s := benchSnapshot()
	applyPlan(s, Schedule(s))
	rng := rand.New(rand.NewPCG(3, 3))
	for _, j := range s.Jobs {
		if j.State == broker.StateRunning {
			st := s.Now.Add(-time.Duration(rng.Int64N(int64(j.Spec.Timeout))))
			j.StartedAt = &st
		}
	}
	return s
}

// BenchmarkFullCycleBusy is one cycle over a full cluster with ~96,000
// jobs pending, a quarter of them high priority facing preemptible
// running jobs: a storm of preemptions.
func BenchmarkFullCycleBusy(b *testing.B) {
	s := busyBenchSnapshot()
	sc := New()
	sc.Schedule(s)
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := processCPU()
	for b.Loop() {
		sc.Schedule(s)
	}
	reportCPU(b, cpu0)
	reportHeap(b, s)
}

// BenchmarkSteadyState: between cycles 1% of the jobs change — half of the
// changes are running jobs that end, half new submissions — and each
// cycle's plan is carried out before the next.
func BenchmarkSteadyState(b *testing.B) {
	s := busyBenchSnapshot()
	rng := rand.New(rand.NewPCG(7, 7))
	sc := New()
	sc.Schedule(s)
	next := benchJobs
	starts := 0
	b.ReportAllocs()
	b.ResetTimer()
	var cpu time.Duration
	for b.Loop() {
		b.StopTimer()
		s.Now = s.Now.Add(time.Second)
		// Half the churn ends (running jobs picked at random), half is new:
		// the queue stays level, as in a steady state.
		churn := len(s.Jobs) / 100
		var running []int
		for i, j := range s.Jobs {
			if j.State == broker.StateRunning {
				running = append(running, i)
			}
		}
		end := map[int]bool{}
		for k := 0; k < churn/2 && k < len(running); k++ {
			r := k + rng.IntN(len(running)-k)
			running[k], running[r] = running[r], running[k]
			end[running[k]] = true
		}
		kept := s.Jobs[:0]
		for i, j := range s.Jobs {
			if !end[i] {
				kept = append(kept, j)
			}
		}
		s.Jobs = kept
		for k := 0; k < churn/2; k++ {
			s.Jobs = append(s.Jobs, genJob(rng, fmt.Sprintf("j%07d", next), s.Now))
			next++
		}
		b.StartTimer()
		cpu0 := processCPU()
		plan := sc.Schedule(s)
		cpu += processCPU() - cpu0
		b.StopTimer()
		starts += len(plan.Starts)
		applyPlan(s, plan)
		b.StartTimer()
	}
	b.ReportMetric(float64(starts)/float64(b.N), "starts/op")
	b.ReportMetric(float64(len(s.Jobs)), "jobs-at-end")
	if cpu > 0 {
		b.ReportMetric(float64(cpu)/float64(b.N)/1e6, "cpu-ms/op")
	}
	reportHeap(b, s)
}
