// Package redis is the store for larger installs: several brokers share one
// Redis (go-redis/v9), one of them leads through a lease (see Elector), and
// every write the leader makes carries a fencing token the store checks.
//
// Key layout, under a configurable prefix P (default "spillway"), all in
// one hash slot so that a transaction never spans slots:
//
//	{P}:v:<bucket>:<key>   string: the value of key in bucket
//	{P}:k:<bucket>         sorted set, every member at score 0: the keys of
//	                       the bucket, so ZRANGEBYLEX gives bytewise order
//	{P}:fence              integer: the fencing counter (INCR per won lease)
//	{P}:leader             string "<token>|<broker id>|<peer URL>",
//	                       with a TTL: the leader lease
//
// Transactions are optimistic. Inside Update every key read is WATCHed
// first (a scan WATCHes the bucket's index and every value it returns),
// writes are buffered in the transaction (reads merge them in, so a
// transaction sees its own writes), and the commit is one Lua script that
// checks the fence and applies every buffered write; when the transaction
// read anything the script runs inside MULTI/EXEC, so EXEC fails if a
// watched key changed and fn runs again. View reads committed data
// without watching. docs/operations.md has the whole story, per operation.
package redis

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/spillway-dev/spillway/broker"
)

// DefaultPrefix namespaces the keys when neither Options nor the URL name
// a prefix.
const DefaultPrefix = "spillway"

// prefixRe is what a key prefix may be: no glob characters (Wipe matches
// on it) and no braces (it becomes the hash tag).
var prefixRe = regexp.MustCompile(`^[A-Za-z0-9._:-]{1,64}$`)

// Options tune a Store; zero values get defaults.
type Options struct {
	// Prefix namespaces every key; "?prefix=" in the URL overrides it.
	Prefix string
	// Logger receives warnings about the server's persistence settings.
	Logger *slog.Logger
	// MaxBatchSize bounds how many Batch calls share one commit (default
	// 1000).
	MaxBatchSize int
}

// Store is a broker.Store (and broker.Fenced) on Redis.
type Store struct {
	rdb    *goredis.Client
	prefix string // "{P}"
	log    *slog.Logger
	// fenced reports whether SetFence was called; token is the token set.
	fenced atomic.Bool
	token  atomic.Uint64

	// group is Batch's group commit.
	group *broker.GroupCommit
	// inflight counts Batch calls not yet answered; Close waits for them.
	inflight sync.WaitGroup
}

var (
	_ broker.Store        = (*Store)(nil)
	_ broker.Fenced       = (*Store)(nil)
	_ broker.BucketLister = (*Store)(nil)
)

// target is a parsed store URL.
type target struct {
	opt      *goredis.Options         // redis://, rediss://
	failover *goredis.FailoverOptions // redis-sentinel://, rediss-sentinel://
	prefix   string
}

func (t *target) client() *goredis.Client {
	if t.failover != nil {
		return goredis.NewFailoverClient(t.failover)
	}
	return goredis.NewClient(t.opt)
}

// CheckURL reports whether a store URL is well formed, without connecting.
// Accepted forms:
//
//	redis://[[user]:password@]host:port/db[?prefix=P&<go-redis options>]
//	rediss://…                      the same over TLS (skip_verify=true to
//	                                accept any certificate)
//	redis-sentinel://[[user]:password@]host1:26379,host2:26379/master[/db][?prefix=P&sentinel_password=S]
//	rediss-sentinel://…             Sentinel, with TLS to sentinels and master
//
// The user and password of a Sentinel URL are the master's; the sentinels'
// own password goes in sentinel_password. The go-redis options are its
// ParseURL's (dial_timeout, read_timeout, pool_size, …).
func CheckURL(raw string) error {
	_, err := parseURL(raw)
	return err
}

