package billing

import (
	"bytes"
	"context"
	"slices"
	"sync"
	"time"
)

// Store is the ledger's durable storage; the broker implements it on its
// bbolt and Redis stores, and billingtest.RunStoreConformance checks an
// implementation against this contract.
type Store interface {
	// Append writes the entries whose ID is not in the ledger yet and skips
	// the others: the first write of an id wins, whatever the later one
	// holds. It returns how many it wrote. Entries are durable when it
	// returns nil. It refuses (with an error wrapping ErrInvalidEntry, and
	// writing nothing) a batch with an entry that fails Validate. It need
	// not be atomic across the batch: a partial append followed by a retry
	// of the whole batch is safe.
	Append(ctx context.Context, entries []Entry) (added int, err error)
	// Scan calls fn for every entry with from <= Start < to, in (Start, ID)
	// order (SortKey order). A zero to means no upper bound. It stops at
	// and returns the first error fn returns.
	Scan(ctx context.Context, from, to time.Time, fn func(Entry) error) error
}

// Watermarks keeps the instants billing resumes from: the meter's cursor
// (MeterMark) and each scheduled export's last successful run
// (ExportMark). The broker implements it next to Store.
type Watermarks interface {
	// Watermark returns the instant stored under key, or the zero time
	// when none was ever stored.
	Watermark(ctx context.Context, key string) (time.Time, error)
	// SetWatermark stores t under key, durably when it returns nil.
	SetWatermark(ctx context.Context, key string, t time.Time) error
}

// MeterMark is the Watermarks key of the meter's cursor.
const MeterMark = "meter"

// ExportMark is the Watermarks key of a scheduled export's last successful
// run (its cron fire time).
func ExportMark(name string) string { return "export/" + name }

// MemStore is an in-memory Store and Watermarks, for tests and for the
// simulator. It is safe for concurrent use.
type MemStore struct {
	mu      sync.Mutex
	byID    map[string]struct{}
	entries []Entry // sorted by SortKey when sorted is true
	sorted  bool
	marks   map[string]time.Time
}

// NewMemStore returns an empty MemStore.
func NewMemStore() *MemStore {
	return &MemStore{byID: map[string]struct{}{}, marks: map[string]time.Time{}, sorted: true}
}

// Append implements Store.
func (m *MemStore) Append(ctx context.Context, entries []Entry) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	if err := ValidateEntries(entries); err != nil {
		return 0, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	added := 0
	for _, e := range entries {
		if _, ok := m.byID[e.ID]; ok {
			continue
		}
		m.byID[e.ID] = struct{}{}
		if n := len(m.entries); n > 0 && m.sorted && e.Less(m.entries[n-1]) {
			m.sorted = false
		}
		m.entries = append(m.entries, e)
		added++
	}
	return added, nil
}

// Scan implements Store. It copies the range under the lock and calls fn
// without it, so fn may use the store.
func (m *MemStore) Scan(ctx context.Context, from, to time.Time, fn func(Entry) error) error {
	m.mu.Lock()
	if !m.sorted {
		slices.SortFunc(m.entries, func(a, b Entry) int { return bytes.Compare(a.SortKey(), b.SortKey()) })
		m.sorted = true
	}
	lo, _ := slices.BinarySearchFunc(m.entries, from, func(e Entry, t time.Time) int { return e.Start.Compare(t) })
	hi := len(m.entries)
	if !to.IsZero() {
		hi, _ = slices.BinarySearchFunc(m.entries, to, func(e Entry, t time.Time) int { return e.Start.Compare(t) })
	}
	var part []Entry
	if lo < hi {
		part = slices.Clone(m.entries[lo:hi])
	}
	m.mu.Unlock()
	for _, e := range part {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := fn(e); err != nil {
			return err
		}
	}
	return nil
}

// Len returns the number of entries.
func (m *MemStore) Len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.entries)
}

// Watermark implements Watermarks.
func (m *MemStore) Watermark(ctx context.Context, key string) (time.Time, error) {
	if err := ctx.Err(); err != nil {
		return time.Time{}, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.marks[key], nil
}

// SetWatermark implements Watermarks.
func (m *MemStore) SetWatermark(ctx context.Context, key string, t time.Time) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.marks[key] = t.UTC()
	return nil
}
