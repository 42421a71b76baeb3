package redis

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/spillway-dev/spillway/broker"
)

// Scans fetch keys in pages that double from firstKeyPage up to
// maxKeyPage, and values in groups that double from 1 up to maxValGroup:
// a scan that stops after one key (ReadLog's seek) fetches one value, a
// full scan few round trips.
const (
	firstKeyPage = 32
	maxKeyPage   = 1024
	maxValGroup  = 128
)

// maxAttempts bounds how often Update runs fn again after conflicts.
const maxAttempts = 500

// errNoScript: Redis lost the commit script (a restart or failover); the
// transaction runs again after the scripts are loaded.
var errNoScript = errors.New("commit script not loaded")

// View runs fn over committed data. Reads are not watched: each Get and
// each scan page sees the latest commit, not one snapshot of the whole
// transaction (docs/operations.md).
func (s *Store) View(ctx context.Context, fn func(broker.Tx) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return fn(&tx{s: s, ctx: ctx})
}

// Update runs fn and commits its writes atomically, fenced when a token
// was set; fn runs again when a key it read changed before the commit.
func (s *Store) Update(ctx context.Context, fn func(broker.Tx) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.update(ctx, func(t *tx) error { return fn(t) })
}

// update is the optimistic loop: run fn on a fresh transaction, commit,
// and on a conflict back off and run it again.
func (s *Store) update(ctx context.Context, fn func(*tx) error) error {
	for attempt := 1; ; attempt++ {
		var fnErr error
		err := s.rdb.Watch(ctx, func(rtx *goredis.Tx) error {
			t := &tx{s: s, ctx: ctx, rtx: rtx, writable: true}
			if err := fn(t); err != nil {
				// A failure may come from reads that saw a moving target;
				// if a watched key changed, run again instead.
				if verr := t.verify(); verr != nil {
					return verr
				}
				fnErr = err
				return err
			}
			return t.commit()
		})
		switch {
		case fnErr != nil:
			return fnErr
		case err == nil:
			return nil
		case errors.Is(err, errNoScript):
			if lerr := s.loadScripts(ctx); lerr != nil {
				return lerr
			}
		case errors.Is(err, goredis.TxFailedErr):
			if attempt >= maxAttempts {
				return fmt.Errorf("commit after %d conflicting attempts: %w", attempt, broker.ErrConflict)
			}
			backoff := time.Duration(min(attempt, 20)) * 100 * time.Microsecond
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(backoff/2 + rand.N(backoff)):
			}
		default:
			return err
		}
	}
}

// bufVal is one buffered write: a value, or a delete.
type bufVal struct {
	val []byte
	del bool
}

// undoRec restores one buffered key when a Batch member fails.
type undoRec struct {
	b    broker.Bucket
	key  string
	prev bufVal
	had  bool
}

// tx is a broker.Tx on Redis: reads go to Redis (watched in Update),
// writes wait in buf until the commit.
type tx struct {
	s        *Store
	ctx      context.Context
	rtx      *goredis.Tx // nil in View
	writable bool
	// armed: a WATCH is active on rtx (set through rtx.Watch, so that
	// go-redis releases it if the transaction never reaches EXEC).
	armed   bool
	watched map[string]bool
	buf     map[broker.Bucket]map[string]bufVal
	undo    []undoRec
}

// arm starts watching on rtx with the fence key, so that the pipelined
// WATCHes of later reads are released with the connection.
func (t *tx) arm() error {
	if t.armed {
		return nil
	}
	if err := t.rtx.Watch(t.ctx, t.s.fenceKey()).Err(); err != nil {
		return fmt.Errorf("watch: %w", err)
	}
	t.armed = true
	t.watched = map[string]bool{t.s.fenceKey(): true}
	return nil
}

// unwatched returns the keys not yet watched and marks them watched.
func (t *tx) unwatched(keys ...string) []any {
	var out []any
	for _, k := range keys {
		if !t.watched[k] {
			t.watched[k] = true
			out = append(out, k)
		}
	}
	return out
}

