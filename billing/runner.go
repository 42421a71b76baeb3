package billing

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"
)

// Clock is the injected time source; the broker's clock.Clock satisfies it.
type Clock interface {
	Now() time.Time
	After(d time.Duration) <-chan time.Time
}

// Backoff is how a failed export is retried: Attempts tries in all, waiting
// Initial after the first failure and doubling up to Max.
type Backoff struct {
	// Attempts in all, the first included.
	Attempts int
	// Initial wait after the first failure.
	Initial time.Duration
	// Max caps the doubling waits.
	Max time.Duration
}

// DefaultBackoff tries five times over about five minutes.
var DefaultBackoff = Backoff{Attempts: 5, Initial: 10 * time.Second, Max: 2 * time.Minute}

func (b Backoff) wait(failures int) time.Duration {
	d := b.Initial
	for i := 1; i < failures && d < b.Max; i++ {
		d *= 2
	}
	return min(d, b.Max)
}

// ExportJob is a scheduled export and the sink it writes to.
type ExportJob struct {
	ScheduledExport
	Sink Sink
}

// RunState is how a scheduled export run ended.
type RunState string

// Run states.
const (
	// RunOK: the file is in the sink and the export's mark moved to the
	// run's fire time.
	RunOK RunState = "ok"
	// RunFailed: every attempt failed; the mark stays, so the next RunDue
	// tries the period again.
	RunFailed RunState = "failed"
	// RunWaiting: the meter has not finished the period yet; the run waits
	// for a later RunDue.
	RunWaiting RunState = "waiting"
)

// RunStatus reports one run.
type RunStatus struct {
	DueRun
	// Key is the object name the file was (or would be) stored under.
	Key   string
	State RunState
	// Attempts made (0 when the run waited or could not start).
	Attempts int
	// Err is why the run failed or waits; nil when it is ok.
	Err error
	// Summary of the written export (rows, totals) when it is ok.
	Summary ExportSummary
}

// Runner performs scheduled exports. The running server calls RunDue on
// each tick of its own timer (sleeping until NextRun); the runner holds no
// goroutines and reads time only from Clock.
type Runner struct {
	// Store is the ledger exported.
	Store Store
	// Marks holds the meter cursor (read) and the exports' marks.
	Marks Watermarks
	// Jobs are the scheduled exports with their sinks.
	Jobs []ExportJob
	// Clock gives now and the backoff waits.
	Clock Clock
	// Log defaults to slog.Default().
	Log *slog.Logger
	// Retry defaults to DefaultBackoff.
	Retry Backoff
	// BillingAccountID and BillingAccountName fill the FOCUS account columns.
	BillingAccountID   string
	BillingAccountName string
	// TempDir holds export files while they upload (os.TempDir() if empty).
	TempDir string
}

// NextRun is the earliest fire time of any job after now: when to call
// RunDue next.
func (r *Runner) NextRun(now time.Time) time.Time {
	var next time.Time
	for _, j := range r.Jobs {
		if t := j.Next(now); !t.IsZero() && (next.IsZero() || t.Before(next)) {
			next = t
		}
	}
	return next
}

// RunDue runs every export that fell due since its last successful run, in
// order, retrying each with backoff. A job whose run fails or waits for the
// meter stops there (later periods wait behind it, so marks only move
// forward over periods that landed). Failures are logged and returned.
func (r *Runner) RunDue(ctx context.Context) []RunStatus {
	log := r.Log
	if log == nil {
		log = slog.Default()
	}
	var out []RunStatus
	for _, job := range r.Jobs {
		jlog := log.With("export", job.Name)
		last, err := r.Marks.Watermark(ctx, ExportMark(job.Name))
		if err != nil {
			jlog.Error("read export mark", "err", err)
			out = append(out, RunStatus{DueRun: DueRun{Export: job.Name}, State: RunFailed, Err: fmt.Errorf("read export mark: %w", err)})
			continue
		}
		for _, due := range job.Due(last, r.Clock.Now()) {
			st := r.run(ctx, job, due, jlog)
			out = append(out, st)
			if st.State != RunOK {
				break
			}
		}
	}
	return out
}

func (r *Runner) run(ctx context.Context, job ExportJob, due DueRun, log *slog.Logger) RunStatus {
	st := RunStatus{DueRun: due, Key: due.Key(job.Format)}
	log = log.With("period", due.Period.Label(), "key", st.Key)
	metered, err := r.Marks.Watermark(ctx, MeterMark)
	if err != nil {
		st.State, st.Err = RunFailed, fmt.Errorf("read meter cursor: %w", err)
		log.Error("scheduled export failed", "err", st.Err)
		return st
	}
	if metered.Before(due.Period.To) {
		st.State = RunWaiting
		st.Err = fmt.Errorf("%w: metered through %s, period ends %s", ErrNotMetered, metered.UTC().Format(time.RFC3339), due.Period.To.UTC().Format(time.RFC3339))
		log.Info("scheduled export waits for the meter", "err", st.Err)
		return st
	}
	retry := r.Retry
	if retry.Attempts <= 0 {
		retry = DefaultBackoff
	}
	for st.Attempts < retry.Attempts {
		st.Attempts++
		st.Summary, err = r.exportOnce(ctx, job, due, st.Key)
		if err == nil {
			break
		}
		st.Err = err
		if ctx.Err() != nil || st.Attempts == retry.Attempts {
			break
		}
		wait := retry.wait(st.Attempts)
		log.Warn("scheduled export attempt failed; retrying", "attempt", st.Attempts, "wait", wait, "err", err)
		select {
		case <-ctx.Done():
		case <-r.Clock.After(wait):
		}
	}
	if err != nil {
		st.State = RunFailed
		st.Err = fmt.Errorf("export %s %s after %d attempts: %w", job.Name, due.Period.Label(), st.Attempts, errors.Join(err, ctx.Err()))
		log.Error("scheduled export failed", "attempts", st.Attempts, "err", st.Err)
		return st
	}
	st.Err = nil
	if err := r.Marks.SetWatermark(ctx, ExportMark(job.Name), due.Fire); err != nil {
		// The file landed; the next run exports the period again, which
		// overwrites it with the same bytes.
		st.State, st.Err = RunFailed, fmt.Errorf("record export run: %w", err)
		log.Error("scheduled export landed but its mark did not move", "err", st.Err)
		return st
	}
	st.State = RunOK
	log.Info("scheduled export done", "rows", st.Summary.Rows, "cost", st.Summary.Totals.Cost.String(), "currency", st.Summary.Currency)
	return st
}

// exportOnce writes the export to a temporary file and puts it in the sink.
func (r *Runner) exportOnce(ctx context.Context, job ExportJob, due DueRun, key string) (ExportSummary, error) {
	if job.Sink == nil {
		return ExportSummary{}, fmt.Errorf("export %s: no sink", job.Name)
	}
	f, err := os.CreateTemp(r.TempDir, "spillway-export-*")
	if err != nil {
		return ExportSummary{}, fmt.Errorf("create temp file: %w", err)
	}
	defer os.Remove(f.Name())
	defer f.Close()
	sum, err := Export(ctx, r.Store, f, ExportOptions{
		Format:             job.Format,
		Granularity:        job.Granularity,
		Period:             due.Period,
		Team:               job.Team,
		BillingAccountID:   r.BillingAccountID,
		BillingAccountName: r.BillingAccountName,
	})
	if err != nil {
		return sum, err
	}
	if err := job.Sink.Put(ctx, key, f); err != nil {
		return sum, fmt.Errorf("put export: %w", err)
	}
	return sum, nil
}
