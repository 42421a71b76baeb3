package billing_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	gocmp "github.com/google/go-cmp/cmp"

	"github.com/spillway-dev/spillway/billing"
	"github.com/spillway-dev/spillway/billing/billingtest"
)

// records collects log records, to check that failures are reported.
type records struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (r *records) Enabled(context.Context, slog.Level) bool { return true }
func (r *records) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.recs = append(r.recs, rec)
	return nil
}
func (r *records) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *records) WithGroup(string) slog.Handler      { return r }
func (r *records) count(l slog.Level) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, rec := range r.recs {
		if rec.Level == l {
			n++
		}
	}
	return n
}

func TestScheduledExportRunsInVirtualTimeAndReconciles(t *testing.T) {
	ctx := t.Context()
	dir := t.TempDir()
	clock := billingtest.NewVirtualClock(t0)
	store := billing.NewMemStore()
	w := randomWorld(3)
	daily := scheduled(t, "10 0 * * *", billing.PreviousDay, time.UTC)
	daily.Name, daily.Granularity = "daily", billing.GranularityHour
	r := &billing.Runner{
		Store: store, Marks: store, Clock: clock, Log: slog.New(&records{}),
		Jobs:             []billing.ExportJob{{ScheduledExport: daily, Sink: billing.DirSink{Dir: dir}}},
		BillingAccountID: "acme",
	}
	// The broker's loop: meter every minute, run due exports, until 00:30.
	var ran []billing.RunStatus
	for clock.Now().Before(time.Date(2026, 11, 6, 0, 30, 0, 0, time.UTC)) {
		clock.Set(clock.Now().Add(time.Minute))
		cursor := mustMark(t, store)
		as, ms := w.view(clock.Now(), cursor)
		if _, err := billing.MeterCycle(ctx, store, store, cfgForWorld(), as, ms, clock.Now()); err != nil {
			t.Fatal(err)
		}
		ran = append(ran, r.RunDue(ctx)...)
	}
	// A fresh broker first exports the last completed day (Nov 4, before
	// the world began: empty), then Nov 5 when it completes.
	type run struct {
		Fire   time.Time
		Period string
		State  billing.RunState
	}
	var runs []run
	for _, st := range ran {
		runs = append(runs, run{st.Fire, st.Period.Label(), st.State})
	}
	wantRuns := []run{
		{time.Date(2026, 11, 5, 0, 10, 0, 0, time.UTC), "2026-11-04", billing.RunOK},
		{time.Date(2026, 11, 6, 0, 10, 0, 0, time.UTC), "2026-11-05", billing.RunOK},
	}
	if diff := gocmp.Diff(wantRuns, runs); diff != "" {
		t.Fatalf("runs (-want +got):\n%s", diff)
	}
	nov5, _ := billing.ParseDay("2026-11-05", time.UTC)
	b, err := os.ReadFile(filepath.Join(dir, "daily", "2026-11-05.csv"))
	if err != nil {
		t.Fatalf("the export did not land: %v", err)
	}
	got := parseExport(t, billing.FormatCSV, b)
	want, err := billing.LedgerTotals(ctx, store, nov5, "")
	if err != nil {
		t.Fatal(err)
	}
	if want.Cost == 0 || want.GPUMillis == 0 {
		t.Fatalf("the day's ledger is empty: %+v", want)
	}
	if c := got.sumAmount(t, "BilledCost"); c != want.Cost {
		t.Errorf("CSV BilledCost sums to %s, ledger %s", c, want.Cost)
	}
	if ms := got.sumMillis(t, "ConsumedQuantity"); ms != want.GPUMillis {
		t.Errorf("CSV ConsumedQuantity sums to %d ms, ledger %d", ms, want.GPUMillis)
	}

	t.Run("running the period again overwrites it with the same bytes", func(t *testing.T) {
		if err := store.SetWatermark(ctx, billing.ExportMark("daily"), time.Date(2026, 11, 5, 0, 10, 0, 0, time.UTC)); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "daily", "2026-11-05.csv"), []byte("tampered"), 0o644); err != nil {
			t.Fatal(err)
		}
		again := r.RunDue(ctx)
		if len(again) != 1 || again[0].State != billing.RunOK {
			t.Fatalf("rerun = %+v", again)
		}
		b2, err := os.ReadFile(filepath.Join(dir, "daily", "2026-11-05.csv"))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(b, b2) {
			t.Error("the rerun wrote different bytes")
		}
	})
}

// flakySink fails its first failures calls, then stores into a map.
type flakySink struct {
	mu       sync.Mutex
	failures int
	calls    int
	objects  map[string][]byte
}

var errSinkDown = errors.New("sink down")

func (f *flakySink) Put(_ context.Context, key string, body io.ReadSeeker) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	if f.calls <= f.failures {
		return errSinkDown
	}
	b, err := io.ReadAll(body)
	if err != nil {
		return err
	}
	if f.objects == nil {
		f.objects = map[string][]byte{}
	}
	f.objects[key] = b
	return nil
}

