package server

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/broker/clock"
	"github.com/spillway-dev/spillway/broker/config"
)

// BenchmarkScrape is one Prometheus scrape of GET /metrics at
// SPILLWAY_BENCH_PENDING (default 100,000) pending jobs, loaded as
// BenchmarkBrokerCycle loads them and given their reasons by one cycle.
// The job gauges read every job under the broker's lock, so this is also
// about how long a scrape keeps submits and agents waiting.
func BenchmarkScrape(b *testing.B) {
	st := benchBolt(b)
	cfg, err := config.Parse(fmt.Appendf(nil, "listen: 127.0.0.1:0\ndataDir: %s\nauth:\n  tokens:\n    - {name: admin, role: operator, token: %s}\n",
		b.TempDir(), tokAdmin))
	if err != nil {
		b.Fatal(err)
	}
	loadSweep(b, st, benchPending())
	srv, err := New(context.Background(), cfg, st, Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Clock: clock.NewFake(t0.Add(time.Hour))})
	if err != nil {
		b.Fatal(err)
	}
	if err := srv.Cycle(context.Background()); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodGet, "/metrics", nil)
		req.Header.Set("Authorization", "Bearer "+tokAdmin)
		srv.Handler().ServeHTTP(rec, req)
		if rec.Code != http.StatusOK {
			b.Fatalf("GET /metrics: %d %s", rec.Code, rec.Body)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Microseconds())/1000/float64(b.N), "ms/scrape")
}