// pipelined runs a pipeline on the transaction's connection (Update) or
// the pool (View), first watching keys when in Update.
func (t *tx) pipelined(watch []string, fn func(goredis.Pipeliner)) error {
	if t.rtx == nil {
		_, _ = t.s.rdb.Pipelined(t.ctx, func(p goredis.Pipeliner) error { fn(p); return nil })
		return nil
	}
	if err := t.arm(); err != nil {
		return err
	}
	var w *goredis.Cmd
	_, _ = t.rtx.Pipelined(t.ctx, func(p goredis.Pipeliner) error {
		if keys := t.unwatched(watch...); len(keys) > 0 {
			w = p.Do(t.ctx, append([]any{"watch"}, keys...)...)
		}
		fn(p)
		return nil
	})
	if w != nil && w.Err() != nil {
		return fmt.Errorf("watch: %w", w.Err())
	}
	return nil
}

func (t *tx) buffered(b broker.Bucket, key string) (bufVal, bool) {
	v, ok := t.buf[b][key]
	return v, ok
}

func (t *tx) Get(b broker.Bucket, key string) ([]byte, error) {
	if v, ok := t.buffered(b, key); ok {
		if v.del {
			return nil, broker.ErrNotFound
		}
		return v.val, nil
	}
	vk := t.s.valKey(b, key)
	var get *goredis.StringCmd
	if err := t.pipelined([]string{vk}, func(p goredis.Pipeliner) { get = p.Get(t.ctx, vk) }); err != nil {
		return nil, fmt.Errorf("get %s: %w", b, err)
	}
	v, err := get.Bytes()
	if errors.Is(err, goredis.Nil) {
		return nil, broker.ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("get %s: %w", b, err)
	}
	return v, nil
}

// maxMGet bounds the keys one GetMany round trip asks for, so that a
// reply stays a few megabytes however many keys the caller has.
const maxMGet = 1000

// GetMany reads keys in MGETs of up to maxMGet (watched in Update, as
// Get's), the transaction's own writes first.
func (t *tx) GetMany(b broker.Bucket, keys []string) ([][]byte, error) {
	out := make([][]byte, len(keys))
	var idx []int // of keys to read from Redis
	var vkeys []string
	flush := func() error {
		if len(vkeys) == 0 {
			return nil
		}
		var cmd *goredis.SliceCmd
		if err := t.pipelined(vkeys, func(p goredis.Pipeliner) { cmd = p.MGet(t.ctx, vkeys...) }); err != nil {
			return fmt.Errorf("get %s: %w", b, err)
		}
		vals, err := cmd.Result()
		if err != nil {
			return fmt.Errorf("get %s: %w", b, err)
		}
		for i, v := range vals {
			if s, ok := v.(string); ok {
				out[idx[i]] = []byte(s)
			}
		}
		idx, vkeys = idx[:0], vkeys[:0]
		return nil
	}
	for i, k := range keys {
		if v, ok := t.buffered(b, k); ok {
			if !v.del {
				out[i] = v.val
				if out[i] == nil {
					out[i] = []byte{}
				}
			}
			continue
		}
		idx, vkeys = append(idx, i), append(vkeys, t.s.valKey(b, k))
		if len(vkeys) == maxMGet {
			if err := flush(); err != nil {
				return nil, err
			}
		}
	}
	if err := flush(); err != nil {
		return nil, err
	}
	return out, nil
}

func (t *tx) write(b broker.Bucket, key string, v bufVal) error {
	if !t.writable {
		return fmt.Errorf("write %s: read-only transaction", b)
	}
	if key == "" {
		return fmt.Errorf("write %s: empty key", b)
	}
	if t.buf == nil {
		t.buf = map[broker.Bucket]map[string]bufVal{}
	}
	m := t.buf[b]
	if m == nil {
		m = map[string]bufVal{}
		t.buf[b] = m
	}
	prev, had := m[key]
	t.undo = append(t.undo, undoRec{b: b, key: key, prev: prev, had: had})
	m[key] = v
	return nil
}

func (t *tx) Put(b broker.Bucket, key string, value []byte) error {
	return t.write(b, key, bufVal{val: append([]byte{}, value...)})
}

func (t *tx) Delete(b broker.Bucket, key string) error {
	return t.write(b, key, bufVal{del: true})
}