func parseURL(raw string) (*target, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("parse store URL: %w", err)
	}
	q := u.Query()
	t := &target{prefix: q.Get("prefix")}
	q.Del("prefix")
	if t.prefix != "" && !prefixRe.MatchString(t.prefix) {
		return nil, fmt.Errorf("store URL: prefix %q: want 1-64 letters, digits, '.', '_', ':' or '-'", t.prefix)
	}
	switch u.Scheme {
	case "redis", "rediss":
		u.RawQuery = q.Encode()
		if t.opt, err = goredis.ParseURL(u.String()); err != nil {
			return nil, fmt.Errorf("store URL: %w", err)
		}
		return t, nil
	case "redis-sentinel", "rediss-sentinel":
		if t.failover, err = parseSentinel(u, q); err != nil {
			return nil, fmt.Errorf("store URL: %w", err)
		}
		return t, nil
	}
	return nil, fmt.Errorf("store URL: scheme %q is not redis, rediss, redis-sentinel or rediss-sentinel", u.Scheme)
}

func parseSentinel(u *url.URL, q url.Values) (*goredis.FailoverOptions, error) {
	opt := &goredis.FailoverOptions{}
	if u.User != nil {
		opt.Username = u.User.Username()
		opt.Password, _ = u.User.Password()
	}
	for _, a := range strings.Split(u.Host, ",") {
		host, port, err := net.SplitHostPort(a)
		if err != nil || host == "" || port == "" {
			return nil, fmt.Errorf("sentinel address %q: want host:port", a)
		}
		opt.SentinelAddrs = append(opt.SentinelAddrs, a)
	}
	parts := strings.FieldsFunc(u.Path, func(r rune) bool { return r == '/' })
	switch len(parts) {
	case 2:
		db, err := strconv.Atoi(parts[1])
		if err != nil || db < 0 {
			return nil, fmt.Errorf("database %q: want a number", parts[1])
		}
		opt.DB = db
		fallthrough
	case 1:
		opt.MasterName = parts[0]
	default:
		return nil, fmt.Errorf("path %q: want /<master name>[/<db>]", u.Path)
	}
	opt.SentinelPassword = q.Get("sentinel_password")
	q.Del("sentinel_password")
	for k := range q {
		return nil, fmt.Errorf("unknown sentinel option %q (prefix and sentinel_password are known)", k)
	}
	if u.Scheme == "rediss-sentinel" {
		opt.TLSConfig = tlsConfig()
	}
	return opt, nil
}

// Open connects to the Redis a store URL names (see CheckURL) and checks
// that it answers.
func Open(ctx context.Context, rawURL string, o Options) (*Store, error) {
	t, err := parseURL(rawURL)
	if err != nil {
		return nil, err
	}
	prefix := t.prefix
	if prefix == "" {
		prefix = o.Prefix
	}
	if prefix == "" {
		prefix = DefaultPrefix
	}
	if !prefixRe.MatchString(prefix) {
		return nil, fmt.Errorf("redis store: prefix %q: want 1-64 letters, digits, '.', '_', ':' or '-'", prefix)
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.MaxBatchSize <= 0 {
		o.MaxBatchSize = 1000
	}
	clientLog.Do(func() { goredis.SetLogger(redisLog{o.Logger}) })
	s := &Store{rdb: t.client(), prefix: "{" + prefix + "}", log: o.Logger}
	s.group = &broker.GroupCommit{Max: o.MaxBatchSize, Commit: s.commitGroup}
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := s.rdb.Ping(pctx).Err(); err != nil {
		s.rdb.Close()
		return nil, fmt.Errorf("reach redis for %s: %w", redactURL(rawURL), err)
	}
	if err := s.loadScripts(pctx); err != nil {
		s.rdb.Close()
		return nil, err
	}
	s.checkPersistence(pctx)
	return s, nil
}

// clientLog routes go-redis's own messages (one per failed dial while
// Redis is down) to the first store's logger at debug level: the broker
// reports the outage itself, once.
var clientLog sync.Once

type redisLog struct{ l *slog.Logger }

func (r redisLog) Printf(ctx context.Context, format string, v ...any) {
	r.l.DebugContext(ctx, "redis client: "+fmt.Sprintf(format, v...))
}

func tlsConfig() *tls.Config { return &tls.Config{MinVersion: tls.VersionTLS12} }

// redactURL hides the password of a store URL for messages.
func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "the store URL"
	}
	return u.Redacted()
}

