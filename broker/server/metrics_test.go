package server

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/spillway-dev/spillway/broker/bolt"
	"github.com/spillway-dev/spillway/broker/clock"
)

// newRegistryHarness is newHarness with the broker's Prometheus registry
// in the test's hands.
func newRegistryHarness(t *testing.T) (*harness, *prometheus.Registry) {
	t.Helper()
	cfg := testConfig(t)
	reg := prometheus.NewRegistry()
	h := &harness{t: t, clock: clock.NewFake(t0), path: filepath.Join(cfg.DataDir, "spillway.db")}
	st, err := bolt.Open(h.path)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := New(context.Background(), cfg, st, Options{Clock: h.clock, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	h.srv, h.store = srv, st
	h.http = httptest.NewServer(srv.Handler())
	t.Cleanup(func() {
		h.http.Close()
		h.store.Close()
	})
	return h, reg
}

var fqName = regexp.MustCompile(`fqName: "([^"]+)"`)

// exported lists every metric the broker's registry describes, and the
// type of each that has series after a busy scenario: jobs submitted, run,
// idle, preempted, ended, units reported, a burst machine's lead time.
func exported(t *testing.T) (names []string, types map[string]dto.MetricType) {
	h, reg := newRegistryHarness(t)
	a := h.agent("n1", 2)
	util := 0
	a.util = &util
	j := h.submit(tokAlice, `{"resources": {"gpus": 2}, "priority": "low", "preemptible": true, "timeout": "1h", "command": ["a"]}`)
	h.settle(a)
	h.srv.cfg().Idle.Window = 0
	h.advance(2*time.Second, a)
	h.do("POST", "/v1/jobs/"+j.ID+"/units", tokAlice, `{"units": 10, "kind": "samples"}`, nil)
	high := h.submit(tokBob, `{"resources": {"gpus": 2}, "priority": "high", "timeout": "1h", "command": ["b"]}`)
	h.cycle()
	a.sync()
	a.exit(j.ID, 0, "")
	a.sync()
	h.settle(a)
	a.exit(high.ID, 0, "")
	a.sync()
	h.settle(a) // the preempted job resumes
	h.submit(tokBob, `{"resources": {"gpus": 2}, "timeout": "1h", "command": ["c"]}`)
	h.cycle() // and one waits
	// Burst machines, budget alerts and scheduled exports need providers,
	// budgets and export schedules; their series are made here so their
	// names and types are checked with the rest.
	h.srv.metrics.burstLead.WithLabelValues("fake").Observe(95)
	h.srv.metrics.budgetUsed.WithLabelValues("global").Set(0.5)
	h.srv.metrics.budgetAlerts.WithLabelValues("global", "80").Inc()
	h.srv.metrics.exports.WithLabelValues("daily", "ok").Inc()
	h.srv.metrics.limited.WithLabelValues("submit_rate").Inc()

	ch := make(chan *prometheus.Desc, 1000)
	reg.Describe(ch)
	close(ch)
	for d := range ch {
		m := fqName.FindStringSubmatch(d.String())
		if m == nil {
			t.Fatalf("desc without a name: %s", d)
		}
		names = append(names, m[1])
	}
	slices.Sort(names)
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	types = map[string]dto.MetricType{}
	for _, f := range fams {
		types[f.GetName()] = f.GetType()
	}
	return slices.Compact(names), types
}

// TestMetricNamesFollowConventions: every broker series is spillway_…,
// snake case, counters end in _total and nothing else does, histograms
// carry a base unit, and every one of them shows up in a live scrape.
func TestMetricNamesFollowConventions(t *testing.T) {
	names, types := exported(t)
	snake := regexp.MustCompile(`^spillway_[a-z][a-z0-9_]*[a-z0-9]$`)
	n := 0
	for _, name := range names {
		if !strings.HasPrefix(name, "spillway_") {
			continue
		}
		n++
		typ, seen := types[name]
		switch {
		case !snake.MatchString(name):
			t.Errorf("%s: not spillway_snake_case", name)
		case !seen:
			t.Errorf("%s: no series after the scenario", name)
		case typ == dto.MetricType_COUNTER && !strings.HasSuffix(name, "_total"):
			t.Errorf("%s: a counter must end in _total", name)
		case typ != dto.MetricType_COUNTER && strings.HasSuffix(name, "_total"):
			t.Errorf("%s: only counters end in _total", name)
		case typ == dto.MetricType_HISTOGRAM && !strings.HasSuffix(name, "_seconds") && !strings.HasSuffix(name, "_bytes"):
			t.Errorf("%s: a histogram needs its base unit (_seconds, _bytes)", name)
		case strings.Contains(name, "_milliseconds") || strings.Contains(name, "_minutes") || strings.Contains(name, "_percent"):
			t.Errorf("%s: use base units (seconds, bytes, ratio)", name)
		}
	}
	if n < 20 {
		t.Fatalf("only %d spillway series: %v", n, names)
	}
}

// TestMetricsDocumented: docs/metrics.md names exactly the exported
// spillway_ series.
func TestMetricsDocumented(t *testing.T) {
	names, _ := exported(t)
	raw, err := os.ReadFile("../../docs/metrics.md")
	if err != nil {
		t.Fatal(err)
	}
	documented := map[string]bool{}
	for _, m := range regexp.MustCompile("`(spillway_[a-z0-9_]+)`").FindAllStringSubmatch(string(raw), -1) {
		documented[m[1]] = true
	}
	have := map[string]bool{}
	for _, n := range names {
		if strings.HasPrefix(n, "spillway_") {
			have[n] = true
			if !documented[n] {
				t.Errorf("docs/metrics.md does not document %s", n)
			}
		}
	}
	for n := range documented {
		if !have[n] && !have[strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(n, "_bucket"), "_count"), "_sum")] {
			t.Errorf("docs/metrics.md documents %s, which the broker does not export", n)
		}
	}
}

