package server

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/bolt"
	"github.com/spillway-dev/spillway/broker/redis"
)

// benchClients are the numbers of clients that submit at once.
var benchClients = []int{16, 64}

// BenchmarkSubmit measures durable submits through the real HTTP API on
// loopback: a broker serving on 127.0.0.1, 16 or 64 clients posting
// job specs over keep-alive connections, each submit answered only once
// the job is in the store. It reports submits per second and the 50th and
// 99th percentile latency, on the embedded store and on Redis (at
// $SPILLWAY_BENCH_REDIS, default 127.0.0.1:6379; skipped when none
// answers), with the scheduling loop stopped so
// that the figures are the API's and the store's; BenchmarkSubmitScheduling
// runs the loop too. docs/benchmarks.md records figures.
func BenchmarkSubmit(b *testing.B) {
	for _, clients := range benchClients {
		b.Run(fmt.Sprintf("store=bolt/clients=%d", clients), func(b *testing.B) {
			benchSubmit(b, benchBolt(b), clients, false)
		})
	}
	for _, clients := range benchClients {
		b.Run(fmt.Sprintf("store=redis/clients=%d", clients), func(b *testing.B) {
			benchSubmit(b, benchRedis(b), clients, false)
		})
	}
}

// benchBolt opens a bbolt store in the benchmark's temporary directory,
// closed when it ends.
func benchBolt(b *testing.B) broker.Store {
	st, err := bolt.Open(filepath.Join(b.TempDir(), bolt.FileName))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { st.Close() })
	return st
}

// benchRedis opens a Redis store (SPILLWAY_BENCH_REDIS, default
// 127.0.0.1:6379) under a fresh key prefix, wiped and closed when the
// benchmark ends; without a Redis the benchmark is skipped.
func benchRedis(b *testing.B) broker.Store {
	buf := make([]byte, 6)
	_, _ = rand.Read(buf)
	addr := cmp.Or(os.Getenv("SPILLWAY_BENCH_REDIS"), "127.0.0.1:6379")
	st, err := redis.Open(context.Background(), "redis://"+addr+"/0?prefix=spillway-bench-"+hex.EncodeToString(buf),
		redis.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		b.Skipf("start redis-server on %s: %v", addr, err)
	}
	b.Cleanup(func() {
		st.Wipe(context.Background())
		st.Close()
	})
	return st
}

// BenchmarkSubmitScheduling is BenchmarkSubmit on the embedded store with
// the scheduling loop running: every submit asks for a cycle, and every
// cycle looks at every pending job (no node registers, so all stay
// pending and the queue grows with b.N).
func BenchmarkSubmitScheduling(b *testing.B) {
	st, err := bolt.Open(filepath.Join(b.TempDir(), bolt.FileName))
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	benchSubmit(b, st, benchClients[0], true)
}

func benchSubmit(b *testing.B, st broker.Store, clients int, loop bool) {
	// One team submitting flat out: the flood limits (issue #15) stay out
	// of the way, so the figures are the API's and the store's.
	cfg := benchAliceConfig(b, benchNoLimits)
	ctx, cancel := context.WithCancel(context.Background())
	srv, err := New(ctx, cfg, st, Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	if loop {
		served := make(chan error, 1)
		go func() { served <- srv.Serve(ctx, l) }()
		defer func() {
			cancel()
			<-served
		}()
	} else {
		hs := &http.Server{Handler: srv.Handler()}
		go hs.Serve(l)
		defer func() {
			cancel()
			hs.Close()
		}()
	}
	url := "http://" + l.Addr().String() + "/v1/jobs"
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: clients, MaxConnsPerHost: clients}}
	body := []byte(`{"name":"bench","project":"throughput","resources":{"gpus":1},"timeout":"1h","command":["python","train.py"]}`)
	submit := func() (time.Duration, error) {
		req, _ := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+tokAlice)
		req.Header.Set("Content-Type", "application/json")
		t := time.Now()
		resp, err := client.Do(req)
		if err != nil {
			return 0, err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated {
			return 0, fmt.Errorf("submit: status %d", resp.StatusCode)
		}
		return time.Since(t), nil
	}
	// Warm the connections up.
	for i := 0; i < clients; i++ {
		if _, err := submit(); err != nil {
			b.Fatal(err)
		}
	}
	var next atomic.Int64
	lat := make([][]time.Duration, clients)
	errs := make(chan error, clients)
	var wg sync.WaitGroup
	gc, _ := st.(broker.GroupCommitter)
	var gc0 broker.GroupCommitStats
	if gc != nil {
		gc0 = gc.GroupCommits()
	}
	b.ResetTimer()
	cpu0 := processCPU()
	start := time.Now()
	for w := 0; w < clients; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for next.Add(1) <= int64(b.N) {
				d, err := submit()
				if err != nil {
					errs <- err
					return
				}
				lat[w] = append(lat[w], d)
			}
		}(w)
	}
	wg.Wait()
	elapsed := time.Since(start)
	cpu := processCPU() - cpu0
	b.StopTimer()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	all := slices.Concat(lat...)
	slices.Sort(all)
	pct := func(p float64) float64 {
		return float64(all[min(len(all)-1, int(float64(len(all))*p))].Microseconds()) / 1000
	}
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "submits/s")
	b.ReportMetric(pct(0.50), "p50-ms")
	b.ReportMetric(pct(0.99), "p99-ms")
	// CPU of the whole process (broker and clients, GC included) per
	// submit: steadier than wall figures on a shared machine.
	b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/op")
	b.ReportMetric(0, "ns/op")
	if gc != nil {
		// Submits per commit, and the share of the run the store's writer
		// was committing: near 1, the submits wait on its fsyncs (the
		// disk), not on the broker's CPU.
		d := gc.GroupCommits()
		if n := d.Commits - gc0.Commits; n > 0 {
			b.ReportMetric(float64(d.Calls-gc0.Calls)/float64(n), "submits/commit")
		}
		b.ReportMetric((d.Busy-gc0.Busy).Seconds()/elapsed.Seconds(), "writer-busy")
	}
}

// processCPU is the process's user + system CPU time so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