func runnerFor(t *testing.T, sink billing.Sink, now time.Time, meteredThrough time.Time) (*billing.Runner, *billing.MemStore, *billingtest.VirtualClock, *records) {
	t.Helper()
	store := billing.NewMemStore()
	if _, err := store.Append(t.Context(), billingtest.Entries(5, 500, november, "USD")); err != nil {
		t.Fatal(err)
	}
	if err := store.SetWatermark(t.Context(), billing.MeterMark, meteredThrough); err != nil {
		t.Fatal(err)
	}
	monthly := scheduled(t, "0 6 1 * *", billing.PreviousMonth, time.UTC)
	monthly.Name = "finance"
	clock := billingtest.NewVirtualClock(now)
	logs := &records{}
	return &billing.Runner{
		Store: store, Marks: store, Clock: clock, Log: slog.New(logs),
		Jobs: []billing.ExportJob{{ScheduledExport: monthly, Sink: sink}},
	}, store, clock, logs
}

var dec1 = time.Date(2026, 12, 1, 6, 0, 0, 0, time.UTC)

func TestRunnerRetriesWithBackoff(t *testing.T) {
	sink := &flakySink{failures: 2}
	r, _, clock, logs := runnerFor(t, sink, dec1, dec1)
	st := r.RunDue(t.Context())
	if len(st) != 1 || st[0].State != billing.RunOK || st[0].Attempts != 3 {
		t.Fatalf("status = %+v, want ok after 3 attempts", st)
	}
	if diff := gocmp.Diff([]time.Duration{10 * time.Second, 20 * time.Second}, clock.Slept()); diff != "" {
		t.Errorf("backoff waits (-want +got):\n%s", diff)
	}
	if logs.count(slog.LevelWarn) != 2 || logs.count(slog.LevelError) != 0 {
		t.Errorf("logged %d warnings and %d errors, want 2 and 0", logs.count(slog.LevelWarn), logs.count(slog.LevelError))
	}
	if _, ok := sink.objects["finance/2026-11.csv"]; !ok {
		t.Errorf("objects = %v", sink.objects)
	}
}

func TestRunnerReportsFailureAndRetriesThePeriodNextTime(t *testing.T) {
	sink := &flakySink{failures: 1000}
	r, store, _, logs := runnerFor(t, sink, dec1, dec1)
	r.Retry = billing.Backoff{Attempts: 3, Initial: time.Second, Max: time.Second}
	st := r.RunDue(t.Context())
	if len(st) != 1 || st[0].State != billing.RunFailed || !errors.Is(st[0].Err, errSinkDown) || st[0].Attempts != 3 {
		t.Fatalf("status = %+v, want failed after 3 attempts with the sink's error", st)
	}
	if logs.count(slog.LevelError) != 1 {
		t.Errorf("logged %d errors, want 1", logs.count(slog.LevelError))
	}
	if mark, _ := store.Watermark(t.Context(), billing.ExportMark("finance")); !mark.IsZero() {
		t.Errorf("a failed run moved the mark to %v", mark)
	}
	sink.failures = 0
	st = r.RunDue(t.Context())
	if len(st) != 1 || st[0].State != billing.RunOK || st[0].Period.Label() != "2026-11" {
		t.Fatalf("next RunDue = %+v, want the same period ok", st)
	}
}

func TestRunnerWaitsForTheMeter(t *testing.T) {
	sink := &flakySink{}
	r, store, _, _ := runnerFor(t, sink, dec1, dec1.Add(-7*time.Hour)) // metered through 23:00 on Nov 30
	st := r.RunDue(t.Context())
	if len(st) != 1 || st[0].State != billing.RunWaiting || !errors.Is(st[0].Err, billing.ErrNotMetered) {
		t.Fatalf("status = %+v, want waiting for the meter", st)
	}
	if sink.calls != 0 {
		t.Errorf("the sink was called %d times", sink.calls)
	}
	if err := store.SetWatermark(t.Context(), billing.MeterMark, dec1); err != nil {
		t.Fatal(err)
	}
	if st := r.RunDue(t.Context()); len(st) != 1 || st[0].State != billing.RunOK {
		t.Fatalf("after the meter caught up: %+v", st)
	}
}

func TestRunnerNextRun(t *testing.T) {
	r, _, _, _ := runnerFor(t, &flakySink{}, dec1, dec1)
	if got := r.NextRun(dec1); !got.Equal(time.Date(2027, 1, 1, 6, 0, 0, 0, time.UTC)) {
		t.Errorf("NextRun = %v", got)
	}
}

func TestDirSinkRefusesKeysOutsideItsDirectory(t *testing.T) {
	d := billing.DirSink{Dir: t.TempDir()}
	for _, k := range []string{"", "../x.csv", "/etc/x.csv", "a/../../x.csv", `..\x.csv`} {
		if err := d.Put(t.Context(), k, bytes.NewReader(nil)); err == nil {
			t.Errorf("Put(%q) accepted", k)
		}
	}
	if err := d.Put(t.Context(), "team..a/2026-11.csv", bytes.NewReader([]byte("ok"))); err != nil {
		t.Errorf("a name with two dots is a name: %v", err)
	}
}