// savepoint marks the buffer's state; rollbackTo returns to it.
func (t *tx) savepoint() int { return len(t.undo) }

func (t *tx) rollbackTo(sp int) {
	for i := len(t.undo) - 1; i >= sp; i-- {
		u := t.undo[i]
		if u.had {
			t.buf[u.b][u.key] = u.prev
		} else {
			delete(t.buf[u.b], u.key)
		}
	}
	t.undo = t.undo[:sp]
}

func (t *tx) Scan(b broker.Bucket, from, to string, fn func(string, []byte) error) error {
	return t.scan(b, from, to, false, fn)
}

func (t *tx) ScanReverse(b broker.Bucket, from, to string, fn func(string, []byte) error) error {
	return t.scan(b, from, to, true, fn)
}

// scan merges the keys Redis has in [from, to) with the transaction's
// buffered writes, in order: a buffered value replaces the stored one, a
// buffered delete hides it.
func (t *tx) scan(b broker.Bucket, from, to string, reverse bool, fn func(string, []byte) error) error {
	var mine []string
	for k := range t.buf[b] {
		if k >= from && (to == "" || k < to) {
			mine = append(mine, k)
		}
	}
	slices.Sort(mine)
	if reverse {
		slices.Reverse(mine)
	}
	it := &pageIter{t: t, b: b, idx: t.s.idxKey(b), reverse: reverse, lo: "-", hi: "+", page: firstKeyPage}
	if from != "" {
		it.lo = "[" + from
	}
	if to != "" {
		it.hi = "(" + to
	}
	before := func(a, c string) bool {
		if reverse {
			return a > c
		}
		return a < c
	}
	for i := 0; ; {
		rk, rv, rok, err := it.peek()
		if err != nil {
			return fmt.Errorf("scan %s: %w", b, err)
		}
		if !rok && i == len(mine) {
			return nil
		}
		var key string
		var val []byte
		switch {
		case i < len(mine) && (!rok || before(mine[i], rk) || mine[i] == rk):
			if rok && mine[i] == rk {
				it.next()
			}
			key = mine[i]
			i++
			v := t.buf[b][key]
			if v.del {
				continue
			}
			val = v.val
		default:
			key, val = rk, rv
			it.next()
		}
		if err := fn(key, val); err != nil {
			if errors.Is(err, broker.ErrStopScan) {
				return nil
			}
			return err
		}
	}
}

// pageIter walks a bucket's index in lexicographic pages and fetches the
// values lazily.
type pageIter struct {
	t       *tx
	b       broker.Bucket
	idx     string
	reverse bool
	// lo and hi are ZRANGEBYLEX bounds of what is left to read.
	lo, hi string
	page   int
	keys   []string
	vals   []*[]byte // vals[i] is nil until fetched; points to nil when the key vanished
	pos    int
	group  int
	done   bool
}

func (it *pageIter) next() { it.pos++ }

// peek returns the current key and value without moving.
func (it *pageIter) peek() (string, []byte, bool, error) {
	for {
		if it.pos < len(it.keys) {
			if it.vals[it.pos] == nil {
				if err := it.fetchValues(); err != nil {
					return "", nil, false, err
				}
			}
			if v := *it.vals[it.pos]; v != nil {
				return it.keys[it.pos], v, true, nil
			}
			it.pos++ // deleted since the page was read; nothing to show
			continue
		}
		if it.done {
			return "", nil, false, nil
		}
		if err := it.fetchKeys(); err != nil {
			return "", nil, false, err
		}
	}
}

func (it *pageIter) fetchKeys() error {
	t := it.t
	var cmd *goredis.StringSliceCmd
	rng := &goredis.ZRangeBy{Min: it.lo, Max: it.hi, Count: int64(it.page)}
	err := t.pipelined([]string{it.idx}, func(p goredis.Pipeliner) {
		if it.reverse {
			cmd = p.ZRevRangeByLex(t.ctx, it.idx, rng)
		} else {
			cmd = p.ZRangeByLex(t.ctx, it.idx, rng)
		}
	})
	if err != nil {
		return err
	}
	keys, err := cmd.Result()
	if err != nil {
		return err
	}
	it.keys, it.vals, it.pos = keys, make([]*[]byte, len(keys)), 0
	if len(keys) < it.page {
		it.done = true
	} else {
		last := "(" + keys[len(keys)-1]
		if it.reverse {
			it.hi = last
		} else {
			it.lo = last
		}
	}
	it.page = min(it.page*2, maxKeyPage)
	return nil
}