// TestGrafanaDashboardUsesExportedMetrics: every expression and variable
// query of deploy/grafana/*.json names only series the broker (with its Go
// and process collectors) exports.
func TestGrafanaDashboardUsesExportedMetrics(t *testing.T) {
	names, types := exported(t)
	have := map[string]bool{}
	for _, n := range names {
		have[n] = true
		if types[n] == dto.MetricType_HISTOGRAM {
			for _, s := range []string{"_bucket", "_sum", "_count"} {
				have[n+s] = true
			}
		}
	}
	files, err := filepath.Glob("../../deploy/grafana/*.json")
	if err != nil || len(files) == 0 {
		t.Fatalf("no dashboards: %v", err)
	}
	metric := regexp.MustCompile(`\b(?:spillway|go|process)_[a-z0-9_]+\b`)
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var doc any
		if err := json.Unmarshal(raw, &doc); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		exprs := 0
		walkJSON(doc, func(key, val string) {
			if key != "expr" && key != "query" && key != "definition" {
				return
			}
			used := metric.FindAllString(val, -1)
			if key == "expr" {
				exprs++
				if len(used) == 0 {
					t.Errorf("%s: expression %q names no metric", f, val)
				}
			}
			for _, m := range used {
				if !have[m] {
					t.Errorf("%s: %q uses %s, which the broker does not export", f, val, m)
				}
			}
		})
		if exprs < 20 {
			t.Errorf("%s: only %d expressions", f, exprs)
		}
	}
}

// walkJSON calls fn for every string value with its key.
func walkJSON(v any, fn func(key, val string)) {
	switch x := v.(type) {
	case map[string]any:
		for k, c := range x {
			if s, ok := c.(string); ok {
				fn(k, s)
			} else {
				walkJSON(c, fn)
			}
		}
	case []any:
		for _, c := range x {
			walkJSON(c, fn)
		}
	}
}

// TestGroupCommitMetrics: the store's group commits are exported; a
// submit is one call carried by one commit, and the writer's busy time
// grows with it.
func TestGroupCommitMetrics(t *testing.T) {
	h, reg := newRegistryHarness(t)
	value := func(name string) float64 {
		t.Helper()
		fams, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range fams {
			if f.GetName() == name {
				return f.GetMetric()[0].GetCounter().GetValue()
			}
		}
		t.Fatalf("%s is not exported", name)
		return 0
	}
	names := []string{"spillway_store_group_commits_total", "spillway_store_group_commit_calls_total", "spillway_store_writer_busy_seconds_total"}
	before := map[string]float64{}
	for _, n := range names {
		before[n] = value(n)
	}
	h.submit(tokAlice, `{"resources": {"gpus": 1}, "timeout": "1h", "command": ["a"]}`)
	if d := value(names[1]) - before[names[1]]; d < 1 {
		t.Errorf("calls after a submit grew by %v, want at least 1", d)
	}
	if d := value(names[0]) - before[names[0]]; d < 1 {
		t.Errorf("commits after a submit grew by %v, want at least 1", d)
	}
	if value(names[2]) <= before[names[2]] {
		t.Errorf("writer busy time did not grow with a submit")
	}
}
