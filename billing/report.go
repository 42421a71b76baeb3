package billing

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Dimension is something a report groups by.
type Dimension string

// Report dimensions.
const (
	DimTeam     Dimension = "team"
	DimProject  Dimension = "project"
	DimUser     Dimension = "user"
	DimJob      Dimension = "job"
	DimQueue    Dimension = "queue"
	DimPool     Dimension = "pool"      // Pool.Label()
	DimPoolKind Dimension = "pool-kind" // onprem | cloud | lease
	DimGPUModel Dimension = "gpu-model"
	DimSpot     Dimension = "spot" // "spot" | "on-demand"
	DimKind     Dimension = "kind" // usage | overhead
	DimDay      Dimension = "day"  // YYYY-MM-DD of Start in the report's location
	DimMonth    Dimension = "month"
)

// Dimensions lists every dimension, in the order docs and help show them.
var Dimensions = []Dimension{DimTeam, DimProject, DimUser, DimJob, DimQueue, DimPool, DimPoolKind, DimGPUModel, DimSpot, DimKind, DimDay, DimMonth}

// ParseDimensions reads a comma-separated list like "team,pool" (what
// `spillway bill usage --by` takes). Empty input means no grouping.
func ParseDimensions(s string) ([]Dimension, error) {
	var out []Dimension
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(strings.ToLower(f))
		if f == "" {
			continue
		}
		d := Dimension(f)
		if !slices.Contains(Dimensions, d) {
			return nil, fmt.Errorf("%w: unknown dimension %q (want one of %s)", ErrBadQuery, f, joinDims(Dimensions))
		}
		if slices.Contains(out, d) {
			return nil, fmt.Errorf("%w: dimension %q given twice", ErrBadQuery, f)
		}
		out = append(out, d)
	}
	return out, nil
}

func joinDims(ds []Dimension) string {
	s := make([]string, len(ds))
	for i, d := range ds {
		s[i] = string(d)
	}
	return strings.Join(s, ", ")
}

// value is the entry's value in dimension d.
func (d Dimension) value(e Entry, loc *time.Location) string {
	switch d {
	case DimTeam:
		return e.Team
	case DimProject:
		return e.Project
	case DimUser:
		return e.User
	case DimJob:
		return e.Job
	case DimQueue:
		return e.Queue
	case DimPool:
		return e.Pool.Label()
	case DimPoolKind:
		return string(e.Pool.Kind)
	case DimGPUModel:
		return e.GPUModel
	case DimSpot:
		if e.Spot {
			return "spot"
		}
		return "on-demand"
	case DimKind:
		return string(e.Kind)
	case DimDay:
		return e.Start.In(loc).Format("2006-01-02")
	case DimMonth:
		return e.Start.In(loc).Format("2006-01")
	}
	return ""
}

// Totals are exact integer sums over entries.
type Totals struct {
	// Entries counted.
	Entries int `json:"entries"`
	// GPUMillis is kept equal to the sum of the entries' GPUMillis.
	GPUMillis int64 `json:"gpuMillis"`
	// EffectiveGPUMillis is kept equal to the sum of EffectiveGPUMillis().
	EffectiveGPUMillis int64 `json:"effectiveGPUMillis"`
	// MeasuredGPUMillis is the GPU-time telemetry covered (the base
	// EffectiveGPUMillis is a share of).
	MeasuredGPUMillis int64 `json:"measuredGPUMillis"`
	// Cost is kept equal to the sum of the entries' Cost.
	Cost Amount `json:"cost"`
}

// Add counts one entry.
func (t *Totals) Add(e Entry) {
	t.Entries++
	t.GPUMillis += e.GPUMillis
	t.EffectiveGPUMillis += e.EffectiveGPUMillis()
	t.MeasuredGPUMillis += e.MeasuredGPUMillis()
	t.Cost += e.Cost
}

// GPUHours prints GPUMillis as hours with three decimals.
func (t Totals) GPUHours() string { return FormatGPUHours(t.GPUMillis) }

// EffectiveGPUHours prints EffectiveGPUMillis as hours with three decimals.
func (t Totals) EffectiveGPUHours() string { return FormatGPUHours(t.EffectiveGPUMillis) }

