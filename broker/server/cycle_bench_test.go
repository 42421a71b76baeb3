package server

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/bolt"
	"github.com/spillway-dev/spillway/broker/clock"
	"github.com/spillway-dev/spillway/broker/config"
	"github.com/spillway-dev/spillway/onprem/gpu"
)

// BenchmarkBrokerCycle is one scheduling cycle of the broker at
// SPILLWAY_BENCH_PENDING (default 100,000) pending jobs: BenchmarkFullCycle
// (broker/sched) measures the core alone; this is Server.Cycle, the core
// and the broker's work around it under its lock — housekeeping (lost
// nodes, idle jobs), the snapshot, and applying the plan (each waiting
// job's reason). The jobs are one team's, submitted as 1,000-element
// arrays a second apart, as a sweep is: an array's elements share their
// class, score and submit time, so the core orders each array by id.
//
// nodes=0: no node registers, so every job stays pending. nodes=1250:
// 1,250 ready nodes of 8 cards (10,000 GPUs, the scale); the first
// cycle fills them, and the timed cycles are a full cluster with ~97,000
// waiting, each given its reason and an estimated start. The agents never
// answer, so the started jobs stay starting; the clock moves 100 ms a
// cycle, well inside the nodes' and the starts' timeouts.
//
// The store is loaded directly and the broker started on it (a restart),
// and three cycles run, which takes a few seconds before the timer starts.
func BenchmarkBrokerCycle(b *testing.B) {
	for _, nodes := range []int{0, 1250} {
		b.Run(fmt.Sprintf("nodes=%d", nodes), func(b *testing.B) { benchBrokerCycle(b, nodes) })
	}
}

func benchBrokerCycle(b *testing.B, nodes int) {
	n := benchPending()
	dir := b.TempDir()
	cfg, err := config.Parse([]byte(fmt.Sprintf("listen: 127.0.0.1:0\ndataDir: %s\n", dir)))
	if err != nil {
		b.Fatal(err)
	}
	st, err := bolt.Open(filepath.Join(dir, bolt.FileName))
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	loadSweep(b, st, n)
	now := t0.Add(time.Hour)
	if err := st.Update(context.Background(), func(tx broker.Tx) error {
		for k := range nodes {
			node := &broker.Node{Name: fmt.Sprintf("node-%04d", k), Pool: "onprem", State: broker.NodeReady,
				Generation: 1, RegisteredAt: now, LastSeen: now, CPU: 128, Memory: 1 << 40,
				Inventory: gpu.Inventory{Backend: "sim"}}
			for c := range 8 {
				node.Inventory.Devices = append(node.Inventory.Devices, gpu.Device{Index: c,
					UUID: fmt.Sprintf("GPU-%04d-%d", k, c), Model: "NVIDIA H100 80GB HBM3", MemoryBytes: 80 << 30})
			}
			if err := broker.PutNode(tx, node); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		b.Fatal(err)
	}
	step := time.Second
	if nodes > 0 {
		step = 100 * time.Millisecond
	}
	clk := clock.NewFake(now)
	srv, err := New(context.Background(), cfg, st, Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Clock: clk})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	// The first cycles derive every job's record and store each job's
	// first reason; then the garbage of loading goes.
	for range 3 {
		clk.Step(step)
		if err := srv.Cycle(ctx); err != nil {
			b.Fatal(err)
		}
	}
	if got := srv.pendingCount(); got > n || (nodes == 0 && got != n) || (nodes > 0 && got > n-1000) {
		b.Fatalf("%d pending jobs of %d with %d nodes", got, n, nodes)
	}
	runtime.GC()
	for b.Loop() {
		clk.Step(step)
		if err := srv.Cycle(ctx); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N), "ms/cycle")
}

// loadSweep writes n pending jobs of one team straight into the store:
// 1,000-element arrays submitted a second apart from t0, with 1, 2, 4 or
// 8 GPUs each, as a sweep is.
func loadSweep(b *testing.B, st broker.Store, n int) {
	b.Helper()
	const arraySize = 1000
	// A store the broker made marks its team index complete when it is
	// empty; PutJob keeps the index from then on.
	if err := broker.EnsureTeamIndex(context.Background(), st); err != nil {
		b.Fatal(err)
	}
	for from := 0; from < n; from += 10_000 {
		if err := st.Update(context.Background(), func(tx broker.Tx) error {
			for i := from; i < min(n, from+10_000); i++ {
				at := t0.Add(time.Duration(i/arraySize) * time.Second)
				idx := i % arraySize
				arr := fmt.Sprintf("01M93Y1BY5%012dAAAA", i/arraySize)
				j := &broker.Job{ID: fmt.Sprintf("01M93Y1BY5%012d%04d", i/arraySize, idx+1), ArrayID: arr, ArrayIndex: &idx,
					State: broker.StatePending, SubmittedAt: at, User: "alice",
					Spec: broker.Spec{Name: "sweep", Team: "nlp", Queue: "default", Priority: "low",
						Resources: broker.Resources{GPUs: 1 << (i % 4), Nodes: 1}, Timeout: broker.Duration(4 * time.Hour),
						Command: []string{"python", "train.py"}},
					History: []broker.Transition{{At: at, To: broker.StatePending, Reason: "submitted"}}}
				if err := broker.PutJob(tx, j); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			b.Fatal(err)
		}
	}
}
