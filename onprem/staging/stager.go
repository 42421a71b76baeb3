package staging

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spillway-dev/spillway/onprem/staging/location"
)

// Input is one thing a job reads: an object or a prefix, placed at To
// (relative to the job's working directory unless absolute).
type Input struct {
	From string `json:"from"`
	To   string `json:"to"`
	// Cache false fetches straight to the job, bypassing the node cache.
	Cache *bool `json:"cache,omitempty"`
}

// When an output is uploaded.
const (
	WhenAlways  = "always"
	WhenSuccess = "success"
)

// Output is a file or directory a job writes, uploaded to To after it ends.
type Output struct {
	From string `json:"from"`
	To   string `json:"to"`
	When string `json:"when,omitempty"`
}

// MissingError says an input does not exist. It is not retried: the job
// fails with the URI in its status.
type MissingError struct{ URI string }

func (e *MissingError) Error() string { return "input not found: " + e.URI }

// Progress is a staging step's advance, in bytes.
type Progress struct {
	Phase string `json:"phase"` // inputs | restore | outputs | checkpoint
	Done  int64  `json:"done"`
	Total int64  `json:"total"`
}

// Config configures a Stager.
type Config struct {
	// S3 reaches s3:// locations; GS reaches gs:// ones (its Endpoint
	// defaults to GCSEndpoint and its Region to "auto").
	S3 S3Config `json:"s3"`
	GS S3Config `json:"gs"`
	// CacheDir and CacheBytes place and cap the input cache.
	CacheDir   string `json:"cacheDir"`
	CacheBytes int64  `json:"cacheBytes"`
	// Retry bounds uploads to an unreachable store: Attempts tries (0:
	// 8), waiting Backoff, doubled each time up to MaxBackoff.
	Retry Retry `json:"retry"`
}

// Retry is the upload retry policy.
type Retry struct {
	Attempts   int           `json:"attempts,omitempty"`
	Backoff    time.Duration `json:"backoff,omitempty"`
	MaxBackoff time.Duration `json:"maxBackoff,omitempty"`
}

// Stager stages data for the jobs of one node.
type Stager struct {
	cfg   Config
	cache *Cache
	s3    Store
	gs    Store
	https Store
	// OnRetry, when set, is called before each upload retry (tests).
	OnRetry func(uri string, attempt int, err error)

	initOnce sync.Once
	initErr  error
	ctx      context.Context
}

// New builds a Stager; object-store clients are created on first use.
func New(ctx context.Context, cfg Config) (*Stager, error) {
	if cfg.CacheDir == "" {
		return nil, errors.New("staging: CacheDir is required")
	}
	c, err := OpenCache(cfg.CacheDir, cfg.CacheBytes)
	if err != nil {
		return nil, err
	}
	if cfg.Retry.Attempts == 0 {
		cfg.Retry.Attempts = 8
	}
	if cfg.Retry.Backoff == 0 {
		cfg.Retry.Backoff = time.Second
	}
	if cfg.Retry.MaxBackoff == 0 {
		cfg.Retry.MaxBackoff = 30 * time.Second
	}
	return &Stager{cfg: cfg, cache: c, https: httpsStore{c: &http.Client{Timeout: 0}}, ctx: ctx}, nil
}

// NewWithStores builds a Stager over given stores (tests, benchmarks).
func NewWithStores(cfg Config, s3, gs Store) (*Stager, error) {
	st, err := New(context.Background(), cfg)
	if err != nil {
		return nil, err
	}
	st.s3, st.gs = s3, gs
	st.initOnce.Do(func() {})
	return st, nil
}

// Cache is the node's input cache.
func (st *Stager) Cache() *Cache { return st.cache }

func (st *Stager) store(u location.URI) (Store, error) {
	st.initOnce.Do(func() {
		var err error
		if st.s3, err = NewS3(st.ctx, st.cfg.S3); err != nil {
			st.initErr = err
			return
		}
		gs := st.cfg.GS
		if gs.Endpoint == "" {
			gs.Endpoint = GCSEndpoint
		}
		if gs.Region == "" {
			gs.Region = "auto"
		}
		st.gs, st.initErr = NewS3(st.ctx, gs)
	})
	switch u.Scheme {
	case location.SchemeHTTPS:
		return st.https, nil
	case location.SchemeGS:
		return st.gs, st.initErr
	default:
		return st.s3, st.initErr
	}
}

