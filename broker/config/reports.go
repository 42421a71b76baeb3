package config

import (
	"fmt"
	"strings"
	"time"

	"github.com/spillway-dev/spillway/broker"
)

// Reports shapes the utilisation and delivery reports and the delivery
// metrics: how the week is cut into shifts, and when a waiting job counts
// as starving.
type Reports struct {
	// TimeZone the shifts are cut in (an IANA name; default: the billing
	// time zone, else UTC).
	TimeZone string `json:"timeZone,omitempty"`
	// DayStart and DayEnd are the hours (0-24) that bound a weekday's day
	// shift: [DayStart, DayEnd). The rest of a weekday is night. Defaults
	// 8 and 20.
	DayStart *int `json:"dayStart,omitempty"`
	DayEnd   *int `json:"dayEnd,omitempty"`
	// Weekend lists the days that count as weekend, all day (default
	// saturday and sunday).
	Weekend []string `json:"weekend,omitempty"`
	// StarvationAfter is the wait after which a pending job counts as
	// starving in reports and in spillway_jobs_starving (default 24h).
	StarvationAfter broker.Duration `json:"starvationAfter,omitempty"`
	// Lookback bounds how far before a report's period the delivery report
	// looks for jobs submitted earlier (default 30d).
	Lookback broker.Duration `json:"lookback,omitempty"`

	// zone is TimeZone loaded by Validate.
	zone *time.Location
	// weekend is Weekend parsed by Validate.
	weekend [7]bool
}

// Shift names, as reports print them.
const (
	ShiftWeekdayDay   = "weekday-day"
	ShiftWeekdayNight = "weekday-night"
	ShiftWeekend      = "weekend"
)

func (c *Config) reportsDefaults() {
	r := &c.Reports
	if r.DayStart == nil {
		v := 8
		r.DayStart = &v
	}
	if r.DayEnd == nil {
		v := 20
		r.DayEnd = &v
	}
	if r.Weekend == nil {
		r.Weekend = []string{"saturday", "sunday"}
	}
	if r.StarvationAfter == 0 {
		r.StarvationAfter = broker.Duration(24 * time.Hour)
	}
	if r.Lookback == 0 {
		r.Lookback = broker.Duration(30 * 24 * time.Hour)
	}
}

func (c *Config) validateReports(add func(field, code, format string, args ...any)) {
	r := &c.Reports
	zone := r.TimeZone
	if zone == "" {
		zone = c.Billing.TimeZone
	}
	r.zone = time.UTC
	if zone != "" {
		loc, err := time.LoadLocation(zone)
		if err != nil {
			add("reports.timeZone", broker.CodeInvalid, "unknown time zone %q (use an IANA name like Europe/Berlin)", zone)
		} else {
			r.zone = loc
		}
	}
	if *r.DayStart < 0 || *r.DayStart > 23 {
		add("reports.dayStart", broker.CodeOutOfRange, "must be an hour between 0 and 23")
	}
	if *r.DayEnd < 1 || *r.DayEnd > 24 || *r.DayEnd <= *r.DayStart {
		add("reports.dayEnd", broker.CodeOutOfRange, "must be an hour between 1 and 24, after reports.dayStart")
	}
	r.weekend = [7]bool{}
	for i, d := range r.Weekend {
		wd, ok := weekdays[strings.ToLower(d)]
		if !ok {
			add(fmt.Sprintf("reports.weekend[%d]", i), broker.CodeInvalid, "must be a day name like saturday, got %q", d)
			continue
		}
		r.weekend[wd] = true
	}
	if r.StarvationAfter.D() < time.Minute {
		add("reports.starvationAfter", broker.CodeOutOfRange, "must be at least 1m")
	}
	if r.Lookback.D() < time.Hour || r.Lookback.D() > 400*24*time.Hour {
		add("reports.lookback", broker.CodeOutOfRange, "must be between 1h and 400d")
	}
}

var weekdays = map[string]time.Weekday{
	"sunday": time.Sunday, "monday": time.Monday, "tuesday": time.Tuesday, "wednesday": time.Wednesday,
	"thursday": time.Thursday, "friday": time.Friday, "saturday": time.Saturday,
}

// Location is the zone shifts are cut in.
func (r *Reports) Location() *time.Location {
	if r.zone == nil {
		return time.UTC
	}
	return r.zone
}

// ShiftOf names the shift an instant falls in.
func (r *Reports) ShiftOf(t time.Time) string {
	lt := t.In(r.Location())
	if r.weekend[lt.Weekday()] {
		return ShiftWeekend
	}
	if h := lt.Hour(); h >= r.dayStart() && h < r.dayEnd() {
		return ShiftWeekdayDay
	}
	return ShiftWeekdayNight
}

// NextShiftChange is the first instant after t at which ShiftOf may
// change: the next local hour that starts or ends a day shift, or the next
// local midnight.
func (r *Reports) NextShiftChange(t time.Time) time.Time {
	loc := r.Location()
	lt := t.In(loc)
	y, m, d := lt.Date()
	var out time.Time
	for _, h := range []int{r.dayStart(), r.dayEnd(), 24} {
		c := time.Date(y, m, d, h, 0, 0, 0, loc)
		if c.After(t) && (out.IsZero() || c.Before(out)) {
			out = c
		}
	}
	if out.IsZero() {
		out = time.Date(y, m, d+1, 0, 0, 0, 0, loc)
	}
	return out
}

func (r *Reports) dayStart() int {
	if r.DayStart == nil {
		return 8
	}
	return *r.DayStart
}

func (r *Reports) dayEnd() int {
	if r.DayEnd == nil {
		return 20
	}
	return *r.DayEnd
}
