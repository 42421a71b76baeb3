package billing

import (
	"fmt"
	"regexp"
	"slices"
	"time"

	"github.com/robfig/cron/v3"
)

// PeriodKind says which period a scheduled export covers, relative to the
// moment it fires.
type PeriodKind string

// Period kinds of scheduled exports.
const (
	// PreviousDay is the calendar day before the fire time's day.
	PreviousDay PeriodKind = "previous-day"
	// PreviousMonth is the calendar month before the fire time's month.
	PreviousMonth PeriodKind = "previous-month"
)

// DefaultCatchUp is how many missed periods a scheduled export runs at most
// when the broker was down across several fire times.
const DefaultCatchUp = 31

// maxFires bounds the cron walk of one Due call (a "@every 1s" schedule
// after a month of downtime); the rest is picked up by the next call.
const maxFires = 100_000

// PeriodFor is the period an export of kind k covers when it fires at t,
// with days and months cut in loc (UTC when nil).
func PeriodFor(k PeriodKind, fire time.Time, loc *time.Location) (Period, error) {
	switch k {
	case PreviousDay:
		today := DayOf(fire, loc)
		return Period{From: today.From.AddDate(0, 0, -1), To: today.From}, nil
	case PreviousMonth:
		this := MonthOf(fire, loc)
		return Period{From: this.From.AddDate(0, -1, 0), To: this.From}, nil
	}
	return Period{}, fmt.Errorf("%w: period %q is not previous-day or previous-month", ErrInvalidConfig, k)
}

// ScheduledExport is an export that runs on a cron schedule; Config.Compile
// builds them, parsing every schedule once.
type ScheduledExport struct {
	// Name identifies the export in file names, marks and logs.
	Name string
	// Spec is the cron expression as configured ("0 6 1 * *", "@daily").
	Spec string
	// Schedule is Spec parsed by robfig/cron's standard parser.
	Schedule cron.Schedule
	// Period is what each run covers.
	Period PeriodKind
	// Location is the zone the schedule fires in and periods are cut in.
	Location *time.Location
	// CatchUp caps missed periods run at once (DefaultCatchUp when 0).
	CatchUp int
	// Format and Granularity shape the file (see ExportOptions).
	Format      Format
	Granularity Granularity
	// Team restricts the export to one team; empty exports all teams.
	Team string
	// Destination is where the file goes; the broker opens a Sink for it
	// (s3sink.SinkFor).
	Destination Destination
}

// DueRun is one export that should run now: the cron fire time it stands
// for and the period it covers.
type DueRun struct {
	// Export is the ScheduledExport's name.
	Export string
	// Fire is the cron fire time the run stands for; it becomes the
	// export's mark when the run succeeds.
	Fire time.Time
	// Period is what the run exports.
	Period Period
}

// Key is the object name of the run's file: "<name>/<period label>.<format>",
// e.g. "finance-monthly/2026-11.csv". The same period always gets the same
// key, so running it again overwrites the file with identical content.
func (d DueRun) Key(f Format) string { return d.Export + "/" + d.Period.Label() + "." + string(f) }

// Due is cron as arithmetic: the runs that fell due after the last
// successful one (its fire time; zero when it never ran) up to now, oldest
// first, one per period (fire times that map to the same period collapse
// into the latest), at most CatchUp of them (the latest ones). With no
// successful run yet it looks back one period from now, so a fresh broker
// exports the last completed period once.
func (x ScheduledExport) Due(last, now time.Time) []DueRun {
	loc := x.loc()
	anchor := last
	if anchor.IsZero() {
		switch x.Period {
		case PreviousMonth:
			anchor = now.In(loc).AddDate(0, -1, 0)
		default:
			anchor = now.In(loc).AddDate(0, 0, -1)
		}
	}
	var runs []DueRun
	t := anchor.In(loc)
	for i := 0; i < maxFires; i++ {
		t = x.Schedule.Next(t)
		if t.IsZero() || t.After(now) {
			break
		}
		p, err := PeriodFor(x.Period, t, loc)
		if err != nil {
			return nil
		}
		if n := len(runs); n > 0 && runs[n-1].Period.From.Equal(p.From) && runs[n-1].Period.To.Equal(p.To) {
			runs[n-1].Fire = t
			continue
		}
		runs = append(runs, DueRun{Export: x.Name, Fire: t, Period: p})
	}
	catchUp := x.CatchUp
	if catchUp <= 0 {
		catchUp = DefaultCatchUp
	}
	if len(runs) > catchUp {
		runs = slices.Clone(runs[len(runs)-catchUp:])
	}
	return runs
}

// Next is the first fire time after t.
func (x ScheduledExport) Next(t time.Time) time.Time { return x.Schedule.Next(t.In(x.loc())) }

func (x ScheduledExport) loc() *time.Location {
	if x.Location == nil {
		return time.UTC
	}
	return x.Location
}

var exportName = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)

// ParseSchedule parses a cron expression with robfig/cron's standard parser
// (five fields, or a descriptor such as "@daily" or "@every 6h").
func ParseSchedule(spec string) (cron.Schedule, error) {
	s, err := cron.ParseStandard(spec)
	if err != nil {
		return nil, fmt.Errorf("parse cron %q: %w", spec, err)
	}
	return s, nil
}