// resolve lists what a location names: the object itself, or every object
// under it as a prefix. Nothing there is a *MissingError.
func (st *Stager) resolve(ctx context.Context, u location.URI) (Store, []Object, bool, error) {
	s, err := st.store(u)
	if err != nil {
		return nil, nil, false, err
	}
	if u.Key != "" && !strings.HasSuffix(u.Key, "/") {
		o, err := s.Head(ctx, u.Bucket, u.Key)
		if err == nil {
			return s, []Object{o}, true, nil
		}
		if !errors.Is(err, ErrNotFound) {
			return nil, nil, false, fmt.Errorf("%s: %w", u, err)
		}
		if u.Scheme == location.SchemeHTTPS {
			return nil, nil, false, &MissingError{URI: u.String()}
		}
	}
	objs, err := s.List(ctx, u.Bucket, u.Prefix())
	if errors.Is(err, ErrNotFound) || (err == nil && len(objs) == 0) {
		return nil, nil, false, &MissingError{URI: u.String()}
	}
	if err != nil {
		return nil, nil, false, fmt.Errorf("%s: %w", u, err)
	}
	return s, objs, false, nil
}

// StageResult is what staging the inputs did.
type StageResult struct {
	Bytes     int64         `json:"bytes"`
	HitBytes  int64         `json:"hitBytes"`
	Objects   int           `json:"objects"`
	Hits      int           `json:"hits"`
	Duration  time.Duration `json:"duration"`
	BytesRead int64         `json:"bytesRead"`
}

// StageInputs places every input under workdir, through the cache unless an
// input says cache: false. progress is called as bytes arrive.
func (st *Stager) StageInputs(ctx context.Context, inputs []Input, workdir string, progress func(Progress)) (StageResult, error) {
	start := time.Now()
	type item struct {
		s      Store
		u      location.URI
		o      Object
		dest   string
		cached bool
	}
	var items []item
	var total int64
	for _, in := range inputs {
		u, err := location.Parse(in.From)
		if err != nil {
			return StageResult{}, fmt.Errorf("input %s %w", in.From, err)
		}
		s, objs, single, err := st.resolve(ctx, u)
		if err != nil {
			return StageResult{}, err
		}
		to := in.To
		if !filepath.IsAbs(to) {
			to = filepath.Join(workdir, to)
		}
		for _, o := range objs {
			var dest string
			switch {
			case single && strings.HasSuffix(in.To, "/"):
				dest = filepath.Join(to, path.Base(o.Key))
			case single:
				dest = to
			default:
				rel := strings.TrimPrefix(o.Key, u.Prefix())
				if rel == "" || strings.HasSuffix(rel, "/") {
					continue
				}
				dest = filepath.Join(to, filepath.FromSlash(rel))
				if !strings.HasPrefix(dest, filepath.Clean(to)+string(filepath.Separator)) {
					return StageResult{}, fmt.Errorf("input %s: key %q escapes %s", u, o.Key, in.To)
				}
			}
			items = append(items, item{s: s, u: u.Join(o.Key),
				o: o, dest: dest, cached: in.Cache == nil || *in.Cache})
			total += o.Size
		}
	}
	var done atomic.Int64
	report := func(n int64) {
		d := done.Add(n)
		if progress != nil {
			progress(Progress{Phase: "inputs", Done: d, Total: total})
		}
	}
	report(0)
	res := StageResult{}
	for _, it := range items {
		if err := os.MkdirAll(filepath.Dir(it.dest), 0o750); err != nil {
			return res, fmt.Errorf("input %s: %w", it.u, err)
		}
		open := func() (io.ReadCloser, error) {
			rc, err := it.s.Get(ctx, it.u.Bucket, it.u.Key)
			if errors.Is(err, ErrNotFound) {
				return nil, &MissingError{URI: it.u.String()}
			}
			return rc, err
		}
		res.Objects++
		res.Bytes += it.o.Size
		if it.cached {
			key := Key(it.u.String(), it.o)
			if blob, ok := st.cache.lookup(key, it.o.Size); ok {
				err := place(blob, it.dest)
				st.cache.unpin(key)
				if err != nil {
					return res, fmt.Errorf("input %s: %w", it.u, err)
				}
				res.Hits++
				res.HitBytes += it.o.Size
				report(it.o.Size)
				continue
			}
			if st.cache.reserve(it.o.Size) {
				blob, err := st.cache.fill(key, it.o.Size, open, report)
				if err == nil {
					err = place(blob, it.dest)
					st.cache.unpin(key)
					if err != nil {
						return res, fmt.Errorf("input %s: %w", it.u, err)
					}
					res.BytesRead += it.o.Size
					continue
				}
				var me *MissingError
				if errors.As(err, &me) || !errors.Is(err, errFull) {
					return res, wrapInput(it.u, err)
				}
				// The disk is full even after eviction: fetch around it.
			}
		}
		if err := fetchTo(it.dest, open, report); err != nil {
			return res, wrapInput(it.u, err)
		}
		res.BytesRead += it.o.Size
	}
	res.Duration = time.Since(start)
	return res, nil
}

