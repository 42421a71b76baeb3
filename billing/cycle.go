package billing

import (
	"context"
	"fmt"
	"time"
)

// MeterCycle is one metering step of the running broker, in three moves:
//
//  1. read the cursor (MeterMark) from marks;
//  2. Meter the allocations and machines from the cursor to now;
//  3. Append the entries, and only then move the cursor to the result's
//     Through.
//
// A crash anywhere in between leaves the cursor at or before the first
// slice not yet durable; the next cycle meters from there again, and the
// slices that did reach the store are skipped by id. The broker passes the
// allocations running now and those that ended after the cursor (older
// ones are harmless), and logs res.Problems.
func MeterCycle(ctx context.Context, store Store, marks Watermarks, cfg MeterConfig, allocs []Allocation, machines []Machine, now time.Time) (MeterResult, error) {
	from, err := marks.Watermark(ctx, MeterMark)
	if err != nil {
		return MeterResult{}, fmt.Errorf("read meter cursor: %w", err)
	}
	res := Meter(cfg, MeterInput{From: from, Now: now, Allocations: allocs, Machines: machines})
	if len(res.Entries) > 0 {
		if _, err := store.Append(ctx, res.Entries); err != nil {
			return res, fmt.Errorf("append ledger entries: %w", err)
		}
	}
	if res.Through.After(from) {
		if err := marks.SetWatermark(ctx, MeterMark, res.Through); err != nil {
			return res, fmt.Errorf("advance meter cursor: %w", err)
		}
	}
	return res, nil
}
