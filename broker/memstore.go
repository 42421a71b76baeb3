package broker

import (
	"context"
	"errors"
	"slices"
	"sync"
)

var errReadOnly = errors.New("memstore: write in a View")

// MemStore is a Store held in memory, for what runs in one process and
// keeps nothing: the simulator's budgets and reservations, which go
// through the same functions (Reserve, Release, Settle) as the broker's
// store. A failed Update or Batch leaves nothing behind. Transactions do not
// nest: fn must not call the store again.
type MemStore struct {
	mu      sync.Mutex
	buckets map[Bucket]*memBucket
}

type memBucket struct {
	keys []string // sorted
	vals map[string][]byte
}

// NewMemStore returns an empty store.
func NewMemStore() *MemStore { return &MemStore{buckets: map[Bucket]*memBucket{}} }

// View runs fn over the store.
func (s *MemStore) View(_ context.Context, fn func(Tx) error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return fn(&memTx{s: s, readOnly: true})
}

// Update runs fn and keeps its writes only when it returns nil.
func (s *MemStore) Update(_ context.Context, fn func(Tx) error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	tx := &memTx{s: s}
	if err := fn(tx); err != nil {
		tx.rollback()
		return err
	}
	return nil
}

// Batch is Update.
func (s *MemStore) Batch(ctx context.Context, fn func(Tx) error) error { return s.Update(ctx, fn) }

// Close does nothing.
func (s *MemStore) Close() error { return nil }

type memUndo struct {
	b   Bucket
	key string
	val []byte
	had bool
}

type memTx struct {
	s        *MemStore
	readOnly bool
	undo     []memUndo
}

func (t *memTx) bucket(b Bucket) *memBucket {
	mb := t.s.buckets[b]
	if mb == nil {
		mb = &memBucket{vals: map[string][]byte{}}
		t.s.buckets[b] = mb
	}
	return mb
}

func (t *memTx) Get(b Bucket, key string) ([]byte, error) {
	if v, ok := t.bucket(b).vals[key]; ok {
		return v, nil
	}
	return nil, ErrNotFound
}

func (t *memTx) set(b Bucket, key string, val []byte, keep bool) {
	mb := t.bucket(b)
	old, had := mb.vals[key]
	t.undo = append(t.undo, memUndo{b: b, key: key, val: old, had: had})
	i, found := slices.BinarySearch(mb.keys, key)
	switch {
	case keep && !found:
		mb.keys = slices.Insert(mb.keys, i, key)
	case !keep && found:
		mb.keys = slices.Delete(mb.keys, i, i+1)
	}
	if keep {
		mb.vals[key] = val
	} else {
		delete(mb.vals, key)
	}
}

func (t *memTx) Put(b Bucket, key string, value []byte) error {
	if t.readOnly {
		return errReadOnly
	}
	t.set(b, key, slices.Clone(value), true)
	return nil
}

func (t *memTx) Delete(b Bucket, key string) error {
	if t.readOnly {
		return errReadOnly
	}
	if _, ok := t.bucket(b).vals[key]; ok {
		t.set(b, key, nil, false)
	}
	return nil
}

func (t *memTx) rollback() {
	for i := len(t.undo) - 1; i >= 0; i-- {
		u := t.undo[i]
		t.set(u.b, u.key, u.val, u.had)
	}
	t.undo = nil
}

// span is the index range of the keys k with from <= k < to.
func (mb *memBucket) span(from, to string) (int, int) {
	lo, _ := slices.BinarySearch(mb.keys, from)
	hi := len(mb.keys)
	if to != "" {
		hi, _ = slices.BinarySearch(mb.keys, to)
	}
	return lo, max(lo, hi)
}

func (t *memTx) Scan(b Bucket, from, to string, fn func(string, []byte) error) error {
	mb := t.bucket(b)
	lo, hi := mb.span(from, to)
	keys := slices.Clone(mb.keys[lo:hi]) // fn may write
	for _, k := range keys {
		v, ok := mb.vals[k]
		if !ok {
			continue
		}
		if err := fn(k, v); err != nil {
			if err == ErrStopScan {
				return nil
			}
			return err
		}
	}
	return nil
}

func (t *memTx) ScanReverse(b Bucket, from, to string, fn func(string, []byte) error) error {
	mb := t.bucket(b)
	lo, hi := mb.span(from, to)
	keys := slices.Clone(mb.keys[lo:hi])
	for i := len(keys) - 1; i >= 0; i-- {
		v, ok := mb.vals[keys[i]]
		if !ok {
			continue
		}
		if err := fn(keys[i], v); err != nil {
			if err == ErrStopScan {
				return nil
			}
			return err
		}
	}
	return nil
}
