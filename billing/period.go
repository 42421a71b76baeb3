package billing

import (
	"fmt"
	"time"
)

// Period is a half-open interval of time [From, To). An entry belongs to
// the period that holds its Start; because slices never cross a UTC hour,
// periods on UTC hour boundaries split the ledger exactly.
type Period struct {
	From time.Time `json:"from"`
	To   time.Time `json:"to"`
}

// Validate checks that the period is not empty.
func (p Period) Validate() error {
	if p.From.IsZero() || p.To.IsZero() || !p.From.Before(p.To) {
		return fmt.Errorf("%w: period [%s, %s) is empty", ErrBadQuery, p.From.Format(time.RFC3339), p.To.Format(time.RFC3339))
	}
	return nil
}

// Contains reports whether t is in [From, To).
func (p Period) Contains(t time.Time) bool { return !t.Before(p.From) && t.Before(p.To) }

// MonthOf is the calendar month holding t, in loc (UTC when nil).
func MonthOf(t time.Time, loc *time.Location) Period {
	if loc == nil {
		loc = time.UTC
	}
	t = t.In(loc)
	from := time.Date(t.Year(), t.Month(), 1, 0, 0, 0, 0, loc)
	return Period{From: from, To: from.AddDate(0, 1, 0)}
}

// DayOf is the calendar day holding t, in loc (UTC when nil).
func DayOf(t time.Time, loc *time.Location) Period {
	if loc == nil {
		loc = time.UTC
	}
	t = t.In(loc)
	from := time.Date(t.Year(), t.Month(), t.Day(), 0, 0, 0, 0, loc)
	return Period{From: from, To: from.AddDate(0, 0, 1)}
}

// ParseMonth reads "2026-11" as that calendar month in loc.
func ParseMonth(s string, loc *time.Location) (Period, error) {
	if loc == nil {
		loc = time.UTC
	}
	t, err := time.ParseInLocation("2006-01", s, loc)
	if err != nil {
		return Period{}, fmt.Errorf("%w: month %q is not YYYY-MM", ErrBadQuery, s)
	}
	return MonthOf(t, loc), nil
}

// ParseDay reads "2026-11-05" as that calendar day in loc.
func ParseDay(s string, loc *time.Location) (Period, error) {
	if loc == nil {
		loc = time.UTC
	}
	t, err := time.ParseInLocation("2006-01-02", s, loc)
	if err != nil {
		return Period{}, fmt.Errorf("%w: day %q is not YYYY-MM-DD", ErrBadQuery, s)
	}
	return DayOf(t, loc), nil
}

// Label names the period in file names: "2026-11" for a calendar month,
// "2026-11-05" for a calendar day (in From's location), otherwise
// "20261105T060000Z_20261106T060000Z" in UTC.
func (p Period) Label() string {
	f := p.From
	if f.Equal(MonthOf(f, f.Location()).From) && p.To.Equal(f.AddDate(0, 1, 0)) {
		return f.Format("2006-01")
	}
	if f.Equal(DayOf(f, f.Location()).From) && p.To.Equal(f.AddDate(0, 0, 1)) {
		return f.Format("2006-01-02")
	}
	const compact = "20060102T150405Z"
	return p.From.UTC().Format(compact) + "_" + p.To.UTC().Format(compact)
}
