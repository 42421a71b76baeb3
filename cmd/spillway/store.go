package main

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"hash"
	"log/slog"
	"strings"

	"github.com/spf13/cobra"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/bolt"
	"github.com/spillway-dev/spillway/broker/config"
	"github.com/spillway-dev/spillway/broker/redis"
)

func storeCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "store",
		Short: "Work on a broker store directly (stop the brokers first)",
		Args:  cobra.NoArgs,
	}
	cmd.AddCommand(storeCopyCmd(g))
	return cmd
}

func storeCopyCmd(g *globals) *cobra.Command {
	var from, to string
	var force bool
	cmd := &cobra.Command{
		Use:   "copy --from URL --to URL",
		Short: "Copy every bucket of one store into another (bolt to Redis, or back)",
		Long: `Copy every bucket of one store into another, then check that both hold
the same keys and values (a count and a SHA-256 per bucket).

Store URLs are those of the config's store field: bolt:///abs/path/spillway.db
(or a plain path), redis://host:port/db, rediss://…, redis-sentinel://….
Stop every broker on both stores first: a bolt file in use is refused, a
Redis in use is not detected. A target that holds any key is refused unless
--force, which deletes the target's buckets before copying.

  spillway store copy --from bolt:///var/lib/spillway/spillway.db --to redis://127.0.0.1:6379/0`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if from == "" || to == "" {
				return errors.New("--from and --to are required")
			}
			log := newLogger(g.stderr, config.Log{Level: "warn"})
			ctx := cmd.Context()
			src, err := openStoreURL(ctx, from, log)
			if err != nil {
				return fmt.Errorf("open --from: %w", err)
			}
			defer src.Close()
			dst, err := openStoreURL(ctx, to, log)
			if err != nil {
				return fmt.Errorf("open --to: %w", err)
			}
			defer dst.Close()
			res, err := copyStore(ctx, src, dst, force)
			if err != nil {
				return err
			}
			tw := g.table()
			fmt.Fprintln(tw, "BUCKET\tKEYS\tVERIFIED")
			total := 0
			for _, r := range res {
				fmt.Fprintf(tw, "%s\t%d\t%s\n", r.Bucket, r.Keys, "ok")
				total += r.Keys
			}
			tw.Flush()
			fmt.Fprintf(g.stderr, "copied %d keys in %d buckets from %s to %s\n", total, len(res), redactStoreURL(from), redactStoreURL(to))
			return nil
		},
	}
	cmd.Flags().StringVar(&from, "from", "", "source store URL")
	cmd.Flags().StringVar(&to, "to", "", "target store URL")
	cmd.Flags().BoolVar(&force, "force", false, "delete what the target holds before copying")
	return cmd
}

// openStoreURL opens a store from a URL: bolt:///path, a plain path, or a
// Redis URL.
func openStoreURL(ctx context.Context, raw string, log *slog.Logger) (broker.Store, error) {
	switch {
	case strings.HasPrefix(raw, "bolt://"):
		return bolt.Open(strings.TrimPrefix(raw, "bolt://"))
	case strings.Contains(raw, "://"):
		return redis.Open(ctx, raw, redis.Options{Logger: log})
	}
	return bolt.Open(raw)
}

func redactStoreURL(raw string) string {
	if i := strings.Index(raw, "@"); i >= 0 && strings.Contains(raw[:i], "://") {
		return raw[:strings.Index(raw, "://")+3] + "***" + raw[i:]
	}
	return raw
}

// BucketCopy is one bucket's result of a copy.
type BucketCopy struct {
	Bucket broker.Bucket
	Keys   int
}

// copyChunk is how many keys one target transaction writes.
const copyChunk = 500