// MarshalJSON adds the hours, as strings, next to the exact integers.
func (t Totals) MarshalJSON() ([]byte, error) {
	type plain Totals
	return json.Marshal(struct {
		plain
		GPUHours          string `json:"gpuHours"`
		EffectiveGPUHours string `json:"effectiveGPUHours"`
	}{plain(t), t.GPUHours(), t.EffectiveGPUHours()})
}

// FormatGPUHours prints GPU-milliseconds as GPU-hours rounded half up to
// three decimals: 5_400_000 → "1.500". For display; sums use the integers.
func FormatGPUHours(ms int64) string {
	neg := ms < 0
	if neg {
		ms = -ms
	}
	th := divRound(ms, MillisPerHour/1000)
	s := strconv.FormatInt(th/1000, 10) + "." + fmt.Sprintf("%03d", th%1000)
	if neg {
		s = "-" + s
	}
	return s
}

// ReportQuery asks for a usage report.
type ReportQuery struct {
	Period Period
	// Team restricts the report to one team; empty means every team. The
	// API sets it from the caller's token for everyone but finance and
	// operators: a user sees only their team.
	Team string
	// GroupBy lists the dimensions of a row key, in order; none gives one
	// row with the total.
	GroupBy []Dimension
	// Location is where day and month buckets are cut (UTC when nil).
	Location *time.Location
}

// ReportRow is one group.
type ReportRow struct {
	// Key holds the group's value in each GroupBy dimension, in order.
	Key []string `json:"key"`
	Totals
}

// MarshalJSON writes the key next to the totals (Totals' own MarshalJSON
// would otherwise be promoted and drop it).
func (r ReportRow) MarshalJSON() ([]byte, error) {
	tot, err := r.Totals.MarshalJSON()
	if err != nil {
		return nil, err
	}
	key, err := json.Marshal(r.Key)
	if err != nil {
		return nil, err
	}
	out := append([]byte(`{"key":`), key...)
	out = append(out, ',')
	return append(out, tot[1:]...), nil
}

// Report is GPU-hours, effective GPU-hours and cost by group.
type Report struct {
	// GroupBy, Period and Team echo the query.
	GroupBy []Dimension `json:"groupBy"`
	Period  Period      `json:"period"`
	Team    string      `json:"team,omitempty"`
	// Currency of every amount (empty when the period is empty).
	Currency string `json:"currency,omitempty"`
	// Rows ordered by Key.
	Rows []ReportRow `json:"rows"`
	// Total is kept equal to the sum of Rows.
	Total Totals `json:"total"`
}

// BuildReport scans the period once and sums entries by group.
func BuildReport(ctx context.Context, s Store, q ReportQuery) (Report, error) {
	if err := q.Period.Validate(); err != nil {
		return Report{}, err
	}
	loc := q.Location
	if loc == nil {
		loc = time.UTC
	}
	rep := Report{GroupBy: q.GroupBy, Period: q.Period, Team: q.Team}
	groups := map[string]*ReportRow{}
	key := make([]string, len(q.GroupBy))
	err := s.Scan(ctx, q.Period.From, q.Period.To, func(e Entry) error {
		if q.Team != "" && e.Team != q.Team {
			return nil
		}
		if err := sameCurrency(&rep.Currency, e); err != nil {
			return err
		}
		for i, d := range q.GroupBy {
			key[i] = d.value(e, loc)
		}
		k := strings.Join(key, "\x00")
		row, ok := groups[k]
		if !ok {
			row = &ReportRow{Key: slices.Clone(key)}
			groups[k] = row
		}
		row.Add(e)
		rep.Total.Add(e)
		return nil
	})
	if err != nil {
		return Report{}, fmt.Errorf("build report: %w", err)
	}
	for _, k := range sortedKeys(groups) {
		rep.Rows = append(rep.Rows, *groups[k])
	}
	return rep, nil
}

// LedgerTotals sums every entry of the period (of one team, or of all when
// team is empty): the figure exports reconcile with.
func LedgerTotals(ctx context.Context, s Store, p Period, team string) (Totals, error) {
	rep, err := BuildReport(ctx, s, ReportQuery{Period: p, Team: team})
	if err != nil {
		return Totals{}, err
	}
	return rep.Total, nil
}

func sameCurrency(cur *string, e Entry) error {
	if *cur == "" {
		*cur = e.Currency
		return nil
	}
	if *cur != e.Currency {
		return fmt.Errorf("%w: %s and %s (entry %s)", ErrMixedCurrency, *cur, e.Currency, e.ID)
	}
	return nil
}
