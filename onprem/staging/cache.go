package staging

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"syscall"
	"time"
)

// Cache is the node-local content-addressed input cache: each object is
// kept once under the digest of its identity (location, ETag, size), with
// a cap on the bytes held. When a new object does not fit, the least
// recently used ones that no running job is placing go first. The last use
// is the blob's modification time, so the order survives an agent restart.
//
// A full disk never fails a job: on ENOSPC the cache evicts and retries,
// and an object that still does not fit is fetched straight to the job.
type Cache struct {
	dir string
	cap int64
	now func() time.Time
	// createTemp makes the file an object is written to (os.CreateTemp;
	// tests swap in a full disk).
	createTemp func(dir, pattern string) (*os.File, error)

	mu      sync.Mutex
	entries map[string]*cacheEntry
	used    int64
	pins    map[string]int
	hits    int64
	misses  int64
	hitB    int64
	missB   int64
	evicted int64
}

type cacheEntry struct {
	key  string
	size int64
	used time.Time
}

// CacheStats is what `spillway nodes` and the metrics show.
type CacheStats struct {
	Bytes     int64 `json:"bytes"`
	CapBytes  int64 `json:"capBytes"`
	Objects   int   `json:"objects"`
	Hits      int64 `json:"hits"`
	Misses    int64 `json:"misses"`
	HitBytes  int64 `json:"hitBytes"`
	MissBytes int64 `json:"missBytes"`
	Evictions int64 `json:"evictions"`
}

// HitRatio is hits over lookups (0 before the first).
func (s CacheStats) HitRatio() float64 {
	if s.Hits+s.Misses == 0 {
		return 0
	}
	return float64(s.Hits) / float64(s.Hits+s.Misses)
}

// OpenCache opens (or creates) the cache in dir holding at most capBytes.
func OpenCache(dir string, capBytes int64) (*Cache, error) {
	c := &Cache{dir: dir, cap: capBytes, now: time.Now, createTemp: os.CreateTemp, entries: map[string]*cacheEntry{}, pins: map[string]int{}}
	if err := os.MkdirAll(filepath.Join(dir, "blobs"), 0o750); err != nil {
		return nil, fmt.Errorf("staging: cache dir: %w", err)
	}
	_ = os.RemoveAll(filepath.Join(dir, "tmp"))
	if err := os.MkdirAll(filepath.Join(dir, "tmp"), 0o750); err != nil {
		return nil, fmt.Errorf("staging: cache dir: %w", err)
	}
	ents, err := os.ReadDir(filepath.Join(dir, "blobs"))
	if err != nil {
		return nil, fmt.Errorf("staging: cache dir: %w", err)
	}
	for _, e := range ents {
		fi, err := e.Info()
		if err != nil || !fi.Mode().IsRegular() {
			continue
		}
		c.entries[e.Name()] = &cacheEntry{key: e.Name(), size: fi.Size(), used: fi.ModTime()}
		c.used += fi.Size()
	}
	c.mu.Lock()
	c.evictLocked(0)
	c.mu.Unlock()
	return c, nil
}

// Stats returns the cache's counters.
func (c *Cache) Stats() CacheStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return CacheStats{Bytes: c.used, CapBytes: c.cap, Objects: len(c.entries), Hits: c.hits, Misses: c.misses,
		HitBytes: c.hitB, MissBytes: c.missB, Evictions: c.evicted}
}

// Key is the cache address of an object: the digest of where it lives and
// which version of it is meant.
func Key(loc string, o Object) string {
	h := sha256.Sum256([]byte(fmt.Sprintf("%s\x00%s\x00%d", loc, o.ETag, o.Size)))
	return hex.EncodeToString(h[:])
}

func (c *Cache) blob(key string) string { return filepath.Join(c.dir, "blobs", key) }

// lookup returns the blob path and pins it when the object is cached.
func (c *Cache) lookup(key string, size int64) (string, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.entries[key]
	if !ok {
		c.misses++
		c.missB += size
		return "", false
	}
	c.hits++
	c.hitB += size
	e.used = c.now()
	c.pins[key]++
	_ = os.Chtimes(c.blob(key), e.used, e.used)
	return c.blob(key), true
}

// unpin lets an entry be evicted again.
func (c *Cache) unpin(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.pins[key] <= 1 {
		delete(c.pins, key)
	} else {
		c.pins[key]--
	}
}

// reserve makes room for size bytes; false when the object can never fit.
func (c *Cache) reserve(size int64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cap > 0 && size > c.cap {
		return false
	}
	c.evictLocked(size)
	return c.cap <= 0 || c.used+size <= c.cap
}

// evictLocked removes least recently used unpinned entries until need more
// bytes fit under the cap (need < 0: evict everything unpinned).
func (c *Cache) evictLocked(need int64) {
	if c.cap <= 0 && need >= 0 {
		return
	}
	if need >= 0 && c.used+need <= c.cap {
		return
	}
	list := make([]*cacheEntry, 0, len(c.entries))
	for _, e := range c.entries {
		if c.pins[e.key] == 0 {
			list = append(list, e)
		}
	}
	sort.Slice(list, func(i, j int) bool {
		if !list[i].used.Equal(list[j].used) {
			return list[i].used.Before(list[j].used)
		}
		return list[i].key < list[j].key
	})
	for _, e := range list {
		if need >= 0 && c.used+need <= c.cap {
			return
		}
		if err := os.Remove(c.blob(e.key)); err != nil && !errors.Is(err, os.ErrNotExist) {
			continue
		}
		delete(c.entries, e.key)
		c.used -= e.size
		c.evicted++
	}
}

// fill writes an object into the cache from r and pins it. On ENOSPC it
// evicts every unpinned entry and reports errFull so the caller can fetch
// around the cache.
func (c *Cache) fill(key string, size int64, open func() (io.ReadCloser, error), progress func(int64)) (string, error) {
	tmp, err := c.createTemp(filepath.Join(c.dir, "tmp"), key[:16]+"-*")
	if err != nil {
		return "", err
	}
	defer os.Remove(tmp.Name())
	rc, err := open()
	if err != nil {
		tmp.Close()
		return "", err
	}
	n, err := io.Copy(tmp, &countingReader{r: rc, fn: progress})
	rc.Close()
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		progress(-n)
		if errors.Is(err, syscall.ENOSPC) {
			c.mu.Lock()
			c.evictLocked(-1)
			c.mu.Unlock()
			return "", errFull
		}
		return "", err
	}
	if size >= 0 && n != size {
		progress(-n)
		return "", fmt.Errorf("short read: %d of %d bytes", n, size)
	}
	_ = os.Chmod(tmp.Name(), 0o444)
	if err := os.Rename(tmp.Name(), c.blob(key)); err != nil {
		return "", err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if old, ok := c.entries[key]; ok {
		c.used -= old.size
	}
	now := c.now()
	c.entries[key] = &cacheEntry{key: key, size: n, used: now}
	c.used += n
	c.pins[key]++
	return c.blob(key), nil
}

var errFull = errors.New("cache disk full")

type countingReader struct {
	r  io.Reader
	fn func(int64)
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	if n > 0 && c.fn != nil {
		c.fn(int64(n))
	}
	return n, err
}
