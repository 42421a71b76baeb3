package billing_test

import (
	"testing"
	"time"

	gocmp "github.com/google/go-cmp/cmp"

	"github.com/spillway-dev/spillway/billing"
)

func scheduled(t *testing.T, spec string, k billing.PeriodKind, loc *time.Location) billing.ScheduledExport {
	t.Helper()
	s, err := billing.ParseSchedule(spec)
	if err != nil {
		t.Fatal(err)
	}
	return billing.ScheduledExport{Name: "x", Spec: spec, Schedule: s, Period: k, Location: loc, Format: billing.FormatCSV}
}

// due is a DueRun as tables state it.
type due struct {
	Fire   string
	Period string
}

func dues(rs []billing.DueRun) []due {
	out := []due{}
	for _, r := range rs {
		out = append(out, due{r.Fire.UTC().Format(time.RFC3339), r.Period.Label()})
	}
	return out
}

func TestDueIsCronArithmetic(t *testing.T) {
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Skipf("no tz database: %v", err)
	}
	utc := func(s string) time.Time {
		v, err := time.Parse(time.RFC3339, s)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	cases := []struct {
		name    string
		x       billing.ScheduledExport
		last    string
		now     string
		catchUp int
		want    []due
	}{
		{
			name: "monthly on the 1st exports the previous month",
			x:    scheduled(t, "0 6 1 * *", billing.PreviousMonth, time.UTC),
			last: "2026-11-01T06:00:00Z", now: "2026-12-01T06:00:00Z",
			want: []due{{"2026-12-01T06:00:00Z", "2026-11"}},
		},
		{
			name: "nothing is due a minute before the fire time",
			x:    scheduled(t, "0 6 1 * *", billing.PreviousMonth, time.UTC),
			last: "2026-11-01T06:00:00Z", now: "2026-12-01T05:59:00Z",
			want: []due{},
		},
		{
			name: "daily in Berlin exports yesterday as Berlin sees it",
			x:    scheduled(t, "@daily", billing.PreviousDay, berlin),
			last: "2026-11-03T23:00:00Z", now: "2026-11-04T23:30:00Z", // 00:30 on the 5th in Berlin
			want: []due{{"2026-11-04T23:00:00Z", "2026-11-04"}},
		},
		{
			name: "a broker down for four days catches up oldest first",
			x:    scheduled(t, "15 0 * * *", billing.PreviousDay, time.UTC),
			last: "2026-11-01T00:15:00Z", now: "2026-11-05T12:00:00Z",
			want: []due{
				{"2026-11-02T00:15:00Z", "2026-11-01"},
				{"2026-11-03T00:15:00Z", "2026-11-02"},
				{"2026-11-04T00:15:00Z", "2026-11-03"},
				{"2026-11-05T00:15:00Z", "2026-11-04"},
			},
		},
		{
			name: "catch-up keeps only the latest periods",
			x:    scheduled(t, "15 0 * * *", billing.PreviousDay, time.UTC),
			last: "2026-11-01T00:15:00Z", now: "2026-11-05T12:00:00Z", catchUp: 2,
			want: []due{{"2026-11-04T00:15:00Z", "2026-11-03"}, {"2026-11-05T00:15:00Z", "2026-11-04"}},
		},
		{
			name: "an hourly schedule of a daily export runs each day once, at its latest fire",
			x:    scheduled(t, "0 * * * *", billing.PreviousDay, time.UTC),
			last: "2026-11-04T22:00:00Z", now: "2026-11-05T02:30:00Z",
			want: []due{{"2026-11-04T23:00:00Z", "2026-11-03"}, {"2026-11-05T02:00:00Z", "2026-11-04"}},
		},
		{
			name: "a first start exports the last completed month once",
			x:    scheduled(t, "0 6 1 * *", billing.PreviousMonth, time.UTC),
			last: "", now: "2026-11-15T09:00:00Z",
			want: []due{{"2026-11-01T06:00:00Z", "2026-10"}},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var last time.Time
			if c.last != "" {
				last = utc(c.last)
			}
			c.x.CatchUp = c.catchUp
			got := dues(c.x.Due(last, utc(c.now)))
			if diff := gocmp.Diff(c.want, got); diff != "" {
				t.Errorf("due (-want +got):\n%s", diff)
			}
		})
	}
}

func TestPeriodLabel(t *testing.T) {
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Skipf("no tz database: %v", err)
	}
	d, _ := billing.ParseDay("2026-11-05", berlin)
	m, _ := billing.ParseMonth("2026-02", time.UTC)
	odd := billing.Period{From: time.Date(2026, 11, 5, 6, 0, 0, 0, time.UTC), To: time.Date(2026, 11, 6, 6, 0, 0, 0, time.UTC)}
	for p, want := range map[billing.Period]string{d: "2026-11-05", m: "2026-02", odd: "20261105T060000Z_20261106T060000Z"} {
		if got := p.Label(); got != want {
			t.Errorf("Label(%v) = %q, want %q", p, got, want)
		}
	}
	if _, err := billing.ParseMonth("2026-13", nil); err == nil {
		t.Error("ParseMonth accepted month 13")
	}
}
