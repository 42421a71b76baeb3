package broker

import (
	"context"
	"errors"
)

// Bucket names one keyspace of the store. Keys inside a bucket are ordered
// bytewise.
type Bucket string

// The buckets the broker uses. Each is documented where its records are
// defined.
const (
	BucketJobs      Bucket = "jobs"      // job id → Job (JSON)
	BucketActive    Bucket = "active"    // job id → "" for every non-terminal job (index)
	BucketNodes     Bucket = "nodes"     // node name → Node (JSON)
	BucketLogs      Bucket = "logs"      // job/attempt/offset → bytes of log
	BucketLogMeta   Bucket = "logmeta"   // job/attempt → LogMeta (JSON)
	BucketMeta      Bucket = "meta"      // schema version and counters
	BucketUsage     Bucket = "usage"     // team → decayed GPU-seconds (fair share)
	BucketLedger    Bucket = "ledger"    // billing entries
	BucketInstances Bucket = "instances" // burst machine records
	BucketBudgets   Bucket = "budgets"   // burst budgets and reservations
	BucketAudit     Bucket = "audit"     // who changed what, when
	BucketTelemetry Bucket = "telemetry" // downsampled GPU time series
)

// ErrStopScan, returned from a Scan callback, ends the scan without error.
var ErrStopScan = errors.New("stop scan")

// Store is the broker's durable state. Two implementations exist — bbolt
// (embedded, the default) and Redis (several brokers) — and both pass the
// conformance suite in broker/storetest.
//
// Contract:
//   - Update and Batch commit durably before they return nil: an accepted
//     write survives a crash of the broker right after.
//   - A transaction sees its own writes; View sees only committed data.
//   - Transactions are serializable: two Updates that read and write the
//     same keys behave as if one ran after the other. An implementation may
//     run fn again after a conflict, so fn must not have effects outside
//     the transaction.
//   - Batch is Update that may be coalesced with concurrent Batch calls into
//     one commit (group commit); fn may run more than once.
//   - A Store with a fencing token (see Fenced) refuses every write once a
//     newer token exists, returning ErrFenced.
type Store interface {
	View(ctx context.Context, fn func(Tx) error) error
	Update(ctx context.Context, fn func(Tx) error) error
	Batch(ctx context.Context, fn func(Tx) error) error
	Close() error
}

// Fenced is implemented by stores that several brokers share (Redis). The
// cluster keeps a fence counter next to the data; the leader election
// increments it each time a broker wins the lease and hands the new value
// to the winner as its token.
//
// Once SetFence has been called, every write transaction (Update, Batch)
// checks atomically with its commit that the cluster's counter still equals
// the token, and fails with ErrFenced otherwise: a broker that was paused
// or partitioned past its lease cannot write after a newer leader took
// over, whatever it still believes. A store whose SetFence was never called
// writes unchecked (tools such as `spillway store copy`). Reads are never
// fenced.
type Fenced interface {
	// SetFence sets the token that later writes carry. Token 0 is below
	// every token a leader can hold, so it fences a broker that never led.
	SetFence(token uint64)
	// Fence returns the cluster's current counter (0 before any leader).
	Fence(ctx context.Context) (uint64, error)
}

// BucketLister is implemented by stores that can name their buckets, so
// that tools (`spillway store copy`) move every bucket, including ones
// added after the tool was written.
type BucketLister interface {
	// Buckets returns the buckets holding at least one key, by name.
	Buckets(ctx context.Context) ([]Bucket, error)
}

// Tx is one transaction. Byte slices returned by Get and passed to Scan
// callbacks are valid only until the transaction ends; copy what you keep.
type Tx interface {
	// Get returns the value of key, or ErrNotFound.
	Get(b Bucket, key string) ([]byte, error)
	// Put stores value under key.
	Put(b Bucket, key string, value []byte) error
	// Delete removes key; deleting a missing key is not an error.
	Delete(b Bucket, key string) error
	// Scan calls fn for every key k with from <= k < to, in ascending
	// order; to == "" means no upper bound. fn returning ErrStopScan ends
	// the scan early without error.
	Scan(b Bucket, from, to string, fn func(key string, value []byte) error) error
	// ScanReverse is Scan in descending order.
	ScanReverse(b Bucket, from, to string, fn func(key string, value []byte) error) error
}

// MultiGetter is implemented by stores that read many keys at once
// faster than one by one (Redis: one round trip for many keys). Use
// GetMany, which falls back to Get for the others.
type MultiGetter interface {
	// GetMany returns the values of keys, in order, nil for a key that
	// has none, with the same lifetime as Get's.
	GetMany(b Bucket, keys []string) ([][]byte, error)
}

// GetMany returns the values of keys in b, in order, nil for a key that
// has none: through the store's MultiGetter when it has one, else one
// Get at a time.
func GetMany(tx Tx, b Bucket, keys []string) ([][]byte, error) {
	if m, ok := tx.(MultiGetter); ok {
		return m.GetMany(b, keys)
	}
	out := make([][]byte, len(keys))
	for i, k := range keys {
		v, err := tx.Get(b, k)
		switch {
		case errors.Is(err, ErrNotFound):
		case err != nil:
			return nil, err
		case v == nil:
			out[i] = []byte{} // present, empty
		default:
			out[i] = v
		}
	}
	return out, nil
}

// PrefixEnd returns the smallest key greater than every key with the given
// prefix, for use as Scan's upper bound.
func PrefixEnd(prefix string) string {
	b := []byte(prefix)
	for i := len(b) - 1; i >= 0; i-- {
		if b[i] < 0xff {
			b[i]++
			return string(b[:i+1])
		}
	}
	return ""
}