func wrapInput(u location.URI, err error) error {
	var me *MissingError
	if errors.As(err, &me) {
		return me
	}
	return fmt.Errorf("input %s: %w", u, err)
}

// place puts a cached blob at dest: a hard link where the cache and the job
// share a filesystem, else a copy.
func place(blob, dest string) error {
	_ = os.Remove(dest)
	if err := os.Link(blob, dest); err == nil {
		return nil
	}
	src, err := os.Open(blob)
	if err != nil {
		return err
	}
	defer src.Close()
	return writeFile(dest, src)
}

func fetchTo(dest string, open func() (io.ReadCloser, error), progress func(int64)) error {
	rc, err := open()
	if err != nil {
		return err
	}
	defer rc.Close()
	return writeFile(dest, &countingReader{r: rc, fn: progress})
}

func writeFile(dest string, r io.Reader) error {
	tmp, err := os.CreateTemp(filepath.Dir(dest), ".spillway-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := io.Copy(tmp, r); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), dest)
}

// UploadOutputs uploads the outputs due for this end (succeeded or not).
// A store that fails is retried with backoff; the error is returned only
// when every attempt failed.
func (st *Stager) UploadOutputs(ctx context.Context, outputs []Output, workdir string, succeeded bool, progress func(Progress)) error {
	type file struct{ src, key string }
	var files []file
	var total int64
	var dests []location.URI
	for _, out := range outputs {
		if out.When == WhenSuccess && !succeeded {
			continue
		}
		u, err := location.Parse(out.To)
		if err != nil {
			return fmt.Errorf("output %s %w", out.To, err)
		}
		src := out.From
		if !filepath.IsAbs(src) {
			src = filepath.Join(workdir, src)
		}
		fi, err := os.Stat(src)
		if errors.Is(err, os.ErrNotExist) {
			continue // nothing written: nothing to upload
		}
		if err != nil {
			return fmt.Errorf("output %s: %w", out.From, err)
		}
		if !fi.IsDir() {
			key := u.Key
			if key == "" || strings.HasSuffix(key, "/") {
				key = u.Prefix() + filepath.Base(src)
			}
			files = append(files, file{src, key})
			dests = append(dests, u)
			total += fi.Size()
			continue
		}
		err = filepath.WalkDir(src, func(p string, d os.DirEntry, err error) error {
			if err != nil || !d.Type().IsRegular() {
				return err
			}
			rel, _ := filepath.Rel(src, p)
			info, err := d.Info()
			if err != nil {
				return err
			}
			files = append(files, file{p, u.Prefix() + filepath.ToSlash(rel)})
			dests = append(dests, u)
			total += info.Size()
			return nil
		})
		if err != nil {
			return fmt.Errorf("output %s: %w", out.From, err)
		}
	}
	var done int64
	for i, f := range files {
		s, err := st.store(dests[i])
		if err != nil {
			return err
		}
		n, err := st.putRetry(ctx, s, dests[i], f.key, f.src)
		if err != nil {
			return err
		}
		done += n
		if progress != nil {
			progress(Progress{Phase: "outputs", Done: done, Total: total})
		}
	}
	return nil
}

// putRetry uploads one file, retrying with exponential backoff and jitter.
func (st *Stager) putRetry(ctx context.Context, s Store, u location.URI, key, src string) (int64, error) {
	wait := st.cfg.Retry.Backoff
	var last error
	for attempt := 1; attempt <= st.cfg.Retry.Attempts; attempt++ {
		n, err := putFile(ctx, s, u.Bucket, key, src)
		if err == nil {
			return n, nil
		}
		last = err
		if attempt == st.cfg.Retry.Attempts || ctx.Err() != nil {
			break
		}
		if st.OnRetry != nil {
			st.OnRetry(string(u.Scheme)+"://"+u.Bucket+"/"+key, attempt, err)
		}
		d := wait/2 + rand.N(wait/2+1)
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(d):
		}
		wait = min(wait*2, st.cfg.Retry.MaxBackoff)
	}
	return 0, fmt.Errorf("upload %s://%s/%s: %d attempts: %w", u.Scheme, u.Bucket, key, st.cfg.Retry.Attempts, last)
}

func putFile(ctx context.Context, s Store, bucket, key, src string) (int64, error) {
	f, err := os.Open(src)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return 0, err
	}
	return fi.Size(), s.Put(ctx, bucket, key, f, fi.Size())
}
