package server

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/spillway-dev/spillway/broker/bolt"
	"github.com/spillway-dev/spillway/broker/clock"
)

// BenchmarkPendingMemory submits SPILLWAY_BENCH_PENDING (default 100,000)
// jobs through the HTTP API on the embedded store (16 clients, each job
// its own spec: a name, a three-word command, two env variables), lets a
// scheduling cycle give each its pending reason (no node is registered,
// so every job stays pending), and reports the broker's heap after a
// garbage collection (runtime.MemStats.HeapAlloc, the benchmark's own
// HTTP clients and buffers gone). It then closes the broker, opens a new
// one on the same store (a restart), runs a cycle and reports the heap
// again. SPILLWAY_BENCH_HEAPPROFILE=file writes a heap profile of the
// first broker. docs/benchmarks.md records the figures; the goal is ≤ 400 MB
// both ways at 100,000 pending jobs.
func BenchmarkPendingMemory(b *testing.B) {
	n := benchPending()
	for range b.N {
		cfg := benchAliceConfig(b, benchNoLimits)
		path := filepath.Join(cfg.DataDir, bolt.FileName)
		quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
		clk := clock.NewFake(t0)
		heap := func() float64 {
			runtime.GC()
			debug.FreeOSMemory()
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			return float64(ms.HeapAlloc) / (1 << 20)
		}
		base := heap()

		st, err := bolt.Open(path)
		if err != nil {
			b.Fatal(err)
		}
		srv, err := New(context.Background(), cfg, st, Options{Logger: quiet, Clock: clk})
		if err != nil {
			b.Fatal(err)
		}
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		hs := &http.Server{Handler: srv.Handler()}
		go hs.Serve(l)
		url := "http://" + l.Addr().String() + "/v1/jobs"
		client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16}}
		var next atomic.Int64
		var wg sync.WaitGroup
		errs := make(chan error, 16)
		for range 16 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					i := next.Add(1)
					if i > int64(n) {
						return
					}
					body := fmt.Sprintf(`{"name":"sweep-%d","project":"p%d","priority":"low","resources":{"gpus":%d},"timeout":"4h",`+
						`"command":["python","train.py","--seed=%d"],"env":{"WANDB_MODE":"offline","RUN":"r%d"}}`, i, i%7, 1<<(i%4), i, i)
					req, _ := http.NewRequest(http.MethodPost, url, bytes.NewBufferString(body))
					req.Header.Set("Authorization", "Bearer "+tokAlice)
					resp, err := client.Do(req)
					if err != nil {
						errs <- err
						return
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode != http.StatusCreated {
						errs <- fmt.Errorf("submit: %d", resp.StatusCode)
						return
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			b.Fatal(err)
		}
		client.CloseIdleConnections()
		hs.Close()
		if err := srv.Cycle(context.Background()); err != nil {
			b.Fatal(err)
		}
		if got := srv.pendingCount(); got != n {
			b.Fatalf("%d pending jobs, want %d", got, n)
		}
		live := heap() - base
		if f := os.Getenv("SPILLWAY_BENCH_HEAPPROFILE"); f != "" {
			out, err := os.Create(f)
			if err != nil {
				b.Fatal(err)
			}
			_ = pprof.Lookup("heap").WriteTo(out, 0)
			out.Close()
		}
		runtime.KeepAlive(srv)
		st.Close()
		srv = nil

		st, err = bolt.Open(path)
		if err != nil {
			b.Fatal(err)
		}
		heap()
		base2 := heap()
		srv2, err := New(context.Background(), cfg, st, Options{Logger: quiet, Clock: clk})
		if err != nil {
			b.Fatal(err)
		}
		if err := srv2.Cycle(context.Background()); err != nil {
			b.Fatal(err)
		}
		if got := srv2.pendingCount(); got != n {
			b.Fatalf("after restart %d pending jobs, want %d", got, n)
		}
		restarted := heap() - base2
		runtime.KeepAlive(srv2)
		st.Close()
		b.ReportMetric(live, "heap-MiB")
		b.ReportMetric(restarted, "heap-after-restart-MiB")
		b.ReportMetric(live*(1<<20)/float64(n), "B/job")
		b.ReportMetric(0, "ns/op")
	}
}

// pendingCount is the number of pending jobs in memory.
func (s *Server) pendingCount() int {
	s.lock()
	defer s.mu.Unlock()
	n := 0
	for j := range s.view.Jobs() {
		if j.State == "pending" {
			n++
		}
	}
	return n
}

// benchPending is how many pending jobs the broker benchmarks load:
// SPILLWAY_BENCH_PENDING, 100,000 when unset.
func benchPending() int {
	if v, err := strconv.Atoi(os.Getenv("SPILLWAY_BENCH_PENDING")); err == nil && v > 0 {
		return v
	}
	return 100_000
}
