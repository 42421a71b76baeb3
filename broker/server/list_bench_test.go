package server

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"testing"

	"github.com/spillway-dev/spillway/broker/api"
	"github.com/spillway-dev/spillway/broker/bolt"
	"github.com/spillway-dev/spillway/broker/config"
)

// BenchmarkListJobs is one page of `spillway jobs` (active states, 100
// rows) at SPILLWAY_BENCH_PENDING (default 100,000) pending jobs of one
// team, loaded as BenchmarkBrokerCycle loads them: 1,000-element arrays.
// fold=true is the table's request, each array's waiting elements on one
// line with their counts (foldArrays); fold=false is --expand and --json,
// one record a job. It reports the page's time and what it allocates.
func BenchmarkListJobs(b *testing.B) {
	for _, fold := range []bool{true, false} {
		b.Run(fmt.Sprintf("fold=%t", fold), func(b *testing.B) { benchListJobs(b, fold) })
	}
}

func benchListJobs(b *testing.B, fold bool) {
	n := 100_000
	if v, err := strconv.Atoi(os.Getenv("SPILLWAY_BENCH_PENDING")); err == nil && v > 0 {
		n = v
	}
	dir := b.TempDir()
	cfg, err := config.Parse([]byte(fmt.Sprintf(`
listen: 127.0.0.1:0
dataDir: %s
auth:
  tokens:
    - {name: alice, role: user, team: nlp, token: %s}
`, dir, tokAlice)))
	if err != nil {
		b.Fatal(err)
	}
	st, err := bolt.Open(filepath.Join(dir, bolt.FileName))
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	loadSweep(b, st, n)
	srv, err := New(context.Background(), cfg, st, Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	h := srv.Handler()
	url := "/v1/jobs?state=pending,provisioning,starting,running,preempted,lost&foldArrays=" + strconv.FormatBool(fold)
	list := func() *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodGet, url, nil)
		req.Header.Set("Authorization", "Bearer "+tokAlice)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != http.StatusOK {
			b.Fatalf("list: %d %s", rec.Code, rec.Body)
		}
		return rec
	}
	var page api.JobList
	if err := json.Unmarshal(list().Body.Bytes(), &page); err != nil {
		b.Fatal(err)
	}
	// Folded, the 100 rows are every array: no next page.
	if len(page.Jobs) != 100 || (page.Next == "") != fold {
		b.Fatalf("first page: %d jobs, next %q", len(page.Jobs), page.Next)
	}
	if fold {
		// 100 rows, each an array's 1,000 waiting elements.
		for _, j := range page.Jobs {
			a, ok := page.Arrays[j.ArrayID]
			waiting := 0
			for _, k := range a.Waiting {
				waiting += k
			}
			if !ok || a.Count != 1000 || waiting != 1000 {
				b.Fatalf("array %s folded as %d elements, %d waiting", j.ArrayID, a.Count, waiting)
			}
		}
	}
	runtime.GC()
	for b.Loop() {
		list()
	}
	b.ReportMetric(float64(b.Elapsed().Microseconds())/1000/float64(b.N), "ms/page")
}
