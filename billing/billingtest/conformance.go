package billingtest

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/spillway-dev/spillway/billing"
)

// Backend is what a ledger store under test must provide: the entries and
// the watermarks (the broker's bolt and Redis stores implement both).
type Backend interface {
	billing.Store
	billing.Watermarks
}

// RunStoreConformance checks a Store and Watermarks implementation against
// the contract in billing.Store's doc comment. newBackend must return an
// empty backend each time it is called; it may register cleanups on t.
// The broker runs it for its bbolt and Redis stores; billing runs it for
// MemStore.
func RunStoreConformance(t *testing.T, newBackend func(t *testing.T) Backend) {
	t.Helper()
	ctx := context.Background()
	month := billing.MonthOf(time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC), time.UTC)

	t.Run("empty store scans nothing and has no marks", func(t *testing.T) {
		b := newBackend(t)
		got := scanAll(t, b, time.Time{}, time.Time{})
		if len(got) != 0 {
			t.Fatalf("empty store returned %d entries", len(got))
		}
		mark, err := b.Watermark(ctx, billing.MeterMark)
		if err != nil || !mark.IsZero() {
			t.Fatalf("Watermark on empty store = %v, %v; want zero time, nil", mark, err)
		}
	})

	t.Run("entries round-trip every field in (Start, ID) order", func(t *testing.T) {
		b := newBackend(t)
		in := Entries(1, 300, month, "USD")
		shuffled := slices.Clone(in)
		slices.Reverse(shuffled) // writes out of order must still scan in order
		added, err := b.Append(ctx, shuffled)
		if err != nil {
			t.Fatalf("Append: %v", err)
		}
		want := uniqueSorted(in)
		if added != len(want) {
			t.Errorf("Append added %d, want %d", added, len(want))
		}
		if diff := cmp.Diff(want, scanAll(t, b, month.From, month.To)); diff != "" {
			t.Fatalf("Scan after Append (-want +got):\n%s", diff)
		}
	})

	t.Run("appending the same slices again adds nothing", func(t *testing.T) {
		b := newBackend(t)
		in := Entries(2, 120, month, "USD")
		mustAppend(t, b, in)
		added, err := b.Append(ctx, in)
		if err != nil || added != 0 {
			t.Fatalf("second Append = %d, %v; want 0, nil", added, err)
		}
		if got := scanAll(t, b, time.Time{}, time.Time{}); len(got) != len(uniqueSorted(in)) {
			t.Fatalf("after a repeated Append the store holds %d entries, want %d", len(got), len(uniqueSorted(in)))
		}
	})

	t.Run("first write of an id wins", func(t *testing.T) {
		b := newBackend(t)
		first := Entries(3, 1, month, "USD")[0]
		mustAppend(t, b, []billing.Entry{first})
		second := first
		second.GPUMillis++
		second.Cost = billing.CostOf(second.Rate, second.GPUMillis)
		second.Team = "someone-else"
		added, err := b.Append(ctx, []billing.Entry{second})
		if err != nil || added != 0 {
			t.Fatalf("Append of a changed entry with a known id = %d, %v; want 0, nil", added, err)
		}
		if diff := cmp.Diff([]billing.Entry{first}, scanAll(t, b, time.Time{}, time.Time{})); diff != "" {
			t.Fatalf("stored entry changed (-want +got):\n%s", diff)
		}
	})

	t.Run("a batch mixing new and known entries adds the new ones", func(t *testing.T) {
		b := newBackend(t)
		in := uniqueSorted(Entries(4, 100, month, "USD"))
		mustAppend(t, b, in[:60])
		added, err := b.Append(ctx, in[30:])
		if err != nil || added != len(in)-60 {
			t.Fatalf("Append = %d, %v; want %d, nil", added, err, len(in)-60)
		}
		if diff := cmp.Diff(in, scanAll(t, b, time.Time{}, time.Time{})); diff != "" {
			t.Fatalf("Scan (-want +got):\n%s", diff)
		}
	})

	t.Run("a batch with an invalid entry is refused whole", func(t *testing.T) {
		b := newBackend(t)
		in := Entries(5, 10, month, "USD")
		bad := in[7]
		bad.Cost++ // breaks Cost == Rate × GPU-time
		batch := append(slices.Clone(in[:7]), bad)
		_, err := b.Append(ctx, batch)
		if !errors.Is(err, billing.ErrInvalidEntry) {
			t.Fatalf("Append with an invalid entry: err = %v, want ErrInvalidEntry", err)
		}
		if got := scanAll(t, b, time.Time{}, time.Time{}); len(got) != 0 {
			t.Fatalf("refused batch left %d entries behind", len(got))
		}
	})

	t.Run("scan selects [from, to) by Start", func(t *testing.T) {
		b := newBackend(t)
		base := month.From.Add(10 * time.Hour)
		var in []billing.Entry
		for i, off := range []time.Duration{-time.Millisecond, 0, time.Millisecond, time.Hour - time.Millisecond, time.Hour, time.Hour + time.Second} {
			e := Entries(uint64(100+i), 1, month, "USD")[0]
			e.Start = base.Add(off)
			e.End = e.Start.Add(time.Second)
			e.ID = billing.DeriveID(e.Kind, e.Job, e.Attempt, e.Pool.ResourceID(), e.Start)
			in = append(in, e)
		}
		mustAppend(t, b, in)
		got := scanAll(t, b, base, base.Add(time.Hour))
		want := uniqueSorted(in[1:4])
		if diff := cmp.Diff(want, got); diff != "" {
			t.Fatalf("Scan [base, base+1h) (-want +got):\n%s", diff)
		}
		if got := scanAll(t, b, base.Add(time.Hour), time.Time{}); len(got) != 2 {
			t.Fatalf("Scan with no upper bound returned %d entries, want 2", len(got))
		}
	})

	t.Run("scan stops at the callback's error", func(t *testing.T) {
		b := newBackend(t)
		mustAppend(t, b, Entries(6, 50, month, "USD"))
		stop := errors.New("stop here")
		calls := 0
		err := b.Scan(ctx, time.Time{}, time.Time{}, func(billing.Entry) error {
			calls++
			if calls == 3 {
				return stop
			}
			return nil
		})
		if !errors.Is(err, stop) || calls != 3 {
			t.Fatalf("Scan = %v after %d calls; want the callback's error after 3", err, calls)
		}
	})

	t.Run("concurrent appends of overlapping batches store each id once", func(t *testing.T) {
		b := newBackend(t)
		in := uniqueSorted(Entries(7, 400, month, "USD"))
		var wg sync.WaitGroup
		var mu sync.Mutex
		total := 0
		for w := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				n, err := b.Append(ctx, in[w*50:w*50+250])
				if err != nil {
					t.Errorf("Append: %v", err)
				}
				mu.Lock()
				total += n
				mu.Unlock()
			}()
		}
		wg.Wait()
		want := in
		if total != len(want) {
			t.Errorf("appends reported %d added, want %d", total, len(want))
		}
		if diff := cmp.Diff(want, scanAll(t, b, time.Time{}, time.Time{})); diff != "" {
			t.Fatalf("Scan after concurrent appends (-want +got):\n%s", diff)
		}
	})

	t.Run("watermarks round-trip per key", func(t *testing.T) {
		b := newBackend(t)
		t1 := time.Date(2026, 11, 5, 10, 31, 0, 0, time.UTC)
		t2 := time.Date(2026, 12, 1, 6, 0, 0, 0, time.FixedZone("CET", 3600))
		if err := b.SetWatermark(ctx, billing.MeterMark, t1); err != nil {
			t.Fatalf("SetWatermark: %v", err)
		}
		if err := b.SetWatermark(ctx, billing.ExportMark("finance"), t2); err != nil {
			t.Fatalf("SetWatermark: %v", err)
		}
		for key, want := range map[string]time.Time{billing.MeterMark: t1, billing.ExportMark("finance"): t2} {
			got, err := b.Watermark(ctx, key)
			if err != nil || !got.Equal(want) {
				t.Errorf("Watermark(%q) = %v, %v; want %v", key, got, err, want)
			}
		}
		t3 := t1.Add(time.Minute)
		if err := b.SetWatermark(ctx, billing.MeterMark, t3); err != nil {
			t.Fatalf("SetWatermark: %v", err)
		}
		if got, _ := b.Watermark(ctx, billing.MeterMark); !got.Equal(t3) {
			t.Errorf("Watermark after overwrite = %v, want %v", got, t3)
		}
	})
}

func mustAppend(t *testing.T, s billing.Store, in []billing.Entry) {
	t.Helper()
	if _, err := s.Append(context.Background(), in); err != nil {
		t.Fatalf("Append: %v", err)
	}
}

func scanAll(t *testing.T, s billing.Store, from, to time.Time) []billing.Entry {
	t.Helper()
	var out []billing.Entry
	if err := s.Scan(context.Background(), from, to, func(e billing.Entry) error {
		out = append(out, e)
		return nil
	}); err != nil {
		t.Fatalf("Scan: %v", err)
	}
	return out
}

// uniqueSorted keeps the first entry of each id, in (Start, ID) order.
func uniqueSorted(in []billing.Entry) []billing.Entry {
	seen := map[string]bool{}
	var out []billing.Entry
	for _, e := range in {
		if !seen[e.ID] {
			seen[e.ID] = true
			out = append(out, e)
		}
	}
	slices.SortFunc(out, func(a, b billing.Entry) int {
		if c := a.Start.Compare(b.Start); c != 0 {
			return c
		}
		return compare(a.ID, b.ID)
	})
	return out
}

func compare(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
