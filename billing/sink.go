package billing

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// Sink is where scheduled exports land: a directory (DirSink) or an S3
// bucket (package billing/s3sink).
type Sink interface {
	// Put stores body under key ("finance-monthly/2026-11.csv"), replacing
	// what the key held. body is read from its start.
	Put(ctx context.Context, key string, body io.ReadSeeker) error
}

// Destination is where a scheduled export goes: exactly one of Dir and S3.
type Destination struct {
	// Dir is a local directory; files land at Dir/<key>.
	Dir string `json:"dir,omitempty"`
	// S3 is a bucket (AWS or any S3-compatible server).
	S3 *S3Destination `json:"s3,omitempty"`
}

// S3Destination names a bucket. Credentials come from the AWS default
// chain (environment, shared config, instance role), never from the
// billing config.
type S3Destination struct {
	Bucket string `json:"bucket"`
	// Prefix is put before every key ("spillway/exports/").
	Prefix string `json:"prefix,omitempty"`
	Region string `json:"region,omitempty"`
	// Endpoint overrides the S3 endpoint, for S3-compatible servers
	// ("https://minio.internal:9000").
	Endpoint string `json:"endpoint,omitempty"`
	// PathStyle addresses the bucket in the path, not the host name (most
	// S3-compatible servers want it).
	PathStyle bool `json:"pathStyle,omitempty"`
}

// DirSink writes exports under a directory. Each file is written to a
// temporary name and renamed into place, so readers never see half a file
// and a rerun replaces it whole.
type DirSink struct {
	Dir string
}

// Put implements Sink.
func (d DirSink) Put(ctx context.Context, key string, body io.ReadSeeker) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if key == "" || strings.HasPrefix(key, "/") || slices.Contains(strings.Split(key, "/"), "..") || strings.Contains(key, "\\") {
		return fmt.Errorf("put %q: key must be a relative slash-separated path without ..", key)
	}
	path := filepath.Join(d.Dir, filepath.FromSlash(key))
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("put %s: %w", key, err)
	}
	if _, err := body.Seek(0, io.SeekStart); err != nil {
		return fmt.Errorf("put %s: rewind: %w", key, err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("put %s: %w", key, err)
	}
	defer os.Remove(tmp.Name()) // no-op after the rename
	if _, err := io.Copy(tmp, body); err != nil {
		tmp.Close()
		return fmt.Errorf("put %s: write: %w", key, err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("put %s: sync: %w", key, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("put %s: close: %w", key, err)
	}
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		return fmt.Errorf("put %s: %w", key, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("put %s: rename: %w", key, err)
	}
	return nil
}