// checkPersistence warns when the server's settings do not keep accepted
// writes: without an fsynced AOF a Redis restart loses them, and an
// eviction policy other than noeviction drops keys under memory pressure.
// Managed services that disable CONFIG are not checked.
func (s *Store) checkPersistence(ctx context.Context) {
	got, err := s.rdb.ConfigGet(ctx, "*").Result()
	if err != nil {
		s.log.Info("redis persistence not checked (CONFIG GET refused)", "err", err)
		return
	}
	if got["appendonly"] != "yes" {
		s.log.Warn("redis runs without appendonly: a Redis restart loses accepted writes; set appendonly yes and appendfsync always (docs/operations.md)")
	} else if got["appendfsync"] != "always" {
		s.log.Warn("redis appendfsync is not always: a Redis crash may lose the last second of accepted writes", "appendfsync", got["appendfsync"])
	}
	if p := got["maxmemory-policy"]; p != "" && p != "noeviction" {
		s.log.Warn("redis evicts keys under memory pressure: set maxmemory-policy noeviction or the store loses data", "maxmemory-policy", p)
	}
}

// Prefix is the key prefix, with its hash-tag braces ("{spillway}").
func (s *Store) Prefix() string { return s.prefix }

// Client is the underlying go-redis client (for the elector and tools).
func (s *Store) Client() *goredis.Client { return s.rdb }

func (s *Store) valKey(b broker.Bucket, key string) string {
	return s.prefix + ":v:" + string(b) + ":" + key
}

func (s *Store) idxKey(b broker.Bucket) string { return s.prefix + ":k:" + string(b) }

func (s *Store) fenceKey() string { return s.prefix + ":fence" }

func (s *Store) leaderKey() string { return s.prefix + ":leader" }

// SetFence makes every later write check the cluster's fence counter
// against token (broker.Fenced).
func (s *Store) SetFence(token uint64) {
	s.token.Store(token)
	s.fenced.Store(true)
}

// Fence reads the cluster's fence counter (broker.Fenced).
func (s *Store) Fence(ctx context.Context) (uint64, error) {
	v, err := s.rdb.Get(ctx, s.fenceKey()).Uint64()
	if errors.Is(err, goredis.Nil) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("read fence: %w", err)
	}
	return v, nil
}

// AdvanceFence increments the fence counter, as winning the lease does,
// and returns the new value: every broker holding an older token is fenced
// off at once. Operators use it to stop a broker they cannot reach.
func (s *Store) AdvanceFence(ctx context.Context) (uint64, error) {
	v, err := s.rdb.Incr(ctx, s.fenceKey()).Uint64()
	if err != nil {
		return 0, fmt.Errorf("advance fence: %w", err)
	}
	return v, nil
}

// Ping checks that Redis answers.
func (s *Store) Ping(ctx context.Context) error {
	if err := s.rdb.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("ping redis: %w", err)
	}
	return nil
}

// Close closes the connections. Batch calls in flight finish first.
func (s *Store) Close() error {
	s.inflight.Wait()
	return s.rdb.Close()
}

// Buckets lists the buckets that hold at least one key, by name
// (broker.BucketLister).
func (s *Store) Buckets(ctx context.Context) ([]broker.Bucket, error) {
	var out []broker.Bucket
	iter := s.rdb.Scan(ctx, 0, s.prefix+":k:*", 256).Iterator()
	for iter.Next(ctx) {
		out = append(out, broker.Bucket(strings.TrimPrefix(iter.Val(), s.prefix+":k:")))
	}
	if err := iter.Err(); err != nil {
		return nil, fmt.Errorf("list buckets: %w", err)
	}
	slices.Sort(out)
	return out, nil
}

// Wipe deletes every key under the store's prefix, lease and fence
// included. Tests and `spillway store copy --force` use it.
func (s *Store) Wipe(ctx context.Context) error {
	iter := s.rdb.Scan(ctx, 0, s.prefix+":*", 512).Iterator()
	var batch []string
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		err := s.rdb.Unlink(ctx, batch...).Err()
		batch = batch[:0]
		return err
	}
	for iter.Next(ctx) {
		batch = append(batch, iter.Val())
		if len(batch) == 512 {
			if err := flush(); err != nil {
				return fmt.Errorf("wipe: %w", err)
			}
		}
	}
	if err := iter.Err(); err != nil {
		return fmt.Errorf("wipe: %w", err)
	}
	if err := flush(); err != nil {
		return fmt.Errorf("wipe: %w", err)
	}
	return nil
}
