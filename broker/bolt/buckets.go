package bolt

import (
	"context"

	bbolt "go.etcd.io/bbolt"

	"github.com/spillway-dev/spillway/broker"
)

var _ broker.BucketLister = (*Store)(nil)

// Buckets lists the buckets holding at least one key, by name
// (broker.BucketLister).
func (s *Store) Buckets(ctx context.Context) ([]broker.Bucket, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var out []broker.Bucket
	err := s.db.View(func(tx *bbolt.Tx) error {
		return tx.ForEach(func(name []byte, b *bbolt.Bucket) error {
			if k, _ := b.Cursor().First(); k != nil {
				out = append(out, broker.Bucket(name))
			}
			return nil
		})
	})
	return out, err
}
