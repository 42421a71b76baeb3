// Package bolt is the embedded store: one bbolt file under the data dir, so
// a small team runs one broker process and nothing else.
//
// Every Update is one bbolt read-write transaction, fsynced before it
// returns. Batch coalesces concurrent callers into one transaction and one
// fsync (group commit, broker.GroupCommit): that is how the submit path
// reaches thousands of durable writes per second on one disk.
package bolt

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"time"

	bbolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"

	"github.com/spillway-dev/spillway/broker"
)

// FileName is the store's file under the data dir.
const FileName = "spillway.db"

// Store is a broker.Store on one bbolt file.
type Store struct {
	db    *bbolt.DB
	group *broker.GroupCommit
}

var _ broker.Store = (*Store)(nil)

// Open opens (or creates) the store at path. It fails fast when another
// process holds the file.
func Open(path string) (*Store, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return nil, fmt.Errorf("create data dir: %w", err)
	}
	db, err := bbolt.Open(path, 0o600, &bbolt.Options{Timeout: 2 * time.Second, InitialMmapSize: initialMmapSize})
	if err != nil {
		if errors.Is(err, berrors.ErrTimeout) {
			return nil, fmt.Errorf("open store %s: another process has it open", path)
		}
		return nil, fmt.Errorf("open store %s: %w", path, err)
	}
	group := &broker.GroupCommit{Max: 2000, Linger: commitLinger, Commit: func(fns []func(broker.Tx) error) []error { return commitGroup(db, fns) }}
	return &Store{db: db, group: group}, nil
}

// commitLinger is how long, after a commit, the next one waits for the
// callers it answered to come back and share it: concurrent clients'
// next submits, or the next submit for the broker's own state changes
// (broker.GroupCommit.Linger). A commit here is two fsyncs, 1–2 ms on
// the disks measured (docs/benchmarks.md); a client's next submit comes
// a fraction of a millisecond after its answer.
const commitLinger = time.Millisecond

// initialMmapSize is the address space the store maps at open (not
// memory: pages are read in as they are used, and the file grows only as
// data is written). bbolt otherwise maps the file in doubling steps, and
// each step waits for every open read transaction to end, holds off new
// ones, and copies the writer's materialized pages out of the old
// mapping: a pause for every request in flight, once per doubling. With
// 1 GiB the first such step comes when the store passes 1 GiB (etcd maps
// 10 GiB). On Windows mapping grows the file to the mapped size, and a
// 32-bit process has little address space: there bbolt keeps its default.
var initialMmapSize = func() int {
	if runtime.GOOS == "windows" || strconv.IntSize < 64 {
		return 0
	}
	return 1 << 30
}()

// GroupCommits reports the group commits of Batch (broker.GroupCommitter).
func (s *Store) GroupCommits() broker.GroupCommitStats { return s.group.GroupCommits() }

// Path is the file the store lives in.
func (s *Store) Path() string { return s.db.Path() }

// View runs fn in a read-only transaction.
func (s *Store) View(ctx context.Context, fn func(broker.Tx) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.db.View(func(btx *bbolt.Tx) error { return fn(&tx{btx}) })
}

// Update runs fn in a read-write transaction and commits it durably.
func (s *Store) Update(ctx context.Context, fn func(broker.Tx) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.db.Update(func(btx *bbolt.Tx) error { return fn(&tx{btx}) })
}

// Batch is Update with group commit.
func (s *Store) Batch(ctx context.Context, fn func(broker.Tx) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.group.Do(ctx, fn)
}

// Close closes the file.
func (s *Store) Close() error { return s.db.Close() }

type tx struct{ t *bbolt.Tx }

func (t *tx) bucket(b broker.Bucket, create bool) (*bbolt.Bucket, error) {
	bk := t.t.Bucket([]byte(b))
	if bk == nil && create {
		var err error
		if bk, err = t.t.CreateBucket([]byte(b)); err != nil {
			return nil, err
		}
	}
	if bk != nil && appendMostly[b] {
		bk.FillPercent = 0.9
	}
	return bk, nil
}

// appendMostly are the buckets whose new keys sort after the old ones
// (ids and times): each submit adds to all four. bbolt splits a full
// page in half by default, which leaves these half empty for good (a
// new key never lands in the left half); filled to 90% they take fewer
// pages, and each commit reads, copies and writes fewer.
var appendMostly = map[broker.Bucket]bool{
	broker.BucketJobs: true, broker.BucketActive: true, broker.BucketTeamJobs: true, broker.BucketAudit: true,
}

func (t *tx) Get(b broker.Bucket, key string) ([]byte, error) {
	bk, _ := t.bucket(b, false)
	if bk == nil {
		return nil, broker.ErrNotFound
	}
	v := bk.Get([]byte(key))
	if v == nil {
		return nil, broker.ErrNotFound
	}
	return v, nil
}

func (t *tx) Put(b broker.Bucket, key string, value []byte) error {
	if key == "" {
		return fmt.Errorf("put %s: empty key", b)
	}
	bk, err := t.bucket(b, true)
	if err != nil {
		return fmt.Errorf("put %s: %w", b, err)
	}
	if value == nil {
		value = []byte{}
	}
	return bk.Put([]byte(key), value)
}

func (t *tx) Delete(b broker.Bucket, key string) error {
	bk, _ := t.bucket(b, false)
	if bk == nil {
		return nil
	}
	return bk.Delete([]byte(key))
}

func (t *tx) Scan(b broker.Bucket, from, to string, fn func(string, []byte) error) error {
	bk, _ := t.bucket(b, false)
	if bk == nil {
		return nil
	}
	c := bk.Cursor()
	var k, v []byte
	if from == "" {
		k, v = c.First()
	} else {
		k, v = c.Seek([]byte(from))
	}
	for ; k != nil; k, v = c.Next() {
		if to != "" && string(k) >= to {
			break
		}
		if err := fn(string(k), v); err != nil {
			if errors.Is(err, broker.ErrStopScan) {
				return nil
			}
			return err
		}
	}
	return nil
}

func (t *tx) ScanReverse(b broker.Bucket, from, to string, fn func(string, []byte) error) error {
	bk, _ := t.bucket(b, false)
	if bk == nil {
		return nil
	}
	c := bk.Cursor()
	var k, v []byte
	if to == "" {
		k, v = c.Last()
	} else {
		// Seek lands on the first key >= to; step back once to get below it.
		k, _ = c.Seek([]byte(to))
		if k == nil {
			k, v = c.Last()
		} else {
			k, v = c.Prev()
		}
	}
	for ; k != nil; k, v = c.Prev() {
		if string(k) < from {
			break
		}
		if err := fn(string(k), v); err != nil {
			if errors.Is(err, broker.ErrStopScan) {
				return nil
			}
			return err
		}
	}
	return nil
}
