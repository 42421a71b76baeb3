package server

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/clock"
	"github.com/spillway-dev/spillway/broker/config"
)

// BenchmarkRestart is how long a broker takes to read SPILLWAY_BENCH_PENDING
// (default 100,000) pending jobs from its store and decide once: what a
// restart costs on bbolt, and what a standby's takeover costs on Redis
// (both read the store through the same load). The jobs are loadSweep's.
// Before the timer, a first broker runs one cycle, which stores each
// job's pending reason as a broker that ran before the restart would
// have. load-s is New (the store read into the view), cycle-s the first
// scheduling cycle after it, which derives every job's record.
func BenchmarkRestart(b *testing.B) {
	b.Run("store=bolt", func(b *testing.B) { benchRestart(b, benchBolt(b)) })
	b.Run("store=redis", func(b *testing.B) { benchRestart(b, benchRedis(b)) })
}

func benchRestart(b *testing.B, st broker.Store) {
	n := benchPending()
	cfg, err := config.Parse(fmt.Appendf(nil, "listen: 127.0.0.1:0\ndataDir: %s\n", b.TempDir()))
	if err != nil {
		b.Fatal(err)
	}
	loadSweep(b, st, n)
	ctx := context.Background()
	start := func() *Server {
		srv, err := New(ctx, cfg, st, Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
			Clock: clock.NewFake(t0.Add(time.Hour))})
		if err != nil {
			b.Fatal(err)
		}
		return srv
	}
	// A broker that ran before the restart stored each waiting job's
	// reason; the first run does that here, untimed.
	if err := start().Cycle(ctx); err != nil {
		b.Fatal(err)
	}
	var load, cycle time.Duration
	for b.Loop() {
		began := time.Now()
		srv := start()
		loaded := time.Now()
		if err := srv.Cycle(ctx); err != nil {
			b.Fatal(err)
		}
		load += loaded.Sub(began)
		cycle += time.Since(loaded)
		if got := srv.pendingCount(); got != n {
			b.Fatalf("%d pending jobs after the restart, want %d", got, n)
		}
	}
	b.ReportMetric(load.Seconds()/float64(b.N), "load-s")
	b.ReportMetric(cycle.Seconds()/float64(b.N), "cycle-s")
}
