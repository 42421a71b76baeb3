package broker

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// AppendAudit adds one record to the audit log under a key of its time and
// id (an id unique to the record). The log is append-only: a key that
// exists already is never overwritten (ErrConflict).
func AppendAudit(tx Tx, id string, r AuditRecord) error {
	e, err := EncodeAudit(id, r)
	if err != nil {
		return err
	}
	return e.Append(tx)
}

// AuditEntry is an audit record encoded for AppendAudit ahead of its
// transaction: a handler encodes it before it waits for the store's
// writer, so the one writer does not spend its time on JSON.
type AuditEntry struct {
	key string
	raw []byte
}

// EncodeAudit encodes r for the log under the key of its time and id.
func EncodeAudit(id string, r AuditRecord) (AuditEntry, error) {
	key := auditKey(r.At, id)
	raw, err := json.Marshal(r)
	if err != nil {
		return AuditEntry{}, fmt.Errorf("encode %s/%s: %w", BucketAudit, key, err)
	}
	return AuditEntry{key: key, raw: raw}, nil
}

// Append writes the entry as AppendAudit does (ErrConflict when its key
// exists).
func (e AuditEntry) Append(tx Tx) error {
	if _, err := tx.Get(BucketAudit, e.key); err == nil {
		return fmt.Errorf("audit record %s exists: %w", e.key, ErrConflict)
	} else if !errors.Is(err, ErrNotFound) {
		return err
	}
	return tx.Put(BucketAudit, e.key, e.raw)
}

// auditKey is "%020d/%s" of the record's time in nanoseconds and id,
// without fmt (one per audited call, on the submit path).
func auditKey(at time.Time, id string) string {
	n := at.UnixNano()
	if n < 0 {
		return fmt.Sprintf("%020d/%s", n, id)
	}
	var b [20]byte
	for i := len(b) - 1; i >= 0; i-- {
		b[i] = byte('0' + n%10)
		n /= 10
	}
	return string(b[:]) + "/" + id
}

// ScanAudit calls fn with the audit records from from (inclusive) to to
// (exclusive; zero: no end), oldest first, until fn returns ErrStopScan.
func ScanAudit(tx Tx, from, to time.Time, fn func(AuditRecord) error) error {
	lo, hi := "", ""
	if !from.IsZero() {
		lo = fmt.Sprintf("%020d", from.UnixNano())
	}
	if !to.IsZero() {
		hi = fmt.Sprintf("%020d", to.UnixNano())
	}
	err := tx.Scan(BucketAudit, lo, hi, func(_ string, v []byte) error {
		var r AuditRecord
		if err := json.Unmarshal(v, &r); err != nil {
			return err
		}
		return fn(r)
	})
	if errors.Is(err, ErrStopScan) {
		return nil
	}
	return err
}
