package server

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/api"
	"github.com/spillway-dev/spillway/broker/config"
)

// BenchmarkListJobs is one page of `spillway jobs` (active states, 100
// rows) as a user of team nlp asks for it, and reports the page's time and
// what it allocates.
//
// fold=true and fold=false: SPILLWAY_BENCH_PENDING (default 100,000)
// pending jobs of the team, loaded as BenchmarkBrokerCycle loads them
// (1,000-element arrays). fold=true is the table's request, each array's
// waiting elements on one line with their counts (foldArrays); fold=false
// is --expand-arrays and -o json, one record a job.
//
// history: the team's 100 pending jobs after 100,000 that have finished,
// unfolded (-o json): a team with a long past and a short queue.
func BenchmarkListJobs(b *testing.B) {
	n := benchPending()
	sweep := func(b *testing.B, st broker.Store) { loadSweep(b, st, n) }
	// Folded, the page's 100 rows are 100 arrays of 1,000.
	b.Run("fold=true", func(b *testing.B) { benchListJobs(b, true, sweep, n, min(n, 100*1000)) })
	b.Run("fold=false", func(b *testing.B) { benchListJobs(b, false, sweep, n, min(n, 100)) })
	b.Run("history", func(b *testing.B) { benchListJobs(b, false, loadHistory, 100, 100) })
}

// loadHistory writes 100,000 finished jobs of team nlp, then 100 pending.
func loadHistory(b *testing.B, st broker.Store) {
	b.Helper()
	const done, pending = 100_000, 100
	for from := 0; from < done+pending; from += 10_000 {
		if err := st.Update(context.Background(), func(tx broker.Tx) error {
			for i := from; i < min(done+pending, from+10_000); i++ {
				at := t0.Add(time.Duration(i) * time.Second)
				j := &broker.Job{ID: fmt.Sprintf("01M93Y1BY5%012d%04d", i, 0), State: broker.StatePending, SubmittedAt: at, User: "alice",
					Spec: broker.Spec{Name: "train", Team: "nlp", Queue: "default", Priority: "low",
						Resources: broker.Resources{GPUs: 1, Nodes: 1}, Timeout: broker.Duration(4 * time.Hour),
						Command: []string{"python", "train.py"}},
					History: []broker.Transition{{At: at, To: broker.StatePending, Reason: "submitted"}}}
				if i < done {
					end := at.Add(time.Minute)
					j.State, j.EndedAt = broker.StateSucceeded, &end
					j.History = append(j.History, broker.Transition{At: end, From: broker.StatePending, To: broker.StateSucceeded, Reason: "exited"})
				}
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

// benchListJobs times the first page of a listing of the `active` jobs
// that load writes; the page stands for `shown` of them.
func benchListJobs(b *testing.B, fold bool, load func(*testing.B, broker.Store), active, shown int) {
	h := benchAliceBroker(b, load).Handler()
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
	// The page stands for `shown` of the `active` jobs: its rows and,
	// folded, each array's waiting elements; a next page while any is left.
	got := len(page.Jobs)
	for _, j := range page.Jobs {
		if a, ok := page.Arrays[j.ArrayID]; ok {
			got += a.Count - 1
		}
	}
	if got != shown || (page.Next == "") != (shown == active) {
		b.Fatalf("first page: %d rows for %d jobs of %d (want %d), next %q", len(page.Jobs), got, active, shown, page.Next)
	}
	runtime.GC()
	for b.Loop() {
		list()
	}
	b.ReportMetric(float64(b.Elapsed().Microseconds())/1000/float64(b.N), "ms/page")
}

// BenchmarkQueues is `spillway queue` as a user of team nlp asks for it
// (GET /v1/queues, the head of each queue) with SPILLWAY_BENCH_PENDING
// (default 100,000) pending jobs of the team in queue default, placed by
// one scheduling cycle (no nodes: every job waits, with its place).
func BenchmarkQueues(b *testing.B) {
	n := benchPending()
	srv := benchAliceBroker(b, func(b *testing.B, st broker.Store) { loadSweep(b, st, n) })
	if err := srv.Cycle(context.Background()); err != nil {
		b.Fatal(err)
	}
	h := srv.Handler()
	get := func() []byte {
		req := httptest.NewRequest(http.MethodGet, "/v1/queues", nil)
		req.Header.Set("Authorization", "Bearer "+tokAlice)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != http.StatusOK {
			b.Fatalf("queues: %d %s", rec.Code, rec.Body)
		}
		return rec.Body.Bytes()
	}
	var out struct {
		Queues []api.QueueView `json:"queues"`
	}
	if err := json.Unmarshal(get(), &out); err != nil {
		b.Fatal(err)
	}
	def := out.Queues[slices.IndexFunc(out.Queues, func(q api.QueueView) bool { return q.Name == "default" })]
	if def.Pending != n || len(def.Waiting) != min(n, 100) || def.WaitingMore != n-len(def.Waiting) || def.Waiting[0].Reason == nil || def.Waiting[0].Reason.Position != 1 {
		b.Fatalf("default: pending %d, listed %d, more %d, first %+v", def.Pending, len(def.Waiting), def.WaitingMore, def.Waiting[0].Reason)
	}
	runtime.GC()
	for b.Loop() {
		get()
	}
	b.ReportMetric(float64(b.Elapsed().Microseconds())/1000/float64(b.N), "ms/call")
}

// benchAliceBroker is a broker on a bbolt store that load fills, with one
// user token (alice, team nlp), not serving: benchmarks call its Handler.
func benchAliceBroker(b *testing.B, load func(*testing.B, broker.Store)) *Server {
	b.Helper()
	cfg := benchAliceConfig(b, "")
	st := benchBolt(b)
	load(b, st)
	srv, err := New(context.Background(), cfg, st, Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	return srv
}

// benchNoLimits lifts the flood limits for benchmarks that submit flat out.
const benchNoLimits = "limits: {submitsPerMinute: 1000000, submitBurst: 1000000, maxPendingPerTeam: 10000000}\n"

// benchAliceConfig is a benchmark broker's config: a fresh data dir, one
// user token (alice, team nlp), and extra YAML.
func benchAliceConfig(b *testing.B, extra string) *config.Config {
	b.Helper()
	cfg, err := config.Parse([]byte(fmt.Sprintf("listen: 127.0.0.1:0\ndataDir: %s\n%sauth:\n  tokens:\n    - {name: alice, role: user, team: nlp, token: %s}\n",
		b.TempDir(), extra, tokAlice)))
	if err != nil {
		b.Fatal(err)
	}
	return cfg
}
