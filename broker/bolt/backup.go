package bolt

import (
	"fmt"
	"io"

	bbolt "go.etcd.io/bbolt"
)

// Backup writes a consistent copy of the whole store file to w while the
// broker keeps running: one read transaction's snapshot (bbolt's
// Tx.WriteTo), so writers are not blocked and the copy is a valid bbolt
// file as of the moment the backup began. size, if not nil, learns the
// copy's length before the first byte is written. It returns the bytes
// written.
func (s *Store) Backup(w io.Writer, size func(int64)) (int64, error) {
	var n int64
	err := s.db.View(func(tx *bbolt.Tx) error {
		if size != nil {
			size(tx.Size())
		}
		var err error
		n, err = tx.WriteTo(w)
		return err
	})
	if err != nil {
		return n, fmt.Errorf("back up store: %w", err)
	}
	return n, nil
}
