package broker

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/spillway-dev/spillway/billing"
)

// Buckets of the billing ledger.
const (
	// BucketLedgerIDs maps an entry id to its key in BucketLedger, so a
	// slice written twice is found and skipped.
	BucketLedgerIDs Bucket = "ledger-ids"
	// BucketAllocs holds the allocations the meter has still to finish:
	// one record per job attempt and node, written with the transition
	// that gave or took back the GPUs.
	BucketAllocs Bucket = "allocs"
)

// Ledger is the billing ledger kept in a broker Store. It implements
// billing.Store and billing.Watermarks, so the bbolt and the Redis stores
// both hold it, and both pass billingtest.RunStoreConformance.
//
// Layout: BucketLedger maps hex(entry.SortKey()) — start then id, so a
// range of time is a range of keys — to the entry as JSON;
// BucketLedgerIDs maps each id to that key (kept equal to the ids in
// BucketLedger); marks live in BucketMeta under "billing/".
type Ledger struct {
	Store Store
	// Budgets, when set, cuts burst spend into months in this zone and
	// settles budget reservations in the transaction that appends the
	// entries (see Settle).
	Budgets *time.Location
}

var (
	_ billing.Store      = Ledger{}
	_ billing.Watermarks = Ledger{}
)

// appendChunk bounds the entries written in one transaction.
const appendChunk = 2000

func ledgerKey(e billing.Entry) string { return hex.EncodeToString(e.SortKey()) }

func ledgerBound(t time.Time) string {
	return hex.EncodeToString(billing.Entry{Start: t}.SortKey())
}

// Append writes the entries whose id is new, in transactions of at most
// appendChunk entries (the contract allows a partial append: a retry of
// the batch skips what landed).
func (l Ledger) Append(ctx context.Context, entries []billing.Entry) (int, error) {
	if err := billing.ValidateEntries(entries); err != nil {
		return 0, err
	}
	added := 0
	for len(entries) > 0 {
		chunk := entries[:min(appendChunk, len(entries))]
		entries = entries[len(chunk):]
		n := 0
		err := l.Store.Update(ctx, func(tx Tx) error {
			n = 0
			for _, e := range chunk {
				if _, err := tx.Get(BucketLedgerIDs, e.ID); err == nil {
					continue
				} else if !errors.Is(err, ErrNotFound) {
					return err
				}
				raw, err := json.Marshal(e)
				if err != nil {
					return err
				}
				k := ledgerKey(e)
				if err := tx.Put(BucketLedger, k, raw); err != nil {
					return err
				}
				if err := tx.Put(BucketLedgerIDs, e.ID, []byte(k)); err != nil {
					return err
				}
				if l.Budgets != nil {
					if err := Settle(tx, e, l.Budgets); err != nil {
						return err
					}
				}
				n++
			}
			return nil
		})
		if err != nil {
			return added, fmt.Errorf("append ledger: %w", err)
		}
		added += n
	}
	return added, nil
}

// Scan calls fn for entries with from <= Start < to (to zero: no bound),
// in start-then-id order. It reads in pages so fn may take its time.
func (l Ledger) Scan(ctx context.Context, from, to time.Time, fn func(billing.Entry) error) error {
	lo := ledgerBound(from)
	if from.IsZero() {
		lo = ""
	}
	hi := ""
	if !to.IsZero() {
		hi = ledgerBound(to)
	}
	const page = 5000
	for {
		var batch []billing.Entry
		var last string
		err := l.Store.View(ctx, func(tx Tx) error {
			return tx.Scan(BucketLedger, lo, hi, func(k string, v []byte) error {
				var e billing.Entry
				if err := json.Unmarshal(v, &e); err != nil {
					return fmt.Errorf("decode ledger entry %s: %w", k, err)
				}
				batch = append(batch, e)
				last = k
				if len(batch) == page {
					return ErrStopScan
				}
				return nil
			})
		})
		if err != nil {
			return err
		}
		for _, e := range batch {
			if err := ctx.Err(); err != nil {
				return err
			}
			if err := fn(e); err != nil {
				return err
			}
		}
		if len(batch) < page {
			return nil
		}
		lo = last + "\x00"
	}
}

func markKey(key string) string { return "billing/" + key }

// Watermark returns the instant stored under key (zero when none).
func (l Ledger) Watermark(ctx context.Context, key string) (time.Time, error) {
	var t time.Time
	err := l.Store.View(ctx, func(tx Tx) error {
		raw, err := tx.Get(BucketMeta, markKey(key))
		if errors.Is(err, ErrNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		return t.UnmarshalText(raw)
	})
	return t, err
}

// SetWatermark stores t under key.
func (l Ledger) SetWatermark(ctx context.Context, key string, t time.Time) error {
	raw, err := t.UTC().MarshalText()
	if err != nil {
		return err
	}
	return l.Store.Update(ctx, func(tx Tx) error { return tx.Put(BucketMeta, markKey(key), raw) })
}

// AllocRecord is one job attempt's GPUs on one node, as the meter needs
// them: written when the broker gives the GPUs (Start) and updated when it
// takes them back (End), in the same transaction as the job's transition.
type AllocRecord struct {
	billing.Allocation
	// GPUs are the card indexes, to read their utilisation.
	GPUs []int `json:"gpus"`
}

func allocKey(job string, attempt int, node string) string {
	return fmt.Sprintf("%s/%06d/%s", job, attempt, node)
}

// PutAlloc writes an allocation record.
func PutAlloc(tx Tx, a AllocRecord) error {
	return putJSON(tx, BucketAllocs, allocKey(a.Job, a.Attempt, a.Pool.Node), a)
}

// GetAlloc reads one allocation record.
func GetAlloc(tx Tx, job string, attempt int, node string) (AllocRecord, error) {
	var a AllocRecord
	err := getJSON(tx, BucketAllocs, allocKey(job, attempt, node), &a)
	return a, err
}

// ListAllocs returns every allocation record.
func ListAllocs(tx Tx) ([]AllocRecord, error) {
	var out []AllocRecord
	err := tx.Scan(BucketAllocs, "", "", func(k string, v []byte) error {
		var a AllocRecord
		if err := json.Unmarshal(v, &a); err != nil {
			return fmt.Errorf("decode alloc %s: %w", k, err)
		}
		out = append(out, a)
		return nil
	})
	return out, err
}

// DeleteAlloc removes a record the meter has finished.
func DeleteAlloc(tx Tx, a AllocRecord) error {
	return tx.Delete(BucketAllocs, allocKey(a.Job, a.Attempt, a.Pool.Node))
}
