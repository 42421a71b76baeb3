package staging

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/spillway-dev/spillway/onprem/staging/s3server"
)

// TestAFullCacheDiskNeverFailsTheJob: the cache's disk answers ENOSPC
// (writes go to /dev/full). The cache evicts what it can and the input is
// fetched straight into the job's directory: the job gets its data.
func TestAFullCacheDiskNeverFailsTheJob(t *testing.T) {
	srv := s3server.Start(t)
	srv.Bucket("data")
	for _, kv := range srv.Env() {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}
	for _, k := range []string{"old", "new"} {
		if _, err := srv.Client().PutObject(t.Context(), &s3.PutObjectInput{Bucket: aws.String("data"), Key: aws.String(k),
			Body: bytes.NewReader([]byte("contents of " + k))}); err != nil {
			t.Fatal(err)
		}
	}
	st, err := New(context.Background(), Config{S3: S3Config{Endpoint: srv.Endpoint, PathStyle: true}, CacheDir: t.TempDir(), CacheBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.StageInputs(t.Context(), []Input{{From: "s3://data/old", To: "old"}}, t.TempDir(), nil); err != nil {
		t.Fatal(err)
	}
	// A link to /dev/full: the cache removes its temp file afterwards,
	// which must remove the link, never the device.
	full := filepath.Join(t.TempDir(), "full")
	st.cache.createTemp = func(string, string) (*os.File, error) {
		if err := os.Symlink("/dev/full", full); err != nil && !os.IsExist(err) {
			return nil, err
		}
		return os.OpenFile(full, os.O_WRONLY, 0)
	}
	work := t.TempDir()
	if _, err := st.StageInputs(t.Context(), []Input{{From: "s3://data/new", To: "new"}}, work, nil); err != nil {
		t.Fatalf("a full cache disk failed the job: %v", err)
	}
	if got, _ := os.ReadFile(filepath.Join(work, "new")); string(got) != "contents of new" {
		t.Fatalf("input %q", got)
	}
	if s := st.cache.Stats(); s.Evictions != 1 || s.Objects != 0 {
		t.Fatalf("the full disk evicted nothing: %+v", s)
	}
	if fi, err := os.Stat("/dev/full"); err != nil || fi.Mode()&os.ModeCharDevice == 0 {
		t.Fatalf("/dev/full harmed: %v", err)
	}
}