func (it *pageIter) fetchValues() error {
	t := it.t
	it.group = min(max(it.group*2, 1), maxValGroup)
	end := min(it.pos+it.group, len(it.keys))
	vkeys := make([]string, 0, end-it.pos)
	for _, k := range it.keys[it.pos:end] {
		vkeys = append(vkeys, t.s.valKey(it.b, k))
	}
	var cmd *goredis.SliceCmd
	if err := t.pipelined(vkeys, func(p goredis.Pipeliner) { cmd = p.MGet(t.ctx, vkeys...) }); err != nil {
		return err
	}
	vals, err := cmd.Result()
	if err != nil {
		return err
	}
	for i, v := range vals {
		var b []byte
		if s, ok := v.(string); ok {
			b = []byte(s)
		}
		it.vals[it.pos+i] = &b
	}
	return nil
}

// verify checks, after fn failed, whether any key it read changed: it
// returns TxFailedErr when so (fn runs again), nil otherwise.
func (t *tx) verify() error {
	if !t.armed {
		return nil
	}
	_, err := t.rtx.TxPipelined(t.ctx, func(p goredis.Pipeliner) error {
		p.Ping(t.ctx)
		return nil
	})
	if errors.Is(err, goredis.TxFailedErr) {
		return err
	}
	return nil
}

// commit applies the buffered writes in one script run, which checks the
// fence first. When the transaction read anything the script runs inside
// MULTI/EXEC, so a change to a watched key aborts it (TxFailedErr).
func (t *tx) commit() error {
	n := 0
	for _, m := range t.buf {
		n += len(m)
	}
	if n == 0 {
		// Read-only: still serializable, so check nothing read changed.
		if t.armed {
			_, err := t.rtx.TxPipelined(t.ctx, func(p goredis.Pipeliner) error {
				p.Ping(t.ctx)
				return nil
			})
			return err
		}
		return nil
	}
	keys := make([]string, 1, 1+2*n)
	keys[0] = t.s.fenceKey()
	args := make([]any, 2, 2+3*n)
	args[0], args[1] = "0", strconv.FormatUint(t.s.token.Load(), 10)
	if t.s.fenced.Load() {
		args[0] = "1"
	}
	buckets := make([]broker.Bucket, 0, len(t.buf))
	for b := range t.buf {
		buckets = append(buckets, b)
	}
	slices.Sort(buckets)
	for _, b := range buckets {
		m := t.buf[b]
		ks := make([]string, 0, len(m))
		for k := range m {
			ks = append(ks, k)
		}
		slices.Sort(ks)
		idx := t.s.idxKey(b)
		for _, k := range ks {
			v := m[k]
			keys = append(keys, t.s.valKey(b, k), idx)
			if v.del {
				args = append(args, "d", k, "")
			} else {
				args = append(args, "p", k, v.val)
			}
		}
	}
	var err error
	if t.armed {
		var cmds []goredis.Cmder
		cmds, err = t.rtx.TxPipelined(t.ctx, func(p goredis.Pipeliner) error {
			p.EvalSha(t.ctx, commitScript.Hash(), keys, args...)
			return nil
		})
		if err == nil && len(cmds) > 0 {
			err = cmds[0].Err()
		}
	} else {
		err = t.rtx.EvalSha(t.ctx, commitScript.Hash(), keys, args...).Err()
	}
	switch {
	case err == nil:
		return nil
	case goredis.HasErrorPrefix(err, "FENCED"):
		return fmt.Errorf("commit (%s): %w", strings.TrimPrefix(err.Error(), "FENCED "), broker.ErrFenced)
	case goredis.HasErrorPrefix(err, "NOSCRIPT"):
		return errNoScript
	case errors.Is(err, goredis.TxFailedErr):
		return err
	}
	return fmt.Errorf("commit: %w", err)
}