// copyStore copies every bucket of src into dst and verifies that dst
// then holds exactly src's keys and values, bucket by bucket.
func copyStore(ctx context.Context, src, dst broker.Store, force bool) ([]BucketCopy, error) {
	srcL, ok1 := src.(broker.BucketLister)
	dstL, ok2 := dst.(broker.BucketLister)
	if !ok1 || !ok2 {
		return nil, errors.New("both stores must list their buckets")
	}
	existing, err := dstL.Buckets(ctx)
	if err != nil {
		return nil, err
	}
	if len(existing) > 0 {
		if !force {
			names := make([]string, len(existing))
			for i, b := range existing {
				names[i] = string(b)
			}
			return nil, fmt.Errorf("the target already holds buckets %s: refusing to copy into it (--force deletes them first)", strings.Join(names, ", "))
		}
		for _, b := range existing {
			if err := clearBucket(ctx, dst, b); err != nil {
				return nil, err
			}
		}
	}
	buckets, err := srcL.Buckets(ctx)
	if err != nil {
		return nil, err
	}
	var out []BucketCopy
	for _, b := range buckets {
		n, err := copyBucket(ctx, src, dst, b)
		if err != nil {
			return nil, fmt.Errorf("copy bucket %s: %w", b, err)
		}
		out = append(out, BucketCopy{Bucket: b, Keys: n})
	}
	// Verify: the same buckets, and per bucket the same count and digest.
	after, err := dstL.Buckets(ctx)
	if err != nil {
		return nil, err
	}
	if fmt.Sprint(after) != fmt.Sprint(buckets) {
		return nil, fmt.Errorf("verify: target has buckets %v, source %v", after, buckets)
	}
	for _, r := range out {
		sn, sd, err := digestBucket(ctx, src, r.Bucket)
		if err != nil {
			return nil, err
		}
		dn, dd, err := digestBucket(ctx, dst, r.Bucket)
		if err != nil {
			return nil, err
		}
		if sn != r.Keys || dn != sn || sd != dd {
			return nil, fmt.Errorf("verify bucket %s: source %d keys, copied %d, target %d keys; digests equal: %v", r.Bucket, sn, r.Keys, dn, sd == dd)
		}
	}
	return out, nil
}

type kv struct {
	k string
	v []byte
}

// readChunk returns up to copyChunk pairs of bucket b from key `after`
// on (exclusive when after is not "").
func readChunk(ctx context.Context, s broker.Store, b broker.Bucket, after string) ([]kv, error) {
	var out []kv
	from := ""
	if after != "" {
		from = after + "\x00"
	}
	err := s.View(ctx, func(tx broker.Tx) error {
		return tx.Scan(b, from, "", func(k string, v []byte) error {
			out = append(out, kv{k, append([]byte{}, v...)})
			if len(out) == copyChunk {
				return broker.ErrStopScan
			}
			return nil
		})
	})
	return out, err
}

func copyBucket(ctx context.Context, src, dst broker.Store, b broker.Bucket) (int, error) {
	n, after := 0, ""
	for {
		chunk, err := readChunk(ctx, src, b, after)
		if err != nil {
			return n, err
		}
		if len(chunk) == 0 {
			return n, nil
		}
		err = dst.Update(ctx, func(tx broker.Tx) error {
			for _, p := range chunk {
				if err := tx.Put(b, p.k, p.v); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return n, err
		}
		n += len(chunk)
		after = chunk[len(chunk)-1].k
	}
}

func clearBucket(ctx context.Context, s broker.Store, b broker.Bucket) error {
	for {
		chunk, err := readChunk(ctx, s, b, "")
		if err != nil || len(chunk) == 0 {
			return err
		}
		err = s.Update(ctx, func(tx broker.Tx) error {
			for _, p := range chunk {
				if err := tx.Delete(b, p.k); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("clear bucket %s: %w", b, err)
		}
	}
}

// digestBucket counts a bucket's keys and hashes its pairs in order.
func digestBucket(ctx context.Context, s broker.Store, b broker.Bucket) (int, string, error) {
	h := sha256.New()
	n, after := 0, ""
	for {
		chunk, err := readChunk(ctx, s, b, after)
		if err != nil {
			return 0, "", err
		}
		if len(chunk) == 0 {
			return n, fmt.Sprintf("%x", h.Sum(nil)), nil
		}
		for _, p := range chunk {
			writeLenPrefixed(h, []byte(p.k))
			writeLenPrefixed(h, p.v)
		}
		n += len(chunk)
		after = chunk[len(chunk)-1].k
	}
}

func writeLenPrefixed(h hash.Hash, b []byte) {
	fmt.Fprintf(h, "%d:", len(b))
	_, _ = h.Write(b)
}
