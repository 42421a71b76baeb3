package billing

import (
	"context"
	"fmt"
	"time"
)

// CycleWindow is the most time one Meter call inside MeterCycle covers. A
// broker that was down for a day meters the gap in windows of this size,
// each appended and checkpointed before the next, so no batch grows with
// the length of the outage.
const CycleWindow = time.Hour

// CycleResult sums up one MeterCycle.
type CycleResult struct {
	// Entries metered (including ones the store already had).
	Entries int
	// Added is how many of them were new to the store.
	Added int
	// Through is the cursor after the cycle.
	Through time.Time
	// Problems from Meter, each reported once per cycle.
	Problems []error
}

// MeterCycle is one metering step of the running broker, in three moves
// per window of at most CycleWindow:
//
//  1. read the cursor (MeterMark) from marks;
//  2. Meter the allocations and machines from the cursor to the window's
//     end (now, for the last window);
//  3. Append the entries, and only then move the cursor to the result's
//     Through.
//
// A crash anywhere in between leaves the cursor at or before the first
// slice not yet durable; the next cycle meters from there again, and the
// slices that did reach the store are skipped by id. The broker passes the
// allocations running now and those that ended after the cursor (older
// ones are harmless), with End set only for those that have ended, and
// logs res.Problems.
func MeterCycle(ctx context.Context, store Store, marks Watermarks, cfg MeterConfig, allocs []Allocation, machines []Machine, now time.Time) (CycleResult, error) {
	from, err := marks.Watermark(ctx, MeterMark)
	if err != nil {
		return CycleResult{}, fmt.Errorf("read meter cursor: %w", err)
	}
	res := CycleResult{Through: from}
	now = utcMilli(now)
	if from.IsZero() {
		// Nothing metered yet: begin at the first known start, or now
		// when nothing is known.
		from = earliestStart(allocs, machines)
		if from.IsZero() || from.After(now) {
			from = now
		}
		from = from.Truncate(cfg.slice())
	}
	seen := map[string]bool{}
	for {
		windowNow := now
		if end := from.Add(CycleWindow); end.Before(now) {
			windowNow = end
		}
		m := Meter(cfg, MeterInput{From: from, Now: windowNow, Allocations: allocs, Machines: machines})
		for _, p := range m.Problems {
			if !seen[p.Error()] {
				seen[p.Error()] = true
				res.Problems = append(res.Problems, p)
			}
		}
		if len(m.Entries) > 0 {
			added, err := store.Append(ctx, m.Entries)
			if err != nil {
				return res, fmt.Errorf("append ledger entries: %w", err)
			}
			res.Entries += len(m.Entries)
			res.Added += added
		}
		if m.Through.After(res.Through) {
			if err := marks.SetWatermark(ctx, MeterMark, m.Through); err != nil {
				return res, fmt.Errorf("advance meter cursor: %w", err)
			}
			res.Through = m.Through
		}
		if !windowNow.Before(now) || !m.Through.After(from) {
			return res, nil
		}
		from = m.Through
	}
}

// earliestStart is where metering begins when nothing was metered yet.
func earliestStart(allocs []Allocation, machines []Machine) time.Time {
	var first time.Time
	consider := func(t time.Time) {
		t = utcMilli(t)
		if !t.IsZero() && (first.IsZero() || t.Before(first)) {
			first = t
		}
	}
	for _, a := range allocs {
		consider(a.Start)
	}
	for _, m := range machines {
		consider(m.Start)
	}
	return first
}
